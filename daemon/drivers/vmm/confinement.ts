/**
 * The VMM's confinement (docs/SECURITY.md "VMM confinement"): what `dsec-vmm-launch` is
 * told for one boot, with the host side prepared for it, and what the kernel says is in
 * force for a running QEMU. Both VM tiers confine their QEMU the same way.
 */
import { readFileSync, readlinkSync } from 'node:fs';
import { chmod, chown, mkdir, stat } from 'node:fs/promises';
import path from 'node:path';
import type { VmConfig } from '../../config.js';
import { failedPrecondition } from '../../errors.js';
import type { DefenceStatus } from '../../model/sandbox.js';
import { kvmGroup } from './host.js';
import { isVmmOf, qemuRuntimePaths, vmPaths, type Accel, type VmmConfinement } from './qemu.js';

/** One boot's confinement inputs. */
export interface ConfinementInput {
  /** The sandbox dir, and its host uid (the base of its uid range; null: none). */
  dir: string;
  uidBase: number | null;
  /** What the sandbox is called in messages (`sandbox <id>`). */
  what: string;
  accel: Accel;
  /** The QEMU binary (its libraries and firmware are bound too). */
  qemu: string;
  /** Host files the boot reads, bound read-only: kernel, initramfs, layers or base disk. */
  files: string[];
  /** The writable disk (owned by the VMM's uid when it runs unprivileged). */
  writableDisk: string;
  /** `<root>/vm`: the VMM's root mount point lives there. */
  vmDir: string;
}

/**
 * The VMM's confinement for one boot, or null when `[vm]` turns all of it off: a mount
 * namespace holding only QEMU's runtime, the boot files and the sandbox dir; the
 * sandbox's own host uid (the base of its uid range) unless the accelerator needs a
 * device that uid cannot open; dsec's seccomp filter. Prepares the host side: the
 * sandbox dir becomes root-owned, group the VMM's gid, mode 01770 (QEMU creates its
 * sockets there; the sticky bit keeps dsecd's own entries out of its reach), and the
 * writable disk and swap disk are owned by the VMM's uid.
 * @throws DsecError FailedPrecondition when a boot file is not readable by the VMM's uid.
 */
export async function prepareConfinement(c: VmConfig['confine'], i: ConfinementInput): Promise<VmmConfinement | null> {
  if (!c.mountNamespace && !c.unprivileged && !c.seccomp) return null;
  const kvm = i.accel === 'kvm';
  let uid: number | null = null;
  let gid: number | null = null;
  const groups: number[] = [];
  if (c.unprivileged && i.uidBase !== null) {
    const kvmOk = !kvm || kvmGroup() !== null;
    if (kvmOk) {
      uid = i.uidBase;
      gid = i.uidBase;
      if (kvm) groups.push(kvmGroup()!);
    }
  }
  if (uid !== null) {
    await chown(i.dir, 0, gid!);
    await chmod(i.dir, 0o1770);
    for (const disk of [i.writableDisk, vmPaths(i.dir).swap]) {
      if (await stat(disk).catch(() => null)) await chown(disk, uid, gid!);
    }
    // An unprivileged VMM must be able to read every file it opens.
    for (const f of i.files) {
      const st = await stat(f).catch(() => null);
      if (st && (st.mode & 0o004) === 0) {
        throw failedPrecondition(`${i.what}: ${f} is not readable by others (mode ${(st.mode & 0o777).toString(8)}), so the VMM, running as host uid ${uid}, cannot open it; chmod o+r it, or set [vm] vmm_unprivileged = false`);
      }
    }
  } else {
    await chmod(i.dir, 0o700);
  }
  let newRoot: string | null = null;
  const ro: string[] = [];
  if (c.mountNamespace) {
    newRoot = path.join(i.vmDir, 'vmm-root');
    await mkdir(newRoot, { recursive: true, mode: 0o700 });
    ro.push(...(await qemuRuntimePaths(i.qemu)), ...i.files);
  }
  return {
    newRoot, ro: [...new Set(ro)], rw: [i.dir], dev: ['/dev/null', '/dev/zero', '/dev/urandom', ...(kvm ? ['/dev/kvm'] : [])],
    uid, gid, groups, seccomp: c.seccomp,
  };
}

/**
 * The VMM's confinement as the kernel reports it for the running QEMU: its mount
 * namespace against dsecd's, its uids and capabilities, its seccomp mode and filter
 * count (/proc/<pid>/status). Nothing is taken from the config but the wording of why not.
 */
export function vmmDefences(pid: number | null, dir: string, vm: Pick<VmConfig, 'accel' | 'confine'>): Record<string, DefenceStatus> {
  if (pid === null || !isVmmOf(pid, dir)) {
    const none = { enforced: false, detail: 'the VMM is not running' };
    return { vmm_mount_namespace: none, vmm_unprivileged: none, vmm_seccomp: none };
  }
  let status = '';
  let ns = '';
  let own = '';
  try {
    status = readFileSync(`/proc/${pid}/status`, 'utf8');
    ns = readlinkSync(`/proc/${pid}/ns/mnt`);
    own = readlinkSync('/proc/self/ns/mnt');
  } catch { /* gone meanwhile */ }
  const field = (k: string) => new RegExp(`^${k}:\\s*(.*)$`, 'm').exec(status)?.[1].trim() ?? '';
  const uids = field('Uid').split(/\s+/).map(Number);
  const seccomp = field('Seccomp');
  const filters = Number(field('Seccomp_filters') || 0);
  return {
    vmm_mount_namespace: ns && ns !== own
      ? { enforced: true, detail: `QEMU (pid ${pid}) has a mount namespace of its own (${ns}): a read-only tmpfs root holding only QEMU, its libraries and firmware, the kernel, initramfs and disks, the sandbox dir and /dev/null, /dev/zero, /dev/urandom${vm.accel === 'kvm' ? ', /dev/kvm' : ''}` }
      : { enforced: false, detail: `QEMU (pid ${pid}) shares dsecd's mount namespace${vm.confine.mountNamespace ? '' : ' ([vm] vmm_mount_namespace = false)'}` },
    vmm_unprivileged: uids.length && uids.every((u) => u !== 0)
      ? { enforced: true, detail: `QEMU runs as host uid ${uids[0]} (the base of the sandbox's uid range), no capabilities (CapEff ${field('CapEff')})` }
      : { enforced: false, detail: `QEMU runs as root: ${vm.confine.unprivileged ? 'the accelerator needs /dev/kvm, which only root may open on this host (give /dev/kvm a group with rw access to let it drop)' : '[vm] vmm_unprivileged = false'}` },
    vmm_seccomp: seccomp === '2'
      ? { enforced: true, detail: `seccomp filter mode, ${filters} filter(s): QEMU's -sandbox on (obsolete, elevateprivileges, spawn, resourcecontrol denied)${filters > 1 ? ' over dsec\'s (namespaces, mounts, ptrace, bpf, keyrings, io_uring, userfaultfd, modules, kexec, clocks: EPERM)' : ''}` }
      : { enforced: false, detail: `QEMU has no seccomp filter (Seccomp: ${seccomp || '?'})` },
  };
}
