/**
 * {@link RequestChannel}: the client side of dsecd's request channels
 * (daemon/api/channel.ts): one WebSocket over which requests of one kind are sent, many
 * in flight, each answered by its id, with the door's authentication and the HTTP
 * request paid once for the connection instead of once per request. The exec channel
 * ({@link ExecChannel}, sdk/exec-channel.ts) and the run channel ({@link RunChannel},
 * sdk/run-channel.ts) are its two kinds.
 *
 * Lifecycle: the connection opens at once (requests sent before the handshake completes
 * are queued); {@link RequestChannel.opened} settles with the handshake. A refused
 * handshake (`NotFound`, `Unauthenticated`, `PermissionDenied`) or a dropped connection
 * rejects every request in flight and every later one with that error;
 * {@link RequestChannel.close} rejects them with `Unavailable`. dsecd runs at most 16
 * requests of one channel at once; more are queued on the socket.
 */
import type WebSocketType from 'ws';
import { CONNECTING, OPEN, onRefusedHandshake, webSocketClass, type AttachErrorFactory } from './attach.js';

/** Largest message dsecd's WebSocket server takes (daemon/api/server.ts: 1 MiB). */
export const MAX_MESSAGE_BYTES = 1024 * 1024;

/** A request waiting for its answer. */
interface Pending {
  resolve: (r: unknown) => void;
  reject: (e: Error) => void;
}

/** A WebSocket request channel; see the module comment. Subclasses add the typed request method. */
export class RequestChannel {
  /** Settles when the handshake completes (rejects with the error every request then gets). */
  readonly opened: Promise<void>;
  /** The errors' name for this channel, e.g. `exec channel`. */
  protected readonly what: string;
  protected readonly errors: AttachErrorFactory;
  private readonly ws: WebSocketType;
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
   * @param what the channel's name in error messages (`exec channel`, `run channel`)
   * @param url `ws+unix://SOCKET:/PATH` or the `wss://` URL of the TCP door
   * @param errors error constructors of the client
   * @param wsOptions extra options of the `ws` client (TLS trust and the token of the TCP door)
   */
  constructor(what: string, url: string, errors: AttachErrorFactory, wsOptions: Record<string, unknown> = {}) {
    this.what = what;
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
      ? errors.kind('Unavailable', `${what} connection to dsecd broke: ${err.message}`, 0)
      : errors.connection(err)));
    this.ws.on('close', (code: number, reason: Buffer) => {
      this.fail(errors.kind('Unavailable', `${what} to dsecd closed (WebSocket close ${code}${reason.length ? ` ${reason.toString('utf8')}` : ''})`, 0));
    });
  }

  /**
   * Requests sent and not yet answered. A request given up on (its `signal` aborted) no
   * longer counts here, but it may still hold one of dsecd's 16 places of this channel
   * until it ends.
   */
  get inFlight(): number {
    return this.pending.size;
  }

  /**
   * Sends `body` as one request and resolves with its answer's `result` passed through
   * `decode`. `signal` rejects the promise with its reason (the answer, if it comes, is
   * dropped). Rejects with `InvalidArgument` when the message would exceed
   * {@link MAX_MESSAGE_BYTES} (dsecd would close the whole channel on it; `alternative`
   * names the HTTP call to use instead), with the request's own error when dsecd answers
   * one, or with the channel's failure (see the module comment).
   */
  protected send<T>(body: unknown, signal: AbortSignal | undefined, decode: (result: never) => T, alternative: string): Promise<T> {
    if (this.failure) return Promise.reject(this.failure);
    if (signal?.aborted) return Promise.reject(signal.reason);
    const id = this.nextId++;
    const frame = JSON.stringify({ id, request: body });
    if (frame.length > MAX_MESSAGE_BYTES / 4 && Buffer.byteLength(frame) > MAX_MESSAGE_BYTES) {
      return Promise.reject(this.errors.kind('InvalidArgument', `request is ${Buffer.byteLength(frame)} bytes; the ${this.what} takes at most ${MAX_MESSAGE_BYTES} per request (stdin up to ~768 KiB): use ${alternative} for this one`, 0));
    }
    return new Promise<T>((resolve, reject) => {
      const onAbort = () => {
        this.pending.delete(id);
        reject(signal!.reason);
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.pending.set(id, {
        resolve: (r) => {
          signal?.removeEventListener('abort', onAbort);
          resolve(decode(r as never));
        },
        reject: (e) => {
          signal?.removeEventListener('abort', onAbort);
          reject(e);
        },
      });
      if (this.ws.readyState === CONNECTING) this.queued.push(frame);
      else if (this.ws.readyState === OPEN) this.ws.send(frame);
    });
  }

  /** Closes the channel; requests in flight reject with `Unavailable`. Safe to call twice. */
  close(): void {
    this.fail(this.errors.kind('Unavailable', `${this.what} closed by the client`, 0));
    if (this.ws.readyState === CONNECTING) this.ws.terminate();
    else if (this.ws.readyState === OPEN) this.ws.close(1000, 'done');
  }

  private onMessage(data: Buffer, isBinary: boolean): void {
    if (isBinary) return; // not part of the protocol: a newer dsecd's addition
    let msg: { id?: unknown; result?: unknown; error?: unknown };
    try {
      msg = JSON.parse(data.toString('utf8'));
    } catch {
      this.fail(this.errors.kind('Internal', `dsecd sent a malformed ${this.what} message: ${JSON.stringify(data.toString('utf8').slice(0, 80))}`, 101));
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
    if (msg.result !== undefined) p.resolve(msg.result);
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
