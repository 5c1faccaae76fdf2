/**
 * Machine snapshots of microVMs (`kind: vm`): the whole machine, RAM, CPU and device
 * state and the writable disk, captured from a running or paused VM and resumed in new
 * ones (docs/ARCHITECTURE.md "The microvm tier", microVM snapshots).
 *
 * Capture: the VM is stopped (QMP `stop`, which drains and flushes its disks), its
 * writable disk copied (a reflink where the filesystem has them) and its RAM and device
 * state streamed by QMP `migrate` to a Unix socket dsecd listens on in the sandbox dir
 * (the only place the confined VMM can reach; `exec:` migration would need a shell and a
 * fork, which the VMM's mount namespace and `-sandbox spawn=deny` refuse, and `fd:` would
 * need SCM_RIGHTS, which Node's sockets cannot send); then it continues. Restore: a new
 * QEMU with the machine's recorded configuration and `-incoming defer`, on its own copy
 * of the disk, is fed the stream through `migrate-incoming` on a socket in its own dir;
 * the guest resumes where it stopped and dsecd's new mux session takes over the agent port.
 */
import { createReadStream, createWriteStream } from 'node:fs';
import { createHash, randomBytes } from 'node:crypto';
import { chmod, chown, copyFile, readFile, rm, stat } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { execa } from 'execa';
import type { Logger } from 'pino';
import type { VmConfig } from '../../config.js';
import { deadlineExceeded, failedPrecondition, internal, unavailable } from '../../errors.js';
import type { SandboxRecord } from '../../model/sandbox.js';
import { MACHINE_DISK_FILE, MACHINE_STATE_FILE, type MachineRestore, type MachineSnapshot } from '../../model/snapshot.js';
import type { AgentConnections } from '../agent-connections.js';
import type { BootContext, MachineSpec } from '../vmm/driver.js';
import { connectUnix, copyDisk, isFile, procOwner, sleep, u64 } from '../vmm/host.js';
import type { Platform, VmmPlatform } from '../vmm/platform.js';
import type { QmpLinks } from '../vmm/qmp-link.js';
import { isVmmOf, vmPaths } from '../vmm/qemu.js';
import { GuestOp } from '../vmm/vmux.js';
import { snapshotSwapFile } from './reclaim.js';

/**
 * How long the migration of a machine snapshot may take: 10 min. A stopped VM's state
 * streams at ~100 MB/s (measured under TCG on a busy 2-core host: docs/ARCHITECTURE.md,
 * "The microvm tier", microVM snapshots), so this only ends a migration that hangs.
 */
const MIGRATE_TIMEOUT_MS = 600_000;
/** Host random bytes a restore mixes into the guest's pool: 64 (512 bits, twice the CRNG's 256-bit key). */
const RESEED_BYTES = 64;
/** How often a snapshot polls `query-migrate`, and a restore `query-status`: 20 ms (one QMP round trip is well under 1 ms). */
const MIGRATE_POLL_MS = 20;
/**
 * QEMU's `max-bandwidth` for a snapshot's migration: 1 TiB/s, i.e. unlimited. QEMU's
 * default (32 MiB/s) throttles live migration over a network; a stopped VM streaming to
 * a local file has no reason to be throttled.
 */
const MIGRATE_MAX_BANDWIDTH = 2 ** 40;

/** The copy of the source's `guest-confinement.json` in a machine snapshot's dir. */
const GUEST_CONFINEMENT_FILE = 'guest-confinement.json';
/** The guest reclaim record in a snapshot dir (the running boot's, see MicrovmDriver.reclaimFile). */
const GUEST_RECLAIM_FILE = 'guest-reclaim.json';

/**
 * Migration capability set on both ends of a machine snapshot: RAM blocks backed by a
 * shared file (`share=on`: the pmem layers' aligned copies) are neither written to the
 * state nor loaded from it; the restoring QEMU maps the same read-only copy. Without it
 * the stream would carry every layer, and loading it would write into the read-only
 * mapping (QEMU dies of SIGSEGV).
 */
const IGNORE_SHARED = [{ capability: 'x-ignore-shared', state: true }];

/** What machine snapshots use of their driver. */
export interface MachineSnapshotHost {
  /** `<root>/sandboxes/<id>`. */
  dir(id: string): string;
  /** Host path of the sandbox's writable disk. */
  writableDisk(id: string): string;
  /** The running boot's guest confinement record (guest-confinement.json): it travels with the machine. */
  confinementFile(id: string): string;
  /** The running boot's guest reclaim record (guest-reclaim.json): it travels with the machine. */
  reclaimFile(id: string): string;
  /** Continues a stopped VM and sets its clock. */
  resume(sb: SandboxRecord): Promise<void>;
  qmp: QmpLinks;
  agents: AgentConnections;
  platform: VmmPlatform;
  vm: Pick<VmConfig, 'qmpTimeoutMs'>;
  log: Logger;
}

/** Captures, checks and restores machine snapshots of one driver's microVMs. */
export class MachineSnapshots {
  constructor(private readonly o: MachineSnapshotHost) {}

  /**
   * The platform a restore boots with: this dsecd's, with the snapshot's kernel,
   * initramfs, accelerator and TSC rate (the guest was booted with those; its RAM holds
   * that kernel).
   * @throws DsecError FailedPrecondition (as {@link platform}; a KVM snapshot where KVM is not usable).
   */
  async restorePlatform(r: MachineRestore): Promise<Platform> {
    const plat = await this.o.platform.get();
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
  async incoming(sb: SandboxRecord, ctx: BootContext, r: MachineRestore): Promise<void> {
    const sock = vmPaths(this.o.dir(sb.id)).migrate;
    const qmpOpts = { timeoutMs: this.o.vm.qmpTimeoutMs };
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
    this.o.qmp.running(sb.id, true);
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
      .catch((e) => this.o.log.warn({ err: e, id: sb.id }, 'setting the guest clock after a restore failed'));
    await ctx.step(this.o.agents.get(sb.id, Math.max(1000, ctx.deadline - Date.now())));
    // The resumed guest's commands are confined as the source's were (its agent's state
    // came with the RAM); no record means the source was not confined, and inspect says so.
    await copyFile(path.join(r.dir, GUEST_CONFINEMENT_FILE), this.o.confinementFile(sb.id)).catch(() => {});
    // Its guest reclaim too: the agent's scheme came with the RAM.
    await copyFile(path.join(r.dir, GUEST_RECLAIM_FILE), this.o.reclaimFile(sb.id)).catch(() => {});
  }

  /**
   * The machine a running QEMU of this sandbox was started with (`machine.json`).
   * @throws DsecError FailedPrecondition when there is none (started by a dsecd without machine records).
   */
  private async machineSpec(sb: SandboxRecord): Promise<MachineSpec> {
    try {
      return JSON.parse(await readFile(vmPaths(this.o.dir(sb.id)).machine, 'utf8')) as MachineSpec;
    } catch (e) {
      throw failedPrecondition(`sandbox ${sb.id} has no machine record (${vmPaths(this.o.dir(sb.id)).machine}: ${(e as Error).message}); it was started by an older dsecd: stop and start it, then snapshot it`);
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
  async capture(sb: SandboxRecord, dir: string): Promise<MachineSnapshot> {
    const src = this.o.dir(sb.id);
    if ((sb.state !== 'running' && sb.state !== 'paused') || sb.initPid === null || !isVmmOf(sb.initPid, src)) {
      throw failedPrecondition(`sandbox ${sb.id} is ${sb.state}: a microvm snapshot captures the running machine (RAM and processes); start it first`);
    }
    const spec = await this.machineSpec(sb);
    const qmp = await this.o.qmp.get(sb.id).catch((e: Error) => { throw unavailable(`sandbox ${sb.id}: cannot reach QMP: ${e.message}`, e); });
    const v = qmp.version;
    const wasRunning = sb.state === 'running';
    const t0 = Date.now();
    let pausedMs = 0;
    let disk: { reflinked: boolean };
    let state: { bytes: number; sha256: string };
    if (wasRunning) await this.o.qmp.run(sb, 'stop');
    let failed = true;
    try {
      // QMP stop has drained and flushed the disks: the file is what the guest's RAM expects.
      disk = await copyDisk(this.o.writableDisk(sb.id), path.join(dir, MACHINE_DISK_FILE));
      // The guest's swap holds pages its RAM state refers to: it travels with the snapshot.
      await snapshotSwapFile(vmPaths(src).swap, dir, copyDisk);
      // The guest's confinement is part of its RAM state: a restore resumes it as applied,
      // so the record of what was applied travels with the snapshot.
      await copyFile(this.o.confinementFile(sb.id), path.join(dir, GUEST_CONFINEMENT_FILE)).catch(() => {});
      await copyFile(this.o.reclaimFile(sb.id), path.join(dir, GUEST_RECLAIM_FILE)).catch(() => {});
      state = await this.migrateOut(sb, path.join(dir, MACHINE_STATE_FILE));
      failed = false;
    } finally {
      pausedMs = Date.now() - t0;
      if (wasRunning) {
        try {
          await this.o.resume(sb);
        } catch (e) {
          // A failed snapshot reports its own error; a lost `cont` is resynced in the background (qmpRun).
          if (!failed) throw e;
          this.o.log.error({ err: e, id: sb.id }, 'continuing the VM after a failed snapshot failed');
        }
      }
    }
    const st = await stat(path.join(dir, MACHINE_DISK_FILE));
    this.o.log.info({ id: sb.id, pausedMs, stateBytes: state.bytes, reflink: disk.reflinked }, 'microvm machine snapshot');
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
    const sock = vmPaths(this.o.dir(sb.id)).migrate;
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
      await this.o.qmp.run(sb, 'migrate-set-capabilities', { capabilities: IGNORE_SHARED });
      await this.o.qmp.run(sb, 'migrate-set-parameters', { 'max-bandwidth': MIGRATE_MAX_BANDWIDTH });
      await this.o.qmp.run(sb, 'migrate', { uri: `unix:${sock}` });
      const deadline = Date.now() + MIGRATE_TIMEOUT_MS;
      for (;;) {
        const m = await this.o.qmp.run<{ status?: string; 'error-desc'?: string }>(sb, 'query-migrate');
        if (m.status === 'completed') break;
        if (m.status === 'failed' || m.status === 'cancelled') {
          const why = await Promise.race([done.then(() => null, (e: Error) => e.message), sleep(100).then(() => null)]);
          throw internal(`sandbox ${sb.id}: the migration of its state ${m.status}${m['error-desc'] ? `: ${m['error-desc']}` : ''}${why ? ` (writing ${file}: ${why})` : ''}`);
        }
        if (Date.now() >= deadline) {
          await this.o.qmp.run(sb, 'migrate_cancel').catch(() => {});
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
   * Checks a machine snapshot can be restored here (see SandboxExtras.checkMachine):
   * the state file has the recorded size and sha256 (read once per change of the file,
   * ~1 s per GB; later restores of an unchanged file skip the read), the disk copy
   * the recorded size, this QEMU the same major.minor version (the microvm machine type is
   * not versioned, so only the same QEMU is known to load the stream), the kernel and
   * initramfs are still here, and KVM is usable if the snapshot was taken under KVM.
   * @throws DsecError FailedPrecondition naming what is wrong (the caller names the snapshot).
   */
  async check(r: MachineRestore): Promise<void> {
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
      if (!this.o.platform.qemuPath) return null;
      const r = await execa(this.o.platform.qemuPath, ['--version'], { reject: false });
      return /version (\d+\.\d+\.\d+)/.exec(String(r.stdout))?.[1] ?? null;
    })();
    return this.qemuVersionP;
  }
  private qemuVersionP: Promise<string | null> | null = null;
  /** State files whose sha256 {@link checkMachine} verified, by path: the file's inode, size, mtime, ctime and the digest checked. */
  private readonly verifiedStates = new Map<string, string>();
}
