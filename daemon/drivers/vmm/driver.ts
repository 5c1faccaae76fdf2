/**
 * What both VM tiers share: the life of a QEMU process per sandbox. The microvm tier
 * (daemon/drivers/microvm/) and the vm tier (daemon/drivers/vm/) extend {@link VmmDriver}
 * with their machine, disks and boot steps; the cgroup, the launcher and its
 * confinement, QMP with its resync, the agent endpoint and mux, stop, pause and resume,
 * adopt and orphans are written once here.
 *
 * Boot (create or start): cgroup with the sandbox's limits → `dsec-vmm-launch` joins it
 * and execs QEMU (detached: QEMU outlives dsecd) → QMP answers → the tier's boot steps
 * ({@link VmmDriver.bootGuest}: by default the mux handshake with the guest agent,
 * retried while the guest boots, then the agent's HELLO). Any failure within the boot
 * timeout kills QEMU by pid and reports QEMU's stderr and the console log's tail.
 *
 * State that survives a dsecd restart: QEMU itself (pid + /proc starttime in the store,
 * its command line naming this sandbox dir), its sockets and the disks. `adopt`
 * reconnects QMP and rebinds agent.sock; the next agent connection opens a new mux
 * session, and the guest drops the previous dsecd's streams (their execs end as after a
 * lost connection).
 */
import { chmod, mkdir, readdir, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { ChildProcess } from 'node:child_process';
import type { Logger } from 'pino';
import type { AgentClient, AgentExecHandle } from '../../agent/client.js';
import type { VmConfig } from '../../config.js';
import { DsecError, deadlineExceeded, failedPrecondition, internal, isDsecError, resourceExhausted } from '../../errors.js';
import type { CgroupManager } from '../../host/cgroups/index.js';
import { hostHasSwap, procStartTime } from '../../host/proc.js';
import { removeSandboxDir } from '../../image/rootfs.js';
import type { Backend } from '../../model/backend.js';
import { effectiveLayers } from '../../model/image.js';
import type { DefenceStatus, SandboxRecord } from '../../model/sandbox.js';
import { MACHINE_STATE_FILE, type MachineRestore, type MachineSnapshot } from '../../model/snapshot.js';
import type { StepObserver } from '../../model/steps.js';
import { AgentConnections, refuseBadCwdOrUser } from '../agent-connections.js';
import { BATCH_CPU_SHARES, CPU_PERIOD_US, cpuQuotaUs } from '../cgroup-limits.js';
import { shuttingDown } from '../shutdown.js';
import type {
  AgentFiles, BackendCapabilities, DriverExecHandlers, DriverExecRequest, DriverExecResult, DriverStartExecRequest, InitInfo, LiveUpdate, OrphanReport,
  ReclaimReport, SandboxDriver, SandboxStats,
} from '../types.js';
import { prepareConfinement, vmmDefences } from './confinement.js';
import { VmEndpoint } from './endpoint.js';
import { sleep, u32, u64, waitGone } from './host.js';
import { VmmPlatform, type Platform } from './platform.js';
import { QmpClient } from './qmp.js';
import { QmpLinks } from './qmp-link.js';
import { isVmmOf, spawnVmm, tailFile, vmPaths, vmmOfDir, vmmOverheadBytes, type VmmConfinement } from './qemu.js';
import { GuestOp, type VmuxSession } from './vmux.js';

/** How long stop waits for QEMU to exit after `quit` before SIGKILL: 5 s. */
export const QUIT_WAIT_MS = 5_000;
/** How often stop polls the guest's process count during a grace period: 100 ms (one mux round trip is ~2 ms). */
const GRACE_POLL_MS = 100;
/** How long a guest `sync` may take at stop: 30 s (it flushes the guest page cache to the disk file). */
const SYNC_TIMEOUT_MS = 30_000;
/** How long a boot step that lost a socket waits for QEMU's exit to be reported: 1 s (QEMU exits within ms of closing its sockets). */
const EXIT_GRACE_MS = 1_000;
/** Connect timeout of an agent connection through the mux: 10 s (a busy TCG guest answers slowly). */
const AGENT_TIMEOUT_MS = 10_000;

/** The machine one QEMU was started with (`machine.json` in its sandbox dir; see MachineSnapshot for the fields). */
export type MachineSpec = Pick<MachineSnapshot, 'accel' | 'memoryMiB' | 'vcpus' | 'kernel' | 'initrd' | 'tscKhz' | 'layers'>;

/** Dependencies of a VM driver, built once by the daemon. */
export interface VmmDriverDeps {
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
}

/** What one boot's steps get (see {@link VmmDriver.bootGuest}). */
export interface BootContext {
  /** Races a promise against QEMU's exit and the boot deadline; throws the boot error. */
  step: <T>(p: Promise<T>) => Promise<T>;
  /** Boot deadline, ms since the epoch. */
  deadline: number;
  qmp: QmpClient;
  ep: VmEndpoint;
}

/** The QEMU process lifecycle of one VM tier; see the module comment. */
export abstract class VmmDriver implements SandboxDriver {
  abstract readonly backends: readonly Backend[];
  /** The sandboxes' backend. */
  abstract readonly backend: Backend;
  /** The tier's machine in messages: `microVM` or `VM`. */
  protected abstract readonly machineName: string;
  protected readonly endpoints = new Map<string, VmEndpoint>();
  /** The agent connections of its VMs (through each VM's endpoint). */
  protected readonly agents: AgentConnections;
  /** The QMP connections of its VMs. */
  protected readonly qmp: QmpLinks;
  /** What every boot of this tier needs (QEMU, kernel, initramfs, accelerator). */
  protected readonly platform: VmmPlatform;
  /** Set by {@link close}: no connection to a VM is made any more. */
  private closed = false;
  /** Layer digests each live VM has attached (the blob cache must not evict them). */
  private readonly blobs = new Map<string, string[]>();

  constructor(protected readonly d: VmmDriverDeps) {
    this.agents = new AgentConnections({ socketPath: (id) => vmPaths(this.dir(id)).agentSock, timeoutMs: AGENT_TIMEOUT_MS });
    this.qmp = new QmpLinks({
      socketPath: (id) => vmPaths(this.dir(id)).qmp, timeoutMs: d.vm.qmpTimeoutMs, closed: () => this.closed, log: d.log,
      alive: (sb) => sb.initPid !== null && isVmmOf(sb.initPid, this.dir(sb.id)),
    });
    this.platform = new VmmPlatform({ root: d.root, vm: d.vm, agentBinary: d.agentBinary, launcher: d.launcher, log: d.log, modules: () => this.guestModules() });
  }

  /** `<root>/sandboxes/<id>`. */
  dir(id: string): string {
    return path.join(this.d.root, 'sandboxes', id);
  }

  /**
   * Finds QEMU. The platform work (the initramfs build and, with `accel = "auto"`, the KVM
   * probe boot) waits for the first create. Never throws: what is missing is reported by
   * {@link capabilities} and by create.
   */
  async init(): Promise<void> {
    this.platform.init();
  }

  abstract capabilities(backend: Backend): BackendCapabilities;

  /** What the host lacks for this tier, with the fix; null when nothing. */
  protected missing(): string | null {
    return this.platform.missing();
  }

  /** The accelerator verdict for `dsec host info`: which one VMs use and why. */
  accelInfo(): Promise<{ available: boolean; reason: string }> {
    return this.platform.accelInfo();
  }

  /** Layer digests attached by live VMs (the blob cache must not evict their files). */
  pinnedLayers(): Set<string> {
    return new Set([...this.blobs.values()].flat());
  }

  /** The sandbox's endpoint (agent.sock into the guest's mux). @throws DsecError Unavailable once {@link close} ran. */
  protected endpoint(id: string): VmEndpoint {
    if (this.closed) throw shuttingDown();
    let ep = this.endpoints.get(id);
    if (!ep) {
      ep = new VmEndpoint({ dir: this.dir(id), what: `sandbox ${id}`, log: this.d.log });
      this.endpoints.set(id, ep);
    }
    return ep;
  }

  /** Checks a sandbox against what a VM of this tier can be, before anything is made. @throws DsecError FailedPrecondition, InvalidArgument. */
  protected abstract check(sb: SandboxRecord): void;

  async prepare(sb: SandboxRecord, steps: StepObserver, restore?: MachineRestore): Promise<void> {
    this.check(sb);
    if (restore) this.checkRestore(sb, restore);
    const dir = this.dir(sb.id);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await chmod(dir, 0o700);
    await this.makeDisks(sb, restore);
    steps.hit('create.after-rootfs');
  }

  /**
   * Checks that `sb` can be the machine of the snapshot `r` (a tier with machine
   * snapshots overrides it).
   * @throws DsecError FailedPrecondition: this tier restores no machine snapshot.
   */
  protected checkRestore(sb: SandboxRecord, _r: MachineRestore): void {
    throw failedPrecondition(`backend ${sb.backend} cannot restore machine snapshots`);
  }

  /** Makes the disks of a new VM in its (empty) dir: the writable disk, fresh or the snapshot's copy (`restore`), and any other. */
  protected abstract makeDisks(sb: SandboxRecord, restore?: MachineRestore): Promise<void>;

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

  /** Host path of the sandbox's writable disk. */
  protected abstract writableDisk(id: string): string;

  /** The guest's swap disk for this boot (`restoreFrom`: a snapshot's copy); none by default. */
  protected async prepareSwap(_sb: SandboxRecord, _restoreFrom: string | null): Promise<void> {}

  /** Kernel modules of the tier's initramfs. */
  protected abstract guestModules(): readonly string[];

  /** Layer digests attached to the VM, lowest first. */
  protected abstract attachedLayers(sb: SandboxRecord): string[];

  /**
   * The files the VMM maps for the layers of one boot (by default the verified blobs
   * themselves, as read-only disks); a tier may lay them out otherwise (microvm: as
   * persistent memory, through aligned copies).
   */
  protected async layerFiles(_sb: SandboxRecord, _plat: Platform, _digests: string[], blobs: string[], _guestMiB: number): Promise<string[]> {
    return blobs;
  }

  /** The QEMU argument vector of one boot. */
  protected abstract qemuCommand(sb: SandboxRecord, plat: Platform, layers: string[], guestMiB: number): Promise<string[]>;

  /** Host files one boot reads (bound read-only into the VMM's mount namespace): kernel, initramfs, layer files. */
  protected bootFiles(_sb: SandboxRecord, plat: Platform, layers: string[]): string[] {
    return [plat.kernel, plat.initramfs.path, ...layers];
  }

  /** The platform of one boot: this tier's, or the one a machine snapshot was taken with (`restore`). */
  protected platformFor(_restore?: MachineRestore): Promise<Platform> {
    return this.platform.get();
  }

  /** Files that describe a running boot (removed before each launch); none by default. */
  protected bootRecords(_id: string): string[] {
    return [];
  }

  /** Files of a running boot removed at stop; none by default. */
  protected stopRecords(_id: string): string[] {
    return [];
  }

  /**
   * Starts QEMU in the sandbox's cgroup and waits until the guest is up (within the boot
   * timeout). On failure QEMU is killed and its cgroup removed; the error names what
   * failed with the console's tail.
   */
  private async launch(sb: SandboxRecord, steps: StepObserver, op: 'create' | 'start', restore?: MachineRestore): Promise<InitInfo> {
    const t0 = Date.now();
    const deadline = t0 + this.d.vm.bootTimeoutMs;
    const dir = this.dir(sb.id);
    const paths = vmPaths(dir);
    const plat = await this.platformFor(restore);
    const blobs: string[] = [];
    const digests = this.attachedLayers(sb);
    this.blobs.set(sb.id, digests);
    for (const dg of digests) blobs.push(await this.d.blobPath(dg));
    for (const f of [paths.qmp, paths.vmux, paths.agentSock, paths.pid, paths.migrate, ...this.bootRecords(sb.id)]) await rm(f, { force: true });

    const guestMiB = Math.ceil(sb.memoryBytes / (1024 * 1024));
    const mapped = await this.layerFiles(sb, plat, digests, blobs, guestMiB);
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
    const args = [...await this.qemuCommand(sb, plat, blobs, guestMiB), ...(restore ? ['-incoming', 'defer'] : [])];
    const spec: MachineSpec = {
      accel: plat.accel, memoryMiB: guestMiB, vcpus: Math.max(1, Math.ceil(sb.cpus)), kernel: plat.kernel, initrd: plat.initramfs.path,
      tscKhz: plat.tscKhz, layers: digests,
    };
    await writeFile(paths.machine, JSON.stringify(spec), { mode: 0o600 });
    const confine = await this.confinement(sb, plat, mapped);
    let child: ChildProcess;
    try {
      child = spawnVmm({
        launcher: this.d.launcher, qemu: this.platform.qemuPath!, args, cgroupProcs: this.d.cgroups.procsFiles(sb.id),
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
    const timeoutError = (why?: string) => this.bootError(sb, `the ${this.machineName} did not boot within ${this.d.vm.bootTimeoutMs} ms${why ? ` (${why})` : ''}`, 'DeadlineExceeded', null);
    // A QEMU that exits while loading a snapshot's state refused that state (the log says why).
    const exitError = () => (restore
      ? this.bootError(sb, `snapshot ${restore.snapshotId} cannot be restored: QEMU could not load its machine state (${path.join(restore.dir, MACHINE_STATE_FILE)}) and exited`, 'FailedPrecondition', state.exit)
      : this.bootError(sb, 'QEMU exited during boot', null, state.exit));
    // One boot step, raced against QEMU's exit and the boot deadline.
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
      // QMP first (QEMU is up), then the tier's boot steps (the guest and its agent).
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
      this.qmp.set(sb.id, qmp);
      steps.hit(op === 'create' ? 'create.after-runtime' : 'start.after-runtime');
      await this.bootGuest(sb, { step, deadline, qmp, ep }, restore);
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

  /** The VMM's confinement for one boot (./confinement.ts), over the files it maps for the layers. */
  protected confinement(sb: SandboxRecord, plat: Platform, layers: string[]): Promise<VmmConfinement | null> {
    return prepareConfinement(this.d.vm.confine, {
      dir: this.dir(sb.id), uidBase: sb.uidBase, what: `sandbox ${sb.id}`, accel: plat.accel, qemu: this.platform.qemuPath!,
      files: this.bootFiles(sb, plat, layers), writableDisk: this.writableDisk(sb.id), vmDir: path.join(this.d.root, 'vm'),
    });
  }

  /**
   * The boot steps after QMP answered, each raced by `ctx.step` against QEMU's exit and
   * the boot deadline: by default {@link connectGuest}. A tier that resumes machine
   * snapshots handles `restore` here.
   */
  protected async bootGuest(sb: SandboxRecord, ctx: BootContext, _restore?: MachineRestore): Promise<void> {
    await this.connectGuest(sb, ctx);
  }

  /** The mux session with the guest agent (retried while the guest boots), then the agent's HELLO; each a boot step. */
  protected async connectGuest(sb: SandboxRecord, ctx: BootContext): Promise<{ session: VmuxSession; client: AgentClient }> {
    const session = await ctx.step(ctx.ep.session(Math.max(1, ctx.deadline - Date.now())));
    const client = await ctx.step(this.agents.get(sb.id, Math.max(1000, ctx.deadline - Date.now())));
    return { session, client };
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

  /** Closes dsecd's connections to a VM (agent, mux, QMP, listener); the VM is not touched. */
  protected async dropConnections(id: string): Promise<void> {
    await this.agents.drop(id);
    const ep = this.endpoints.get(id);
    this.endpoints.delete(id);
    if (ep) await ep.close();
    await this.qmp.drop(id);
  }

  async stop(sb: SandboxRecord, steps: StepObserver, opts: { graceMs?: number } = {}): Promise<void> {
    const dir = this.dir(sb.id);
    const pid = sb.initPid !== null && isVmmOf(sb.initPid, dir) ? sb.initPid : vmmOfDir(dir)?.pid ?? null;
    if (pid !== null) {
      // A paused VM cannot act on anything: continue it first.
      if (sb.state === 'paused') await this.qmp.run(sb, 'cont').catch((e) => this.d.log.warn({ err: e, id: sb.id }, 'cont before stop failed'));
      const s = await this.endpoint(sb.id).session().catch(() => null);
      if (s && opts.graceMs && opts.graceMs > 0 && sb.state === 'running') {
        // SIGTERM to every guest process but the agent; wait for them (at most graceMs).
        await s.op(GuestOp.KILL_ALL, u32(15)).catch(() => {});
        const until = Date.now() + opts.graceMs;
        while (Date.now() < until && ((await s.op(GuestOp.PROCS).catch(() => 0)) > 0)) await sleep(GRACE_POLL_MS);
      }
      // The writable layer must be on the disk file before QEMU goes.
      if (s) await s.op(GuestOp.SYNC, undefined, SYNC_TIMEOUT_MS).catch((e) => this.d.log.warn({ err: e, id: sb.id }, 'guest sync at stop failed; the writable layer keeps what ext4 had committed'));
      await this.qmp.run(sb, 'quit').catch(() => {});
      await waitGone(pid, QUIT_WAIT_MS);
    }
    steps.hit('stop.after-kill');
    await this.killVmm(sb.id, pid);
    await this.dropConnections(sb.id);
    this.forget(sb.id);
    await this.d.cgroups.remove(sb.id);
    const p = vmPaths(dir);
    for (const f of [p.qmp, p.vmux, p.agentSock, p.pid, p.migrate, ...this.stopRecords(sb.id)]) await rm(f, { force: true });
  }

  async destroy(sb: SandboxRecord, steps: StepObserver): Promise<void> {
    await this.killVmm(sb.id, sb.initPid);
    steps.hit('destroy.after-kill');
    await this.dropConnections(sb.id);
    this.forget(sb.id);
    steps.hit('destroy.after-runtime');
    steps.hit('destroy.after-rootfs');
    await this.d.cgroups.killAll(sb.id).catch(() => {});
    await this.d.cgroups.remove(sb.id);
    steps.hit('destroy.after-cgroup');
    await removeSandboxDir(this.dir(sb.id));
    steps.hit('destroy.after-dir');
  }

  /** Drops what this driver keeps in memory about a VM that is gone (its pinned layers). */
  protected forget(id: string): void {
    this.blobs.delete(id);
  }

  async exec(sb: SandboxRecord, req: DriverExecRequest): Promise<DriverExecResult> {
    const res = await this.agents.exec(sb.id, req);
    refuseBadCwdOrUser(sb.id, res);
    // The guest's OOM killer is not visible in the VMM's cgroup (an OOM kill there would end QEMU itself).
    return { ...res, oom: false, oomKills: null };
  }

  async files(sb: SandboxRecord): Promise<AgentFiles> {
    return this.agents.client(sb.id);
  }

  async startExec(sb: SandboxRecord, req: DriverStartExecRequest, handlers: DriverExecHandlers): Promise<AgentExecHandle> {
    return this.agents.startExec(sb.id, req, handlers);
  }

  async stats(sb: SandboxRecord): Promise<SandboxStats | null> {
    if (sb.state !== 'running' && sb.state !== 'paused') return null;
    const st = await this.d.cgroups.stats(sb.id).catch((e: unknown) => {
      this.d.log.warn({ err: e, id: sb.id }, 'cgroup stats read failed');
      return null;
    });
    if (!st) return null;
    // The VMM's cgroup: its memory is the guest RAM QEMU has touched plus QEMU's own; pids are QEMU's threads.
    return {
      cpuUsageNs: st.cpuUsageNs, memoryBytes: st.memoryBytes, memoryLimitBytes: st.memoryLimitBytes, pids: st.pidsCurrent, oomKills: st.oomKills, pidsLimitHits: st.pidsLimitHits, seccompDenials: null,
      guestReclaim: sb.state === 'running' ? await this.guestReclaim(sb) : null,
    };
  }

  /** The guest's own memory reclaim, as of its last stats read; null by default (none runs). */
  protected async guestReclaim(_sb: SandboxRecord): Promise<SandboxStats['guestReclaim']> {
    return null;
  }

  /** Defences of `sb`: the VMM's confinement (as the kernel reports it) and the tier's in-guest defences. */
  async defences(sb: SandboxRecord): Promise<Record<string, DefenceStatus>> {
    return { ...vmmDefences(sb.initPid, this.dir(sb.id), this.d.vm), ...this.guestDefences(sb) };
  }

  /** The tier's in-guest defences of `sb` (readonly_paths, capabilities, no_new_privileges, seccomp, landlock). */
  protected abstract guestDefences(sb: SandboxRecord): Record<string, DefenceStatus>;

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
    const status = await this.qmp.run<{ status: string; running: boolean }>(sb, 'query-status');
    // A running sandbox is never left stopped (dsecd may have died in the middle of a pause
    // that it never committed; reconcile rolls an uncommitted pause back by resume()).
    if (sb.state === 'running' && sb.desired === null && !status.running) await this.qmp.run(sb, 'cont');
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
    await this.qmp.run(sb, 'stop');
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
    await this.qmp.run(sb, 'cont');
    // The guest's clock stood still while it was stopped: set it again (best effort).
    void this.endpoint(sb.id).session()
      .then((s) => s.op(GuestOp.SET_TIME, u64(BigInt(Date.now()) * 1_000_000n)))
      .catch((e) => this.d.log.warn({ err: e, id: sb.id }, 'setting the guest clock after resume failed'));
  }

  /** The writable layer of a VM is a disk image, not a host directory: commit and filesystem snapshots are not built for it. @throws DsecError FailedPrecondition. */
  async withWritableLayer<T>(sb: SandboxRecord, _fn: (upperDir: string, dsecCreated: readonly string[]) => Promise<T>): Promise<T> {
    throw failedPrecondition(`sandbox ${sb.id} is a ${sb.backend}: its writable layer is the ${this.writableDiskKind(sb.id)}, not a host directory; commit and filesystem snapshots of ${sb.backend} sandboxes are not built yet`);
  }

  /** The writable disk in words, e.g. `ext4 disk <path>`. */
  protected abstract writableDiskKind(id: string): string;

  /**
   * Closes dsecd's connections to every VM; from here on no new one is made (an operation
   * still in flight when dsecd shuts down fails Unavailable instead of keeping the process
   * alive). The VMs are not touched. Safe to call twice.
   */
  async close(): Promise<void> {
    this.closed = true;
    await this.agents.close();
    for (const id of new Set([...this.endpoints.keys(), ...this.qmp.ids()])) await this.dropConnections(id);
  }
}
