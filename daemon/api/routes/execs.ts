/**
 * Commands: an exec to completion (POST .../exec, optionally a trajectory step), and exec
 * sessions: start, list, inspect, stream output, feed stdin, signal, resize, wait, kill,
 * and attach over a WebSocket (daemon/sandbox/exec-sessions.ts has their lifecycle).
 *
 * Ownership: a session belongs to the uid of the process that started it (SO_PEERCRED
 * of the Unix socket connection). Other uids get NotFound for its id; root sees all.
 *
 * The attach WebSocket (GET .../execs/{exec_id}/attach):
 * - server -> client, binary: 1 byte channel (1 stdout, 2 stderr) + data;
 * - server -> client, text: `{"type":"exit", ...ExecInfo}` when the command has ended
 *   and all output was sent (then close 1000), or `{"type":"error","error":{code,message}}`
 *   (then close 1011, or 1008 for a protocol violation by the client);
 * - client -> server, binary: 1 byte channel 0 + stdin bytes;
 * - client -> server, text: `{"type":"stdin_eof"}`, `{"type":"resize","rows":R,"cols":C}`,
 *   `{"type":"signal","signal":"SIGINT"}`.
 * Anything else from the client is a protocol violation: error message, close 1008.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { WebSocket } from 'ws';
import type { Socket } from 'node:net';
import { AttachQuery, ExecInfo, ExecList, ExecRequest, ExecResult, OutputQuery, ResizeRequest, SignalRequest, StartExecRequest, WaitQuery } from '../schema.js';
import { execInput, startExecInput } from '../convert.js';
import { parseWith } from '../parse.js';
import { DsecError, invalidArgument } from '../../errors.js';
import { assertStdin, parseSignal, type ExecSession, type StreamName } from '../../sandbox/exec-sessions.js';
import * as native from '../../host/native.js';
import { route } from './table.js';
import type { Metrics } from '../../metrics.js';
import type { ExecService } from '../../sandbox/exec.js';
import type { ExecRegistry } from '../../sandbox/exec-sessions.js';
import type { SandboxLifecycle } from '../../sandbox/lifecycle.js';

const execRoute = route({
  method: 'POST', url: '/v1/sandboxes/:id/exec', summary: 'Run a command to completion inside the sandbox.', body: ExecRequest, status: 200, response: ExecResult,
  errors: ['InvalidArgument', 'NotFound', 'FailedPrecondition', 'Unavailable'],
});
const P = '/v1/sandboxes/:id/execs';
const startRoute = route({ method: 'POST', url: P, summary: 'Start an exec session (streamed output, optional stdin and PTY); it runs until it exits, whoever is connected.', body: StartExecRequest, status: 201, response: ExecInfo, errors: ['InvalidArgument', 'NotFound', 'FailedPrecondition', 'Unavailable'] });
const listRoute = route({ method: 'GET', url: P, summary: "The caller's exec sessions in this sandbox.", status: 200, response: ExecList, errors: ['NotFound'] });
const getRoute = route({ method: 'GET', url: `${P}/:exec_id`, summary: 'One exec session.', status: 200, response: ExecInfo, errors: ['NotFound'] });
const outputRoute = route({ method: 'GET', url: `${P}/:exec_id/output`, summary: 'Output of one stream as raw bytes from an offset; follow=true streams until the command ends.', query: OutputQuery, status: 200, response: null, errors: ['InvalidArgument', 'NotFound'] });
const stdinRoute = route({ method: 'POST', url: `${P}/:exec_id/stdin`, summary: 'Write the raw request body to the command\'s stdin; ?eof=true closes stdin after it.', status: 204, response: null, errors: ['NotFound', 'FailedPrecondition'] });
const signalRoute = route({ method: 'POST', url: `${P}/:exec_id/signal`, summary: "Send a signal to the command's process group.", body: SignalRequest, status: 200, response: ExecInfo, errors: ['InvalidArgument', 'NotFound'] });
const resizeRoute = route({ method: 'POST', url: `${P}/:exec_id/resize`, summary: 'Resize the PTY of a tty exec.', body: ResizeRequest, status: 200, response: ExecInfo, errors: ['InvalidArgument', 'NotFound'] });
const waitRoute = route({ method: 'POST', url: `${P}/:exec_id/wait`, summary: 'Wait until the command ends (or timeout_ms passes: DeadlineExceeded).', query: WaitQuery, status: 200, response: ExecInfo, errors: ['NotFound', 'DeadlineExceeded'] });
const deleteRoute = route({ method: 'DELETE', url: `${P}/:exec_id`, summary: 'Kill the command if it runs and forget the session and its output.', status: 200, response: ExecInfo, errors: ['NotFound'] });
const attachRoute = route({ method: 'GET', url: `${P}/:exec_id/attach`, summary: 'WebSocket: stream output, feed stdin, resize and signal (see daemon/api/routes/execs.ts for the message format).', query: AttachQuery, status: 101, response: null, errors: ['NotFound'] });

const peerUids = new WeakMap<object, number>();

/** uid of the API caller: the peer of the Unix socket connection (0 when unknown, e.g. in-process tests, and for the TCP door). */
export function callerUid(req: FastifyRequest): number {
  // The TCP door has no uid: its callers are tokens. A session belongs to its sandbox's
  // tenant (the tenancy hook refuses another tenant's sandbox id, daemon/api/tenancy.ts),
  // so a token sees every session of the sandboxes its tenant owns, as root does.
  if (req.principal?.door === 'tcp') return 0;
  const sock = req.raw.socket as Socket & { _handle?: { fd?: number } };
  const cached = peerUids.get(sock);
  if (cached !== undefined) return cached;
  let uid = 0;
  const fd = sock._handle?.fd;
  if (typeof fd === 'number' && fd >= 0) {
    try {
      uid = native.peerCred(fd).uid;
    } catch { /* not a Unix socket (TCP metrics port): treat as root-equivalent local caller */ }
  }
  peerUids.set(sock, uid);
  return uid;
}

const truthy = (v: string | undefined) => v === 'true' || v === '1';

/** What the exec-to-completion route uses. */
export interface ExecRouteDeps {
  exec: Pick<ExecService, 'exec'>;
  metrics: Pick<Metrics, 'execSeconds'>;
}

/** Registers POST /v1/sandboxes/{id}/exec (at the top level: it is the hot path, with no scope of its own). */
export function registerExecRoute(app: FastifyInstance, deps: ExecRouteDeps): void {
  app.post<{ Params: { id: string } }>(execRoute.url, async (req) => {
    const body = parseWith(ExecRequest, req.body, 'exec request');
    const end = deps.metrics.execSeconds.startTimer();
    const r = await deps.exec.exec(req.params.id, execInput(body));
    end();
    return r;
  });
}

/** What the exec-session routes use. */
export interface ExecSessionRouteDeps {
  exec: Pick<ExecService, 'startExec'>;
  /** The sandbox (NotFound for an unknown one first). */
  lifecycle: Pick<SandboxLifecycle, 'get'>;
  sessions: ExecRegistry;
}

/** Registers the exec-session routes; must run inside a context where @fastify/websocket is registered. */
export function registerExecSessionRoutes(app: FastifyInstance, deps: ExecSessionRouteDeps): void {
  const m = deps.sessions;
  type R = FastifyRequest<{ Params: { id: string; exec_id: string } }>;
  const session = (req: R): ExecSession => {
    deps.lifecycle.get(req.params.id); // NotFound for an unknown sandbox first
    return m.get(req.params.id, req.params.exec_id, callerUid(req));
  };

  // Raw bodies for stdin: handed to the route as a stream, never parsed.
  app.addContentTypeParser('application/octet-stream', (_req, payload, done) => done(null, payload));

  app.post<{ Params: { id: string } }>(startRoute.url, async (req, reply) => {
    const body = parseWith(StartExecRequest, req.body, 'exec request');
    const s = await deps.exec.startExec(req.params.id, startExecInput(body), callerUid(req));
    await s.handle.pid.catch(() => {});
    return reply.code(201).send(s.info());
  });
  app.get<{ Params: { id: string } }>(listRoute.url, async (req) => {
    deps.lifecycle.get(req.params.id);
    return { execs: m.list(req.params.id, callerUid(req)).map((s) => s.info()) };
  });
  app.get(getRoute.url, async (req) => session(req as R).info());
  app.delete(deleteRoute.url, async (req) => {
    const r = req as R;
    session(r);
    return m.remove(r.params.id, r.params.exec_id, callerUid(r));
  });
  app.post(signalRoute.url, async (req) => {
    const s = session(req as R);
    const body = parseWith(SignalRequest, req.body, 'signal request');
    s.handle.signal(parseSignal(body.signal));
    return s.info();
  });
  app.post(resizeRoute.url, async (req) => {
    const s = session(req as R);
    const body = parseWith(ResizeRequest, req.body, 'resize request');
    if (!s.tty) throw invalidArgument(`exec ${s.id} has no tty; resize needs an exec started with "tty"`);
    s.handle.resize(body.rows, body.cols);
    return s.info();
  });
  app.post(waitRoute.url, async (req) => {
    const s = session(req as R);
    const q = parseWith(WaitQuery, req.query, 'query');
    await s.wait(q.timeout_ms);
    return s.info();
  });
  app.post(stdinRoute.url, async (req, reply) => {
    const s = session(req as R);
    assertStdin(s);
    const body = req.body as NodeJS.ReadableStream | string | Buffer | undefined;
    if (body && typeof (body as NodeJS.ReadableStream).on === 'function') {
      // Paced by the agent: wait for the connection to drain after each chunk, so an
      // exec that does not read its stdin holds the upload back instead of daemon memory.
      const stream = body as NodeJS.ReadableStream;
      for await (const chunk of stream as AsyncIterable<Buffer>) {
        if (s.ended) break;
        s.handle.writeStdin(Buffer.from(chunk));
        await s.handle.drained();
      }
      // The command ended first: discard the rest, so the connection is free again.
      stream.resume();
    } else if (body) {
      s.handle.writeStdin(Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body)));
    }
    if (truthy((req.query as { eof?: string }).eof)) s.handle.closeStdin();
    return reply.code(204).send();
  });
  app.get(outputRoute.url, async (req, reply) => {
    const s = session(req as R);
    const q = parseWith(OutputQuery, req.query, 'query');
    const stream: StreamName = q.stream ?? 'stdout';
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'cache-control': 'no-store', 'x-dsec-exec-state': s.info().state });
    let closed = false;
    res.on('close', () => { closed = true; });
    try {
      await s.pipe(stream, q.offset ?? 0, truthy(q.follow), (b) => new Promise<void>((resolve) => {
        if (closed) return resolve();
        if (res.write(b)) resolve();
        else res.once('drain', () => resolve());
      }), () => closed);
    } finally {
      res.end();
    }
  });

  app.get(attachRoute.url, { websocket: true }, (socket: WebSocket, req: FastifyRequest) => {
    const r = req as R;
    let s: ExecSession;
    let q: { stdout_offset?: number; stderr_offset?: number; kill_on_detach?: string };
    const fail = (e: unknown, code = 1011) => {
      const err = e instanceof DsecError ? e : new DsecError('Internal', (e as Error).message);
      if (socket.readyState === socket.OPEN) {
        socket.send(JSON.stringify({ type: 'error', error: { code: err.kind, message: err.message } }));
        socket.close(code, err.kind);
      }
    };
    try {
      s = session(r);
      q = parseWith(AttachQuery, req.query, 'query');
    } catch (e) {
      fail(e, 1008);
      return;
    }
    let closed = false;
    socket.on('close', () => {
      closed = true;
      if (truthy(q.kill_on_detach) && !s.ended) s.handle.signal(9);
    });
    socket.on('error', () => { closed = true; });
    socket.on('message', (data: Buffer, isBinary: boolean) => {
      try {
        if (isBinary) {
          if (data.length < 1 || data[0] !== 0) throw invalidArgument('binary messages must start with channel byte 0 (stdin)');
          if (!s.tty) assertStdin(s);
          s.handle.writeStdin(data.subarray(1));
          // Stop reading this WebSocket until the agent connection drains (backpressure).
          socket.pause();
          void s.handle.drained().then(() => socket.resume());
          return;
        }
        let msg: { type?: string; rows?: number; cols?: number; signal?: string | number };
        try {
          msg = JSON.parse(data.toString('utf8'));
        } catch {
          throw invalidArgument('text messages must be JSON');
        }
        if (typeof msg !== 'object' || msg === null || Array.isArray(msg)) throw invalidArgument('text messages must be JSON objects with a "type"');
        if (msg.type === 'signal' && typeof msg.signal !== 'string' && typeof msg.signal !== 'number') throw invalidArgument('a signal message needs "signal": a name (e.g. "SIGTERM") or a number');
        if (msg.type === 'stdin_eof') s.handle.closeStdin();
        else if (msg.type === 'resize') {
          const rz = parseWith(ResizeRequest, { rows: msg.rows, cols: msg.cols }, 'resize message');
          if (!s.tty) throw invalidArgument(`exec ${s.id} has no tty; cannot resize`);
          s.handle.resize(rz.rows, rz.cols);
        } else if (msg.type === 'signal') s.handle.signal(parseSignal(msg.signal ?? ''));
        else throw invalidArgument(`unknown message type ${JSON.stringify(msg.type)}`);
      } catch (e) {
        fail(e, 1008);
      }
    });
    // Each stream is piped from its spool with the socket's own backpressure: the send
    // callback fires once the frame is handed to the kernel.
    const send = (channel: number) => (b: Buffer) => new Promise<void>((resolve) => {
      if (closed || socket.readyState !== socket.OPEN) return resolve();
      socket.send(Buffer.concat([Buffer.from([channel]), b]), { binary: true }, () => resolve());
    });
    void Promise.all([
      s.pipe('stdout', q.stdout_offset ?? 0, true, send(1), () => closed),
      s.pipe('stderr', q.stderr_offset ?? 0, true, send(2), () => closed),
    ]).then(() => {
      if (closed || socket.readyState !== socket.OPEN) return;
      socket.send(JSON.stringify({ type: 'exit', ...s.info() }), () => socket.close(1000, 'exited'));
    }, (e) => fail(e));
  });
}
