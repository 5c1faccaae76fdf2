/**
 * The exec channel (GET /v1/sandboxes/{id}/exec/channel, a WebSocket): commands run to
 * completion, as POST .../exec runs them, many over one connection. An agent loop that
 * runs thousands of short commands in one sandbox pays the door's authentication, the
 * tenancy check and the HTTP request machinery once per connection instead of once per
 * command (docs/BENCHMARKS.md "Exec p50" has what that saves).
 *
 * Messages (text frames, JSON; a binary frame is a protocol violation):
 * - client -> server: `{"id": ID, "request": ExecRequest}`, ID a string of 1-128
 *   characters or a safe integer, unique among the client's requests still in flight;
 *   ExecRequest exactly as POST .../exec takes it (trajectory steps included);
 * - server -> client: `{"id": ID, "result": ExecResult}` when the command ran (whatever
 *   its exit status), or `{"id": ID, "error": {"code", "message", "reason"?}}` when the
 *   request was refused or failed (the kinds POST .../exec answers with), in the order
 *   commands finish, not the order they were sent;
 * - a protocol violation (not JSON, no valid id, a duplicate id in flight, a binary
 *   frame) is answered `{"id": null, "error": {...}}` and the channel closes with 1008.
 * Requests whose commands have not finished stay running when the channel closes; their
 * results are dropped.
 *
 * Limits: a message is at most 1 MiB (the API's WebSocket limit, so `stdin_b64` up to
 * ~768 KiB; POST .../exec takes more); a bigger one closes the channel with 1009 (the
 * WebSocket library's answer, without an `{"id": null}` message; the SDK refuses such a
 * request itself, before sending). At most {@link MAX_IN_FLIGHT} requests run at once
 * per channel, counted until their answer is handed to the kernel: beyond that the
 * channel stops reading. A request the client stopped waiting for still holds its place
 * until its command ends. An answer the client does not take within
 * {@link ANSWER_STALL_MS} drops the channel, so a client that stops reading holds at most
 * that many results (each at most 2 × `[exec] max_output_bytes`, base64) for at most that
 * long.
 *
 * Access: the channel is opened with the tenancy check of its sandbox id and the door's
 * authentication and role (a `write` route, as any upgrade), once; revoking the token
 * closes it (daemon/remote/door.ts). The channel's opening is an audit line (`result` 101)
 * and so is every request on it, with action `EXEC /v1/sandboxes/:id/exec/channel`
 * (daemon/remote/audit.ts): when it is answered, or, for a request still running when the
 * channel closes, then (`result` 499, error `ClientClosed`). Its commands count in `dsec_exec_seconds` as POST .../exec's do.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { WebSocket } from 'ws';
import { ExecRequest } from '../schema.js';
import { execInput } from '../convert.js';
import { parseJson, parseWith } from '../parse.js';
import { forCaller } from '../reply.js';
import { DsecError, invalidArgument } from '../../errors.js';
import type { ExecRouteDeps } from './execs.js';
import { route } from './table.js';

const channelRoute = route({
  method: 'GET', url: '/v1/sandboxes/:id/exec/channel',
  summary: 'WebSocket: run commands to completion, many on one connection, answers matched by request id (see daemon/api/routes/exec-channel.ts for the message format).',
  status: 101, response: null, errors: ['NotFound'],
});

/**
 * Requests one channel runs at once (the rest wait unread on the socket). 16 keeps a
 * pipelining client busy on a 2-core host and bounds what a client that stops reading
 * makes dsecd hold (16 results).
 */
export const MAX_IN_FLIGHT = 16;

/**
 * How long an answer may wait for the client to take it (ms) before the channel is
 * dropped: 60 s, far beyond what a reading client on any link needs for the largest
 * answer (2 × 4 MiB of output, base64), and the longest a client that stopped reading
 * holds its answers (at most {@link MAX_IN_FLIGHT}) in dsecd.
 */
export const ANSWER_STALL_MS = 60_000;

/** Audit status of a request whose channel closed before it was answered (nginx's "client closed request"). */
const CLIENT_CLOSED_STATUS = 499;

/** Longest string id a client may use, in characters. */
const MAX_ID_CHARS = 128;

/** Action of a channel request's audit line. */
export const CHANNEL_AUDIT_ACTION = 'EXEC /v1/sandboxes/:id/exec/channel';

/** What the exec channel uses: the exec route's own deps and the API logger. */
export type ExecChannelDeps = ExecRouteDeps & { log: Logger };

type Id = string | number;

/** A client's request id, or undefined when it is not one (see the module comment). */
function requestId(v: unknown): Id | undefined {
  if (typeof v === 'string' && v.length >= 1 && v.length <= MAX_ID_CHARS) return v;
  if (typeof v === 'number' && Number.isSafeInteger(v)) return v;
  return undefined;
}

/** Registers the exec channel; must run inside a context where @fastify/websocket is registered. */
export function registerExecChannelRoute(app: FastifyInstance, deps: ExecChannelDeps): void {
  app.get<{ Params: { id: string } }>(channelRoute.url, { websocket: true }, (socket: WebSocket, req: FastifyRequest<{ Params: { id: string } }>) => {
    const sandboxId = req.params.id;
    const inFlight = new Set<Id>();
    /** Messages read while {@link MAX_IN_FLIGHT} ran (ws may emit a few after pause). */
    const waiting: Buffer[] = [];
    let paused = false;
    let closed = false;
    /** Requests accepted and not yet audited (audited when answered, or when the channel closes first). */
    const unaudited = new Set<Id>();
    socket.on('close', () => {
      closed = true;
      // A command still running when the channel closes is audited now: its answer may
      // never come (it may run for as long as it likes after its client left).
      for (const id of unaudited) req.auditMessage?.(CHANNEL_AUDIT_ACTION, CLIENT_CLOSED_STATUS, 'ClientClosed');
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
      let stall: NodeJS.Timeout | undefined;
      const done = () => {
        clearTimeout(stall);
        inFlight.delete(id);
        if (paused && inFlight.size < MAX_IN_FLIGHT) {
          paused = false;
          socket.resume();
          while (waiting.length && inFlight.size < MAX_IN_FLIGHT && !closed) handle(waiting.shift()!);
        }
      };
      if (closed || socket.readyState !== socket.OPEN) {
        if (audit) req.auditMessage?.(CHANNEL_AUDIT_ACTION, status, errorKind);
        return done();
      }
      // An answer the client does not take within ANSWER_STALL_MS ends the channel, so a
      // client that stops reading cannot hold its answers in dsecd for longer than that.
      stall = setTimeout(() => socket.terminate(), ANSWER_STALL_MS);
      stall.unref();
      socket.send(JSON.stringify(msg), done);
      if (audit) req.auditMessage?.(CHANNEL_AUDIT_ACTION, status, errorKind);
    };

    const fail = (id: Id, e: unknown) => {
      let err: DsecError;
      if (e instanceof DsecError) err = e;
      else {
        deps.log.error({ err: e, sandbox: sandboxId, reqId: req.id }, 'exec channel request failed');
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
      let body: ExecRequest;
      try {
        body = parseWith(ExecRequest, request, 'exec request');
      } catch (e) {
        return fail(id, e);
      }
      const end = deps.metrics.execSeconds.startTimer();
      deps.exec.exec(sandboxId, execInput(body)).then(
        (result) => {
          end();
          answer(id, { id, result }, 200, null);
        },
        (e) => fail(id, e),
      );
    };

    socket.on('message', (data: Buffer, isBinary: boolean) => {
      if (closed) return;
      if (isBinary) return violation('binary messages are not part of the exec channel; send JSON text');
      if (paused) waiting.push(data);
      else handle(data);
    });
  });
}
