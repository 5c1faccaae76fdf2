/**
 * {@link ExecAttachment}: one WebSocket attached to an exec session
 * (`GET /v1/sandboxes/{id}/execs/{exec_id}/attach`, daemon/api/routes/execs.ts).
 *
 * Wire format (all of it lives here, so callers never see channel bytes):
 * - server → client, binary: 1 channel byte (1 stdout, 2 stderr) + data;
 * - server → client, text: `{"type":"exit", ...ExecInfo}` once the command has ended and
 *   all its output was sent (then close 1000), or `{"type":"error","error":{code,message}}`
 *   (then close 1011, or 1008 when the client broke the protocol);
 * - client → server, binary: channel byte 0 + stdin bytes;
 * - client → server, text: `{"type":"stdin_eof"}`, `{"type":"resize","rows":R,"cols":C}`,
 *   `{"type":"signal","signal":"SIGINT"}`.
 *
 * Lifecycle contract: created synchronously (attach listeners right away: nothing is
 * emitted before the current tick ends); {@link ExecAttachment.opened} settles once the
 * handshake is done; {@link ExecAttachment.done} settles exactly once: with the final
 * ExecInfo (exit message), with `null` when this side closed first ({@link close}), or
 * rejected with a {@link DsecApiError} (an error message, a refused handshake, a dropped
 * connection). Neither promise is ever an unhandled rejection on its own.
 */
import { EventEmitter } from 'node:events';
import type http from 'node:http';
import { createRequire } from 'node:module';
import type WebSocketType from 'ws';
import type { ErrorKind } from './types.js';

type WebSocket = WebSocketType;

/**
 * The `ws` WebSocket class, loaded on the first attachment or exec channel rather than at
 * import: a CLI run that never opens a WebSocket (most of them) starts ~40 ms sooner.
 */
let wsClass: typeof WebSocketType | undefined;
export function webSocketClass(): typeof WebSocketType {
  wsClass ??= createRequire(import.meta.url)('ws') as typeof WebSocketType;
  return wsClass;
}

/** ws readyState values (the WebSocket constants, without loading ws). */
export const CONNECTING = 0;
export const OPEN = 1;
const CLOSED = 3;

/**
 * The `unexpected-response` listener of a WebSocket whose handshake dsecd refused (a
 * non-101 answer): reads the answer's body, calls `fail` with the client's error for it
 * (`errors.response`), and drops the connection.
 */
export function onRefusedHandshake(ws: WebSocketType, errors: AttachErrorFactory, fail: (e: Error) => void): (req: http.ClientRequest, res: http.IncomingMessage) => void {
  return (req, res) => {
    const chunks: Buffer[] = [];
    res.on('data', (c: Buffer) => chunks.push(c));
    res.on('end', () => {
      fail(errors.response(res.statusCode ?? 0, Buffer.concat(chunks).toString('utf8')));
      req.destroy();
      ws.terminate();
    });
    res.on('error', () => {
      fail(errors.response(res.statusCode ?? 0, ''));
      ws.terminate();
    });
  };
}

/** How an exec session looks on the wire (ExecInfo, sdk/types.ts), as far as this module needs it. */
export interface AttachExecInfo {
  exec_id: string;
  exit_code: number | null;
  signal: string | null;
  timed_out: boolean;
  error: string | null;
  [k: string]: unknown;
}

/** Options of an attachment (see DsecClient.attachExec). */
export interface AttachOptions {
  /** Resume stdout from this byte (default 0: everything dsecd kept is replayed). */
  stdoutOffset?: number;
  /** Resume stderr from this byte (default 0). */
  stderrOffset?: number;
  /** SIGKILL the command when this connection closes while it runs (default false: it keeps running). */
  killOnDetach?: boolean;
  /** Closes the attachment (as {@link ExecAttachment.close}) when aborted. */
  signal?: AbortSignal;
}

/** Events of an {@link ExecAttachment}. */
export interface ExecAttachmentEvents<I> {
  /** The handshake completed. */
  open: [];
  /** A chunk of the command's stdout (all of the output with a tty). */
  stdout: [Buffer];
  /** A chunk of the command's stderr. */
  stderr: [Buffer];
  /** The command ended; its final ExecInfo. The connection closes next. */
  exit: [I];
  /** An error message from dsecd, a refused handshake or a dropped connection; only emitted when someone listens. */
  error: [Error];
  /** The stdin queue dropped below the low-water mark after {@link ExecAttachment.write} returned false. */
  drain: [];
  /** The WebSocket closed (always last). */
  close: [code: number, reason: string];
}

/** How the client turns failures into its error type; supplied by DsecClient. */
export interface AttachErrorFactory {
  /** The error of a non-101 answer to the handshake (`body` is the response text). */
  response(status: number, body: string): Error;
  /** The error of a failed connection (no such socket, permission denied, ...). */
  connection(err: NodeJS.ErrnoException): Error;
  /** An error of kind `code`; `status` 0 when dsecd sent no HTTP status. */
  kind(code: ErrorKind, message: string, status: number): Error;
}

/** Above this many queued stdin bytes, {@link ExecAttachment.write} returns false (1 MiB). */
const STDIN_HIGH_WATER = 1 << 20;
/** How long {@link ExecAttachment.close} waits for the close handshake before dropping the socket. */
const CLOSE_GRACE_MS = 1000;

/** A WebSocket attached to an exec session; see the module comment. */
export class ExecAttachment<I extends object = AttachExecInfo> extends EventEmitter<ExecAttachmentEvents<I>> {
  /** Settles when the handshake completes (rejects like {@link done} when it fails). */
  readonly opened: Promise<void>;
  /** The final ExecInfo, `null` when closed from this side first, or rejected; see the module comment. */
  readonly done: Promise<I | null>;
  /** Bytes of stdout received so far; `stdoutOffset` + this resumes after them. */
  stdoutBytes = 0;
  /** Bytes of stderr received so far. */
  stderrBytes = 0;
  /** Why it ended, once {@link done} settled: `exit`, `closed` (by us), or `error`. */
  outcome: 'exit' | 'closed' | 'error' | undefined;

  private readonly ws: WebSocket;
  private readonly errors: AttachErrorFactory;
  /** Frames written before the handshake completed; sent on open. */
  private queued: (string | Buffer)[] = [];
  /** Callbacks of the queued frames; run once they are sent. */
  private afterFlush: ((err?: Error) => void)[] = [];
  private pendingStdin = 0;
  private overHighWater = false;
  private closedByUs = false;
  /** Set once the handshake completed (errors before it are connection failures). */
  private handshakeDone = false;
  private resolveOpen!: () => void;
  private rejectOpen!: (e: Error) => void;
  private resolveDone!: (v: I | null) => void;
  private rejectDone!: (e: Error) => void;

  /**
   * @param url `ws+unix://SOCKET:/v1/...` or `wss://HOST:PORT/v1/...` of the attach endpoint
   * @param errors error constructors of the client
   * @param signal aborting it closes the attachment
   * @param wsOptions extra options of the `ws` client (TLS trust and the token of the TCP door, sdk/remote.ts)
   */
  constructor(url: string, errors: AttachErrorFactory, signal?: AbortSignal, wsOptions: Record<string, unknown> = {}) {
    super();
    this.errors = errors;
    this.opened = new Promise((res, rej) => {
      this.resolveOpen = res;
      this.rejectOpen = rej;
    });
    this.done = new Promise((res, rej) => {
      this.resolveDone = res;
      this.rejectDone = rej;
    });
    // Callers that only await one of the two must not trip unhandled-rejection handling.
    this.opened.catch(() => {});
    this.done.catch(() => {});
    // No compression: output is often already dense (or huge), and the socket is local.
    const WebSocketClass = webSocketClass();
    this.ws = new WebSocketClass(url, { ...wsOptions, perMessageDeflate: false });
    this.ws.on('open', () => this.onOpen());
    this.ws.on('message', (data: Buffer, isBinary: boolean) => this.onMessage(data, isBinary));
    this.ws.on('unexpected-response', onRefusedHandshake(this.ws, errors, (e) => this.fail(e)));
    this.ws.on('error', (err: NodeJS.ErrnoException) => this.fail(this.handshakeDone ? errors.kind('Unavailable', `attach connection to dsecd broke: ${err.message}`, 0) : errors.connection(err)));
    this.ws.on('close', (code: number, reason: Buffer) => this.onClose(code, reason.toString('utf8')));
    if (signal) {
      if (signal.aborted) queueMicrotask(() => this.close());
      else signal.addEventListener('abort', () => this.close(), { once: true });
    }
  }

  /**
   * Sends bytes to the command's stdin (queued until the handshake completes). Returns
   * false when more than 1 MiB is queued: stop writing until `drain`. `cb` runs once the
   * bytes were handed to the socket.
   */
  write(data: Buffer | Uint8Array | string, cb?: (err?: Error) => void): boolean {
    const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    if (bytes.length === 0) return true;
    const frame = Buffer.concat([Buffer.from([0]), bytes]);
    this.pendingStdin += bytes.length;
    this.sendFrame(frame, (err) => {
      this.pendingStdin -= bytes.length;
      if (this.overHighWater && this.pendingStdin < STDIN_HIGH_WATER / 2) {
        this.overHighWater = false;
        this.emit('drain');
      }
      cb?.(err);
    });
    if (this.pendingStdin >= STDIN_HIGH_WATER) this.overHighWater = true;
    return !this.overHighWater;
  }

  /** Closes the command's stdin (after everything written before it). */
  eof(): void {
    this.sendFrame(JSON.stringify({ type: 'stdin_eof' }));
  }

  /** Resizes the command's terminal (tty sessions only; dsecd refuses it otherwise). */
  resize(rows: number, cols: number): void {
    this.sendFrame(JSON.stringify({ type: 'resize', rows, cols }));
  }

  /** Sends a signal (`SIGINT`, `TERM`, or a number) to the command's process group. */
  signal(name: string | number): void {
    this.sendFrame(JSON.stringify({ type: 'signal', signal: name }));
  }

  /** Stops delivering output (the socket stops reading; dsecd waits). */
  pause(): void {
    if (this.ws.readyState === OPEN) this.ws.pause();
  }

  /** Resumes output after {@link pause}. */
  resume(): void {
    if (this.ws.readyState === OPEN) this.ws.resume();
  }

  /**
   * Detaches: closes the WebSocket (the command keeps running unless `killOnDetach`);
   * {@link done} resolves `null` unless it already settled. Safe to call twice.
   */
  close(): void {
    if (this.outcome === undefined) {
      this.closedByUs = true;
      this.settle('closed', null);
    }
    const ws = this.ws;
    if (ws.readyState === CLOSED) return;
    if (ws.readyState === CONNECTING) {
      ws.terminate();
      return;
    }
    if (ws.readyState === OPEN) ws.close(1000, 'detach');
    setTimeout(() => ws.terminate(), CLOSE_GRACE_MS).unref();
  }

  private sendFrame(frame: string | Buffer, cb?: (err?: Error) => void): void {
    if (this.ws.readyState === CONNECTING) {
      this.queued.push(frame);
      if (cb) this.afterFlush.push(cb);
      return;
    }
    if (this.ws.readyState !== OPEN) {
      cb?.(this.errors.kind('Unavailable', 'attach connection is closed', 0));
      return;
    }
    this.ws.send(frame, { binary: typeof frame !== 'string' }, cb);
  }

  private onOpen(): void {
    this.handshakeDone = true;
    const queued = this.queued;
    const cbs = this.afterFlush;
    this.queued = [];
    this.afterFlush = [];
    for (const f of queued) this.ws.send(f, { binary: typeof f !== 'string' });
    for (const cb of cbs) cb();
    this.resolveOpen();
    this.emit('open');
  }

  private onMessage(data: Buffer, isBinary: boolean): void {
    if (isBinary) {
      if (data.length < 1) return;
      const payload = data.subarray(1);
      if (data[0] === 1) {
        this.stdoutBytes += payload.length;
        this.emit('stdout', payload);
      } else if (data[0] === 2) {
        this.stderrBytes += payload.length;
        this.emit('stderr', payload);
      }
      return; // another channel: a newer dsecd's addition
    }
    let msg: { type?: string; error?: { code?: unknown; message?: unknown }; [k: string]: unknown };
    try {
      msg = JSON.parse(data.toString('utf8'));
    } catch {
      this.fail(this.errors.kind('Internal', `dsecd sent a malformed attach message: ${JSON.stringify(data.toString('utf8').slice(0, 80))}`, 101));
      return;
    }
    if (msg.type === 'exit') {
      const { type: _t, ...info } = msg;
      if (this.outcome === undefined) {
        this.emit('exit', info as unknown as I);
        this.settle('exit', info as unknown as I);
      }
    } else if (msg.type === 'error') {
      const code = typeof msg.error?.code === 'string' ? (msg.error.code as ErrorKind) : 'Internal';
      const message = typeof msg.error?.message === 'string' ? msg.error.message : 'attach failed on dsecd (no message)';
      // dsecd's own answer, on a connection it upgraded: status 101, not 0 (no answer).
      this.fail(this.errors.kind(code, message, 101));
    }
    // Other types: a newer dsecd's addition; ignored.
  }

  private onClose(code: number, reason: string): void {
    if (this.outcome === undefined) {
      if (this.closedByUs) this.settle('closed', null);
      else this.fail(this.errors.kind('Unavailable', `attach connection to dsecd closed before the command ended (WebSocket close ${code}${reason ? ` ${reason}` : ''})`, 0));
    }
    this.emit('close', code, reason);
  }

  private fail(err: Error): void {
    if (this.outcome !== undefined) return;
    if (this.listenerCount('error') > 0) this.emit('error', err);
    this.outcome = 'error';
    this.rejectOpen(err);
    this.rejectDone(err);
  }

  private settle(outcome: 'exit' | 'closed', value: I | null): void {
    if (this.outcome !== undefined) return;
    this.outcome = outcome;
    // An exit (or our own close) after a successful handshake: opened already resolved;
    // a close during the handshake leaves nothing to open.
    this.rejectOpen(this.errors.kind('Unavailable', 'attachment closed before it opened', 0));
    this.resolveDone(value);
  }
}
