/**
 * {@link ExecChannel}: one WebSocket to a sandbox's exec channel
 * (GET /v1/sandboxes/{id}/exec/channel, daemon/api/routes/exec-channel.ts) over which
 * {@link ExecChannel.exec} runs commands to completion as {@link DsecClient.exec} does,
 * with the door's authentication and the HTTP request paid once for the connection
 * instead of once per command. For agent loops that run many short commands in one
 * sandbox.
 *
 * Lifecycle: the connection opens at once (requests sent before the handshake completes
 * are queued); {@link ExecChannel.opened} settles with the handshake. A refused handshake
 * (`NotFound` for an unknown sandbox or one of another tenant, `Unauthenticated`,
 * `PermissionDenied`) or a dropped connection rejects every request in flight and every
 * later one with that error; {@link ExecChannel.close} rejects them with `Unavailable`.
 * dsecd runs at most 16 requests of one channel at once; more are queued on the socket.
 */
import type WebSocketType from 'ws';
import { CONNECTING, OPEN, onRefusedHandshake, webSocketClass, type AttachErrorFactory } from './attach.js';
import { decodeExecResult, execRequestBody, type ExecOptions, type ExecOutput } from './exec-types.js';
import type { ExecResult } from './types.js';

/** Largest message dsecd's WebSocket server takes (daemon/api/server.ts: 1 MiB). */
const MAX_MESSAGE_BYTES = 1024 * 1024;

/** A request waiting for its answer. */
interface Pending {
  resolve: (r: ExecOutput) => void;
  reject: (e: Error) => void;
}

/** Options of {@link ExecChannel.exec}: those of {@link DsecClient.exec}. */
export type ChannelExecOptions = ExecOptions;

/** A WebSocket exec channel to one sandbox; see the module comment. */
export class ExecChannel {
  /** Settles when the handshake completes (rejects with the error every request then gets). */
  readonly opened: Promise<void>;
  private readonly ws: WebSocketType;
  private readonly errors: AttachErrorFactory;
  private readonly pending = new Map<number, Pending>();
  /** Frames sent before the handshake completed. */
  private queued: string[] = [];
  private nextId = 1;
  /** Set once the handshake completed (errors before it are connection failures). */
  private handshakeDone = false;
  /** Once set, every request in flight and later is rejected with it. */
  private failure: Error | undefined;
  private resolveOpen!: () => void;
  private rejectOpen!: (e: Error) => void;

  /**
   * @param url `ws+unix://SOCKET:/v1/sandboxes/ID/exec/channel` or the `wss://` URL of the TCP door
   * @param errors error constructors of the client
   * @param wsOptions extra options of the `ws` client (TLS trust and the token of the TCP door)
   */
  constructor(url: string, errors: AttachErrorFactory, wsOptions: Record<string, unknown> = {}) {
    this.errors = errors;
    this.opened = new Promise((res, rej) => {
      this.resolveOpen = res;
      this.rejectOpen = rej;
    });
    this.opened.catch(() => {});
    const WebSocketClass = webSocketClass();
    this.ws = new WebSocketClass(url, { ...wsOptions, perMessageDeflate: false });
    this.ws.on('open', () => {
      this.handshakeDone = true;
      for (const f of this.queued) this.ws.send(f);
      this.queued = [];
      this.resolveOpen();
    });
    this.ws.on('message', (data: Buffer, isBinary: boolean) => this.onMessage(data, isBinary));
    this.ws.on('unexpected-response', onRefusedHandshake(this.ws, errors, (e) => this.fail(e)));
    this.ws.on('error', (err: NodeJS.ErrnoException) => this.fail(this.handshakeDone
      ? errors.kind('Unavailable', `exec channel connection to dsecd broke: ${err.message}`, 0)
      : errors.connection(err)));
    this.ws.on('close', (code: number, reason: Buffer) => {
      this.fail(errors.kind('Unavailable', `exec channel to dsecd closed (WebSocket close ${code}${reason.length ? ` ${reason.toString('utf8')}` : ''})`, 0));
    });
  }

  /**
   * Requests sent and not yet answered. A request given up on (its `signal` aborted) no
   * longer counts here, but its command still holds one of dsecd's 16 places of this
   * channel until it ends.
   */
  get inFlight(): number {
    return this.pending.size;
  }

  /**
   * Runs a command to completion in the channel's sandbox; resolves as
   * {@link DsecClient.exec} does (the command's exit status, signal, timeout and OOM are
   * fields of the result, not errors). `req.signal` rejects the promise with its reason;
   * the command keeps running (its answer is dropped) and holds its place among the 16 a
   * channel runs at once until it ends. There is no client-side deadline: pass
   * `timeoutMs` (dsecd kills the command then) or a `signal`. `req.stdin` is at most ~768 KiB here
   * (a message is at most 1 MiB); use {@link DsecClient.exec} for more.
   * Errors: those of {@link DsecClient.exec} (`NotFound` once the sandbox is gone,
   * `FailedPrecondition`, `InvalidArgument`, `Conflict`), and the channel's own failure
   * (see the module comment).
   */
  exec(req: ChannelExecOptions): Promise<ExecOutput> {
    if (this.failure) return Promise.reject(this.failure);
    if (req.signal?.aborted) return Promise.reject(req.signal.reason);
    const id = this.nextId++;
    const frame = JSON.stringify({ id, request: execRequestBody(req) });
    if (frame.length > MAX_MESSAGE_BYTES / 4 && Buffer.byteLength(frame) > MAX_MESSAGE_BYTES) {
      // dsecd would close the whole channel (1009) on it: refuse this request alone.
      return Promise.reject(this.errors.kind('InvalidArgument', `exec request is ${Buffer.byteLength(frame)} bytes; the exec channel takes at most ${MAX_MESSAGE_BYTES} per request (stdin up to ~768 KiB): use client.exec() for this one`, 0));
    }
    return new Promise<ExecOutput>((resolve, reject) => {
      const onAbort = () => {
        this.pending.delete(id);
        reject(req.signal!.reason);
      };
      req.signal?.addEventListener('abort', onAbort, { once: true });
      const settle = <A>(f: (a: A) => void) => (a: A) => {
        req.signal?.removeEventListener('abort', onAbort);
        f(a);
      };
      this.pending.set(id, { resolve: settle(resolve), reject: settle(reject) });
      if (this.ws.readyState === CONNECTING) this.queued.push(frame);
      else if (this.ws.readyState === OPEN) this.ws.send(frame);
    });
  }

  /** Closes the channel; requests in flight reject with `Unavailable` (their commands keep running in the sandbox). Safe to call twice. */
  close(): void {
    this.fail(this.errors.kind('Unavailable', 'exec channel closed by the client', 0));
    if (this.ws.readyState === CONNECTING) this.ws.terminate();
    else if (this.ws.readyState === OPEN) this.ws.close(1000, 'done');
  }

  private onMessage(data: Buffer, isBinary: boolean): void {
    if (isBinary) return; // not part of the protocol: a newer dsecd's addition
    let msg: { id?: unknown; result?: ExecResult; error?: unknown };
    try {
      msg = JSON.parse(data.toString('utf8'));
    } catch {
      this.fail(this.errors.kind('Internal', `dsecd sent a malformed exec channel message: ${JSON.stringify(data.toString('utf8').slice(0, 80))}`, 101));
      return;
    }
    if (msg.id === null && msg.error !== undefined) {
      // A protocol violation dsecd saw: the channel closes next.
      this.fail(this.errors.response(101, JSON.stringify({ error: msg.error })));
      return;
    }
    const p = typeof msg.id === 'number' ? this.pending.get(msg.id) : undefined;
    if (!p) return; // an answer to a request we stopped waiting for (aborted)
    this.pending.delete(msg.id as number);
    if (msg.result !== undefined) p.resolve(decodeExecResult(msg.result));
    else p.reject(this.errors.response(101, JSON.stringify({ error: msg.error })));
  }

  private fail(err: Error): void {
    if (this.failure) return;
    this.failure = err;
    this.rejectOpen(err);
    this.queued = [];
    const waiting = [...this.pending.values()];
    this.pending.clear();
    for (const p of waiting) p.reject(err);
  }
}
