/**
 * The transport under every call: HTTP/1.1 over dsecd's Unix socket, or HTTPS to its TCP
 * door (sdk/remote.ts: `remote` option, or DSEC_HOST/DSEC_TOKEN/DSEC_CA), with a keep-alive
 * connection pool, JSON bodies with no runtime schema validation on this side, streamed
 * uploads and downloads with backpressure, NDJSON long operations, and the WebSocket of
 * attachments (sdk/attach.ts). The resource modules (sdk/sandboxes.ts, sdk/exec.ts, ...)
 * add their calls on top of {@link Transport}; sdk/client.ts puts them together.
 *
 * Built for hot loops (an RL framework issuing thousands of execs per second): one
 * keep-alive `http.Agent` per client reuses connections, and idle pooled sockets are
 * unref'd so a short-lived process exits without calling {@link Transport.close}.
 */
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { Readable, pipeline } from 'node:stream';
import { ExecAttachment, type AttachErrorFactory } from './attach.js';
import { DsecApiError, errMessage, errorFromResponse, isErrorKind } from './errors.js';
import { NDJSON_TYPE, clip, ndjsonLines } from './ndjson.js';
import { Endpoint, remoteFromEnv, type RemoteOptions } from './remote.js';

/** Socket path used when neither the `socketPath` option nor `DSEC_SOCKET` is set. */
export const DEFAULT_SOCKET_PATH = '/run/dsec/dsecd.sock';

/**
 * Default per-request deadline, ms. Generous because a create under a burst queues
 * behind others on the daemon; a healthy daemon answers most calls in a few ms.
 */
export const DEFAULT_TIMEOUT_MS = 60_000;

/** Media type of raw uploads (stdin, file contents). */
export const OCTET_STREAM = 'application/octet-stream';

/** Media type of tar uploads. */
export const TAR_TYPE = 'application/x-tar';

/** Methods safe to resend once when a pooled keep-alive socket turns out to be closed. */
const IDEMPOTENT = new Set(['GET', 'HEAD', 'PUT', 'DELETE']);

/** Retries of a create whose answer was lost ({@link Transport.keyedCreate}): 2, so a gateway restart or a dropped connection costs at most ~0.75 s more. */
export const CREATE_RETRIES = 2;

/** Options of {@link DsecClient}. */
export interface DsecClientOptions {
  /** Path of dsecd's Unix socket; default `$DSEC_SOCKET`, else {@link DEFAULT_SOCKET_PATH}. */
  socketPath?: string;
  /**
   * dsecd's TCP door instead of the socket: `{url: 'https://HOST:PORT', token, ca, cert?, key?}`
   * (sdk/remote.ts). Default: from `$DSEC_HOST`, `$DSEC_TOKEN` and `$DSEC_CA` when
   * DSEC_HOST is set and no `socketPath` is given; else the socket.
   */
  remote?: RemoteOptions;
  /**
   * Deadline of one request in ms, from sending it to the end of the response body;
   * default {@link DEFAULT_TIMEOUT_MS}. `0` disables it. exec adds its own `timeoutMs`
   * on top (see {@link DsecClient.exec}); the events stream has no deadline.
   */
  timeoutMs?: number;
}

/** Options of {@link DsecClient.request}. */
export interface RequestOptions {
  /** Abort the call; the promise rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Deadline for this call in ms, overriding the client's `timeoutMs`; `0` disables it. */
  timeoutMs?: number;
  /** Sent as the `Idempotency-Key` request header (creates: daemon/sandbox/create-records.ts). */
  idempotencyKey?: string;
  /** Creates through a gateway: allow a `pool=burst` host (`X-Dsec-Burst: allow`; gateway/placement.ts). */
  allowBurst?: boolean;
}

/** What a long operation's caller passes: a progress callback and an abort signal. */
export interface LongOperationCallbacks<P> {
  /** Called once per `{type: "progress"}` line, in order; if it throws, the call rejects with that error. */
  onProgress?: (p: P) => void;
  /** Stop waiting: the call rejects with the signal's reason; dsecd does not cancel the operation. */
  signal?: AbortSignal;
  /** Sent as the `Idempotency-Key` request header. */
  idempotencyKey?: string;
  /** As {@link RequestOptions.allowBurst}. */
  allowBurst?: boolean;
}

/** A class whose instances are {@link Transport}s: the base a resource module's calls are mixed into. */
export type TransportClass = new (...args: any[]) => Transport;

/**
 * One dsecd's HTTP transport: the socket, the deadline and the connection pool, and the
 * ways to send a call. Safe to use from many concurrent callers (requests run in
 * parallel over pooled connections).
 */
export class Transport {
  /** The socket this client talks to (unused when it talks to the TCP door). */
  readonly socketPath: string;
  /** Per-request deadline in ms (0 = none); see {@link DsecClientOptions.timeoutMs}. */
  readonly timeoutMs: number;
  /** Where requests go: the socket or the TCP door. */
  protected readonly endpoint: Endpoint;
  private readonly agent: http.Agent;

  /** @param opts socket path or TCP door, and deadline; all optional. */
  constructor(opts: DsecClientOptions = {}) {
    this.socketPath = opts.socketPath || process.env.DSEC_SOCKET || DEFAULT_SOCKET_PATH;
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.endpoint = new Endpoint(this.socketPath, opts.remote ?? (opts.socketPath ? undefined : remoteFromEnv()));
    // keepAlive: reuse connections across calls (the hot-loop case). Free sockets are
    // unref'd by the agent, so they never keep the process alive.
    this.agent = this.endpoint.newAgent();
  }

  /** `dsecd socket PATH` or `dsecd at https://HOST:PORT`, as messages name it. */
  get where(): string {
    return this.endpoint.where;
  }

  /**
   * Opens a streamed download: resolves with the response (a Readable of the raw body)
   * once dsecd answered 2xx, or rejects with the error of its answer. No deadline (a
   * transfer takes as long as it takes); `signal` destroys the stream.
   */
  protected async openStream(method: string, path: string, signal?: AbortSignal): Promise<http.IncomingMessage> {
    const res = await this.open(method, path, undefined, signal, 0, 0, IDEMPOTENT.has(method), '*/*');
    const status = res.statusCode ?? 0;
    if (status < 200 || status >= 300) {
      let text = '';
      try {
        text = await readBody(res);
      } catch {
        // The error body is a nicety; the status alone still says what failed.
      }
      throw errorFromResponse(status, text);
    }
    return res;
  }

  /**
   * Sends `body` (bytes, or a Readable piped with backpressure: memory stays at a few
   * chunks whatever its size) and parses the JSON answer (undefined when empty). A new
   * connection per upload: a stream cannot be resent if a pooled socket turns out closed.
   * When dsecd answers before the body is sent (an error), the rest is not sent. Errors:
   * as {@link request}; a failing Readable rejects with its own error.
   */
  protected upload<T>(method: string, path: string, body: Buffer | Uint8Array | Readable, contentType: string, signal?: AbortSignal): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      const isStream = body instanceof Readable;
      // keep-alive although the connection is never reused: with `Connection: close`
      // dsecd closes the socket right after an early (error) answer, and our next write
      // fails with EPIPE before that answer is read. Kept alive, it drains the rest.
      const headers: http.OutgoingHttpHeaders = { accept: 'application/json', 'content-type': contentType, connection: 'keep-alive' };
      if (!isStream) headers['content-length'] = body.byteLength;
      const req = this.endpoint.request({ path, method, headers, agent: false });
      let settled = false;
      let responded = false;
      let bodySent = false;
      let bodyError: Error | undefined;
      const finish = (err: unknown, value?: T) => {
        if (settled) return;
        settled = true;
        signal?.removeEventListener('abort', onAbort);
        if (err) reject(err);
        else resolve(value as T);
      };
      const onAbort = () => {
        finish(signal!.reason);
        req.destroy();
        if (isStream) body.destroy();
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      req.on('response', (res) => {
        responded = true;
        // Answered (possibly early, with an error): stop sending what is left.
        if (isStream && !bodySent) {
          body.unpipe(req);
          body.destroy();
        }
        readBody(res).then(
          (text) => {
            // The body was cut short: this connection cannot be reused; let it go.
            if (isStream && !bodySent) req.destroy();
            const status = res.statusCode ?? 0;
            if (status < 200 || status >= 300) return finish(errorFromResponse(status, text));
            if (text === '') return finish(undefined, undefined as T);
            try {
              finish(undefined, JSON.parse(text) as T);
            } catch (e) {
              finish(new DsecApiError('Internal', `dsecd answered ${method} ${path} with a body that is not JSON (status ${status})`, status, { cause: e }));
            }
          },
          (e) => finish(new DsecApiError('Unavailable', `connection to ${this.where} lost during ${method} ${path}: ${errMessage(e)}`, 0, { cause: e })),
        );
      });
      req.on('error', (err: NodeJS.ErrnoException) => {
        if (bodyError) return finish(bodyError);
        if (responded) return; // e.g. EPIPE after an early answer: the answer is what counts
        if (err.code === 'ENOENT' || err.code === 'ECONNREFUSED' || err.code === 'EACCES' || err.code === 'EPERM' || err.code === 'ENOTSOCK') {
          return finish(this.connectionError(err, method, path));
        }
        finish(new DsecApiError('Unavailable', `connection to ${this.where} lost during ${method} ${path}: ${err.message} (dsecd may have refused the upload part way)`, 0, { cause: err }));
      });
      if (!isStream) {
        req.end(body);
        return;
      }
      body.once('error', (e) => {
        bodyError = e;
      });
      pipeline(body, req, (err) => {
        if (!err) bodySent = true;
        if (!err || settled) return;
        if (bodyError) finish(bodyError);
        // A request error is reported by req's own 'error' handler.
      });
    });
  }

  /**
   * Sends one API call and parses its JSON answer. `path` starts with `/v1/` and may
   * carry a query string; `body` is sent as JSON when given. Resolves with the parsed
   * body (undefined when empty) for 2xx responses; rejects with {@link DsecApiError}
   * otherwise (the body's `{error: {code, message}}` when present, else a kind derived
   * from the status), `Unavailable` when the socket cannot be reached, or
   * `DeadlineExceeded` when the deadline passes.
   */
  async request<T>(method: string, path: string, body?: unknown, opts: RequestOptions = {}): Promise<T> {
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs;
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body), 'utf8');
    const deadline = timeoutMs > 0 ? Date.now() + timeoutMs : 0;
    const res = await this.open(method, path, payload, opts.signal, deadline, timeoutMs, IDEMPOTENT.has(method) || opts.idempotencyKey !== undefined, 'application/json', opts);
    let text: string;
    try {
      text = await withDeadline(readBody(res), res, deadline, () => this.deadlineError(method, path, timeoutMs));
    } catch (e) {
      if (opts.signal?.aborted) throw opts.signal.reason ?? e;
      if (e instanceof DsecApiError) throw e;
      throw new DsecApiError('Unavailable', `connection to ${this.where} lost during ${method} ${path}: ${errMessage(e)}`, 0, { cause: e });
    }
    const status = res.statusCode ?? 0;
    if (status >= 400 || status < 200) throw errorFromResponse(status, text);
    if (text === '') return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch (e) {
      throw new DsecApiError('Internal', `dsecd answered ${method} ${path} with a body that is not JSON (status ${status})`, status, { cause: e });
    }
  }

  /**
   * Runs a create (create, restore, fork) under one idempotency key: `opts.idempotencyKey`,
   * else a fresh random one (UUID v4) for this logical create. When the answer is lost
   * (the connection failed: `Unavailable` with status 0) or the service answered 503, the
   * same call is sent again with the same key, up to {@link CREATE_RETRIES} times, 250 ms
   * apart and more: dsecd (or a gateway) answers a retry with the sandbox the first
   * attempt made, so a retry never makes a second one.
   * @throws DsecApiError the last attempt's error.
   */
  protected async keyedCreate<T>(opts: { idempotencyKey?: string; signal?: AbortSignal }, call: (key: string) => Promise<T>): Promise<T> {
    const key = opts.idempotencyKey ?? randomUUID();
    for (let attempt = 0; ; attempt++) {
      try {
        return await call(key);
      } catch (e) {
        const lost = e instanceof DsecApiError && e.code === 'Unavailable' && (e.status === 0 || e.status === 503);
        if (!lost || attempt >= CREATE_RETRIES || opts.signal?.aborted) throw e;
        await new Promise((r) => setTimeout(r, 250 * (attempt + 1)));
      }
    }
  }

  /**
   * Runs a long operation in NDJSON mode: sends `body` with `Accept: application/x-ndjson`,
   * calls `onProgress` per `{type: "progress"}` line and resolves with the `result` of the
   * `{type: "result"}` line, or rejects with the {@link DsecApiError} of an
   * `{type: "error"}` line. A daemon that ignores the Accept header and answers with one
   * JSON document is accepted too. No deadline.
   */
  protected async longOperation<T, P>(method: string, path: string, body: unknown, opts: LongOperationCallbacks<P>): Promise<T> {
    const { signal, onProgress } = opts;
    const payload = Buffer.from(JSON.stringify(body), 'utf8');
    const res = await this.open(method, path, payload, signal, 0, 0, opts.idempotencyKey !== undefined, NDJSON_TYPE, opts);
    let callbackFailed = false;
    try {
      const status = res.statusCode ?? 0;
      if (status >= 400 || status < 200) throw errorFromResponse(status, await readBody(res));
      if (!String(res.headers['content-type'] ?? '').includes(NDJSON_TYPE)) {
        const text = await readBody(res);
        try {
          return JSON.parse(text) as T;
        } catch (e) {
          throw new DsecApiError('Internal', `dsecd answered ${method} ${path} with a body that is not JSON (status ${status})`, status, { cause: e });
        }
      }
      for await (const line of ndjsonLines(res)) {
        const msg = parseProgressLine(line, method, path, status);
        if (msg.type === 'progress') {
          if (!onProgress) continue;
          try {
            onProgress(msg as unknown as P);
          } catch (e) {
            callbackFailed = true;
            throw e;
          }
        } else if (msg.type === 'result') {
          return msg.result as T;
        } else if (msg.type === 'error') {
          const c = msg.error?.code;
          const code = isErrorKind(c) ? c : 'Internal';
          const message = typeof msg.error?.message === 'string' ? msg.error.message : `${method} ${path} failed on dsecd (no message)`;
          const reason = typeof msg.error?.reason === 'string' ? msg.error.reason : undefined;
          throw new DsecApiError(code, message, status, reason === undefined ? undefined : { reason });
        }
        // Any other type: a newer daemon's addition; skipped.
      }
      throw new DsecApiError('Unavailable', `dsecd ended ${method} ${path} without a result; the operation may still finish on dsecd`, status);
    } catch (e) {
      if (callbackFailed) throw e;
      if (signal?.aborted) throw signal.reason ?? e;
      if (e instanceof DsecApiError) throw e;
      throw new DsecApiError(
        'Unavailable',
        `connection to ${this.where} lost during ${method} ${path}: ${errMessage(e)}; the operation may still finish on dsecd`,
        0,
        { cause: e },
      );
    } finally {
      res.destroy();
    }
  }

  /**
   * Closes pooled connections. Safe to call twice; calls made afterwards still work
   * (they open new connections) but are not pooled. Not needed before process exit.
   */
  close(): void {
    this.agent.destroy();
  }

  /**
   * Sends a request and resolves with the response once its headers arrive. `deadline`
   * (absolute ms, 0 = none; `timeoutMs` is its length, for the message) bounds the wait
   * for the headers; the caller bounds the body.
   * A request that fails on a reused keep-alive socket before any response is resent
   * once when `retryable`. `accept` is the Accept header (NDJSON for long operations).
   */
  protected open(
    method: string,
    path: string,
    payload: Buffer | undefined,
    signal: AbortSignal | undefined,
    deadline: number,
    timeoutMs: number,
    retryable: boolean,
    accept = 'application/json',
    extra: { idempotencyKey?: string; allowBurst?: boolean } = {},
  ): Promise<http.IncomingMessage> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      const headers: http.OutgoingHttpHeaders = { accept };
      if (extra.idempotencyKey !== undefined) headers['idempotency-key'] = extra.idempotencyKey;
      if (extra.allowBurst) headers['x-dsec-burst'] = 'allow';
      if (payload !== undefined) {
        headers['content-type'] = 'application/json';
        headers['content-length'] = payload.length;
      }
      const req = this.endpoint.request({ path, method, headers, agent: this.agent });
      let settled = false;
      let timer: NodeJS.Timeout | undefined;
      const onAbort = () => req.destroy(signal!.reason instanceof Error ? signal!.reason : new Error('aborted'));
      const cleanup = () => {
        settled = true;
        if (timer) clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      if (deadline > 0) {
        const left = Math.max(0, deadline - Date.now());
        timer = setTimeout(() => req.destroy(this.deadlineError(method, path, timeoutMs)), left);
      }
      req.on('response', (res) => {
        if (settled) return;
        cleanup();
        // If the request is aborted while the body streams, surface it on the response.
        if (signal) {
          const onLateAbort = () => res.destroy(signal.reason instanceof Error ? signal.reason : new Error('aborted'));
          signal.addEventListener('abort', onLateAbort, { once: true });
          res.once('close', () => signal.removeEventListener('abort', onLateAbort));
        }
        resolve(res);
      });
      req.on('error', (err: NodeJS.ErrnoException) => {
        if (settled) return;
        cleanup();
        if (signal?.aborted) {
          reject(signal.reason ?? err);
        } else if (err instanceof DsecApiError) {
          reject(err);
        } else if (retryable && req.reusedSocket && (err.code === 'ECONNRESET' || err.code === 'EPIPE')) {
          // The daemon closed an idle pooled connection just as we reused it.
          this.open(method, path, payload, signal, deadline, timeoutMs, false, accept, extra).then(resolve, reject);
        } else {
          reject(this.connectionError(err, method, path));
        }
      });
      req.end(payload);
    });
  }

  private deadlineError(method: string, path: string, ms: number): DsecApiError {
    return new DsecApiError('DeadlineExceeded', `no answer from ${this.where} to ${method} ${path} within ${ms} ms`, 0);
  }

  private connectionError(err: NodeJS.ErrnoException, method: string, path: string): DsecApiError {
    const where = this.where;
    if (this.endpoint.isRemote) return remoteConnectionError(err, where, method, path);
    switch (err.code) {
      case 'ENOENT':
        return new DsecApiError('Unavailable', `cannot connect to ${where}: no such file; is dsecd running?`, 0, { cause: err });
      case 'ECONNREFUSED':
        return new DsecApiError('Unavailable', `cannot connect to ${where}: connection refused; is dsecd running?`, 0, { cause: err });
      case 'EACCES':
      case 'EPERM':
        return new DsecApiError('Unavailable', `cannot connect to ${where}: permission denied (run as root or a member of the socket's group)`, 0, { cause: err });
      case 'ENOTSOCK':
        return new DsecApiError('Unavailable', `cannot connect to ${where}: not a socket; is dsecd running?`, 0, { cause: err });
      default:
        return new DsecApiError('Unavailable', `${method} ${path} to ${where} failed: ${err.message}; is dsecd running?`, 0, { cause: err });
    }
  }

  /**
   * A WebSocket attachment to `path` (an exec session's or a console's), with failures
   * turned into {@link DsecApiError}s; see sdk/attach.ts for its lifecycle.
   */
  protected attach<E extends object>(path: string, signal: AbortSignal | undefined): ExecAttachment<E> {
    const ws = this.endpoint.webSocket(path);
    return new ExecAttachment<E>(ws.url, this.webSocketErrors(path), signal, ws.options);
  }

  /** How a WebSocket to `path` (an attachment, an exec channel) turns its failures into {@link DsecApiError}s. */
  protected webSocketErrors(path: string): AttachErrorFactory {
    return {
      response: (status, body) => errorFromResponse(status, body),
      connection: (err) => this.connectionError(err, 'GET', path),
      kind: (code, message, status) => new DsecApiError(code, message, status),
    };
  }
}

/** The error of a failed connection to the TCP door: refused, unreachable, or a TLS failure (an untrusted certificate, a name it does not cover). */
function remoteConnectionError(err: NodeJS.ErrnoException, where: string, method: string, path: string): DsecApiError {
  const code = err.code ?? '';
  if (code === 'ECONNREFUSED') return new DsecApiError('Unavailable', `cannot connect to ${where}: connection refused; is dsecd listening there (--listen)?`, 0, { cause: err });
  if (code === 'ENOTFOUND' || code === 'EAI_AGAIN') return new DsecApiError('Unavailable', `cannot resolve the host of ${where}: ${err.message}`, 0, { cause: err });
  if (/CERT|SELF_SIGNED|UNABLE_TO_VERIFY|ALTNAME/.test(code)) {
    return new DsecApiError('Unavailable', `TLS: ${where} presented a certificate this client does not trust (${err.message}); pass dsecd's CA certificate (--ca FILE, DSEC_CA: <root>/tls/ca.crt on its host)`, 0, { cause: err });
  }
  if (/SSL|TLS|ALERT/.test(code) || /alert|handshake/i.test(err.message)) {
    return new DsecApiError('Unavailable', `TLS: the handshake with ${where} failed (${err.message}); a port that requires client certificates needs one of its CA`, 0, { cause: err });
  }
  return new DsecApiError('Unavailable', `${method} ${path} to ${where} failed: ${err.message}`, 0, { cause: err });
}

/** Reads a whole response body as UTF-8. */
export async function readBody(res: http.IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of res as AsyncIterable<Buffer>) chunks.push(c);
  return Buffer.concat(chunks).toString('utf8');
}

/** Races `p` against an absolute deadline (0 = none), destroying `res` when it passes. */
function withDeadline<T>(p: Promise<T>, res: http.IncomingMessage, deadline: number, err: () => Error): Promise<T> {
  if (deadline <= 0) return p;
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => {
      const e = err();
      res.destroy(e);
      reject(e);
    }, Math.max(0, deadline - Date.now()));
    p.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e) => {
        clearTimeout(timer);
        reject(e);
      },
    );
  });
}

/** One line of a long operation's stream, as sent (not validated beyond `type`). */
interface StreamLine {
  type: string;
  result?: unknown;
  error?: { code?: unknown; message?: unknown; reason?: unknown };
  [k: string]: unknown;
}

/** Parses one NDJSON line of a long operation; a malformed line is `Internal`. */
function parseProgressLine(line: string, method: string, path: string, status: number): StreamLine {
  let v: unknown;
  try {
    v = JSON.parse(line);
  } catch (e) {
    throw new DsecApiError('Internal', `dsecd sent a malformed line during ${method} ${path}: ${JSON.stringify(clip(line))}`, status, { cause: e });
  }
  if (typeof v !== 'object' || v === null || typeof (v as StreamLine).type !== 'string') {
    throw new DsecApiError('Internal', `dsecd sent a line without a type during ${method} ${path}: ${JSON.stringify(clip(line))}`, status);
  }
  return v as StreamLine;
}
