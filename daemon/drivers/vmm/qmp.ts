/**
 * A small client of the QEMU Machine Protocol (QMP) over a Unix socket: the greeting,
 * capability negotiation, commands matched to replies by id, and asynchronous events.
 * The npm registry has no well-kept QMP client, so this is the subset dsecd needs.
 *
 * Wire format (qemu docs/interop/qmp-spec): one JSON object per line in each direction.
 *   server → `{"QMP": {"version": …, "capabilities": […]}}` once, on connect;
 *   client → `{"execute": "qmp_capabilities"}` → `{"return": {}}` (command mode);
 *   client → `{"execute": NAME, "arguments": {…}, "id": N}` →
 *            `{"return": …, "id": N}` or `{"error": {"class": C, "desc": D}, "id": N}`;
 *   server → `{"event": NAME, "data": {…}, "timestamp": {"seconds", "microseconds"}}` any time.
 * QEMU serves one QMP client per monitor at a time: a second connection waits until the
 * first closes, which is why a dsecd keeps one connection per VM.
 *
 * Errors are DsecErrors: Unavailable (cannot connect, connection lost), DeadlineExceeded
 * (greeting or a reply did not come in time: QMP stopped answering), Internal (a reply
 * QEMU marked as an error, with its class and description; malformed JSON).
 */
import net from 'node:net';
import { DsecError, deadlineExceeded, internal, unavailable } from '../../errors.js';

/** Default limit for connect + greeting + capabilities, and for one command: 10 s (QEMU answers in ms; TCG guests do not slow the monitor). */
export const QMP_DEFAULT_TIMEOUT_MS = 10_000;

/** An asynchronous QMP event, e.g. `{ event: 'STOP', data: {} }`. */
export interface QmpEvent {
  event: string;
  data: Record<string, unknown>;
  /** Host time of the event in ms since the epoch (from QEMU's timestamp). */
  timeMs: number;
}

/** An error reply of a QMP command: its class (e.g. `GenericError`, `CommandNotFound`) and description. */
export class QmpCommandError extends DsecError {
  constructor(readonly command: string, readonly errorClass: string, readonly desc: string) {
    super('Internal', `QMP ${command}: ${errorClass}: ${desc}`);
  }
}

interface Pending {
  command: string;
  resolve(v: unknown): void;
  reject(e: Error): void;
  timer: NodeJS.Timeout;
}

/** One QMP connection in command mode. Create with {@link QmpClient.connect}. */
export class QmpClient {
  /** QEMU's version from the greeting, e.g. `{ major: 7, minor: 2, micro: 22 }`. */
  version: { major: number; minor: number; micro: number } | null = null;
  private buf = '';
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private readonly eventListeners = new Set<(e: QmpEvent) => void>();
  private readonly closeListeners = new Set<(err: Error) => void>();
  private greeting: { resolve(): void; reject(e: Error): void } | null = null;
  private _closed = false;

  private constructor(private readonly sock: net.Socket, private readonly path: string) {}

  /**
   * Connects to the QMP socket at `path`, waits for the greeting and enters command mode.
   * @param opts.timeoutMs limit for all of it (default {@link QMP_DEFAULT_TIMEOUT_MS}).
   * @throws DsecError Unavailable (no socket, refused, closed early), DeadlineExceeded
   *   (no greeting in time, e.g. another client holds the monitor or QEMU is stopped),
   *   Internal (not a QMP greeting).
   */
  static async connect(path: string, opts: { timeoutMs?: number } = {}): Promise<QmpClient> {
    const timeoutMs = opts.timeoutMs ?? QMP_DEFAULT_TIMEOUT_MS;
    const sock = net.createConnection({ path });
    const c = new QmpClient(sock, path);
    sock.setEncoding('utf8');
    sock.on('data', (d: string) => c.onData(d));
    sock.on('error', (e) => c.onGone(unavailable(`QMP ${path}: ${e.message}`, e)));
    sock.on('close', () => c.onGone(unavailable(`QMP ${path}: connection closed`)));
    let timer: NodeJS.Timeout | undefined;
    try {
      await new Promise<void>((resolve, reject) => {
        c.greeting = { resolve, reject };
        timer = setTimeout(() => reject(deadlineExceeded(`QMP ${path}: no greeting within ${timeoutMs} ms (QEMU is not answering its monitor)`)), timeoutMs);
      });
      clearTimeout(timer);
      await c.execute('qmp_capabilities', undefined, { timeoutMs });
    } catch (e) {
      clearTimeout(timer);
      c.close();
      throw e;
    }
    return c;
  }

  /** True once the connection is closed or lost. */
  get closed(): boolean {
    return this._closed;
  }

  /**
   * Runs one command and resolves with its `return` value.
   * @param opts.timeoutMs reply limit (default {@link QMP_DEFAULT_TIMEOUT_MS}).
   * @throws QmpCommandError (kind Internal) for an error reply; DsecError
   *   DeadlineExceeded when no reply comes in time (the connection is then closed: a late
   *   reply could not be told from the next one's), Unavailable when the connection is lost.
   */
  execute<T = unknown>(command: string, args?: Record<string, unknown>, opts: { timeoutMs?: number } = {}): Promise<T> {
    if (this._closed) return Promise.reject(unavailable(`QMP ${this.path}: connection is closed`));
    const id = this.nextId++;
    const timeoutMs = opts.timeoutMs ?? QMP_DEFAULT_TIMEOUT_MS;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(deadlineExceeded(`QMP ${command}: no reply within ${timeoutMs} ms from ${this.path} (QEMU stopped answering its monitor)`));
        this.close();
      }, timeoutMs);
      this.pending.set(id, { command, resolve: resolve as (v: unknown) => void, reject, timer });
      this.sock.write(`${JSON.stringify({ execute: command, ...(args ? { arguments: args } : {}), id })}\n`);
    });
  }

  /** Calls `cb` for every event; returns a function that unregisters it. */
  onEvent(cb: (e: QmpEvent) => void): () => void {
    this.eventListeners.add(cb);
    return () => this.eventListeners.delete(cb);
  }

  /** Calls `cb` once when the connection closes or is lost (not after {@link close}). */
  onClose(cb: (err: Error) => void): () => void {
    this.closeListeners.add(cb);
    return () => this.closeListeners.delete(cb);
  }

  /** Closes the connection; pending commands fail with Unavailable. Safe to call twice. */
  close(): void {
    if (this._closed) return;
    this.closeListeners.clear();
    this.onGone(unavailable(`QMP ${this.path}: connection closed by dsecd`));
    this.sock.destroy();
  }

  private onData(d: string): void {
    this.buf += d;
    // QMP replies are small; a line longer than 16 MiB is not QMP.
    if (this.buf.length > 16 * 1024 * 1024) {
      this.onGone(internal(`QMP ${this.path}: a line longer than 16 MiB`));
      this.sock.destroy();
      return;
    }
    let nl: number;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      const line = this.buf.slice(0, nl).trim();
      this.buf = this.buf.slice(nl + 1);
      if (line) this.onMessage(line);
    }
  }

  private onMessage(line: string): void {
    let m: Record<string, unknown>;
    try {
      m = JSON.parse(line) as Record<string, unknown>;
    } catch {
      this.onGone(internal(`QMP ${this.path}: not JSON: ${line.slice(0, 200)}`));
      this.sock.destroy();
      return;
    }
    if (this.greeting) {
      const g = this.greeting;
      this.greeting = null;
      const q = m.QMP as { version?: { qemu?: { major: number; minor: number; micro: number } } } | undefined;
      if (!q) {
        g.reject(internal(`QMP ${this.path}: expected a greeting, got ${line.slice(0, 200)}`));
        return;
      }
      this.version = q.version?.qemu ?? null;
      g.resolve();
      return;
    }
    if (typeof m.event === 'string') {
      const ts = m.timestamp as { seconds?: number; microseconds?: number } | undefined;
      const e: QmpEvent = { event: m.event, data: (m.data as Record<string, unknown>) ?? {}, timeMs: ts ? (ts.seconds ?? 0) * 1000 + Math.floor((ts.microseconds ?? 0) / 1000) : Date.now() };
      for (const cb of [...this.eventListeners]) cb(e);
      return;
    }
    const id = typeof m.id === 'number' ? m.id : null;
    const p = id === null ? undefined : this.pending.get(id);
    if (!p) return; // a reply to a command that timed out, or without an id
    this.pending.delete(id!);
    clearTimeout(p.timer);
    if (m.error) {
      const err = m.error as { class?: string; desc?: string };
      p.reject(new QmpCommandError(p.command, err.class ?? 'GenericError', err.desc ?? 'unknown error'));
    } else {
      p.resolve(m.return);
    }
  }

  private onGone(err: Error): void {
    if (this._closed) return;
    this._closed = true;
    this.greeting?.reject(err);
    this.greeting = null;
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(err);
    }
    this.pending.clear();
    for (const cb of [...this.closeListeners]) cb(err);
    this.closeListeners.clear();
  }
}
