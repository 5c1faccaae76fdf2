/**
 * Request channels: a WebSocket over which a client sends many requests of one kind,
 * each answered by its id when it finishes, without an HTTP request (and the door's
 * authentication, tenancy check and fastify's hooks) per request. Two routes use it: the
 * exec channel (GET /v1/sandboxes/{id}/exec/channel, requests as POST .../exec takes
 * them) and the run channel (GET /v1/run/channel, requests as POST /v1/run takes them).
 *
 * Messages (text frames, JSON; a binary frame is a protocol violation):
 * - client -> server: `{"id": ID, "request": REQUEST}`, ID a string of 1-128 characters
 *   or a safe integer, unique among the client's requests still in flight; REQUEST
 *   exactly as the route's HTTP twin takes its body;
 * - server -> client: `{"id": ID, "result": RESULT}` (the HTTP twin's 200 body), or
 *   `{"id": ID, "error": {"code", "message", "reason"?}}` when the request was refused
 *   or failed (the kinds the HTTP twin answers with), in the order requests finish, not
 *   the order they were sent;
 * - a protocol violation (not JSON, no valid id, a duplicate id in flight, `__proto__`
 *   keys, a binary frame) is answered `{"id": null, "error": {...}}` and the channel
 *   closes with 1008.
 *
 * Limits: a message is at most 1 MiB (the API's WebSocket limit, daemon/api/server.ts);
 * a bigger one closes the channel with 1009 (the WebSocket library's answer, without an
 * `{"id": null}` message; the SDK refuses such a request itself, before sending). At
 * most {@link MAX_IN_FLIGHT} requests run at once per channel, counted until their answer
 * is handed to the kernel: beyond that the channel stops reading. While answers wait, a
 * channel whose client makes no progress for {@link ANSWER_STALL_MS} is dropped, so a
 * client that stops reading holds at most that many results in dsecd for at most that
 * long. Progress is what dsecd can see of the client's reading: the kernel taking more of
 * the answers from dsecd's buffer, which happens once the client has read a good part of
 * the socket's send buffer (~200 KiB on the Unix socket; over TCP up to a few MiB, as the
 * kernel sizes it). A client that reads less than that in 60 s counts as stopped.
 * Answers are not bounded by the 1 MiB of a request: an exec or run result is up to
 * 2 × `[exec] max_output_bytes` of output in base64 plus its fields (~11 MB at the
 * default 4 MiB per stream), so a client must accept messages that large (e.g. Python
 * `websockets`' `max_size`).
 *
 * Audit: every request is an audit line with the route's action (daemon/remote/audit.ts
 * `req.auditMessage`), written when it is answered, or, for a request still running when
 * the channel closes, then (`result` 499, error `ClientClosed`).
 */
import type { FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { WebSocket } from 'ws';
import { parseJson } from './parse.js';
import { forCaller } from './reply.js';
import { DsecError, invalidArgument } from '../errors.js';

/**
 * Requests one channel runs at once (the rest wait unread on the socket). 16 keeps a
 * pipelining client busy on a 2-core host and bounds what a client that stops reading
 * makes dsecd hold (16 results).
 */
export const MAX_IN_FLIGHT = 16;

/**
 * How long answers may wait without progress (see the module comment) before the channel
 * is dropped, ms: 60 s, far beyond a pause of a client that is still reading, and the
 * longest a client that stopped reading holds its answers (at most
 * {@link MAX_IN_FLIGHT}) in dsecd.
 */
export const ANSWER_STALL_MS = 60_000;

/** How often a channel with answers waiting checks that the client took some of them (ms). */
const STALL_CHECK_MS = 5_000;

/** Audit status of a request whose channel closed before it was answered (nginx's "client closed request"). */
const CLIENT_CLOSED_STATUS = 499;

/** Longest string id a client may use, in characters. */
const MAX_ID_CHARS = 128;

/** What one kind of channel does with a request. */
export interface ChannelHandler {
  /** Audit action of each request, e.g. `EXEC /v1/sandboxes/:id/exec/channel`. */
  auditAction: string;
  /** Logger for requests that fail with a non-DsecError (answered `Internal`). */
  log: Logger;
  /** Fields logged with such a failure (e.g. `{sandbox: id}`). */
  logFields: Record<string, unknown>;
  /**
   * Runs one request and resolves with the answer's `result` (the HTTP twin's 200 body).
   * `request` is the message's `request` value, unvalidated: the handler validates it
   * (InvalidArgument). `closed` aborts when the channel closes, for handlers whose HTTP
   * twin stops work its client left. Rejections with a DsecError are answered with its
   * kind; any other is logged and answered `Internal`.
   */
  run(request: unknown, closed: AbortSignal): Promise<object>;
}

type Id = string | number;

/**
 * The HTTP handler of a channel route, for a request that did not ask to upgrade: refuses
 * it, naming what the route is, instead of an empty 404.
 * @throws DsecError InvalidArgument, always.
 */
export function notUpgraded(req: FastifyRequest): never {
  throw invalidArgument(`GET ${req.url.split('?')[0]} is a WebSocket (a request channel, daemon/api/channel.ts): connect with "Connection: Upgrade" and "Upgrade: websocket", e.g. the SDK's client.execChannel(id) or client.runChannel()`);
}

/** A client's request id, or undefined when it is not one (see the module comment). */
function requestId(v: unknown): Id | undefined {
  if (typeof v === 'string' && v.length >= 1 && v.length <= MAX_ID_CHARS) return v;
  if (typeof v === 'number' && Number.isSafeInteger(v)) return v;
  return undefined;
}

/**
 * Serves one channel on an accepted WebSocket until it closes; see the module comment.
 * `req` is the upgrade request (its principal, audit hook and id).
 */
export function serveChannel(socket: WebSocket, req: FastifyRequest, handler: ChannelHandler): void {
  const inFlight = new Set<Id>();
  /** Messages read while {@link MAX_IN_FLIGHT} ran (ws may emit a few after pause). */
  const waiting: Buffer[] = [];
  const gone = new AbortController();
  let paused = false;
  let closed = false;
  /** Requests accepted and not yet audited (audited when answered, or when the channel closes first). */
  const unaudited = new Set<Id>();
  /** Answers handed to ws and not yet written to the kernel. */
  let sending = 0;
  /** When the client last took answer bytes (ms), and ws's send buffer then (bytes). */
  let progressAt = 0;
  let lastBuffered = 0;
  let watchdog: NodeJS.Timeout | undefined;
  const stopWatchdog = () => {
    clearInterval(watchdog);
    watchdog = undefined;
  };
  const progress = () => {
    progressAt = Date.now();
    lastBuffered = socket.bufferedAmount;
  };
  // Runs only while answers wait: the buffer shrinking (or an answer fully written) is
  // progress; none for ANSWER_STALL_MS drops the channel.
  const watch = () => {
    if (watchdog) return;
    progress();
    watchdog = setInterval(() => {
      if (sending === 0) return stopWatchdog();
      const b = socket.bufferedAmount;
      if (b < lastBuffered) progressAt = Date.now();
      lastBuffered = b;
      if (Date.now() - progressAt > ANSWER_STALL_MS) {
        stopWatchdog();
        socket.terminate();
      }
    }, STALL_CHECK_MS);
    watchdog.unref();
  };
  socket.on('close', () => {
    closed = true;
    stopWatchdog();
    gone.abort();
    // A request still running when the channel closes is audited now: its answer may
    // never come (a command may run for as long as it likes after its client left).
    for (const _ of unaudited) req.auditMessage?.(handler.auditAction, CLIENT_CLOSED_STATUS, 'ClientClosed');
    unaudited.clear();
  });
  socket.on('error', () => {
    closed = true;
  });

  const violation = (message: string) => {
    if (closed) return;
    closed = true;
    waiting.length = 0;
    if (socket.readyState !== socket.OPEN) return;
    socket.send(JSON.stringify({ id: null, error: { code: 'InvalidArgument', message } }), () => socket.close(1008, 'InvalidArgument'));
  };

  const answer = (id: Id, msg: object, status: number, errorKind: string | null) => {
    // Audited after the answer is handed to the socket: the line is dsecd's record, not
    // part of the client's wait.
    const audit = unaudited.delete(id);
    const done = () => {
      inFlight.delete(id);
      if (paused && inFlight.size < MAX_IN_FLIGHT) {
        paused = false;
        socket.resume();
        while (waiting.length && inFlight.size < MAX_IN_FLIGHT && !closed) handle(waiting.shift()!);
      }
    };
    if (closed || socket.readyState !== socket.OPEN) {
      if (audit) req.auditMessage?.(handler.auditAction, status, errorKind);
      return done();
    }
    sending += 1;
    watch();
    socket.send(JSON.stringify(msg), () => {
      sending -= 1;
      progress();
      done();
    });
    if (audit) req.auditMessage?.(handler.auditAction, status, errorKind);
  };

  const fail = (id: Id, e: unknown) => {
    let err: DsecError;
    if (e instanceof DsecError) err = e;
    else {
      handler.log.error({ err: e, ...handler.logFields, reqId: req.id }, 'channel request failed');
      err = new DsecError('Internal', `internal error: ${(e as Error)?.message ?? String(e)}`);
    }
    err = forCaller(err, req);
    answer(id, { id, error: { code: err.kind, message: err.message, ...(err.reason ? { reason: err.reason } : {}) } }, err.status, err.kind);
  };

  const handle = (data: Buffer) => {
    let msg: unknown;
    try {
      msg = parseJson(data.toString('utf8'));
    } catch (e) {
      return violation(e instanceof DsecError ? e.message : `messages must be JSON (${(e as Error).message})`);
    }
    if (typeof msg !== 'object' || msg === null || Array.isArray(msg)) return violation('messages must be JSON objects {"id", "request"}');
    const { id: rawId, request } = msg as { id?: unknown; request?: unknown };
    const id = requestId(rawId);
    if (id === undefined) return violation(`"id" must be a string of 1-${MAX_ID_CHARS} characters or a safe integer`);
    if (inFlight.has(id)) return violation(`id ${JSON.stringify(id)} is already in flight`);
    const extra = Object.keys(msg).filter((k) => k !== 'id' && k !== 'request');
    inFlight.add(id);
    unaudited.add(id);
    if (inFlight.size >= MAX_IN_FLIGHT && !paused) {
      paused = true;
      socket.pause();
    }
    if (extra.length) return fail(id, invalidArgument(`unknown key ${JSON.stringify(extra[0])} in a channel message (expected "id" and "request")`));
    if (request === undefined) return fail(id, invalidArgument('a channel message needs "request": the body its HTTP twin (POST .../exec, POST /v1/run) takes'));
    let running: Promise<object>;
    try {
      running = handler.run(request, gone.signal);
    } catch (e) {
      return fail(id, e);
    }
    running.then((result) => answer(id, { id, result }, 200, null), (e) => fail(id, e));
  };

  socket.on('message', (data: Buffer, isBinary: boolean) => {
    if (closed) return;
    if (isBinary) return violation('binary messages are not part of the channel protocol; send JSON text');
    if (paused) waiting.push(data);
    else handle(data);
  });
}
