/**
 * dsecd's QMP links to its VMs: one cached connection per VM, commands with the
 * configured timeout and errors that name the sandbox, and the run state (vCPUs running
 * or stopped) put back once a QEMU that stopped answering answers again.
 */
import type { Logger } from 'pino';
import { DsecError, isDsecError } from '../../errors.js';
import type { SandboxRecord } from '../../model/sandbox.js';
import { refuseAfterClose, shuttingDown } from '../shutdown.js';
import { sleep } from './host.js';
import { QmpClient } from './qmp.js';

/** How often a resync looks for a QEMU that stopped answering: every 1 s. */
const RESYNC_POLL_MS = 1000;

/** What the links need from their driver. */
export interface QmpLinkOptions {
  /** Host path of sandbox `id`'s QMP socket. */
  socketPath(id: string): string;
  /** Timeout of a connect and of each command, ms (`[vm] qmp_timeout_s`). */
  timeoutMs: number;
  /** Whether the driver closed: no connection is made any more. */
  closed(): boolean;
  /** Whether the sandbox's recorded QEMU is still alive (a resync stops when it is gone). */
  alive(sb: SandboxRecord): boolean;
  log: Logger;
}

/** The QMP connections of one driver's VMs. */
export class QmpLinks {
  private readonly links = new Map<string, Promise<QmpClient>>();
  /**
   * Per VM: whether its vCPUs should run: what the last successful `stop`/`cont` asked
   * for (a failed one keeps the state before it, which is what the store still records).
   * After QMP stopped answering, a command may still be executed later (QEMU reads it
   * once it answers again); {@link resync} then makes the VM's run state match this.
   */
  private readonly wantRunning = new Map<string, boolean>();
  private readonly resyncing = new Set<string>();

  constructor(private readonly o: QmpLinkOptions) {}

  /** Takes `c`, a connection a boot just made, as sandbox `id`'s link. */
  set(id: string, c: QmpClient): void {
    const p = Promise.resolve(c);
    this.links.set(id, p);
    c.onClose(() => {
      if (this.links.get(id) === p) this.links.delete(id);
    });
  }

  /**
   * The VM's QMP connection, (re)connecting on first use.
   * @throws DsecError Unavailable (QEMU not running; the driver closed), DeadlineExceeded (QMP stopped answering).
   */
  get(id: string): Promise<QmpClient> {
    if (this.o.closed()) return Promise.reject(shuttingDown());
    let p = this.links.get(id);
    if (!p) {
      p = refuseAfterClose(this.o.closed, QmpClient.connect(this.o.socketPath(id), { timeoutMs: this.o.timeoutMs }));
      const mine = p;
      this.links.set(id, p);
      p.then((c) => c.onClose(() => { if (this.links.get(id) === mine) this.links.delete(id); }), () => { if (this.links.get(id) === mine) this.links.delete(id); });
    }
    return p;
  }

  /** Records that sandbox `id`'s vCPUs run (or not) now, without a command (a restore continued them). */
  running(id: string, running: boolean): void {
    this.wantRunning.set(id, running);
  }

  /**
   * Runs one QMP command with the configured timeout, naming the sandbox in errors. When
   * QMP does not answer, a background {@link resync} is started.
   * @throws DsecError DeadlineExceeded (QMP stopped answering), Unavailable (QEMU gone),
   *   Internal (QEMU refused the command).
   */
  async run<T>(sb: SandboxRecord, command: string, args?: Record<string, unknown>): Promise<T> {
    const runState = command === 'stop' || command === 'cont';
    if (runState) this.wantRunning.set(sb.id, command === 'cont');
    try {
      const c = await this.get(sb.id);
      return await c.execute<T>(command, args, { timeoutMs: this.o.timeoutMs });
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
        while (this.o.alive(sb)) {
          await sleep(RESYNC_POLL_MS);
          try {
            const c = await this.get(sb.id);
            const st = await c.execute<{ running: boolean }>('query-status', undefined, { timeoutMs: this.o.timeoutMs });
            const want = this.wantRunning.get(sb.id);
            if (want !== undefined && want !== st.running) await c.execute(want ? 'cont' : 'stop', undefined, { timeoutMs: this.o.timeoutMs });
            this.o.log.info({ id: sb.id, running: want ?? st.running }, 'QMP answers again; run state restored');
            return;
          } catch { /* not yet */ }
        }
      } finally {
        this.resyncing.delete(sb.id);
      }
    })();
  }

  /** Closes and forgets sandbox `id`'s link (the VM is not touched). */
  async drop(id: string): Promise<void> {
    const q = this.links.get(id);
    this.links.delete(id);
    if (q) await q.then((c) => c.close(), () => {});
  }

  /** Ids of the VMs with a link (for a driver's close). */
  ids(): string[] {
    return [...this.links.keys()];
  }
}
