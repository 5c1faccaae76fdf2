/**
 * envd's `process.Process` service over dsec exec sessions (daemon/sandbox/execs.ts):
 * Start and Connect stream a start event (the pid inside the sandbox), output as it
 * comes (stdout and stderr, or pty for a terminal), keepalives while it is quiet, then
 * one end event with the exit code; List, SendInput, SendSignal, CloseStdin and Update
 * act on a process by pid or tag.
 *
 * Contracts, as E2B's envd keeps them:
 * - a process outlives its stream: a client that disconnects (or whose `timeoutMs`
 *   passes: DeadlineExceeded) stops receiving events, the process runs on, Connect
 *   picks it up again (from the output that comes next), SendSignal ends it;
 * - commands run as the request's user (Basic authorization `user:`), else the SDKs'
 *   default `user` when the sandbox has that account, with HOME, USER and LOGNAME of
 *   that account, in its home unless a cwd is given;
 * - `stdin` left unset keeps stdin open (SDKs before stdin control write to every
 *   process); false gives the process /dev/null.
 */
import type { ServiceImpl, HandlerContext } from '@connectrpc/connect';
import { Code, ConnectError } from '@connectrpc/connect';
import type { MessageInitShape } from '@bufbuild/protobuf';
import { Process, Signal, type ProcessSelector, type ProcessEventSchema } from './gen/process/process_pb.js';
import type { E2bFront, E2bProcessEntry } from './front.js';
import type { HostProcess } from './host.js';
import { ENVD_CONTEXT } from './context.js';
import { toConnectError } from './wire.js';

/** Header of the keepalive interval the SDKs ask for, seconds (they send 50). */
export const KEEPALIVE_HEADER = 'keepalive-ping-interval';

/** Keepalive interval bounds, seconds: at least 1 (a client cannot make dsecd spin), at most 300 (a quiet stream still shows it is alive within E2B's own 5-minute proxy idle limit). */
const KEEPALIVE_MIN_S = 1;
const KEEPALIVE_MAX_S = 300;
/** Keepalive interval when the client asks for none: 50 s, the SDKs' own value. */
const KEEPALIVE_DEFAULT_S = 50;

type EventInit = MessageInitShape<typeof ProcessEventSchema>;

/** Go's ProcessState text for a signal, which the SDKs show: `signal: killed`, `signal: terminated`, else the name. */
function signalText(name: string): string {
  const words: Record<string, string> = { SIGKILL: 'killed', SIGTERM: 'terminated', SIGINT: 'interrupt', SIGHUP: 'hangup', SIGPIPE: 'broken pipe', SIGSEGV: 'segmentation fault', SIGABRT: 'aborted' };
  return `signal: ${words[name] ?? name}`;
}

/** The end event (a ProcessEvent) of a finished process. */
export function endEvent(r: { exitCode: number | null; signal: string | null; error: string | null }): EventInit {
  const exited = r.exitCode !== null;
  const status = exited ? `exit status ${r.exitCode}` : r.signal ? signalText(r.signal) : (r.error ?? 'ended with its sandbox');
  return {
    event: {
      case: 'end',
      value: { exitCode: exited ? r.exitCode! : -1, exited, status, ...(exited && r.exitCode === 0 ? {} : { error: status }) },
    },
  };
}

/**
 * The events (ProcessEvents) of `proc` from output offsets `from`: output of both streams as it comes (a
 * tty's as pty), a keepalive after every `keepaliveMs` without an event, then the end
 * event. Each event is taken before more output is read (the client paces the reading).
 * Stops when `signal` aborts (the client left or its deadline passed); the process runs on.
 */
export async function* processEvents(proc: HostProcess, tty: boolean, from: { stdout: number; stderr: number }, keepaliveMs: number, signal: AbortSignal): AsyncGenerator<EventInit> {
  const queue: { ev: EventInit; taken: () => void }[] = [];
  let wake: (() => void) | null = null;
  const notify = () => {
    const w = wake;
    wake = null;
    w?.();
  };
  // Once the client left, nothing will take an event: a pump's write returns at once (it
  // then sees `aborted` and leaves the output, so its position holds nothing back).
  const push = (ev: EventInit) => new Promise<void>((taken) => {
    if (signal.aborted) return taken();
    queue.push({ ev, taken });
    notify();
  });
  const aborted = () => signal.aborted;
  // The generator may never be resumed after the client left (its consumer stops pulling):
  // pumps waiting on queued events are released here, not only in the `finally` below.
  const onAbort = () => {
    for (const q of queue.splice(0)) q.taken();
    notify();
  };
  signal.addEventListener('abort', onAbort);
  const data = (stream: 'stdout' | 'stderr') => (b: Buffer) => push({ event: { case: 'data', value: { output: { case: tty ? 'pty' : stream, value: b } } } });
  let pumping = 2;
  let failure: unknown = null;
  for (const s of ['stdout', 'stderr'] as const) {
    proc.pipe(s, from[s], true, data(s), aborted).catch((e: unknown) => { failure ??= e; }).finally(() => {
      pumping -= 1;
      notify();
    });
  }
  const timer = setInterval(() => {
    if (queue.length === 0) void push({ event: { case: 'keepalive', value: {} } });
  }, keepaliveMs);
  timer.unref();
  try {
    for (;;) {
      if (signal.aborted) throw signal.reason instanceof ConnectError ? signal.reason : new ConnectError('the stream was cancelled', Code.Canceled);
      const next = queue.shift();
      if (next) {
        // Released before the yield: a consumer that leaves while holding this event never
        // resumes the generator, and a pump left waiting would keep its place in the
        // command's paced output forever (holding the command). A pump runs at most one
        // event ahead of the consumer.
        next.taken();
        yield next.ev;
        continue;
      }
      if (pumping === 0) break;
      await new Promise<void>((r) => { wake = r; });
    }
    if (failure) throw toConnectError(failure);
    await proc.wait();
    yield endEvent(proc.result());
  } finally {
    clearInterval(timer);
    signal.removeEventListener('abort', onAbort);
    // Unblock pumps waiting on events nobody will take (they see `aborted` next).
    for (const q of queue.splice(0)) q.taken();
    // The client left before the end: the process runs on, unread output is dropped.
    if (!proc.ended) proc.unwatched();
  }
}

/**
 * Once the request ends (client gone, deadline, or done), output nobody reads of `proc`
 * is dropped: whether or not the stream's own reader ever started (a client that leaves
 * right after the start event may never get its events pumped), the process is not held
 * back waiting for a reader.
 */
function dropUnreadAfter(signal: AbortSignal, proc: HostProcess): void {
  const leave = () => {
    if (!proc.ended) proc.unwatched();
  };
  if (signal.aborted) leave();
  else signal.addEventListener('abort', leave, { once: true });
}

/** The keepalive interval a request asks for (Keepalive-Ping-Interval, seconds), bounded, in ms. */
function keepaliveMs(ctx: HandlerContext): number {
  const v = Number(ctx.requestHeader.get(KEEPALIVE_HEADER));
  const s = Number.isFinite(v) && v > 0 ? v : KEEPALIVE_DEFAULT_S;
  return Math.min(KEEPALIVE_MAX_S, Math.max(KEEPALIVE_MIN_S, s)) * 1000;
}

/** The process a selector names. @throws ConnectError NotFound */
function select(front: E2bFront, id: string, sel: ProcessSelector | undefined): E2bProcessEntry {
  const procs = front.processes(id);
  const s = sel?.selector;
  if (s?.case === 'pid') {
    const e = procs.get(s.value);
    if (e && !e.proc.ended) return e;
    throw new ConnectError(`process with pid ${s.value} not found`, Code.NotFound);
  }
  if (s?.case === 'tag') {
    for (const e of procs.values()) if (e.tag === s.value && !e.proc.ended) return e;
    throw new ConnectError(`process with tag ${s.value} not found`, Code.NotFound);
  }
  throw new ConnectError('a process selector (pid or tag) is required', Code.InvalidArgument);
}

/** Runs `fn`, turning dsec errors into Connect errors. */
async function rpc<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    throw toConnectError(e);
  }
}

/** The process service (see the module comment). */
export function processService(front: E2bFront): Partial<ServiceImpl<typeof Process>> {
  return {
    async list(_req, ctx) {
      const { sandbox } = ctx.values.get(ENVD_CONTEXT);
      const processes = [...front.processes(sandbox.id).entries()]
        .filter(([, e]) => !e.proc.ended)
        .map(([pid, e]) => ({ pid, config: e.config, ...(e.tag !== undefined ? { tag: e.tag } : {}) }));
      return { processes };
    },

    async *start(req, ctx) {
      const { sandbox, username } = ctx.values.get(ENVD_CONTEXT);
      const cfg = req.process;
      if (!cfg || !cfg.cmd) throw new ConnectError('process.cmd is required', Code.InvalidArgument);
      const entry = await rpc(async () => {
        const who = await front.actingUser(sandbox.id, username);
        const env: Record<string, string> = {};
        if (who.account) Object.assign(env, { HOME: who.home, USER: who.account.name, LOGNAME: who.account.name });
        Object.assign(env, cfg.envs);
        const cwd = cfg.cwd ? front.resolvePath(cfg.cwd, who.home) : who.home;
        const size = req.pty?.size;
        const proc = await front.host.startProcess(sandbox.id, {
          argv: [cfg.cmd, ...cfg.args], env, cwd, user: who.user,
          stdin: req.stdin ?? true,
          ...(req.pty ? { tty: { rows: size?.rows || 24, cols: size?.cols || 80 } } : {}),
        });
        if (proc.pid === null) {
          const r = proc.result();
          throw new ConnectError(`cannot start ${cfg.cmd}: ${r.error ?? 'it did not start'}`, Code.InvalidArgument);
        }
        const e: E2bProcessEntry = { proc, config: { cmd: cfg.cmd, args: cfg.args, envs: cfg.envs, ...(cfg.cwd ? { cwd: cfg.cwd } : {}) }, tty: !!req.pty, ...(req.tag !== undefined ? { tag: req.tag } : {}) };
        front.track(sandbox.id, e);
        return e;
      });
      dropUnreadAfter(ctx.signal, entry.proc);
      yield { event: { event: { case: 'start', value: { pid: entry.proc.pid! } } } };
      for await (const event of processEvents(entry.proc, entry.tty, { stdout: 0, stderr: 0 }, keepaliveMs(ctx), ctx.signal)) yield { event };
    },

    async *connect(req, ctx) {
      const { sandbox } = ctx.values.get(ENVD_CONTEXT);
      const e = select(front, sandbox.id, req.process);
      // From the output that comes next: what was printed before belongs to the earlier stream.
      const from = { stdout: e.proc.size('stdout'), stderr: e.proc.size('stderr') };
      dropUnreadAfter(ctx.signal, e.proc);
      yield { event: { event: { case: 'start', value: { pid: e.proc.pid! } } } };
      for await (const event of processEvents(e.proc, e.tty, from, keepaliveMs(ctx), ctx.signal)) yield { event };
    },

    async sendInput(req, ctx) {
      const { sandbox } = ctx.values.get(ENVD_CONTEXT);
      const e = select(front, sandbox.id, req.process);
      const input = req.input?.input;
      if (!input?.case) throw new ConnectError('input (stdin or pty) is required', Code.InvalidArgument);
      await rpc(async () => {
        e.proc.writeStdin(Buffer.from(input.value));
        await e.proc.drained();
      });
      return {};
    },

    async sendSignal(req, ctx) {
      const { sandbox } = ctx.values.get(ENVD_CONTEXT);
      const e = select(front, sandbox.id, req.process);
      if (req.signal !== Signal.SIGKILL && req.signal !== Signal.SIGTERM) throw new ConnectError('signal must be SIGTERM or SIGKILL', Code.InvalidArgument);
      await rpc(async () => e.proc.signal(req.signal));
      return {};
    },

    async closeStdin(req, ctx) {
      const { sandbox } = ctx.values.get(ENVD_CONTEXT);
      const e = select(front, sandbox.id, req.process);
      await rpc(async () => e.proc.closeStdin());
      return {};
    },

    async update(req, ctx) {
      const { sandbox } = ctx.values.get(ENVD_CONTEXT);
      const e = select(front, sandbox.id, req.process);
      const size = req.pty?.size;
      if (size) await rpc(async () => e.proc.resize(size.rows, size.cols));
      return {};
    },
  };
}
