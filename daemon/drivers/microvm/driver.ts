/**
 * The `microvm` backend: one QEMU `-M microvm` VM per sandbox (the QEMU process lifecycle
 * is daemon/drivers/vmm/driver.ts), booting the guest kernel with dsec's initramfs, the
 * image's EROFS layers (DAX persistent memory, or read-only virtio-blk disks) under an
 * overlay inside the guest, the writable layer on a per-VM ext4 disk (`disk.raw`,
 * sparse), and the same agent as PID 1 of the guest's root, reached through a stream
 * multiplexer over one virtio-serial port (vmm/vmux.ts, native/agent/vmux.c).
 *
 * Inside the guest, every command is confined like a container process (confine.ts: the
 * filesystem plan as read-only mounts, Docker's capability set, no_new_privs, the seccomp
 * profile, Landlock), sent by {@link MicrovmDriver.bootGuest} at every boot before any
 * command can run; the guest's own memory reclaim (DAMON, reclaim.ts) starts with it.
 *
 * Layers go in as DAX persistent memory backed by one shared, 2 MiB-aligned copy per
 * layer digest (`[vm] pmem`; {@link MicrovmDriver.pmemFor}, qemu.ts pmemLayout), or as
 * read-only virtio-blk disks; a virtio-balloon with free-page reporting (`[vm] balloon`)
 * returns the pages the guest frees. Machine snapshots (capture and restore) are
 * ./snapshot.ts. Not built yet: pruning of the pmem copies; commit and filesystem
 * snapshots (the writable layer is an ext4 image, not a host directory).
 */
import { constants as fsConstants, statSync } from 'node:fs';
import { chmod, copyFile, mkdir, open, readFile, rename, rm, stat, truncate, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { execa } from 'execa';
import type { AgentClient } from '../../agent/client.js';
import { DsecError, failedPrecondition, internal, invalidArgument } from '../../errors.js';
import type { Backend } from '../../model/backend.js';
import { DEFAULT_FILESYSTEM, resolveFilesystem, type ResolvedFilesystem } from '../../model/filesystem.js';
import { effectiveLayers } from '../../model/image.js';
import type { DefenceStatus, SandboxRecord } from '../../model/sandbox.js';
import { MACHINE_DISK_FILE, type MachineRestore, type MachineSnapshot } from '../../model/snapshot.js';
import type { BackendCapabilities } from '../types.js';
import { VmmDriver, type BootContext, type VmmDriverDeps } from '../vmm/driver.js';
import { copyDisk, isFile } from '../vmm/host.js';
import { GUEST_MODULES } from '../vmm/initramfs.js';
import type { Platform } from '../vmm/platform.js';
import { VM_MIN_MEMORY_BYTES, vmPaths } from '../vmm/qemu.js';
import { GuestOp } from '../vmm/vmux.js';
import { buildGuestConfinement, readGuestConfinement } from './confine.js';
import { MICROVM_MAX_LAYERS, PMEM_ALIGN_BYTES, alignUp, pmemLayout, qemuArgs, type PmemLayer, type PmemLayout } from './qemu.js';
import {
  SNAPSHOT_SWAP_FILE, directIoWorks, prepareSwapFile, readGuestReclaimStats, startGuestReclaim, swapSizeBytes, writeGuestReclaimRecord,
  type GuestReclaimRecord,
} from './reclaim.js';
import { MachineSnapshots } from './snapshot.js';

/** Dependencies of the microvm driver: the VM drivers' plus the filesystem defaults of guest confinement. */
export interface MicrovmDriverDeps extends VmmDriverDeps {
  /**
   * `[filesystem]` of the config: the filesystem options of a sandbox row that has none
   * (as for containers); default DEFAULT_FILESYSTEM.
   */
  filesystemDefaults?: ResolvedFilesystem;
}

/** The microvm backend; see the module comment. */
export class MicrovmDriver extends VmmDriver {
  readonly backend = 'microvm' as const;
  readonly backends: readonly Backend[] = ['microvm'];
  protected readonly machineName = 'microVM';
  /** Per VM: the persistent-memory layout of its current boot (null: layers are disks). */
  private readonly pmemLayouts = new Map<string, PmemLayout | null>();
  /** Machine snapshots: capture, check, restore. */
  private readonly machines: MachineSnapshots;

  constructor(protected override readonly d: MicrovmDriverDeps) {
    super(d);
    this.machines = new MachineSnapshots({
      dir: (id) => this.dir(id), writableDisk: (id) => this.writableDisk(id), confinementFile: (id) => this.confinementFile(id),
      reclaimFile: (id) => this.reclaimFile(id), resume: (sb) => this.resume(sb), qmp: this.qmp, agents: this.agents, platform: this.platform,
      vm: d.vm, log: d.log,
    });
  }

  capabilities(_backend: Backend = 'microvm'): BackendCapabilities {
    const missing = this.missing();
    return {
      id: 'dsec.driver.microvm.v1', backend: 'microvm', available: missing === null, reason: missing, isolation: 'vm', pause: true,
      snapshot: 'machine', networkModes: ['none'], io: false, storeDisk: false, pool: false, console: false,
    };
  }

  /**
   * Checks a create request against what a microVM can be, before anything is made.
   * @throws DsecError FailedPrecondition (no QEMU or kernel: names the fix), InvalidArgument
   *   (memory below VM_MIN_MEMORY_BYTES, more layers than virtio-mmio slots).
   */
  protected override check(sb: SandboxRecord): void {
    const missing = this.missing();
    if (missing) throw failedPrecondition(`cannot create microvm sandbox ${sb.id}: ${missing}`);
    if (sb.memoryBytes < VM_MIN_MEMORY_BYTES) {
      throw invalidArgument(`a microvm needs at least ${VM_MIN_MEMORY_BYTES} bytes of memory (the guest kernel and initramfs); memory_bytes is ${sb.memoryBytes}`);
    }
    const n = effectiveLayers(sb.imageLayers).length;
    if (n > MICROVM_MAX_LAYERS) throw invalidArgument(`image ${sb.image} has ${n} layers; a microvm attaches at most ${MICROVM_MAX_LAYERS} (one virtio-mmio slot each)`);
  }

  /** The writable disk (fresh, or the snapshot's copy: a reflink where the filesystem can) and the guest's swap disk. */
  protected override async makeDisks(sb: SandboxRecord, restore?: MachineRestore): Promise<void> {
    if (restore) await copyDisk(path.join(restore.dir, MACHINE_DISK_FILE), this.writableDisk(sb.id));
    else await this.makeDisk(sb);
    await this.prepareSwap(sb, restore ? path.join(restore.dir, SNAPSHOT_SWAP_FILE) : null);
  }

  /**
   * A restore must repeat the captured machine: the same RAM size, vCPU count and layer
   * disks (the migration stream holds their state, not their configuration).
   * @throws DsecError InvalidArgument naming the difference.
   */
  protected override checkRestore(sb: SandboxRecord, r: MachineRestore): void {
    const m = r.machine;
    const guestMiB = Math.ceil(sb.memoryBytes / (1024 * 1024));
    const vcpus = Math.max(1, Math.ceil(sb.cpus));
    if (guestMiB !== m.memoryMiB) throw invalidArgument(`snapshot ${r.snapshotId} holds a machine with ${m.memoryMiB} MiB of RAM; a restore cannot change it (memory_bytes ${sb.memoryBytes} asks for ${guestMiB} MiB): leave memory_bytes out`);
    if (vcpus !== m.vcpus) throw invalidArgument(`snapshot ${r.snapshotId} holds a machine with ${m.vcpus} vCPU(s); a restore cannot change that (cpus ${sb.cpus} means ${vcpus}): ask for cpus in (${m.vcpus - 1}, ${m.vcpus}] or leave cpus out`);
    const layers = this.attachedLayers(sb);
    if (layers.join(',') !== m.layers.join(',')) throw invalidArgument(`snapshot ${r.snapshotId} was taken with layer disks ${m.layers.join(',')}; the restore would attach ${layers.join(',')}`);
  }

  /**
   * The writable disk: a sparse raw file formatted ext4 by dsecd (mkfs.ext4 takes ~15 ms
   * natively, where the guest would run it under TCG, and the image needs no mkfs of its
   * own). Lazy inode tables and journal, no reserved blocks; only blocks the guest writes
   * take host disk. Made once at create; start reuses it (the writable layer).
   */
  private async makeDisk(sb: SandboxRecord): Promise<void> {
    const disk = vmPaths(this.dir(sb.id)).disk;
    const bytes = sb.diskBytes ?? this.d.vm.diskBytes;
    const tmp = `${disk}.tmp`;
    const fh = await open(tmp, 'w', 0o600);
    try {
      await fh.truncate(bytes);
    } finally {
      await fh.close();
    }
    const r = await execa('mkfs.ext4', ['-q', '-F', '-m', '0', '-L', 'dsec-rw', '-E', 'lazy_itable_init=1,lazy_journal_init=1,nodiscard', tmp], { reject: false });
    if (r.exitCode !== 0) {
      await rm(tmp, { force: true });
      throw internal(`sandbox ${sb.id}: mkfs.ext4 of its writable disk failed: ${String(r.stderr).trim() || `exit ${r.exitCode}`} (is e2fsprogs installed?)`);
    }
    await rename(tmp, disk);
  }

  protected override writableDiskKind(id: string): string {
    return `ext4 disk ${vmPaths(this.dir(id)).disk}`;
  }

  /** A snapshot's machine resumes on the platform it was taken with (./snapshot.ts restorePlatform). */
  protected override platformFor(restore?: MachineRestore): Promise<Platform> {
    return restore ? this.machines.restorePlatform(restore) : this.platform.get();
  }

  protected override async layerFiles(sb: SandboxRecord, plat: Platform, digests: string[], blobs: string[], guestMiB: number): Promise<string[]> {
    const pmem = await this.pmemFor(sb, plat, digests, blobs, guestMiB);
    this.pmemLayouts.set(sb.id, pmem);
    // With pmem the VMM maps the aligned copies, never the blobs.
    return pmem ? pmem.nodes.flatMap((n) => (n.file ? [n.file] : [])) : blobs;
  }

  protected override bootRecords(id: string): string[] {
    return [this.confinementFile(id), this.reclaimFile(id)];
  }

  protected override stopRecords(id: string): string[] {
    return [this.confinementFile(id)];
  }

  protected override forget(id: string): void {
    super.forget(id);
    this.pmemLayouts.delete(id);
  }

  /** Captures the whole machine of a running or paused microVM into `dir` (./snapshot.ts). */
  snapshotMachine(sb: SandboxRecord, dir: string): Promise<MachineSnapshot> {
    return this.machines.capture(sb, dir);
  }

  /** Checks a machine snapshot can be restored here (./snapshot.ts). */
  checkMachine(r: MachineRestore): Promise<void> {
    return this.machines.check(r);
  }

  /**
   * The persistent-memory layout of one boot ({@link pmemLayout}), or null when its layers
   * go in as disks: `[vm] pmem = false`, no layers, or RAM
   * plus layers beyond what microvm maps below 4 GiB. Makes the aligned layer copies it
   * needs ({@link pmemCopy}).
   */
  private async pmemFor(sb: SandboxRecord, plat: Platform, digests: string[], blobs: string[], guestMiB: number): Promise<PmemLayout | null> {
    if (!this.d.vm.pmem || digests.length === 0) return null;
    const sizes = await Promise.all(blobs.map(async (b) => (await stat(b)).size));
    const fits = pmemLayout(guestMiB, sizes.map((n) => ({ file: '', sizeBytes: pmemFileBytes(n) })), plat.initramfs.sizeBytes);
    if (!fits) {
      this.d.log.info({ id: sb.id, guestMiB, layerBytes: sizes }, 'guest RAM plus layers exceed what microvm maps below 4 GiB: layers go in as disks');
      return null;
    }
    const files: PmemLayer[] = [];
    for (let i = 0; i < digests.length; i++) files.push({ file: await this.pmemCopy(digests[i], blobs[i], sizes[i]), sizeBytes: pmemFileBytes(sizes[i]) });
    return pmemLayout(guestMiB, files, plat.initramfs.sizeBytes);
  }

  /**
   * The 2 MiB-aligned copy of one layer blob that VMs map as persistent memory:
   * `<root>/vm/pmem/<digest hex>.img`, the blob's bytes then zeros up to
   * {@link pmemFileBytes} (sparse), mode 0644 (an unprivileged VMM opens it; it holds an
   * image layer, nothing secret). Made once per digest (a reflink where the filesystem
   * can, else a copy; written under a temp name and renamed) and shared by every VM of the
   * layer, so the host page cache holds its bytes once.
   * @throws Error from the filesystem (no space, …).
   */
  private pmemCopy(digest: string, blob: string, blobBytes: number): Promise<string> {
    const file = path.join(this.d.root, 'vm', 'pmem', `${digest.replace(/^sha256:/, '')}.img`);
    let p = pmemInflight.get(file);
    if (!p) {
      p = (async () => {
        const want = pmemFileBytes(blobBytes);
        const have = await stat(file).catch(() => null);
        if (have?.isFile() && have.size === want) return file;
        await mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
        const tmp = `${file}.tmp${process.pid}`;
        await copyFile(blob, tmp, fsConstants.COPYFILE_FICLONE);
        await truncate(tmp, want);
        await chmod(tmp, 0o644);
        await rename(tmp, file);
        this.d.log.info({ digest, file, bytes: want }, 'made the aligned pmem copy of a layer');
        return file;
      })().finally(() => pmemInflight.delete(file));
      pmemInflight.set(file, p);
    }
    return p;
  }

  /** Kernel modules of the guest's initramfs (zram swap adds zram). */
  protected override guestModules(): readonly string[] {
    return this.zramBytes(1) > 0 ? [...GUEST_MODULES, 'zram'] : GUEST_MODULES;
  }

  /**
   * The guest's swap disk for this boot (reclaim.ts prepareSwapFile): made
   * per `[vm.reclaim]`, or the snapshot's copy for a restore (`restoreFrom`).
   */
  protected override async prepareSwap(sb: SandboxRecord, restoreFrom: string | null): Promise<void> {
    await prepareSwapFile(vmPaths(this.dir(sb.id)).swap, this.d.vm.reclaim, sb.memoryBytes, restoreFrom, copyDisk);
  }

  /** Bytes of the guest's zram swap device (`[vm.reclaim] swap = "zram"`), 0 for none; `guestBytes` is the guest's RAM. */
  private zramBytes(guestBytes: number): number {
    const c = this.d.vm.reclaim;
    return c.mode === 'on' && c.swap === 'zram' ? swapSizeBytes(c, guestBytes) : 0;
  }

  /** `<sandbox dir>/guest-reclaim.json`: the guest reclaim of the running boot (reclaim.ts GuestReclaimRecord). */
  reclaimFile(id: string): string {
    return path.join(this.dir(id), 'guest-reclaim.json');
  }

  /** Host path of the sandbox's writable disk: the ext4 `disk.raw`. */
  override writableDisk(id: string): string {
    return vmPaths(this.dir(id)).disk;
  }

  /** Layer digests attached to the VM: every effective layer. */
  protected override attachedLayers(sb: SandboxRecord): string[] {
    return effectiveLayers(sb.imageLayers);
  }

  /** The QEMU argument vector of one boot ({@link qemuArgs}). */
  protected override async qemuCommand(sb: SandboxRecord, plat: Platform, layers: string[], guestMiB: number): Promise<string[]> {
    const swap = vmPaths(this.dir(sb.id)).swap;
    return qemuArgs({
      id: sb.id, dir: this.dir(sb.id), kernel: plat.kernel, initrd: plat.initramfs.path, accel: plat.accel,
      vcpus: Math.max(1, Math.ceil(sb.cpus)), memoryMiB: guestMiB, layers, tscKhz: plat.tscKhz, tcgTbMiB: this.d.vm.tcgTbMiB,
      pmem: this.pmemLayouts.get(sb.id) ?? null, balloon: this.d.vm.balloon,
      swapDisk: isFile(swap) ? { file: swap, direct: directIoWorks(swap) } : null, zramBytes: this.zramBytes(guestMiB * 1024 * 1024),
    });
  }

  /**
   * The boot steps after QMP answered, each raced by `ctx.step` against QEMU's exit and
   * the boot deadline: a restore loads the snapshot's machine (./snapshot.ts `incoming`);
   * a boot connects to the guest agent, confines the guest's commands and starts its
   * memory reclaim.
   */
  protected override async bootGuest(sb: SandboxRecord, ctx: BootContext, restore?: MachineRestore): Promise<void> {
    if (restore) return this.machines.incoming(sb, ctx, restore);
    const { session, client } = await this.connectGuest(sb, ctx);
    await ctx.step(this.confineGuest(sb, client, session));
    await ctx.step(this.startReclaim(sb, session));
  }

  /**
   * Starts the guest's DAMON reclaim scheme when `[vm.reclaim] mode = "on"` (reclaim.ts) and
   * records the outcome in {@link reclaimFile}; a guest that cannot run it (no DAMON in
   * its kernel) boots as usual, the record and the log say why.
   */
  private async startReclaim(sb: SandboxRecord, session: Parameters<typeof startGuestReclaim>[0]): Promise<void> {
    const c = this.d.vm.reclaim;
    await rm(this.reclaimFile(sb.id), { force: true });
    if (c.mode !== 'on') return;
    const swapFile = vmPaths(this.dir(sb.id)).swap;
    const swap: GuestReclaimRecord['swap'] = isFile(swapFile) ? { kind: 'disk', bytes: statSync(swapFile).size }
      : c.swap === 'zram' ? { kind: 'zram', bytes: this.zramBytes(sb.memoryBytes) } : { kind: 'none', bytes: 0 };
    const rec = await startGuestReclaim(session, c, swap);
    await writeGuestReclaimRecord(this.reclaimFile(sb.id), rec);
    if (rec.started) this.d.log.info({ id: sb.id, minAgeMs: c.minAgeMs, swap }, 'guest reclaim started');
    else this.d.log.warn({ id: sb.id, reason: rec.reason }, 'guest reclaim not started');
  }

  /** `<sandbox dir>/guest-confinement.json`: what the running guest's agent applied (confine.ts). */
  confinementFile(id: string): string {
    return path.join(this.dir(id), 'guest-confinement.json');
  }

  /** The filesystem options in force for `sb` (resolved at create; older rows: now), as for containers. */
  private filesystemOf(sb: SandboxRecord): ResolvedFilesystem {
    return resolveFilesystem(sb.filesystem, sb.imageConfig.security, this.d.filesystemDefaults ?? DEFAULT_FILESYSTEM);
  }

  /**
   * Plans and sends the confinement of the guest's commands (confine.ts), then records it.
   * The guest agent refuses every exec until it has applied this, so a failure here
   * fails the boot. @throws DsecError FailedPrecondition (options the image cannot
   * honour, no syscall table), Internal (the agent refused: errno).
   */
  private async confineGuest(sb: SandboxRecord, client: AgentClient, session: { op: (op: GuestOp, arg?: Buffer, timeoutMs?: number) => Promise<number> }): Promise<void> {
    let c;
    try {
      c = await buildGuestConfinement({
        fs: this.filesystemOf(sb), imageSeccomp: sb.imageConfig.security?.seccomp ?? undefined, sandboxSeccomp: sb.seccomp ?? undefined,
      }, client);
    } catch (e) {
      if (e instanceof DsecError) throw new DsecError(e.kind, `sandbox ${sb.id}: ${e.message}`, { cause: e });
      throw e;
    }
    const abi = await session.op(GuestOp.CONFINE, c.payload, 60_000);
    const rec = c.record(abi);
    await writeFile(this.confinementFile(sb.id), JSON.stringify(rec), { mode: 0o600 });
    this.d.log.info({ id: sb.id, binds: rec.plan.binds.length, rules: rec.seccomp.rules, landlockAbi: abi }, 'guest commands confined');
  }

  /**
   * The guest reclaim scheme's stats, read from the guest agent (RECLAIM_STATS), also
   * written into {@link reclaimFile}; null when this boot runs no scheme.
   */
  protected override async guestReclaim(sb: SandboxRecord): Promise<GuestReclaimRecord['stats']> {
    let rec: GuestReclaimRecord;
    try {
      rec = JSON.parse(await readFile(this.reclaimFile(sb.id), 'utf8')) as GuestReclaimRecord;
    } catch {
      return null;
    }
    if (!rec.started) return null;
    const s = await this.endpoint(sb.id).session().catch(() => null);
    const stats = s ? await readGuestReclaimStats(s) : null;
    if (stats) await writeGuestReclaimRecord(this.reclaimFile(sb.id), { ...rec, stats, at: Date.now() }).catch(() => {});
    return stats;
  }

  /**
   * The in-guest defences of `sb` (readonly_paths, capabilities, no_new_privileges,
   * seccomp, landlock), from the record the current boot wrote after the guest agent
   * applied them (confine.ts); nothing is taken from the request.
   */
  protected override guestDefences(sb: SandboxRecord): Record<string, DefenceStatus> {
    const names = ['readonly_paths', 'capabilities', 'no_new_privileges', 'seccomp', 'landlock'] as const;
    const all = (d: DefenceStatus) => Object.fromEntries(names.map((n) => [n, d])) as Record<string, DefenceStatus>;
    const rec = sb.state === 'running' || sb.state === 'paused' ? readGuestConfinement(this.confinementFile(sb.id)) : null;
    const fs = this.filesystemOf(sb);
    if (!rec) return all({ enforced: false, detail: sb.state === 'running' || sb.state === 'paused' ? 'no confinement record for the running guest (it was not applied at this boot)' : `sandbox is ${sb.state}; applied by the guest agent at its next boot` });
    const rw = rec.plan.binds.filter((b) => !b.readonly).map((b) => b.path);
    const ro = rec.plan.binds.filter((b) => b.readonly).map((b) => b.path);
    const lacking = ['CAP_SYS_ADMIN', 'CAP_SYS_PTRACE', 'CAP_NET_ADMIN', 'CAP_SYS_MODULE', 'CAP_SYS_RAWIO', 'CAP_SYS_BOOT', 'CAP_SYS_TIME', 'CAP_BPF'].filter((c) => !rec.caps.includes(c));
    return {
      readonly_paths: rec.plan.readonlyRoot
        ? { enforced: true, detail: `in the guest: root mount read-only (readonly_paths ${fs.readonly_paths.join(' ')}); read-write binds: ${rw.join(' ') || 'nothing'}${ro.length ? `; read-only below those: ${ro.join(' ')}` : ''}` }
        : { enforced: false, detail: 'off for this sandbox (readonly_paths []): the guest root is read-write' },
      capabilities: { enforced: true, detail: `every guest command: bounding/effective/permitted set ${rec.caps.length} capabilities (CapEff ${rec.capMaskHex}); without ${lacking.join(', ')}; the guest agent itself keeps all` },
      no_new_privileges: { enforced: true, detail: 'set on every guest command' },
      seccomp: { enforced: true, detail: `every guest command: ${rec.seccomp.rules} x86-64 rules from the profile and overrides, EPERM for ${rec.seccomp.denied.length} syscalls (${rec.seccomp.denied.slice(0, 12).join(', ')}${rec.seccomp.denied.length > 12 ? ', ...' : ''}), by argument: ${rec.seccomp.conditional.join(', ') || 'none'}; other ABIs (i386, x32) kill the process; denials not counted` },
      landlock: !rec.landlock.asked
        ? { enforced: false, detail: 'off for this sandbox (filesystem.landlock false)' }
        : rec.landlock.abi > 0
          ? { enforced: true, detail: `Landlock ABI ${rec.landlock.abi} on every guest command: read and execute everywhere, every right on ${rec.plan.writable.length} writable path(s), file writes and terminal ioctls only under /dev` }
          : { enforced: false, detail: 'asked for, but the guest kernel has no Landlock (not in its lsm= list): guest commands run without it' },
    };
  }

}

/** Aligned pmem copies being made, by file (one copy per digest at a time). */
const pmemInflight = new Map<string, Promise<string>>();

/** Size of a layer's pmem copy for a blob of `blobBytes`: rounded up to 2 MiB, plus the 2 MiB reserved hole that keeps adjacent layers apart (qemu.ts pmemLayout). */
export function pmemFileBytes(blobBytes: number): number {
  return alignUp(Math.max(1, blobBytes), PMEM_ALIGN_BYTES) + PMEM_ALIGN_BYTES;
}
