/**
 * The `microvm` backend: one QEMU `-M microvm` VM per sandbox, booting the guest kernel
 * with dsec's initramfs (initramfs.ts), the image's EROFS layers (DAX persistent memory,
 * or read-only virtio-blk disks) under an overlay inside the guest, the writable layer on a per-VM ext4 disk
 * (`disk.raw`, sparse), and the same agent as PID 1 of the guest's root, reached through a
 * stream multiplexer over one virtio-serial port (vmux.ts, native/agent/vmux.c).
 *
 * Boot path (create/start): cgroup with the sandbox's limits → `dsec-vmm-launch` joins it
 * and execs QEMU (detached: QEMU outlives dsecd) → QMP answers → the mux handshake with
 * the guest agent (retried while the guest boots) → AgentClient HELLO. Any failure within
 * the boot timeout kills QEMU by pid and reports the console log's tail.
 *
 * State that survives a dsecd restart: QEMU itself (pid + /proc starttime in the store,
 * its command line naming this sandbox dir), its sockets and the disk. `adopt` reconnects
 * QMP and rebinds agent.sock; the next agent connection opens a new mux session, and the
 * guest drops the previous dsecd's streams (their execs end as after a lost connection).
 *
 * Inside the guest, every command is confined like a container process (confine.ts: the
 * filesystem plan as read-only mounts, Docker's capability set, no_new_privs, the seccomp
 * profile, Landlock), sent by {@link MicrovmDriver.bootGuest} at every boot before any
 * command can run; the vm tier confines nothing inside its guest.
 *
 * The VMM is confined by the launcher ({@link MicrovmDriver.confinement}: a mount namespace
 * holding only what QEMU needs, the sandbox's own host uid, dsec's seccomp filter below
 * QEMU's `-sandbox`; docs/SECURITY.md "VMM confinement"). The vm tier (daemon/drivers/vm)
 * extends this driver through its protected hooks (qemuCommand, makeDisk, bootGuest, ...).
 *
 * Layers go in as DAX persistent memory backed by one shared, 2 MiB-aligned copy per
 * layer digest (`[vm] pmem`; {@link MicrovmDriver.pmemFor}, qemu.ts pmemLayout), or as
 * read-only virtio-blk disks; a virtio-balloon with free-page reporting (`[vm] balloon`)
 * returns the pages the guest frees.
 *
 * Machine snapshots ({@link MicrovmDriver.snapshotMachine}): the VM is stopped (QMP
 * `stop`, which drains and flushes its disks), its writable disk copied (a reflink where
 * the filesystem has them) and its RAM and device state streamed by QMP `migrate` to a
 * Unix socket dsecd listens on in the sandbox dir (the only place the confined VMM can
 * reach; `exec:` migration would need a shell and a fork, which the VMM's mount
 * namespace and `-sandbox spawn=deny` refuse, and `fd:` would need SCM_RIGHTS, which
 * Node's sockets cannot send); then it continues. A restore boots a new QEMU with the
 * machine's recorded configuration and `-incoming defer`, on its own copy of the disk,
 * and feeds it the stream through `migrate-incoming` on a socket in its own dir; the
 * guest resumes where it stopped and dsecd's new mux session takes over the agent port.
 *
 * Not built yet: pruning of the pmem copies. `withWritableLayer` (commit, filesystem
 * snapshots) answers FailedPrecondition: the writable layer is an ext4 image, not a
 * host directory.
 */
import { accessSync, constants as fsConstants, createReadStream, createWriteStream, readFileSync, readlinkSync, statSync } from 'node:fs';
import { createHash, randomBytes } from 'node:crypto';
import { chmod, chown, copyFile, mkdir, open, readFile, readdir, rename, rm, stat, truncate, writeFile } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ChildProcess } from 'node:child_process';
import { execa } from 'execa';
import type { Logger } from 'pino';
import type { VmConfig } from '../../config.js';
import type { CgroupManager } from '../../host/cgroups/index.js';
import { procStartTime } from '../../host/proc.js';
import { AgentClient, type AgentExecHandle } from '../../agent/client.js';
import {
  DsecError, deadlineExceeded, failedPrecondition, internal, invalidArgument, isDsecError, resourceExhausted, unavailable,
} from '../../errors.js';
import type { StepObserver } from '../../model/steps.js';
import type { Backend } from '../../model/backend.js';
import type { BackendCapabilities, LiveUpdate, DriverExecHandlers, DriverExecRequest, DriverExecResult, DriverStartExecRequest, InitInfo, OrphanReport, ReclaimReport, SandboxDriver, SandboxStats } from '../types.js';
import { hostHasSwap } from '../../host/proc.js';
import { CPU_PERIOD_US, BATCH_CPU_SHARES, cpuQuotaUs } from '../cgroup-limits.js';
import { removeSandboxDir } from '../../image/rootfs.js';
import { GUEST_MODULES, buildInitramfs, type Initramfs } from './initramfs.js';
import { extractPvhKernel, kernelRelease } from './kmod.js';
import { QmpClient } from './qmp.js';
import {
  MICROVM_MAX_LAYERS, MICROVM_MIN_MEMORY_BYTES, hostTscKhz, isVmmOf, probeKvmCached, cachedKvmVerdict, qemuArgs, qemuRuntimePaths, spawnVmm, tailFile, vmPaths,
  vmmOfDir, vmmOverheadBytes, pmemLayout, alignUp, PMEM_ALIGN_BYTES, type Accel, type KvmVerdict, type VmmConfinement, type PmemLayer, type PmemLayout,
} from './qemu.js';
import { VmEndpoint } from './endpoint.js';
import { GuestOp } from './vmux.js';
import { buildGuestConfinement, readGuestConfinement } from './confine.js';
import {
  SNAPSHOT_SWAP_FILE, directIoWorks, prepareSwapFile, readGuestReclaimStats, snapshotSwapFile, startGuestReclaim, swapSizeBytes,
  writeGuestReclaimRecord, type GuestReclaimRecord,
} from './reclaim.js';
import { refuseAfterClose, shuttingDown } from '../shutdown.js';
import type { SandboxRecord, DefenceStatus } from '../../model/sandbox.js';
import { type MachineRestore, type MachineSnapshot, MACHINE_DISK_FILE, MACHINE_STATE_FILE } from '../../model/snapshot.js';
import { effectiveLayers } from '../../model/image.js';
import { DEFAULT_FILESYSTEM, resolveFilesystem, type ResolvedFilesystem } from '../../model/filesystem.js';

/** How long stop waits for QEMU to exit after `quit` before SIGKILL: 5 s. */
const QUIT_WAIT_MS = 5_000;
/** How often stop polls the guest's process count during a grace period: 100 ms (one mux round trip is ~2 ms). */
const GRACE_POLL_MS = 100;
/** How long a guest `sync` may take at stop: 30 s (it flushes the guest page cache to the disk file). */
const SYNC_TIMEOUT_MS = 30_000;
/**
 * How long the migration of a machine snapshot may take: 10 min. A stopped VM's state
 * streams at ~100 MB/s (measured under TCG on a busy 2-core host: docs/ARCHITECTURE.md,
 * "The microvm tier", microVM snapshots), so this only ends a migration that hangs.
 */
const MIGRATE_TIMEOUT_MS = 600_000;
/** Host random bytes a restore mixes into the guest's pool: 64 (512 bits, twice the CRNG's 256-bit key). */
const RESEED_BYTES = 64;
/** How long a boot step that lost a socket waits for QEMU's exit to be reported: 1 s (QEMU exits within ms of closing its sockets). */
const EXIT_GRACE_MS = 1_000;
/** How often a snapshot polls `query-migrate`, and a restore `query-status`: 20 ms (one QMP round trip is well under 1 ms). */
const MIGRATE_POLL_MS = 20;
/**
 * QEMU's `max-bandwidth` for a snapshot's migration: 1 TiB/s, i.e. unlimited. QEMU's
 * default (32 MiB/s) throttles live migration over a network; a stopped VM streaming to
 * a local file has no reason to be throttled.
 */
const MIGRATE_MAX_BANDWIDTH = 2 ** 40;

/** The machine one QEMU was started with (`machine.json` in its sandbox dir; see {@link MachineSnapshot} for the fields). */
type MachineSpec = Pick<MachineSnapshot, 'accel' | 'memoryMiB' | 'vcpus' | 'kernel' | 'initrd' | 'tscKhz' | 'layers'>;

/** Dependencies of the microvm driver, built once by the daemon. */
export interface MicrovmDriverDeps {
  /** Instance root: sandbox dirs live in `<root>/sandboxes/<id>`, built initramfs archives in `<root>/vm`. */
  root: string;
  cgroups: CgroupManager;
  /** The verified host path of a layer blob to attach (LayerStore.prepareForMount, or the blob cache). @throws DsecError NotFound / FailedPrecondition. */
  blobPath: (digest: string) => Promise<string>;
  /** The installed static agent (goes into the initramfs). */
  agentBinary: string;
  /** The static `dsec-vmm-launch` binary. */
  launcher: string;
  vm: VmConfig;
  log: Logger;
  /**
   * `[filesystem]` of the config: the filesystem options of a sandbox row that has none
   * (as for containers); default {@link DEFAULT_FILESYSTEM}.
   */
  filesystemDefaults?: ResolvedFilesystem;
}

/** What one boot's steps get (see {@link MicrovmDriver.bootGuest}). */
export interface BootContext {
  /** Races a promise against QEMU's exit and the boot deadline; throws the boot error. */
  step: <T>(p: Promise<T>) => Promise<T>;
  /** Boot deadline, ms since the epoch. */
  deadline: number;
  qmp: QmpClient;
  ep: VmEndpoint;
}

/** What every microVM of this dsecd boots with: computed once (initramfs build, accelerator verdict, TSC rate). */
export interface Platform {
  initramfs: Initramfs;
  /** What QEMU boots: the uncompressed vmlinux (PVH entry) extracted from [vm] kernel, or that bzImage itself. */
  kernel: string;
  release: string | null;
  accel: Accel;
  kvm: KvmVerdict;
  tscKhz: number | null;
}

/** The microvm backend; see the module comment. */
export class MicrovmDriver implements SandboxDriver {
  readonly backend: 'microvm' | 'vm' = 'microvm';
  readonly backends: readonly Backend[] = ['microvm'];
  private readonly endpoints = new Map<string, VmEndpoint>();
  private readonly agents = new Map<string, Promise<AgentClient>>();
  /** Set by {@link close}: no connection to a VM is made any more. */
  private closed = false;
  private readonly qmps = new Map<string, Promise<QmpClient>>();
  /** Layer digests each live microVM has attached (the blob cache must not evict them). */
  private readonly blobs = new Map<string, string[]>();
  /** Per VM: the persistent-memory layout of its current boot (null: layers are disks). */
  protected readonly pmemLayouts = new Map<string, PmemLayout | null>();
  protected platformP: Promise<Platform> | null = null;
  /**
   * Per VM: whether its vCPUs should run: what the last successful `stop`/`cont` asked
   * for (a failed one keeps the state before it, which is what the store still records).
   * After QMP stopped answering, a command may still be executed later (QEMU reads it
   * once it answers again); {@link resync} then makes the VM's run state match this.
   */
  private readonly wantRunning = new Map<string, boolean>();
  private readonly resyncing = new Set<string>();
  protected qemuPath: string | null = null;

  constructor(protected readonly d: MicrovmDriverDeps) {}

  /** `<root>/sandboxes/<id>`. */
  dir(id: string): string {
    return path.join(this.d.root, 'sandboxes', id);
  }

  /**
   * Finds QEMU and the kernel. The platform work (the initramfs build and, with
   * `accel = "auto"`, the KVM probe boot, whose verdict is kept for the host boot) waits
   * for the first microvm create: a dsecd that never runs a microVM never spends a
   * probe boot's CPU on it. Never throws: what is missing is reported by
   * {@link capabilities} and by create.
   */
  async init(): Promise<void> {
    this.qemuPath = findExecutable(this.d.vm.qemu);
  }

  capabilities(_backend: Backend = 'microvm'): BackendCapabilities {
    const missing = this.missing();
    return {
      id: 'dsec.driver.microvm.v1', backend: 'microvm', available: missing === null, reason: missing, isolation: 'vm', pause: true,
      snapshot: 'machine', networkModes: ['none'], io: false, storeDisk: false, pool: false, console: false,
    };
  }

  /** What the host lacks for microVMs, with the fix; null when nothing. */
  protected missing(): string | null {
    if (!this.qemuPath) return `QEMU (${this.d.vm.qemu}) is not installed: apt-get install qemu-system-x86 qemu-utils, or set [vm] qemu`;
    // Synchronous on purpose: capabilities() is synchronous, and this is one stat.
    if (!isFile(this.d.vm.kernel)) {
      return `the guest kernel ${this.d.vm.kernel} is missing: run \`bash scripts/guest-kernel.sh\` (fetches Debian bookworm's 6.12 kernel package), or set [vm] kernel and [vm] modules`;
    }
    return null;
  }

  /**
   * The accelerator verdict for `dsec host info`: which one microVMs use and why. Waits
   * for the probe when it is still running.
   */
  async accelInfo(): Promise<{ available: boolean; reason: string }> {
    if (!this.capabilities().available) return { available: false, reason: `microvm backend unavailable: ${this.missing()}` };
    if (!this.platformP) {
      // Not set up yet: report a verdict of this host boot if there is one, never start a probe from host info.
      if (this.d.vm.accel !== 'auto') return { available: this.d.vm.accel === 'kvm', reason: `[vm] accel = "${this.d.vm.accel}"` };
      const cached = await cachedKvmVerdict({ qemu: this.qemuPath!, kernel: this.d.vm.kernel });
      return cached ? { available: cached.usable, reason: `${cached.reason} (probed earlier this boot)` }
        : { available: false, reason: 'not probed yet: the first microvm create probes KVM (a boot of up to [vm] kvm_probe_timeout_s), TCG until then' };
    }
    try {
      const p = await this.platform();
      return { available: p.accel === 'kvm', reason: p.kvm.reason };
    } catch (e) {
      return { available: false, reason: `microvm platform setup failed: ${(e as Error).message}` };
    }
  }

  /** Layer digests attached by live microVMs (the blob cache must not evict their files). */
  pinnedLayers(): Set<string> {
    return new Set([...this.blobs.values()].flat());
  }

  /** Builds (once) what every boot needs; a failure is not cached, so fixing the host and retrying works. */
  protected platform(): Promise<Platform> {
    if (!this.platformP) {
      const p = (async (): Promise<Platform> => {
        const missing = this.missing();
        if (missing) throw failedPrecondition(missing);
        const bz = await readFile(this.d.vm.kernel);
        const release = kernelRelease(bz);
        const kernel = await this.bootKernel(bz);
        const initramfs = await buildInitramfs({
          busybox: this.d.vm.busybox, agent: this.d.agentBinary, modulesDir: this.d.vm.modules, cacheDir: path.join(this.d.root, 'vm'), modules: this.guestModules(),
        }, release);
        if (initramfs.built) this.d.log.info({ path: initramfs.path, bytes: initramfs.sizeBytes, modules: initramfs.modules }, 'built the microvm initramfs');
        let kvm: KvmVerdict;
        if (this.d.vm.accel === 'tcg') kvm = { usable: false, reason: 'TCG forced by [vm] accel = "tcg"' };
        else if (this.d.vm.accel === 'kvm') kvm = { usable: true, reason: 'KVM forced by [vm] accel = "kvm" (no probe)' };
        else kvm = await probeKvmCached({ qemu: this.qemuPath!, kernel, initrd: initramfs.path, timeoutMs: this.d.vm.kvmProbeTimeoutMs, guestKernel: this.d.vm.kernel });
        const accel: Accel = kvm.usable ? 'kvm' : 'tcg';
        const tscKhz = accel === 'tcg' ? await hostTscKhz(this.d.launcher) : null;
        this.d.log.info({ accel, reason: kvm.reason, tscKhz, release, kernel }, 'microvm accelerator');
        return { initramfs, kernel, release, accel, kvm, tscKhz };
      })();
      this.platformP = p;
      p.catch(() => {
        if (this.platformP === p) this.platformP = null;
      });
    }
    return this.platformP;
  }

  /**
   * The kernel file QEMU boots: `<root>/vm/vmlinux-<hash of the bzImage>`, the bzImage's
   * uncompressed kernel when it has a PVH entry (kmod.ts extractPvhKernel: no
   * decompression in the guest at every boot), else the bzImage itself. Extracted once
   * per kernel and kept.
   */
  private async bootKernel(bz: Buffer): Promise<string> {
    const file = path.join(this.d.root, 'vm', `vmlinux-${createHash('sha256').update(bz).digest('hex').slice(0, 32)}`);
    if (await stat(file).catch(() => null)) {
      await chmod(file, 0o644);
      return file;
    }
    const elf = await extractPvhKernel(bz);
    if (!elf) {
      this.d.log.info({ kernel: this.d.vm.kernel }, 'guest kernel has no PVH entry (or an unknown compression): booting the bzImage, which decompresses itself at every boot');
      return this.d.vm.kernel;
    }
    await mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
    const tmp = `${file}.tmp${process.pid}`;
    // Readable by others: an unprivileged VMM opens it (docs/SECURITY.md "VMM confinement").
    await writeFile(tmp, elf, { mode: 0o644 });
    await rename(tmp, file);
    return file;
  }

  /** @throws DsecError Unavailable once {@link close} ran (dsecd is shutting down). */
  protected endpoint(id: string): VmEndpoint {
    if (this.closed) throw shuttingDown();
    let ep = this.endpoints.get(id);
    if (!ep) {
      ep = new VmEndpoint({ dir: this.dir(id), what: `sandbox ${id}`, log: this.d.log });
      this.endpoints.set(id, ep);
    }
    return ep;
  }

  /**
   * Checks a create request against what a microVM can be, before anything is made.
   * @throws DsecError FailedPrecondition (no QEMU or kernel: names the fix), InvalidArgument
   *   (memory below {@link MICROVM_MIN_MEMORY_BYTES}, more layers than virtio-mmio slots).
   */
  protected check(sb: SandboxRecord): void {
    const missing = this.missing();
    if (missing) throw failedPrecondition(`cannot create microvm sandbox ${sb.id}: ${missing}`);
    if (sb.memoryBytes < MICROVM_MIN_MEMORY_BYTES) {
      throw invalidArgument(`a microvm needs at least ${MICROVM_MIN_MEMORY_BYTES} bytes of memory (the guest kernel and initramfs); memory_bytes is ${sb.memoryBytes}`);
    }
    const n = effectiveLayers(sb.imageLayers).length;
    if (n > MICROVM_MAX_LAYERS) throw invalidArgument(`image ${sb.image} has ${n} layers; a microvm attaches at most ${MICROVM_MAX_LAYERS} (one virtio-mmio slot each)`);
  }

  async prepare(sb: SandboxRecord, steps: StepObserver, restore?: MachineRestore): Promise<void> {
    this.check(sb);
    if (restore) this.checkRestoreShape(sb, restore);
    const dir = this.dir(sb.id);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await chmod(dir, 0o700);
    if (restore) await copyDisk(path.join(restore.dir, MACHINE_DISK_FILE), this.writableDisk(sb.id));
    else await this.makeDisk(sb);
    await this.prepareSwap(sb, restore ? path.join(restore.dir, SNAPSHOT_SWAP_FILE) : null);
    steps.hit('create.after-rootfs');
  }

  /**
   * A restore must repeat the captured machine: the same RAM size, vCPU count and layer
   * disks (the migration stream holds their state, not their configuration).
   * @throws DsecError InvalidArgument naming the difference.
   */
  private checkRestoreShape(sb: SandboxRecord, r: MachineRestore): void {
    const m = r.machine;
    const guestMiB = Math.ceil(sb.memoryBytes / (1024 * 1024));
    const vcpus = Math.max(1, Math.ceil(sb.cpus));
    if (guestMiB !== m.memoryMiB) throw invalidArgument(`snapshot ${r.snapshotId} holds a machine with ${m.memoryMiB} MiB of RAM; a restore cannot change it (memory_bytes ${sb.memoryBytes} asks for ${guestMiB} MiB): leave memory_bytes out`);
    if (vcpus !== m.vcpus) throw invalidArgument(`snapshot ${r.snapshotId} holds a machine with ${m.vcpus} vCPU(s); a restore cannot change that (cpus ${sb.cpus} means ${vcpus}): ask for cpus in (${m.vcpus - 1}, ${m.vcpus}] or leave cpus out`);
    const layers = this.attachedLayers(sb);
    if (layers.join(',') !== m.layers.join(',')) throw invalidArgument(`snapshot ${r.snapshotId} was taken with layer disks ${m.layers.join(',')}; the restore would attach ${layers.join(',')}`);
  }

  async start(sb: SandboxRecord, steps: StepObserver, restore?: MachineRestore): Promise<InitInfo> {
    // A new VM boots (or resumes `restore`) on the disks prepare made; a stopped one boots again on its kept disk.
    if (sb.state === 'creating') return this.launch(sb, steps, 'create', restore);
    this.check(sb);
    if (!(await stat(this.writableDisk(sb.id)).catch(() => null))) {
      throw failedPrecondition(`sandbox ${sb.id} has no writable disk (${this.writableDisk(sb.id)}); destroy it and create a new one`);
    }
    await this.prepareSwap(sb, null);
    return this.launch(sb, steps, 'start');
  }

  /**
   * The writable disk: a sparse raw file formatted ext4 by dsecd (mkfs.ext4 takes ~15 ms
   * natively, where the guest would run it under TCG, and the image needs no mkfs of its
   * own). Lazy inode tables and journal, no reserved blocks; only blocks the guest writes
   * take host disk. Made once at create; start reuses it (the writable layer).
   */
  protected async makeDisk(sb: SandboxRecord): Promise<void> {
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

  /**
   * Starts QEMU in the sandbox's cgroup and waits until the guest agent answers (within
   * the boot timeout). On failure QEMU is killed and its cgroup removed; the error names
   * what failed with the console's tail.
   */
  private async launch(sb: SandboxRecord, steps: StepObserver, op: 'create' | 'start', restore?: MachineRestore): Promise<InitInfo> {
    const t0 = Date.now();
    const deadline = t0 + this.d.vm.bootTimeoutMs;
    const dir = this.dir(sb.id);
    const paths = vmPaths(dir);
    const plat = restore ? await this.restorePlatform(restore) : await this.platform();
    const layers: string[] = [];
    const digests = this.attachedLayers(sb);
    this.blobs.set(sb.id, digests);
    for (const dg of digests) layers.push(await this.d.blobPath(dg));
    for (const f of [paths.qmp, paths.vmux, paths.agentSock, paths.pid, paths.migrate, this.confinementFile(sb.id), this.reclaimFile(sb.id)]) await rm(f, { force: true });

    const guestMiB = Math.ceil(sb.memoryBytes / (1024 * 1024));
    const pmem = await this.pmemFor(sb, plat, digests, layers, guestMiB);
    this.pmemLayouts.set(sb.id, pmem);
    await this.d.cgroups.create(sb.id, {
      cpuQuotaUs: cpuQuotaUs(sb.cpus), cpuPeriodUs: CPU_PERIOD_US,
      cpuShares: sb.priority === 'batch' ? BATCH_CPU_SHARES : null,
      memoryBytes: guestMiB * 1024 * 1024 + vmmOverheadBytes(plat.accel, this.d.vm.tcgTbMiB),
      // QEMU's threads are its only tasks (the guest's processes are not host tasks): vCPUs,
      // the main loop, and up to 64 block I/O workers per AioContext; 256 leaves room.
      pids: Math.max(256, sb.pids),
      idle: sb.priority === 'batch',
    });
    const ep = this.endpoint(sb.id);
    await ep.listen();
    const args = [...await this.qemuCommand(sb, plat, layers, guestMiB), ...(restore ? ['-incoming', 'defer'] : [])];
    const spec: MachineSpec = {
      accel: plat.accel, memoryMiB: guestMiB, vcpus: Math.max(1, Math.ceil(sb.cpus)), kernel: plat.kernel, initrd: plat.initramfs.path,
      tscKhz: plat.tscKhz, layers: digests,
    };
    await writeFile(paths.machine, JSON.stringify(spec), { mode: 0o600 });
    // With pmem the VMM maps the aligned copies, never the blobs.
    const confine = await this.confinement(sb, plat, pmem ? pmem.nodes.flatMap((n) => (n.file ? [n.file] : [])) : layers);
    let child: ChildProcess;
    try {
      child = spawnVmm({
        launcher: this.d.launcher, qemu: this.qemuPath!, args, cgroupProcs: this.d.cgroups.procsFiles(sb.id),
        schedIdle: sb.priority === 'batch', thp: this.d.vm.thp, logFile: paths.qemuLog, ...(confine ? { confine } : {}),
      });
    } catch (e) {
      throw internal(`sandbox ${sb.id}: cannot start ${this.d.launcher}: ${(e as Error).message}`, e);
    }
    type Exit = { code: number | null; signal: string | null };
    const state: { exit: Exit | null } = { exit: null };
    const exited = new Promise<'exited'>((resolve) => {
      child.once('exit', (code, signal) => { state.exit = { code, signal }; resolve('exited'); });
      child.once('error', (e) => { state.exit = { code: -1, signal: e.message }; resolve('exited'); });
    });
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((resolve) => { timer = setTimeout(() => resolve('late'), Math.max(0, deadline - Date.now())); });
    const timeoutError = (why?: string) => this.bootError(sb, `the ${this.backend === 'vm' ? 'VM' : 'microVM'} did not boot within ${this.d.vm.bootTimeoutMs} ms${why ? ` (${why})` : ''}`, 'DeadlineExceeded', null);
    // One boot step, raced against QEMU's exit and the boot deadline.
    // A QEMU that exits while loading a snapshot's state refused that state (the log says why).
    const exitError = () => (restore
      ? this.bootError(sb, `snapshot ${restore.snapshotId} cannot be restored: QEMU could not load its machine state (${path.join(restore.dir, MACHINE_STATE_FILE)}) and exited`, 'FailedPrecondition', state.exit)
      : this.bootError(sb, 'QEMU exited during boot', null, state.exit));
    const step = async <T>(p: Promise<T>): Promise<T> => {
      const r = await Promise.race([p.then((v) => ({ v }), (e: Error) => ({ e })), exited, late]);
      if (r === 'exited') throw exitError();
      if (r === 'late') throw timeoutError();
      if ('e' in r) {
        // A lost socket is often QEMU going: give its exit a moment to be seen, so the error says why.
        if (!state.exit && isDsecError(r.e, 'Unavailable')) await Promise.race([exited, sleep(EXIT_GRACE_MS)]);
        if (state.exit) throw exitError();
        if (Date.now() >= deadline) throw timeoutError(r.e.message);
        throw r.e;
      }
      return r.v;
    };
    const pid = child.pid!;
    try {
      if (op === 'create') steps.hit('create.after-bundle');
      // QMP first (QEMU is up), then the mux session (the guest booted), then the agent.
      const qmp = await step((async () => {
        for (;;) {
          try {
            return await QmpClient.connect(paths.qmp, { timeoutMs: Math.max(1, Math.min(this.d.vm.qmpTimeoutMs, deadline - Date.now())) });
          } catch (e) {
            if (!isDsecError(e, 'Unavailable') || Date.now() >= deadline || state.exit) throw e;
            await sleep(20);
          }
        }
      })());
      this.setQmp(sb.id, qmp);
      steps.hit(op === 'create' ? 'create.after-runtime' : 'start.after-runtime');
      if (restore) await this.incoming(sb, { step, deadline, qmp, ep }, restore);
      else await this.bootGuest(sb, { step, deadline, qmp, ep });
      if (op === 'create') steps.hit('create.after-agent');
      const st = procStartTime(pid);
      if (st === null) throw this.bootError(sb, 'QEMU exited right after the guest agent answered', 'Internal', state.exit);
      this.d.log.info({ id: sb.id, ms: Date.now() - t0, accel: plat.accel, snapshot: restore?.snapshotId }, `microvm ${restore ? 'restored' : op === 'create' ? 'booted' : 'restarted'}`);
      return { pid, start: st };
    } catch (e) {
      await this.killVmm(sb.id, pid);
      await this.dropConnections(sb.id);
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * The persistent-memory layout of one boot ({@link pmemLayout}), or null when its layers
   * go in as disks: `[vm] pmem = false`, a backend other than microvm, no layers, or RAM
   * plus layers beyond what microvm maps below 4 GiB. Makes the aligned layer copies it
   * needs ({@link pmemCopy}).
   */
  protected async pmemFor(sb: SandboxRecord, plat: Platform, digests: string[], blobs: string[], guestMiB: number): Promise<PmemLayout | null> {
    if (!this.d.vm.pmem || this.backend !== 'microvm' || digests.length === 0) return null;
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
  protected pmemCopy(digest: string, blob: string, blobBytes: number): Promise<string> {
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

  /** Kernel modules of the guest's initramfs (the vm tier adds the PCI transport; zram swap adds zram). */
  protected guestModules(): readonly string[] {
    return this.zramBytes(1) > 0 ? [...GUEST_MODULES, 'zram'] : GUEST_MODULES;
  }

  /**
   * The guest's swap disk for this boot (reclaim.ts prepareSwapFile): microvm only; made
   * per `[vm.reclaim]`, or the snapshot's copy for a restore (`restoreFrom`).
   */
  protected async prepareSwap(sb: SandboxRecord, restoreFrom: string | null): Promise<void> {
    if (this.backend !== 'microvm') return;
    await prepareSwapFile(vmPaths(this.dir(sb.id)).swap, this.d.vm.reclaim, sb.memoryBytes, restoreFrom, copyDisk);
  }

  /** Bytes of the guest's zram swap device (`[vm.reclaim] swap = "zram"`, microvm only), 0 for none; `guestBytes` is the guest's RAM. */
  protected zramBytes(guestBytes: number): number {
    const c = this.d.vm.reclaim;
    return this.backend === 'microvm' && c.mode === 'on' && c.swap === 'zram' ? swapSizeBytes(c, guestBytes) : 0;
  }

  /** `<sandbox dir>/guest-reclaim.json`: the guest reclaim of the running boot (reclaim.ts GuestReclaimRecord). */
  protected reclaimFile(id: string): string {
    return path.join(this.dir(id), 'guest-reclaim.json');
  }

  /** Host path of the sandbox's writable disk (microvm: the ext4 `disk.raw`). */
  protected writableDisk(id: string): string {
    return vmPaths(this.dir(id)).disk;
  }

  /** Layer digests attached to the VM as disks (microvm: every effective layer). */
  protected attachedLayers(sb: SandboxRecord): string[] {
    return effectiveLayers(sb.imageLayers);
  }

  /** The QEMU argument vector of one boot (microvm: {@link qemuArgs}). */
  protected async qemuCommand(sb: SandboxRecord, plat: Platform, layers: string[], guestMiB: number): Promise<string[]> {
    const swap = vmPaths(this.dir(sb.id)).swap;
    return qemuArgs({
      id: sb.id, dir: this.dir(sb.id), kernel: plat.kernel, initrd: plat.initramfs.path, accel: plat.accel,
      vcpus: Math.max(1, Math.ceil(sb.cpus)), memoryMiB: guestMiB, layers, tscKhz: plat.tscKhz, tcgTbMiB: this.d.vm.tcgTbMiB,
      pmem: this.pmemLayouts.get(sb.id) ?? null, balloon: this.d.vm.balloon,
      swapDisk: isFile(swap) ? { file: swap, direct: directIoWorks(swap) } : null, zramBytes: this.zramBytes(guestMiB * 1024 * 1024),
    });
  }

  /** Host files one boot reads (bound read-only into the VMM's mount namespace): kernel, initramfs, layer blobs. */
  protected bootFiles(_sb: SandboxRecord, plat: Platform, layers: string[]): string[] {
    return [plat.kernel, plat.initramfs.path, ...layers];
  }

  /**
   * The VMM's confinement for one boot (docs/SECURITY.md "VMM confinement"), or null when
   * `[vm]` turns all of it off: a mount namespace holding only QEMU's runtime, the boot
   * files and the sandbox dir; the sandbox's own host uid (the base of its uid range)
   * unless the accelerator needs a device that uid cannot open; dsec's seccomp filter.
   * Prepares the host side: the sandbox dir becomes root-owned, group the VMM's gid, mode
   * 01770 (QEMU creates its sockets there; the sticky bit keeps dsecd's own entries out of
   * its reach), and the writable disk is owned by the VMM's uid.
   */
  protected async confinement(sb: SandboxRecord, plat: Platform, layers: string[]): Promise<VmmConfinement | null> {
    const c = this.d.vm.confine;
    if (!c.mountNamespace && !c.unprivileged && !c.seccomp) return null;
    const dir = this.dir(sb.id);
    const kvm = plat.accel === 'kvm';
    let uid: number | null = null;
    let gid: number | null = null;
    const groups: number[] = [];
    if (c.unprivileged && sb.uidBase !== null) {
      const kvmOk = !kvm || kvmGroup() !== null;
      if (kvmOk) {
        uid = sb.uidBase;
        gid = sb.uidBase;
        if (kvm) groups.push(kvmGroup()!);
      }
    }
    const files = this.bootFiles(sb, plat, layers);
    if (uid !== null) {
      await chown(dir, 0, gid!);
      await chmod(dir, 0o1770);
      for (const disk of [this.writableDisk(sb.id), vmPaths(dir).swap]) {
        if (await stat(disk).catch(() => null)) await chown(disk, uid, gid!);
      }
      // An unprivileged VMM must be able to read every file it opens.
      for (const f of files) {
        const st = await stat(f).catch(() => null);
        if (st && (st.mode & 0o004) === 0) {
          throw failedPrecondition(`sandbox ${sb.id}: ${f} is not readable by others (mode ${(st.mode & 0o777).toString(8)}), so the VMM, running as host uid ${uid}, cannot open it; chmod o+r it, or set [vm] vmm_unprivileged = false`);
        }
      }
    } else {
      await chmod(dir, 0o700);
    }
    let newRoot: string | null = null;
    const ro: string[] = [];
    if (c.mountNamespace) {
      newRoot = path.join(this.d.root, 'vm', 'vmm-root');
      await mkdir(newRoot, { recursive: true, mode: 0o700 });
      ro.push(...(await qemuRuntimePaths(this.qemuPath!)), ...files);
    }
    return {
      newRoot, ro: [...new Set(ro)], rw: [dir], dev: ['/dev/null', '/dev/zero', '/dev/urandom', ...(kvm ? ['/dev/kvm'] : [])],
      uid, gid, groups, seccomp: c.seccomp,
    };
  }

  /**
   * The boot steps after QMP answered (microvm: the mux session, then the agent's HELLO),
   * each raced by `ctx.step` against QEMU's exit and the boot deadline.
   */
  protected async bootGuest(sb: SandboxRecord, ctx: BootContext): Promise<void> {
    const session = await ctx.step(ctx.ep.session(Math.max(1, ctx.deadline - Date.now())));
    const client = await ctx.step(this.agent(sb.id, Math.max(1000, ctx.deadline - Date.now())));
    if (this.backend === 'microvm') await ctx.step(this.confineGuest(sb, client, session));
    if (this.backend === 'microvm') await ctx.step(this.startReclaim(sb, session));
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
  protected confinementFile(id: string): string {
    return path.join(this.dir(id), 'guest-confinement.json');
  }

  /** The filesystem options in force for `sb` (resolved at create; older rows: now), as for containers. */
  protected filesystemOf(sb: SandboxRecord): ResolvedFilesystem {
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
   * A boot failure with the evidence: QEMU's exit and stderr, and the console's tail. A
   * guest memory QEMU could not allocate is ResourceExhausted; the guest's /init refusing
   * (dsec-init: FATAL) is FailedPrecondition; a timeout DeadlineExceeded; else Internal.
   */
  protected bootError(sb: SandboxRecord, what: string, kind: 'DeadlineExceeded' | 'Internal' | 'FailedPrecondition' | null, exit: { code: number | null; signal: string | null } | null): DsecError {
    const p = vmPaths(this.dir(sb.id));
    const qlog = tailFile(p.qemuLog, 5);
    const con = tailFile(p.console, 15);
    let k: 'DeadlineExceeded' | 'Internal' | 'ResourceExhausted' | 'FailedPrecondition' = kind ?? 'Internal';
    if (kind === 'FailedPrecondition' && /cannot set up guest memory|Cannot allocate memory/i.test(qlog)) k = 'ResourceExhausted';
    // /init's reason, which a kernel panic after it may have pushed out of the tail.
    const fatal = /dsec-init: FATAL: .*/.exec(tailFile(p.console, 1000, 65536))?.[0] ?? null;
    if (!kind && /cannot set up guest memory|Cannot allocate memory/i.test(qlog)) k = 'ResourceExhausted';
    else if (!kind && fatal) k = 'FailedPrecondition';
    const ex = exit ? ` (QEMU ${exit.signal ? `killed by ${exit.signal}` : `exit status ${exit.code}`})` : '';
    const msg = `sandbox ${sb.id}: ${what}${ex}${fatal && !con.includes(fatal) ? `: ${fatal}` : ''}; QEMU log: ${qlog ? `\n${qlog}` : '(empty)'}\nconsole log tail (${p.console}):${con ? `\n${con}` : ' (empty)'}`;
    if (k === 'ResourceExhausted') return resourceExhausted(`${msg}\nhint: the host could not give the guest ${sb.memoryBytes} bytes; ask for less memory_bytes`);
    if (k === 'FailedPrecondition') return failedPrecondition(msg);
    if (k === 'DeadlineExceeded') return deadlineExceeded(`${msg}\nhint: a TCG boot takes ~3 s on an idle host and several times that on a busy one; raise [vm] boot_timeout_s if it needs longer`);
    return internal(msg);
  }

  /** SIGKILLs the VMM (by `pid` when given and it is this sandbox's, and every process of its cgroup), then waits for it to be gone. */
  protected async killVmm(id: string, pid: number | null): Promise<void> {
    const dir = this.dir(id);
    const target = pid !== null && isVmmOf(pid, dir) ? pid : vmmOfDir(dir)?.pid ?? null;
    if (target !== null) {
      try { process.kill(target, 'SIGKILL'); } catch { /* gone */ }
    }
    await this.d.cgroups.killAll(id).catch((e) => this.d.log.warn({ err: e, id }, 'killing the microvm cgroup failed'));
    if (target !== null) await waitGone(target, QUIT_WAIT_MS);
  }

  private setQmp(id: string, c: QmpClient): void {
    const p = Promise.resolve(c);
    this.qmps.set(id, p);
    c.onClose(() => {
      if (this.qmps.get(id) === p) this.qmps.delete(id);
    });
  }

  /**
   * The VM's QMP connection, (re)connecting on first use.
   * @throws DsecError Unavailable (QEMU not running), DeadlineExceeded (QMP stopped answering).
   */
  private qmp(id: string): Promise<QmpClient> {
    if (this.closed) return Promise.reject(shuttingDown());
    let p = this.qmps.get(id);
    if (!p) {
      p = refuseAfterClose(() => this.closed, QmpClient.connect(vmPaths(this.dir(id)).qmp, { timeoutMs: this.d.vm.qmpTimeoutMs }));
      const mine = p;
      this.qmps.set(id, p);
      p.then((c) => c.onClose(() => { if (this.qmps.get(id) === mine) this.qmps.delete(id); }), () => { if (this.qmps.get(id) === mine) this.qmps.delete(id); });
    }
    return p;
  }

  /**
   * Runs one QMP command with the configured timeout, naming the sandbox in errors. When
   * QMP does not answer, a background {@link resync} is started.
   * @throws DsecError DeadlineExceeded (QMP stopped answering), Unavailable (QEMU gone),
   *   Internal (QEMU refused the command).
   */
  protected async qmpRun<T>(sb: SandboxRecord, command: string, args?: Record<string, unknown>): Promise<T> {
    const runState = command === 'stop' || command === 'cont';
    if (runState) this.wantRunning.set(sb.id, command === 'cont');
    try {
      const c = await this.qmp(sb.id);
      return await c.execute<T>(command, args, { timeoutMs: this.d.vm.qmpTimeoutMs });
    } catch (e) {
      // A failed stop/cont leaves the sandbox in its previous state in the store, so the
      // run state to restore is the previous one: a late `stop` QEMU runs after it answers
      // again must be undone, not kept.
      if (runState) this.wantRunning.set(sb.id, command !== 'cont');
      if (isDsecError(e, 'DeadlineExceeded')) this.resync(sb);
      if (e instanceof DsecError) {
        throw new DsecError(e.kind, `sandbox ${sb.id}: ${e.message}${isDsecError(e, 'DeadlineExceeded') ? '; dsecd keeps reconnecting and restores the VM\'s run state once QEMU answers again' : ''}`, { cause: e });
      }
      throw e;
    }
  }

  /**
   * After QMP stopped answering: reconnects every second (while the VM's QEMU lives) and,
   * once QEMU answers, sets the VM's run state to what dsecd last asked for. QEMU runs the
   * commands of one monitor connection in order and the next connection only after it, so
   * a late `stop` is always seen here before the check. One loop per VM.
   */
  private resync(sb: SandboxRecord): void {
    if (this.resyncing.has(sb.id)) return;
    this.resyncing.add(sb.id);
    void (async () => {
      try {
        while (sb.initPid !== null && isVmmOf(sb.initPid, this.dir(sb.id))) {
          await sleep(1000);
          try {
            const c = await this.qmp(sb.id);
            const st = await c.execute<{ running: boolean }>('query-status', undefined, { timeoutMs: this.d.vm.qmpTimeoutMs });
            const want = this.wantRunning.get(sb.id);
            if (want !== undefined && want !== st.running) await c.execute(want ? 'cont' : 'stop', undefined, { timeoutMs: this.d.vm.qmpTimeoutMs });
            this.d.log.info({ id: sb.id, running: want ?? st.running }, 'QMP answers again; run state restored');
            return;
          } catch { /* not yet */ }
        }
      } finally {
        this.resyncing.delete(sb.id);
      }
    })();
  }

  /**
   * The sandbox's cached agent connection (over the mux), connecting on first use.
   * @throws DsecError Unavailable once {@link close} ran (dsecd is shutting down).
   */
  protected agent(id: string, timeoutMs = 10_000): Promise<AgentClient> {
    if (this.closed) return Promise.reject(shuttingDown());
    let p = this.agents.get(id);
    if (!p) {
      p = refuseAfterClose(() => this.closed, AgentClient.connect(vmPaths(this.dir(id)).agentSock, { timeoutMs })).then((c) => {
        c.onLost(() => {
          if (this.agents.get(id) === p) this.agents.delete(id);
        });
        return c;
      });
      p.catch(() => {
        if (this.agents.get(id) === p) this.agents.delete(id);
      });
      this.agents.set(id, p);
    }
    return p;
  }

  /** Closes dsecd's connections to a VM (agent, mux, QMP, listener); the VM is not touched. */
  protected async dropConnections(id: string): Promise<void> {
    const a = this.agents.get(id);
    this.agents.delete(id);
    if (a) await a.then((c) => c.close(), () => {});
    const ep = this.endpoints.get(id);
    this.endpoints.delete(id);
    if (ep) await ep.close();
    const q = this.qmps.get(id);
    this.qmps.delete(id);
    if (q) await q.then((c) => c.close(), () => {});
  }

  async stop(sb: SandboxRecord, steps: StepObserver, opts: { graceMs?: number } = {}): Promise<void> {
    const dir = this.dir(sb.id);
    const pid = sb.initPid !== null && isVmmOf(sb.initPid, dir) ? sb.initPid : vmmOfDir(dir)?.pid ?? null;
    if (pid !== null) {
      // A paused VM cannot act on anything: continue it first.
      if (sb.state === 'paused') await this.qmpRun(sb, 'cont').catch((e) => this.d.log.warn({ err: e, id: sb.id }, 'cont before stop failed'));
      const s = await this.endpoint(sb.id).session().catch(() => null);
      if (s && opts.graceMs && opts.graceMs > 0 && sb.state === 'running') {
        // SIGTERM to every guest process but the agent; wait for them (at most graceMs).
        await s.op(GuestOp.KILL_ALL, u32(15)).catch(() => {});
        const until = Date.now() + opts.graceMs;
        while (Date.now() < until && ((await s.op(GuestOp.PROCS).catch(() => 0)) > 0)) await sleep(GRACE_POLL_MS);
      }
      // The writable layer must be on the disk file before QEMU goes.
      if (s) await s.op(GuestOp.SYNC, undefined, SYNC_TIMEOUT_MS).catch((e) => this.d.log.warn({ err: e, id: sb.id }, 'guest sync at stop failed; the writable layer keeps what ext4 had committed'));
      await this.qmpRun(sb, 'quit').catch(() => {});
      await waitGone(pid, QUIT_WAIT_MS);
    }
    steps.hit('stop.after-kill');
    await this.killVmm(sb.id, pid);
    await this.dropConnections(sb.id);
    this.blobs.delete(sb.id);
    this.pmemLayouts.delete(sb.id);
    await this.d.cgroups.remove(sb.id);
    const p = vmPaths(dir);
    for (const f of [p.qmp, p.vmux, p.agentSock, p.pid, p.migrate, this.confinementFile(sb.id)]) await rm(f, { force: true });
  }

  async destroy(sb: SandboxRecord, steps: StepObserver): Promise<void> {
    await this.killVmm(sb.id, sb.initPid);
    steps.hit('destroy.after-kill');
    await this.dropConnections(sb.id);
    this.blobs.delete(sb.id);
    this.pmemLayouts.delete(sb.id);
    steps.hit('destroy.after-runtime');
    steps.hit('destroy.after-rootfs');
    await this.d.cgroups.killAll(sb.id).catch(() => {});
    await this.d.cgroups.remove(sb.id);
    steps.hit('destroy.after-cgroup');
    await removeSandboxDir(this.dir(sb.id));
    steps.hit('destroy.after-dir');
  }

  async exec(sb: SandboxRecord, req: DriverExecRequest): Promise<DriverExecResult> {
    const client = await this.agentClient(sb);
    let res;
    try {
      res = await client.exec({
        argv: req.argv, env: req.env, cwd: req.cwd, user: req.user, timeoutMs: req.timeoutMs,
        stdin: req.stdin, maxOutputBytes: req.maxOutputBytes, ...(req.isolate ? { isolate: req.isolate } : {}),
      });
    } catch (e) {
      if (e instanceof DsecError) throw e;
      throw unavailable(`sandbox ${sb.id}: exec interrupted: ${(e as Error).message}`, e);
    }
    if (res.kind === 'exec_error' && /^(chdir|user)\b/.test(res.message)) throw invalidArgument(`sandbox ${sb.id}: ${res.message}`);
    // The guest's OOM killer is not visible in the VMM's cgroup (an OOM kill there would end QEMU itself).
    return { ...res, oom: false, oomKills: null };
  }

  async agentClient(sb: SandboxRecord): Promise<AgentClient> {
    try {
      return await this.agent(sb.id);
    } catch (e) {
      throw unavailable(`sandbox ${sb.id}: cannot reach its agent: ${(e as Error).message}`, e);
    }
  }

  async startExec(sb: SandboxRecord, req: DriverStartExecRequest, handlers: DriverExecHandlers): Promise<AgentExecHandle> {
    const fields = { argv: req.argv, env: req.env, cwd: req.cwd, user: req.user, timeoutMs: req.timeoutMs, stdin: req.stdin, ...(req.tty ? { tty: req.tty } : {}) };
    // As for containers: an exec with stdin gets a connection (here: a mux stream) of its
    // own, so a stdin backlog the agent stops reading never stalls the other execs; so
    // does a paced one, whose paused output pauses its whole connection.
    if (req.stdin || req.tty || req.paced) {
      let own: AgentClient;
      try {
        own = await AgentClient.connect(vmPaths(this.dir(sb.id)).agentSock, { timeoutMs: 10_000 });
      } catch (e) {
        throw unavailable(`sandbox ${sb.id}: cannot reach its agent: ${(e as Error).message}`, e);
      }
      const h = own.startExec(fields, handlers);
      void h.done.then(() => own.close(), () => own.close());
      return {
        ...h,
        signal: (signo: number) => {
          h.signal(signo);
          if (signo === 9) setTimeout(() => own.close(), 1000).unref();
        },
      };
    }
    return (await this.agentClient(sb)).startExec(fields, handlers);
  }

  async stats(sb: SandboxRecord): Promise<SandboxStats | null> {
    if (sb.state !== 'running' && sb.state !== 'paused') return null;
    const st = await this.d.cgroups.stats(sb.id).catch(() => null);
    if (!st) return null;
    // The VMM's cgroup: its memory is the guest RAM QEMU has touched plus QEMU's own; pids are QEMU's threads.
    return {
      cpuUsageNs: st.cpuUsageNs, memoryBytes: st.memoryBytes, memoryLimitBytes: st.memoryLimitBytes, pids: st.pidsCurrent, oomKills: st.oomKills, pidsLimitHits: st.pidsLimitHits, seccompDenials: null,
      guestReclaim: sb.state === 'running' ? await this.reclaimStats(sb) : null,
    };
  }

  /**
   * The guest reclaim scheme's stats, read from the guest agent (RECLAIM_STATS), also
   * written into {@link reclaimFile}; null when this boot runs no scheme.
   */
  private async reclaimStats(sb: SandboxRecord): Promise<GuestReclaimRecord['stats']> {
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
   * The VMM's confinement as the kernel reports it for the running QEMU (docs/SECURITY.md
   * "VMM confinement"): its mount namespace against dsecd's, its uids and capabilities, its
   * seccomp mode and filter count (/proc/<pid>/status). Nothing is taken from the config.
   */
  async defences(sb: SandboxRecord): Promise<Record<string, DefenceStatus>> {
    return { ...this.vmmDefences(sb), ...this.guestDefences(sb) };
  }

  /**
   * The in-guest defences of `sb` (readonly_paths, capabilities, no_new_privileges,
   * seccomp, landlock), from the record the current boot wrote after the guest agent
   * applied them (confine.ts); nothing is taken from the request. The vm tier confines
   * nothing inside its guest and says so.
   */
  protected guestDefences(sb: SandboxRecord): Record<string, DefenceStatus> {
    const names = ['readonly_paths', 'capabilities', 'no_new_privileges', 'seccomp', 'landlock'] as const;
    const all = (d: DefenceStatus) => Object.fromEntries(names.map((n) => [n, d])) as Record<string, DefenceStatus>;
    if (this.backend !== 'microvm') {
      return all({ enforced: false, detail: 'vm tier: commands run as root of the guest with every capability, no seccomp filter and a writable root; the guest kernel (and the VMM confinement) is the only boundary' });
    }
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

  /** The VMM's confinement (see {@link defences}). */
  private vmmDefences(sb: SandboxRecord): Record<string, DefenceStatus> {
    const pid = sb.initPid;
    if (pid === null || !isVmmOf(pid, this.dir(sb.id))) {
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
        ? { enforced: true, detail: `QEMU (pid ${pid}) has a mount namespace of its own (${ns}): a read-only tmpfs root holding only QEMU, its libraries and firmware, the kernel, initramfs and disks, the sandbox dir and /dev/null, /dev/zero, /dev/urandom${this.d.vm.accel === 'kvm' ? ', /dev/kvm' : ''}` }
        : { enforced: false, detail: `QEMU (pid ${pid}) shares dsecd's mount namespace${this.d.vm.confine.mountNamespace ? '' : ' ([vm] vmm_mount_namespace = false)'}` },
      vmm_unprivileged: uids.length && uids.every((u) => u !== 0)
        ? { enforced: true, detail: `QEMU runs as host uid ${uids[0]} (the base of the sandbox's uid range), no capabilities (CapEff ${field('CapEff')})` }
        : { enforced: false, detail: `QEMU runs as root: ${this.d.vm.confine.unprivileged ? 'the accelerator needs /dev/kvm, which only root may open on this host (give /dev/kvm a group with rw access to let it drop)' : '[vm] vmm_unprivileged = false'}` },
      vmm_seccomp: seccomp === '2'
        ? { enforced: true, detail: `seccomp filter mode, ${filters} filter(s): QEMU's -sandbox on (obsolete, elevateprivileges, spawn, resourcecontrol denied)${filters > 1 ? ' over dsec\'s (namespaces, mounts, ptrace, bpf, keyrings, io_uring, userfaultfd, modules, kexec, clocks: EPERM)' : ''}` }
        : { enforced: false, detail: `QEMU has no seccomp filter (Seccomp: ${seccomp || '?'})` },
    };
  }

  async limitCounters(sb: Pick<SandboxRecord, 'id' | 'state'>): Promise<{ oomKills: number; pidsLimitHits: number } | null> {
    if (sb.state !== 'running' && sb.state !== 'paused') return null;
    return this.d.cgroups.limitCounters(sb.id).catch(() => null);
  }

  /** VMs have no live limits or I/O settings (capabilities `pool` and `io` are false). @throws DsecError FailedPrecondition. */
  async update(sb: SandboxRecord, u: LiveUpdate): Promise<void> {
    if (u.limits) throw failedPrecondition(`backend ${sb.backend} cannot change limits of a running sandbox`);
    if (u.io !== undefined) throw failedPrecondition(`backend ${sb.backend} cannot change I/O settings of a running sandbox`);
  }

  logPath(sb: SandboxRecord): string {
    return vmPaths(this.dir(sb.id)).agentLog;
  }

  async isAlive(sb: SandboxRecord): Promise<boolean> {
    if (!sb.initPid || sb.initStart === null) return false;
    return procStartTime(sb.initPid) === sb.initStart && isVmmOf(sb.initPid, this.dir(sb.id));
  }

  async adopt(sb: SandboxRecord): Promise<void> {
    // QEMU holds its layer files open; pin them so the blob cache keeps them.
    this.blobs.set(sb.id, effectiveLayers(sb.imageLayers));
    await this.endpoint(sb.id).listen();
    const status = await this.qmpRun<{ status: string; running: boolean }>(sb, 'query-status');
    // A running sandbox is never left stopped (dsecd may have died in the middle of a pause
    // that it never committed; reconcile rolls an uncommitted pause back by resume()).
    if (sb.state === 'running' && sb.desired === null && !status.running) await this.qmpRun(sb, 'cont');
  }

  async cleanOrphans(known: Set<string>): Promise<OrphanReport> {
    const removed: string[] = [];
    const base = path.join(this.d.root, 'sandboxes');
    let ids: string[] = [];
    try {
      ids = await readdir(base);
    } catch { /* none yet */ }
    for (const id of ids) {
      if (known.has(id)) continue;
      const vmm = vmmOfDir(this.dir(id));
      if (!vmm) continue;
      try { process.kill(vmm.pid, 'SIGKILL'); } catch { /* gone */ }
      await waitGone(vmm.pid, QUIT_WAIT_MS);
      removed.push(`microvm QEMU pid ${vmm.pid} of ${id}`);
      await this.d.cgroups.killAll(id).catch(() => {});
      await this.d.cgroups.remove(id).catch(() => {});
      await removeSandboxDir(this.dir(id));
      removed.push(`sandbox dir ${id}`);
    }
    return { removed };
  }

  async pause(sb: SandboxRecord): Promise<ReclaimReport> {
    await this.qmpRun(sb, 'stop');
    const before = await this.d.cgroups.stats(sb.id);
    // Only page cache can go (the guest's RAM is QEMU's anonymous memory); swap would take the rest.
    await this.d.cgroups.reclaim(sb.id).catch((e) => this.d.log.warn({ err: e, id: sb.id }, 'reclaim at pause failed'));
    const after = await this.d.cgroups.stats(sb.id);
    const swap = hostHasSwap();
    return {
      memory_before_bytes: before.memoryBytes, memory_after_bytes: after.memoryBytes,
      file_before_bytes: before.memoryCacheBytes, file_after_bytes: after.memoryCacheBytes,
      anon_bytes: after.memoryAnonBytes, reclaimed_bytes: Math.max(0, before.memoryBytes - after.memoryBytes), swap,
      note: `the VM's vCPUs are stopped (QMP stop); the VMM's page cache was reclaimed; guest RAM is QEMU's anonymous memory${swap ? ', swapped out under pressure' : ' and stays resident (no swap on this host; free-page reporting returns only what the guest frees)'}`,
    };
  }

  async resume(sb: SandboxRecord): Promise<void> {
    await this.qmpRun(sb, 'cont');
    // The guest's clock stood still while it was stopped: set it again (best effort).
    void this.endpoint(sb.id).session()
      .then((s) => s.op(GuestOp.SET_TIME, u64(BigInt(Date.now()) * 1_000_000n)))
      .catch((e) => this.d.log.warn({ err: e, id: sb.id }, 'setting the guest clock after resume failed'));
  }

  /**
   * The platform a restore boots with: this dsecd's, with the snapshot's kernel,
   * initramfs, accelerator and TSC rate (the guest was booted with those; its RAM holds
   * that kernel).
   * @throws DsecError FailedPrecondition (as {@link platform}; a KVM snapshot where KVM is not usable).
   */
  private async restorePlatform(r: MachineRestore): Promise<Platform> {
    const plat = await this.platform();
    if (r.machine.accel === 'kvm' && plat.accel !== 'kvm') {
      throw failedPrecondition(`snapshot ${r.snapshotId} was taken under KVM; microVMs on this host run under TCG (${plat.kvm.reason}), which cannot load a KVM machine's CPU state`);
    }
    return { ...plat, kernel: r.machine.kernel, initramfs: { ...plat.initramfs, path: r.machine.initrd }, accel: r.machine.accel, tscKhz: r.machine.tscKhz };
  }

  /**
   * The restore's boot steps after QMP answered (QEMU was started with `-incoming defer`):
   * `migrate-incoming` on `<dir>/migrate.sock`, the snapshot's state file streamed into
   * it, the load awaited (QMP `query-status` leaves `inmigrate`), `cont`, then the mux
   * session, the guest's RNG reseeded from the host ({@link GuestOp.RESEED}), the guest
   * clock set to now (it stood still since the capture) and the agent's HELLO. Each step is raced by `ctx.step` against QEMU's exit (a stream
   * QEMU cannot load makes it exit) and the boot deadline.
   */
  private async incoming(sb: SandboxRecord, ctx: BootContext, r: MachineRestore): Promise<void> {
    const sock = vmPaths(this.dir(sb.id)).migrate;
    const qmpOpts = { timeoutMs: this.d.vm.qmpTimeoutMs };
    await ctx.step(ctx.qmp.execute('migrate-set-capabilities', { capabilities: IGNORE_SHARED }, qmpOpts));
    await ctx.step(ctx.qmp.execute('migrate-incoming', { uri: `unix:${sock}` }, qmpOpts));
    // QEMU listens once migrate-incoming has answered.
    const conn = await ctx.step(connectUnix(sock));
    const fed = pipeline(createReadStream(path.join(r.dir, MACHINE_STATE_FILE)), conn);
    // The load's outcome is QEMU's (query-status, or its exit); a write error after QEMU closed the socket says nothing more.
    fed.catch(() => {});
    try {
      for (;;) {
        const st = await ctx.step(ctx.qmp.execute<{ status: string }>('query-status', undefined, qmpOpts));
        if (st.status === 'paused' || st.status === 'running') break;
        if (st.status !== 'inmigrate') throw failedPrecondition(`sandbox ${sb.id}: snapshot ${r.snapshotId} cannot be restored: after loading its machine state QEMU is in state ${st.status}`);
        await ctx.step(sleep(MIGRATE_POLL_MS));
      }
    } finally {
      conn.destroy();
      await rm(sock, { force: true });
    }
    this.wantRunning.set(sb.id, true);
    await ctx.step(ctx.qmp.execute('cont', undefined, qmpOpts));
    const s = await ctx.step(ctx.ep.session(Math.max(1, ctx.deadline - Date.now())));
    // Every restore of one snapshot starts with the source's RNG state: reseed it from the
    // host first thing (the guest's processes have run for only the handshake). Refused (a
    // guest agent without the op), the restore fails: forks sharing random numbers are not
    // forks to hand out.
    await ctx.step(s.op(GuestOp.RESEED, randomBytes(RESEED_BYTES)).catch((e: Error) => {
      throw failedPrecondition(`sandbox ${sb.id}: snapshot ${r.snapshotId} cannot be restored: reseeding the guest's random number generator failed (${e.message}); its guest agent predates machine snapshots: take a new snapshot of a VM started by this dsecd`);
    }));
    await s.op(GuestOp.SET_TIME, u64(BigInt(Date.now()) * 1_000_000n))
      .catch((e) => this.d.log.warn({ err: e, id: sb.id }, 'setting the guest clock after a restore failed'));
    await ctx.step(this.agent(sb.id, Math.max(1000, ctx.deadline - Date.now())));
    // The resumed guest's commands are confined as the source's were (its agent's state
    // came with the RAM); no record means the source was not confined, and inspect says so.
    if (this.backend === 'microvm') await copyFile(path.join(r.dir, GUEST_CONFINEMENT_FILE), this.confinementFile(sb.id)).catch(() => {});
    // Its guest reclaim too: the agent's scheme came with the RAM.
    if (this.backend === 'microvm') await copyFile(path.join(r.dir, GUEST_RECLAIM_FILE), this.reclaimFile(sb.id)).catch(() => {});
  }

  /**
   * The machine a running QEMU of this sandbox was started with (`machine.json`).
   * @throws DsecError FailedPrecondition when there is none (started by a dsecd without machine records).
   */
  private async machineSpec(sb: SandboxRecord): Promise<MachineSpec> {
    try {
      return JSON.parse(await readFile(vmPaths(this.dir(sb.id)).machine, 'utf8')) as MachineSpec;
    } catch (e) {
      throw failedPrecondition(`sandbox ${sb.id} has no machine record (${vmPaths(this.dir(sb.id)).machine}: ${(e as Error).message}); it was started by an older dsecd: stop and start it, then snapshot it`);
    }
  }

  /**
   * A machine snapshot of a running or paused microVM into `dir` (see the module comment):
   * `stop` (a running VM), the disk copied to {@link MACHINE_DISK_FILE}, the state migrated
   * to {@link MACHINE_STATE_FILE} (hashed as it arrives), `cont` (a running VM; also when
   * the capture failed). The VM's vCPUs are stopped for the whole capture (`pausedMs`).
   * @throws DsecError FailedPrecondition (not running or paused, no machine record),
   *   DeadlineExceeded (the migration did not finish in {@link MIGRATE_TIMEOUT_MS}; it is
   *   cancelled), Internal (QEMU's migration failed, with its reason; the copy failed).
   */
  async snapshotMachine(sb: SandboxRecord, dir: string): Promise<MachineSnapshot> {
    const src = this.dir(sb.id);
    if ((sb.state !== 'running' && sb.state !== 'paused') || sb.initPid === null || !isVmmOf(sb.initPid, src)) {
      throw failedPrecondition(`sandbox ${sb.id} is ${sb.state}: a microvm snapshot captures the running machine (RAM and processes); start it first`);
    }
    const spec = await this.machineSpec(sb);
    const qmp = await this.qmp(sb.id).catch((e: Error) => { throw unavailable(`sandbox ${sb.id}: cannot reach QMP: ${e.message}`, e); });
    const v = qmp.version;
    const wasRunning = sb.state === 'running';
    const t0 = Date.now();
    let pausedMs = 0;
    let disk: { reflinked: boolean };
    let state: { bytes: number; sha256: string };
    if (wasRunning) await this.qmpRun(sb, 'stop');
    let failed = true;
    try {
      // QMP stop has drained and flushed the disks: the file is what the guest's RAM expects.
      disk = await copyDisk(this.writableDisk(sb.id), path.join(dir, MACHINE_DISK_FILE));
      // The guest's swap holds pages its RAM state refers to: it travels with the snapshot.
      if (this.backend === 'microvm') await snapshotSwapFile(vmPaths(src).swap, dir, copyDisk);
      // The guest's confinement is part of its RAM state: a restore resumes it as applied,
      // so the record of what was applied travels with the snapshot.
      if (this.backend === 'microvm') await copyFile(this.confinementFile(sb.id), path.join(dir, GUEST_CONFINEMENT_FILE)).catch(() => {});
      if (this.backend === 'microvm') await copyFile(this.reclaimFile(sb.id), path.join(dir, GUEST_RECLAIM_FILE)).catch(() => {});
      state = await this.migrateOut(sb, path.join(dir, MACHINE_STATE_FILE));
      failed = false;
    } finally {
      pausedMs = Date.now() - t0;
      if (wasRunning) {
        try {
          await this.resume(sb);
        } catch (e) {
          // A failed snapshot reports its own error; a lost `cont` is resynced in the background (qmpRun).
          if (!failed) throw e;
          this.d.log.error({ err: e, id: sb.id }, 'continuing the VM after a failed snapshot failed');
        }
      }
    }
    const st = await stat(path.join(dir, MACHINE_DISK_FILE));
    this.d.log.info({ id: sb.id, pausedMs, stateBytes: state.bytes, reflink: disk.reflinked }, 'microvm machine snapshot');
    return {
      qemuVersion: v ? `${v.major}.${v.minor}.${v.micro}` : 'unknown', ...spec,
      stateBytes: state.bytes, stateSha256: state.sha256, diskBytes: st.size, diskAllocatedBytes: disk.reflinked ? 0 : st.blocks * 512,
      diskReflinked: disk.reflinked, pausedMs,
    };
  }

  /**
   * Streams the (stopped) VM's state into `file` through QMP `migrate` to a Unix socket
   * dsecd listens on in the sandbox dir (owned by the VMM's uid, so the confined QEMU may
   * connect), at most one connection, hashed as it arrives.
   * @returns bytes written and their sha256 (hex).
   * @throws DsecError Internal (the migration failed or was cancelled; writing the file
   *   failed), DeadlineExceeded (not done in {@link MIGRATE_TIMEOUT_MS}: cancelled).
   */
  private async migrateOut(sb: SandboxRecord, file: string): Promise<{ bytes: number; sha256: string }> {
    const sock = vmPaths(this.dir(sb.id)).migrate;
    await rm(sock, { force: true });
    const hash = createHash('sha256');
    let bytes = 0;
    let taken = false;
    let resolveDone!: () => void;
    let rejectDone!: (e: Error) => void;
    const done = new Promise<void>((res, rej) => { resolveDone = res; rejectDone = rej; });
    done.catch(() => {});
    const server = net.createServer((c) => {
      if (taken) {
        c.destroy();
        return;
      }
      taken = true;
      const count = new Transform({
        transform(chunk: Buffer, _enc, cb) {
          hash.update(chunk);
          bytes += chunk.length;
          cb(null, chunk);
        },
      });
      pipeline(c, count, createWriteStream(file, { flags: 'wx', mode: 0o600 })).then(resolveDone, rejectDone);
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(sock, () => resolve());
    });
    try {
      const owner = procOwner(sb.initPid!);
      if (owner) await chown(sock, owner.uid, owner.gid);
      await chmod(sock, 0o600);
      await this.qmpRun(sb, 'migrate-set-capabilities', { capabilities: IGNORE_SHARED });
      await this.qmpRun(sb, 'migrate-set-parameters', { 'max-bandwidth': MIGRATE_MAX_BANDWIDTH });
      await this.qmpRun(sb, 'migrate', { uri: `unix:${sock}` });
      const deadline = Date.now() + MIGRATE_TIMEOUT_MS;
      for (;;) {
        const m = await this.qmpRun<{ status?: string; 'error-desc'?: string }>(sb, 'query-migrate');
        if (m.status === 'completed') break;
        if (m.status === 'failed' || m.status === 'cancelled') {
          const why = await Promise.race([done.then(() => null, (e: Error) => e.message), sleep(100).then(() => null)]);
          throw internal(`sandbox ${sb.id}: the migration of its state ${m.status}${m['error-desc'] ? `: ${m['error-desc']}` : ''}${why ? ` (writing ${file}: ${why})` : ''}`);
        }
        if (Date.now() >= deadline) {
          await this.qmpRun(sb, 'migrate_cancel').catch(() => {});
          throw deadlineExceeded(`sandbox ${sb.id}: the migration of its state did not finish within ${MIGRATE_TIMEOUT_MS} ms; cancelled`);
        }
        await sleep(MIGRATE_POLL_MS);
      }
      // QEMU closes the connection after the last byte: the file is complete once the pipeline ends.
      await done.catch((e: Error) => { throw internal(`sandbox ${sb.id}: writing its state to ${file} failed: ${e.message}`, e); });
      return { bytes, sha256: hash.digest('hex') };
    } finally {
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await rm(sock, { force: true });
    }
  }

  /**
   * Checks a machine snapshot can be restored here (see {@link SandboxDriver.checkMachine}):
   * the state file has the recorded size and sha256 (read once per change of the file,
   * ~1 s per GB; later restores of an unchanged file skip the read), the disk copy
   * the recorded size, this QEMU the same major.minor version (the microvm machine type is
   * not versioned, so only the same QEMU is known to load the stream), the kernel and
   * initramfs are still here, and KVM is usable if the snapshot was taken under KVM.
   * @throws DsecError FailedPrecondition naming what is wrong (the caller names the snapshot).
   */
  async checkMachine(r: MachineRestore): Promise<void> {
    const m = r.machine;
    const bad = (why: string) => failedPrecondition(why);
    const statePath = path.join(r.dir, MACHINE_STATE_FILE);
    const diskPath = path.join(r.dir, MACHINE_DISK_FILE);
    const st = await stat(statePath).catch(() => null);
    if (!st) throw bad(`its machine state ${statePath} is missing`);
    if (st.size !== m.stateBytes) throw bad(`its machine state ${statePath} is corrupt: ${st.size} bytes where the snapshot wrote ${m.stateBytes} (truncated or overwritten)`);
    // Hashed once per version of the file (as layer blobs are verified once per change).
    const version = `${st.ino}:${st.size}:${st.mtimeMs}:${st.ctimeMs}:${m.stateSha256}`;
    if (this.verifiedStates.get(statePath) !== version) {
      const hash = createHash('sha256');
      await pipeline(createReadStream(statePath), new Transform({ transform(c: Buffer, _e, cb) { hash.update(c); cb(); } }));
      const sum = hash.digest('hex');
      if (sum !== m.stateSha256) throw bad(`its machine state ${statePath} is corrupt: sha256 ${sum}, the snapshot wrote ${m.stateSha256}`);
      this.verifiedStates.set(statePath, version);
    }
    const ds = await stat(diskPath).catch(() => null);
    if (!ds) throw bad(`its disk copy ${diskPath} is missing`);
    if (ds.size !== m.diskBytes) throw bad(`its disk copy ${diskPath} is corrupt: ${ds.size} bytes where the snapshot wrote ${m.diskBytes}`);
    for (const f of [m.kernel, m.initrd]) {
      if (!isFile(f)) throw bad(`the guest kernel or initramfs it was booted with (${f}) is gone from this host`);
    }
    const here = await this.qemuVersion();
    const mm = (x: string) => x.split('.').slice(0, 2).join('.');
    if (here && m.qemuVersion !== 'unknown' && mm(here) !== mm(m.qemuVersion)) {
      throw bad(`it was written by QEMU ${m.qemuVersion} and this host has QEMU ${here}; the microvm machine type is not versioned, so only the same QEMU release is known to load it`);
    }
    if (m.accel === 'kvm') await this.restorePlatform(r).catch((e: Error) => { throw bad(e.message); });
  }

  /** This host's QEMU version, `major.minor.micro` from `--version` (once), or null when it cannot be told. */
  private qemuVersion(): Promise<string | null> {
    this.qemuVersionP ??= (async () => {
      if (!this.qemuPath) return null;
      const r = await execa(this.qemuPath, ['--version'], { reject: false });
      return /version (\d+\.\d+\.\d+)/.exec(String(r.stdout))?.[1] ?? null;
    })();
    return this.qemuVersionP;
  }
  private qemuVersionP: Promise<string | null> | null = null;
  /** State files whose sha256 {@link checkMachine} verified, by path: the file's inode, size, mtime, ctime and the digest checked. */
  private readonly verifiedStates = new Map<string, string>();

  async withWritableLayer<T>(sb: SandboxRecord, _fn: (upperDir: string, dsecCreated: readonly string[]) => Promise<T>): Promise<T> {
    const p = vmPaths(this.dir(sb.id));
    const disk = sb.backend === 'vm' ? `qcow2 disk ${p.qcow}` : `ext4 disk ${p.disk}`;
    throw failedPrecondition(`sandbox ${sb.id} is a ${sb.backend}: its writable layer is the ${disk}, not a host directory; commit and filesystem snapshots of ${sb.backend} sandboxes are not built yet`);
  }

  /**
   * Closes dsecd's connections to every VM; from here on no new one is made (an operation
   * still in flight when dsecd shuts down fails Unavailable instead of keeping the process
   * alive). The VMs are not touched. Safe to call twice.
   */
  async close(): Promise<void> {
    this.closed = true;
    for (const id of new Set([...this.agents.keys(), ...this.endpoints.keys(), ...this.qmps.keys()])) await this.dropConnections(id);
  }
}

/** Aligned pmem copies being made, by file (one copy per digest at a time). */
const pmemInflight = new Map<string, Promise<string>>();

/** Size of a layer's pmem copy for a blob of `blobBytes`: rounded up to 2 MiB, plus the 2 MiB reserved hole that keeps adjacent layers apart (qemu.ts pmemLayout). */
export function pmemFileBytes(blobBytes: number): number {
  return alignUp(Math.max(1, blobBytes), PMEM_ALIGN_BYTES) + PMEM_ALIGN_BYTES;
}

/**
 * Migration capability set on both ends of a machine snapshot: RAM blocks backed by a
 * shared file (`share=on`: the pmem layers' aligned copies) are neither written to the
 * state nor loaded from it; the restoring QEMU maps the same read-only copy. Without it
 * the stream would carry every layer, and loading it would write into the read-only
 * mapping (QEMU dies of SIGSEGV).
 */
/** The copy of the source's `guest-confinement.json` in a machine snapshot's dir. */
const GUEST_CONFINEMENT_FILE = 'guest-confinement.json';
/** The guest reclaim record in a snapshot dir (the running boot's, see MicrovmDriver.reclaimFile). */
const GUEST_RECLAIM_FILE = 'guest-reclaim.json';

const IGNORE_SHARED = [{ capability: 'x-ignore-shared', state: true }];

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function u32(v: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(v >>> 0, 0);
  return b;
}

function u64(v: bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(v, 0);
  return b;
}

/**
 * Copies a VM's writable disk: a reflink (`cp --reflink=always`: the copy shares every
 * block until either side writes) where the filesystem has them (btrfs, XFS), else a
 * sparse copy (`cp --sparse=always`: holes stay holes, only the blocks the guest wrote
 * are copied). Written to `<to>.tmp` and renamed, so `to` is always complete.
 * @throws DsecError Internal with cp's message.
 */
export async function copyDisk(from: string, to: string): Promise<{ reflinked: boolean }> {
  const tmp = `${to}.tmp`;
  await rm(tmp, { force: true });
  let reflinked = true;
  let r = await execa('cp', ['--reflink=always', from, tmp], { reject: false });
  if (r.exitCode !== 0) {
    reflinked = false;
    await rm(tmp, { force: true });
    r = await execa('cp', ['--sparse=always', from, tmp], { reject: false });
  }
  if (r.exitCode !== 0) {
    await rm(tmp, { force: true });
    throw internal(`copying the VM disk ${from} to ${to} failed: ${String(r.stderr).trim() || `cp exit ${r.exitCode}`}`);
  }
  await rename(tmp, to);
  return { reflinked };
}

/** Connects to a Unix socket. @throws DsecError Unavailable. */
function connectUnix(p: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const c = net.createConnection({ path: p });
    c.once('connect', () => {
      c.removeAllListeners('error');
      c.on('error', () => {});
      resolve(c);
    });
    c.once('error', (e) => reject(unavailable(`cannot connect to ${p}: ${e.message}`, e)));
  });
}

/** The real uid and gid of a process (/proc/<pid>/status), or null when it is gone. */
function procOwner(pid: number): { uid: number; gid: number } | null {
  try {
    const s = readFileSync(`/proc/${pid}/status`, 'utf8');
    const uid = Number(/^Uid:\s*(\d+)/m.exec(s)?.[1]);
    const gid = Number(/^Gid:\s*(\d+)/m.exec(s)?.[1]);
    return Number.isInteger(uid) && Number.isInteger(gid) ? { uid, gid } : null;
  } catch {
    return null;
  }
}

/** Waits until `pid` no longer exists (or is a zombie), polling every 20 ms, at most `ms`. */
async function waitGone(pid: number, ms: number): Promise<boolean> {
  const until = Date.now() + ms;
  while (procStartTime(pid) !== null) {
    if (Date.now() >= until) return false;
    await sleep(20);
  }
  return true;
}

/** `name` itself when it contains a '/', else the first executable `PATH` entry of that name; null when there is none. */
function findExecutable(name: string): string | null {
  const ok = (p: string) => {
    try {
      accessSync(p, fsConstants.X_OK);
      return isFile(p);
    } catch {
      return false;
    }
  };
  if (name.includes('/')) return ok(name) ? path.resolve(name) : null;
  for (const d of (process.env.PATH ?? '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin').split(':')) {
    if (d && ok(path.join(d, name))) return path.join(d, name);
  }
  return null;
}

function isFile(p: string): boolean {
  try {
    return statSync(p).isFile();
  } catch {
    return false;
  }
}

/** The group of /dev/kvm when it grants that group read-write access (so an unprivileged VMM in it can use KVM), else null. */
function kvmGroup(): number | null {
  try {
    const st = statSync('/dev/kvm');
    return st.gid !== 0 && (st.mode & 0o060) === 0o060 ? st.gid : null;
  } catch {
    return null;
  }
}
