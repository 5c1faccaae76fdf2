/**
 * QEMU for both VM tiers (microvm and vm): each VM's host files, what QEMU costs beside
 * the guest's RAM, and the VMM's launch through `dsec-vmm-launch` (into the sandbox's
 * cgroup, confined, detached from dsecd), with the checks that tell a VM's QEMU from a
 * reused pid. The machines themselves are the tiers' (daemon/drivers/microvm/qemu.ts,
 * daemon/drivers/vm/qemu.ts).
 *
 * Host layout of one VM (`<root>/sandboxes/<id>/`, root-only):
 *   disk.raw      the writable disk: sparse raw file, ext4 formatted by dsecd at create
 *   swap.raw      the guest's swap disk (`[vm.reclaim] swap = "disk"`): sparse raw file,
 *                 made at create, formatted by the guest's /init at every boot
 *   qmp.sock      QEMU's QMP monitor (server)
 *   vmux.sock     QEMU's chardev of the agent's virtio-serial port `dsec.agent` (server)
 *   agent.sock    dsecd's listener: every connection becomes one mux stream (vmux.ts)
 *   console.log   the serial console (kernel and /init), appended across boots
 *   agent.log     the agent's stderr, through the virtio-serial port `dsec.log`
 *   qemu.log      QEMU's own stderr
 *   qemu.pid      written by QEMU (-pidfile)
 *   machine.json  the machine QEMU was started with (memory, vCPUs, kernel, initramfs,
 *                 accelerator, layers): what a machine snapshot records
 *   migrate.sock  only during a machine snapshot (dsecd listens, QEMU sends its state) or
 *                 a restore (QEMU listens, dsecd sends the state)
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, openSync, closeSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import { procStartTime } from '../../host/proc.js';

/**
 * QEMU's microvm machine (virtio-mmio, no PCI, no firmware) with the legacy PIT, PIC and
 * RTC on: the microvm tier runs it and the KVM probe boots it (the cheapest machine to
 * boot). Without the PIT the Debian kernel cannot calibrate its TSC under TCG and hangs
 * in early boot; the RTC gives the guest the host's time at boot.
 */
export const MICROVM_MACHINE = 'microvm,pit=on,pic=on,rtc=on,isa-serial=on';

/** Smallest guest memory dsec accepts for a VM of either tier: 128 MiB (the Debian kernel plus the initramfs unpacked need ~90 MiB to reach the agent). */
export const VM_MIN_MEMORY_BYTES = 128 * 1024 * 1024;

/**
 * What QEMU itself needs beside the guest's RAM, charged to the sandbox's cgroup with it:
 * its own code, heap and I/O buffers (~40 MiB resident when measured here), the kernel
 * segments and initramfs it keeps for reset (~60 MiB for Debian's uncompressed kernel),
 * page cache of the layer and disk files it reads,
 * plus, under TCG, the translation cache ({@link VmConfig.tcgTbMiB}). 96 MiB plus the
 * translation cache leaves room for all of it; page cache beyond it is reclaimed, never
 * an OOM kill.
 */
export function vmmOverheadBytes(accel: Accel, tcgTbMiB: number): number {
  return (96 + (accel === 'tcg' ? tcgTbMiB : 0)) * 1024 * 1024;
}

/** Accelerator QEMU runs a guest with. */
export type Accel = 'kvm' | 'tcg';

/** Paths of one VM's host files (see the module comment). */
export function vmPaths(dir: string) {
  return {
    disk: path.join(dir, 'disk.raw'),
    qmp: path.join(dir, 'qmp.sock'),
    vmux: path.join(dir, 'vmux.sock'),
    agentSock: path.join(dir, 'agent.sock'),
    console: path.join(dir, 'console.log'),
    agentLog: path.join(dir, 'agent.log'),
    qemuLog: path.join(dir, 'qemu.log'),
    pid: path.join(dir, 'qemu.pid'),
    machine: path.join(dir, 'machine.json'),
    migrate: path.join(dir, 'migrate.sock'),
    /** The guest's swap disk (reclaim.ts); absent: the guest has none. */
    swap: path.join(dir, 'swap.raw'),
    /** vm tier: the writable disk, a qcow2 overlay over the VM's base disk. */
    qcow: path.join(dir, 'disk.qcow2'),
    /** vm tier: QEMU's chardev of the serial port (server); dsecd holds the one connection (daemon/drivers/vm/console.ts). */
    consoleSock: path.join(dir, 'console.sock'),
    /** vm tier: the previous console log, once `console.log` reached its cap. */
    consoleOld: path.join(dir, 'console.log.1'),
  };
}

/** Options of {@link spawnVmm}. */
export interface SpawnVmmOptions {
  /** dsec-vmm-launch binary. */
  launcher: string;
  /** QEMU binary (PATH search by the launcher). */
  qemu: string;
  args: string[];
  /** cgroup.procs files to join before exec (CgroupManager.procsFiles). */
  cgroupProcs: string[];
  /** SCHED_IDLE for the VMM (a batch sandbox). */
  schedIdle: boolean;
  /** Allow transparent huge pages for the VMM (guest RAM); false: PR_SET_THP_DISABLE (see native/vmm/launch.c). */
  thp: boolean;
  /** File for QEMU's stderr (and the launcher's). */
  logFile: string;
  /** Confinement beyond the cgroup (native/vmm/launch.c); absent: none. */
  confine?: VmmConfinement;
}

/**
 * How `dsec-vmm-launch` confines one VMM (see native/vmm/launch.c and docs/SECURITY.md
 * "VMM confinement"). Every path is a host path, bound at the same path in the VMM's
 * mount namespace.
 */
export interface VmmConfinement {
  /** An empty host directory the new root (a tmpfs) is mounted on; null: no mount namespace. */
  newRoot: string | null;
  /** Bound read-only: QEMU, its libraries and firmware, the kernel, initramfs, layer blobs and base disks. */
  ro: string[];
  /** Bound read-write: the sandbox dir (writable disk, sockets, logs). */
  rw: string[];
  /** Device nodes: /dev/null, /dev/zero, /dev/urandom, and /dev/kvm under KVM. */
  dev: string[];
  /** Host uid and gid QEMU runs as; null: it stays root (the host does not allow otherwise, or confinement is off). */
  uid: number | null;
  gid: number | null;
  /** Supplementary groups kept (the group of /dev/kvm). */
  groups: number[];
  /** dsec's own seccomp filter (below QEMU's `-sandbox`). */
  seccomp: boolean;
}

/** The launcher arguments of a {@link VmmConfinement}. Pure. */
export function confinementArgs(c: VmmConfinement): string[] {
  const a: string[] = [];
  if (c.newRoot) {
    a.push('--new-root', c.newRoot);
    for (const p of c.ro) a.push('--ro', p);
    for (const p of c.rw) a.push('--rw', p);
    for (const p of c.dev) a.push('--dev', p);
  }
  if (c.uid !== null && c.gid !== null) {
    a.push('--uid', String(c.uid), '--gid', String(c.gid));
    if (c.groups.length) a.push('--groups', c.groups.join(','));
  }
  if (c.seccomp) a.push('--seccomp');
  return a;
}

/**
 * Everything QEMU itself needs to run in a mount namespace of its own: the binary, the
 * shared libraries `ldd` lists for it (the dynamic loader included), its module directory
 * (the TCG accelerator is a loadable module in Debian's build) and its firmware
 * directories (SeaBIOS, option ROMs, the PVH loader), those that exist. Computed once per
 * QEMU binary (one `ldd`, ~10 ms) and cached.
 * @throws DsecError Internal when ldd fails on the binary.
 */
export async function qemuRuntimePaths(qemu: string): Promise<string[]> {
  let p = runtimePathsCache.get(qemu);
  if (!p) {
    p = (async () => {
      const r = await execa('ldd', [qemu], { reject: false });
      if (r.exitCode !== 0) throw new Error(`ldd ${qemu} failed: ${String(r.stderr).trim() || `exit ${r.exitCode}`}`);
      const libs = [...String(r.stdout).matchAll(/(\/[^\s]+) \(0x/g)].map((m) => m[1]);
      const dirs = ['/usr/lib/x86_64-linux-gnu/qemu', '/usr/share/qemu', '/usr/share/seabios', '/usr/lib/ipxe/qemu', '/usr/share/OVMF']
        .filter((d) => existsSync(d));
      return [...new Set([qemu, ...libs, ...dirs])];
    })();
    runtimePathsCache.set(qemu, p);
    p.catch(() => runtimePathsCache.delete(qemu));
  }
  return p;
}
const runtimePathsCache = new Map<string, Promise<string[]>>();

/**
 * Starts QEMU through the launcher, in its own session, with no tie to dsecd (unref'd; a
 * restart of dsecd leaves it running). Resolves once it is spawned; the caller watches
 * `child` for an early exit.
 * @returns the child (its pid is QEMU's: the launcher execs it).
 */
export function spawnVmm(o: SpawnVmmOptions): ChildProcess {
  const argv = [...o.cgroupProcs.flatMap((f) => ['--cgroup-procs', f]), ...(o.schedIdle ? ['--sched-idle'] : []), ...(o.thp ? [] : ['--no-thp']),
    ...(o.confine ? confinementArgs(o.confine) : []), '--', o.qemu, ...o.args];
  const log = openSync(o.logFile, 'a', 0o600);
  try {
    const child = spawn(o.launcher, argv, { detached: true, stdio: ['ignore', log, log] });
    child.unref();
    return child;
  } finally {
    closeSync(log);
  }
}

/** The last `maxLines` lines (at most `maxBytes` bytes) of a log file, or '' when unreadable. */
export function tailFile(file: string, maxLines = 20, maxBytes = 4096): string {
  try {
    const b = readFileSync(file);
    const text = b.subarray(Math.max(0, b.length - maxBytes)).toString('utf8');
    return text.split('\n').filter((l) => l.trim()).slice(-maxLines).join('\n');
  } catch {
    return '';
  }
}

/**
 * The QEMU process recorded in a microVM's dir: the pid QEMU wrote to qemu.pid, if that
 * process is alive and is the QEMU of this dir (its command line names this dir's QMP
 * socket), so a reused pid is never taken for it. null otherwise.
 */
export function vmmOfDir(dir: string): { pid: number; start: number } | null {
  let pid: number;
  try {
    pid = Number(readFileSync(vmPaths(dir).pid, 'utf8').trim());
  } catch {
    return null;
  }
  if (!Number.isInteger(pid) || pid <= 1) return null;
  return isVmmOf(pid, dir) ? { pid, start: procStartTime(pid)! } : null;
}

/** True when `pid` is alive (not a zombie) and its command line names `dir`'s QMP socket. */
export function isVmmOf(pid: number, dir: string): boolean {
  if (procStartTime(pid) === null) return false;
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').some((a) => a.includes(vmPaths(dir).qmp));
  } catch {
    return false;
  }
}

