/**
 * dsecd's side of the seccomp monitor (native/seccomp-monitor/monitor.c): starts or adopts
 * the instance's monitor process, reads its control stream, and keeps per-sandbox denial
 * counts for stats and events.
 *
 * Layout under `<root>/seccomp/`: `notify.sock` (runc hands each sandbox's notify fd
 * there: the spec's `listenerPath`), `control.sock` (this module reads denials from it),
 * `monitor.lock`, `monitor.pid`, `monitor.log`, `seen.json` (the per-sandbox counts this
 * dsecd last read, so that the next one can tell what was denied while none was connected).
 *
 * Contracts:
 * - The monitor is a process of its own, started detached, so it (and its EPERM answers
 *   and counts) outlives dsecd; the next dsecd connects to it and receives the totals.
 * - A sandbox's filter names the monitor only if the monitor was reachable when the
 *   sandbox was created or started ({@link SeccompMonitor.listenerFor}); otherwise the
 *   sandbox gets plain EPERM rules, is not counted, and a create never fails because of
 *   the monitor.
 * - Denials while no dsecd is connected are counted by the monitor; the next dsecd finds
 *   them as the difference between the monitor's totals and `seen.json` and reports them
 *   once ({@link SeccompMonitorOptions.onMissed}). `seen.json` is written at once after a
 *   quiet second and at most once a second under a stream of denials, so after a crash
 *   the last second's denials may be reported a second time.
 * - If the monitor dies, the kernel fails the notified calls with ENOSYS: still denied,
 *   no longer counted, until the sandbox is started again. `dsec host info` says so.
 */
import { spawn } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import type { Logger } from 'pino';
import { repoRoot } from '../host/native.js';
import { procStartTime } from '../host/proc.js';

/** Denials of one sandbox as the monitor counted them. */
export interface SeccompCounts {
  /** Denied calls since the sandbox's filter was installed (across dsecd restarts). */
  total: number;
  /** Denials per syscall name (x86-64 numbering; i386 and x32 calls are named too). */
  by_syscall: Record<string, number>;
  /** The sandbox passed the monitor's flood limit: later denials fail with ENOSYS, uncounted. */
  flooded: boolean;
}

/** One denied call, as reported to {@link SeccompMonitorOptions.onDenied}. */
export interface SeccompDenial {
  sandboxId: string;
  /** Syscall name, or `syscall_<nr>` when unknown. */
  syscall: string;
  /** Host pid of the caller. */
  pid: number;
  /** First three syscall arguments (e.g. fd, ioctl command, argument pointer). */
  args: number[];
  /** The sandbox's total after this denial. */
  total: number;
}

/** Options of {@link SeccompMonitor.start}. */
export interface SeccompMonitorOptions {
  /** `<root>/seccomp`. */
  dir: string;
  log: Logger;
  /** The monitor binary; default native/seccomp-monitor/dsec-seccomp-monitor in the repository. */
  binary?: string;
  /** Denials after which a sandbox is no longer counted (monitor `--flood`); default 100,000. */
  floodLimit?: number;
  /** Called for every denial read from the monitor. */
  onDenied?: (d: SeccompDenial) => void;
  /** Called when a sandbox passes the flood limit. */
  onFlood?: (sandboxId: string, total: number) => void;
  /**
   * Called once per sandbox, on (re)connecting, when the monitor counted denials that no
   * dsecd read (it was down or disconnected): `n` calls, per syscall name, and the total.
   */
  onMissed?: (sandboxId: string, n: number, bySyscall: Record<string, number>, total: number) => void;
}

/** How often the counts dsecd has read are saved to `seen.json`: at most once per 1 s. */
const SEEN_SAVE_MS = 1000;

/** AUDIT_ARCH_I386 (include/uapi/linux/audit.h): the arch of a 32-bit x86 call. */
const AUDIT_ARCH_I386 = 0x40000003;
/** __X32_SYSCALL_BIT: x32 calls are x86-64 numbers with this bit set. */
const X32_BIT = 0x40000000;
/** Marks an i386 call in the monitor's per-syscall keys (monitor.c I386_KEY_BIT). */
const I386_KEY_BIT = 0x10000000;
/** How long start() waits for a freshly spawned monitor to accept connections: 5 s. */
const SPAWN_WAIT_MS = 5000;

let names: { x86_64: Record<string, string>; i386: Record<string, string> } | null = null;

/** Name of syscall `nr` of audit arch `arch` (table built with the monitor from the kernel headers). */
export function syscallName(nr: number, arch: number): string {
  if (!names) {
    try {
      names = JSON.parse(readFileSync(path.join(repoRoot(), 'native/seccomp-monitor/syscalls.json'), 'utf8'));
    } catch {
      names = { x86_64: {}, i386: {} };
    }
  }
  if (arch === AUDIT_ARCH_I386) return names!.i386[String(nr)] ?? `syscall_${nr}`;
  const n = nr & ~X32_BIT;
  return names!.x86_64[String(n)] ?? `syscall_${nr}`;
}

/** The instance's seccomp monitor. */
export class SeccompMonitor {
  private sock: net.Socket | null = null;
  private readonly counts = new Map<string, { total: number; byNr: Map<string, number>; flooded: boolean }>();
  private buf = '';
  private connecting: Promise<boolean> | null = null;
  private closed = false;
  private seenTimer: NodeJS.Timeout | null = null;
  private lastSeenSave = 0;
  /** Why the monitor is not reachable, when it is not. */
  reason: string | null = 'not started';

  private constructor(private readonly o: SeccompMonitorOptions) {}

  /** Socket runc connects to. */
  get listenerPath(): string {
    return path.join(this.o.dir, 'notify.sock');
  }

  private get controlPath(): string {
    return path.join(this.o.dir, 'control.sock');
  }

  private get pidFile(): string {
    return path.join(this.o.dir, 'monitor.pid');
  }

  /** The monitor binary (see {@link SeccompMonitorOptions.binary}). */
  static defaultBinary(): string {
    return path.join(repoRoot(), 'native/seccomp-monitor/dsec-seccomp-monitor');
  }

  /**
   * Adopts the running monitor of this instance, or starts one. Never throws: when the
   * monitor cannot run (binary missing, kernel without user notification) the result is
   * unavailable with a {@link reason}, and sandboxes get uncounted EPERM rules.
   */
  static async start(o: SeccompMonitorOptions): Promise<SeccompMonitor> {
    const m = new SeccompMonitor(o);
    mkdirSync(o.dir, { recursive: true, mode: 0o700 });
    await m.ensure();
    return m;
  }

  /** Whether the monitor is connected now. */
  get available(): boolean {
    return this.sock !== null && !this.sock.destroyed;
  }

  /**
   * Makes sure the monitor is reachable: reconnects, or starts a new one when none
   * answers. Resolves with {@link available}. Safe to call concurrently.
   */
  ensure(): Promise<boolean> {
    if (this.available) return Promise.resolve(true);
    this.connecting ??= this.connectOrSpawn().finally(() => { this.connecting = null; });
    return this.connecting;
  }

  /**
   * The notify settings for a sandbox's filter, or undefined when the monitor is not
   * reachable (the sandbox then gets plain EPERM rules).
   */
  async listenerFor(sandboxId: string): Promise<{ listenerPath: string; metadata: string } | undefined> {
    if (this.closed) return undefined;
    return (await this.ensure()) ? { listenerPath: this.listenerPath, metadata: sandboxId } : undefined;
  }

  /** Denials of `sandboxId`, or null when the monitor never saw it (not counted, or none yet and not adopted). */
  countsFor(sandboxId: string): SeccompCounts | null {
    const c = this.counts.get(sandboxId);
    if (!c) return null;
    return { total: c.total, by_syscall: Object.fromEntries(c.byNr), flooded: c.flooded };
  }

  /** Drops the counts of a destroyed sandbox. */
  forget(sandboxId: string): void {
    this.counts.delete(sandboxId);
    this.saveSeenSoon();
  }

  private get seenPath(): string {
    return path.join(this.o.dir, 'seen.json');
  }

  /** The counts the previous dsecd had read, per sandbox (empty when none were saved). */
  private loadSeen(): Map<string, { total: number; counts: Record<string, number> }> {
    try {
      return new Map(Object.entries(JSON.parse(readFileSync(this.seenPath, 'utf8')) as Record<string, { total: number; counts: Record<string, number> }>));
    } catch {
      return new Map();
    }
  }

  /** Saves now when the last save is a second old, else once the second is over. */
  private saveSeenSoon(): void {
    if (this.seenTimer) return;
    const wait = this.lastSeenSave + SEEN_SAVE_MS - Date.now();
    if (wait <= 0) this.saveSeen();
    else this.seenTimer = setTimeout(() => this.saveSeen(), wait);
  }

  /** Writes the counts read so far (atomically: a torn file would report everything again). */
  private saveSeen(): void {
    if (this.seenTimer) clearTimeout(this.seenTimer);
    this.seenTimer = null;
    this.lastSeenSave = Date.now();
    const out: Record<string, { total: number; counts: Record<string, number> }> = {};
    for (const [id, c] of this.counts) out[id] = { total: c.total, counts: Object.fromEntries(c.byNr) };
    try {
      writeFileSync(this.seenPath + '.tmp', JSON.stringify(out), { mode: 0o600 });
      renameSync(this.seenPath + '.tmp', this.seenPath);
    } catch (e) {
      this.o.log.warn({ err: e }, 'cannot save the seccomp counts read so far; denials may be reported again after a restart');
    }
  }

  /** Disconnects (the monitor keeps running and counting). Safe to call twice. */
  close(): void {
    if (this.seenTimer) this.saveSeen();
    this.closed = true;
    this.sock?.destroy();
    this.sock = null;
  }

  /**
   * Stops the instance's monitor by its pid file (dsecd --purge). The pid is checked
   * against /proc (its command line names the monitor) so a reused pid is never signalled.
   */
  static stop(dir: string): void {
    const pf = path.join(dir, 'monitor.pid');
    if (!existsSync(pf)) return;
    const pid = Number(readFileSync(pf, 'utf8').trim());
    if (!Number.isInteger(pid) || pid <= 1) return;
    try {
      if (!readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('dsec-seccomp-monitor')) return;
      process.kill(pid, 'SIGTERM');
    } catch { /* gone */ }
  }

  private async connectOrSpawn(): Promise<boolean> {
    if (this.closed) return false;
    if (await this.connect()) return true;
    const bin = this.o.binary ?? SeccompMonitor.defaultBinary();
    if (!existsSync(bin)) {
      this.reason = `monitor binary ${bin} is not built (make -C native)`;
      return false;
    }
    const logFd = openSync(path.join(this.o.dir, 'monitor.log'), 'a', 0o600);
    try {
      const child = spawn(bin, ['--notify', this.listenerPath, '--control', this.controlPath, '--lock', path.join(this.o.dir, 'monitor.lock'),
        '--pid-file', this.pidFile, '--flood', String(this.o.floodLimit ?? 100_000)], { detached: true, stdio: ['ignore', logFd, logFd] });
      child.unref();
      child.on('error', (e) => { this.reason = `cannot start ${bin}: ${e.message}`; });
    } finally {
      closeSync(logFd);
    }
    const deadline = Date.now() + SPAWN_WAIT_MS;
    while (Date.now() < deadline) {
      if (await this.connect()) return true;
      await new Promise((r) => setTimeout(r, 25));
    }
    let tail = '';
    try {
      tail = readFileSync(path.join(this.o.dir, 'monitor.log'), 'utf8').trim().split('\n').slice(-2).join('; ');
    } catch { /* none */ }
    this.reason = `seccomp monitor did not start within ${SPAWN_WAIT_MS} ms${tail ? `: ${tail}` : ''}`;
    return false;
  }

  /** One connection attempt to the control socket; resolves true once the hello arrived. */
  private connect(): Promise<boolean> {
    return new Promise((resolve) => {
      if (!existsSync(this.controlPath)) return resolve(false);
      const s = net.createConnection({ path: this.controlPath });
      let hello = false;
      const fail = () => {
        if (!hello) resolve(false);
      };
      s.once('error', fail);
      s.once('close', () => {
        if (this.sock === s) {
          this.sock = null;
          this.reason = 'seccomp monitor connection lost';
          this.o.log.warn('seccomp monitor connection lost; denials of running sandboxes fail with ENOSYS and are not counted until the monitor is back');
        }
        fail();
      });
      s.setEncoding('utf8');
      s.on('data', (chunk: string) => {
        this.buf += chunk;
        let nl;
        while ((nl = this.buf.indexOf('\n')) >= 0) {
          const line = this.buf.slice(0, nl);
          this.buf = this.buf.slice(nl + 1);
          let msg: Record<string, unknown>;
          try {
            msg = JSON.parse(line);
          } catch {
            continue;
          }
          if (msg.type === 'hello' && !hello) {
            hello = true;
            this.sock = s;
            this.reason = null;
            this.adoptHello(msg);
            resolve(true);
          } else {
            this.handle(msg);
          }
        }
      });
    });
  }

  private adoptHello(msg: Record<string, unknown>): void {
    for (const e of (msg.sandboxes as { id: string; total: number; counts: Record<string, number>; flooded: boolean }[]) ?? []) {
      const byNr = new Map<string, number>();
      for (const [key, n] of Object.entries(e.counts)) {
        const k = Number(key);
        const name = k & I386_KEY_BIT ? syscallName(k & ~I386_KEY_BIT, AUDIT_ARCH_I386) : syscallName(k, 0);
        byNr.set(name, (byNr.get(name) ?? 0) + n);
      }
      this.counts.set(e.id, { total: e.total, byNr, flooded: e.flooded });
    }
    // What the monitor counted beyond what a dsecd last read was denied while none listened.
    const seen = this.loadSeen();
    for (const [id, c] of this.counts) {
      const before = seen.get(id) ?? { total: 0, counts: {} };
      const n = c.total - before.total;
      if (n <= 0) continue;
      const by: Record<string, number> = {};
      for (const [name, k] of c.byNr) if (k > (before.counts[name] ?? 0)) by[name] = k - (before.counts[name] ?? 0);
      this.o.onMissed?.(id, n, by, c.total);
    }
    this.saveSeen();
  }

  private handle(msg: Record<string, unknown>): void {
    const id = String(msg.id ?? '');
    if (!id) return;
    if (msg.type === 'denied') {
      const name = syscallName(Number(msg.nr), Number(msg.arch));
      const c = this.counts.get(id) ?? { total: 0, byNr: new Map(), flooded: false };
      c.total = Number(msg.total);
      c.byNr.set(name, (c.byNr.get(name) ?? 0) + 1);
      this.counts.set(id, c);
      this.saveSeenSoon();
      this.o.onDenied?.({ sandboxId: id, syscall: name, pid: Number(msg.pid), args: (msg.args as number[]) ?? [], total: c.total });
    } else if (msg.type === 'flood') {
      const c = this.counts.get(id);
      if (c) c.flooded = true;
      this.o.onFlood?.(id, Number(msg.total));
    }
  }
}

/** True when the recorded monitor pid is alive (for `dsec host info`). */
export function monitorPid(dir: string): number | null {
  try {
    const pid = Number(readFileSync(path.join(dir, 'monitor.pid'), 'utf8').trim());
    return Number.isInteger(pid) && procStartTime(pid) !== null ? pid : null;
  } catch {
    return null;
  }
}

/** Denials of one sandbox are reported in at most one event per this interval: 1 s (a probe loop must not flood the store). */
export const DENIAL_EVENT_MS = 1000;

/**
 * Coalesces denials into `seccomp.denied` events: per sandbox, one event per
 * {@link DENIAL_EVENT_MS} at most, naming how many calls were denied, which ones, the
 * last call with its arguments, and the sandbox's running total.
 */
export class DenialEvents {
  private readonly pending = new Map<string, { n: number; last: SeccompDenial; bySyscall: Map<string, number> }>();
  private timer: NodeJS.Timeout | null = null;

  constructor(private readonly emit: (sandboxId: string, message: string) => void, private readonly intervalMs = DENIAL_EVENT_MS) {}

  /** Records one denial; the event follows within the interval. */
  add(d: SeccompDenial): void {
    const p = this.pending.get(d.sandboxId) ?? { n: 0, last: d, bySyscall: new Map<string, number>() };
    p.n++;
    p.last = d;
    p.bySyscall.set(d.syscall, (p.bySyscall.get(d.syscall) ?? 0) + 1);
    this.pending.set(d.sandboxId, p);
    this.timer ??= setTimeout(() => this.flush(), this.intervalMs);
  }

  /** Reports that a sandbox passed the flood limit (after its pending denials). */
  flood(sandboxId: string, total: number): void {
    this.flushOne(sandboxId);
    this.emit(sandboxId, `${total} denials: past the flood limit, later denials of this sandbox fail with ENOSYS and are no longer counted`);
  }

  /** Reports denials the monitor counted while no dsecd was connected (one event). */
  missed(sandboxId: string, n: number, bySyscall: Record<string, number>, total: number): void {
    const which = Object.entries(bySyscall).map(([s, k]) => (k > 1 ? `${s} x${k}` : s)).join(', ');
    this.emit(sandboxId, `${n} system call${n > 1 ? 's' : ''} denied while dsecd was not connected${which ? ` (${which})` : ''}; ${total} in all`);
  }

  /** Emits everything pending and stops the timer. Safe to call twice. */
  close(): void {
    this.flush();
  }

  private flush(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    for (const id of [...this.pending.keys()]) this.flushOne(id);
  }

  private flushOne(id: string): void {
    const p = this.pending.get(id);
    if (!p) return;
    this.pending.delete(id);
    const which = [...p.bySyscall].map(([s, n]) => (n > 1 ? `${s} x${n}` : s)).join(', ');
    const args = p.last.args.map((a) => `0x${BigInt(a).toString(16)}`).join(', ');
    this.emit(id, `${p.n} system call${p.n > 1 ? 's' : ''} denied (${which}); last ${p.last.syscall}(${args}) by host pid ${p.last.pid}; ${p.last.total} in all`);
  }
}
