/**
 * Client for the in-sandbox agent (native/agent, protocol in docs/AGENT_PROTOCOL.md).
 *
 * One {@link AgentClient} is one Unix-socket connection to one agent. Many execs run over
 * it at once, each on its own stream id. Errors are {@link DsecError}s:
 *   - `Unavailable`: cannot connect, or the connection was lost (message says
 *     "agent connection lost");
 *   - `DeadlineExceeded`: the HELLO handshake did not finish in time;
 *   - `FailedPrecondition`: the agent speaks another protocol version or refused HELLO;
 *   - `InvalidArgument`: a malformed exec request (thrown before anything is sent);
 *   - `Internal`: the agent sent an ERROR for one stream (a bug on one side).
 *
 * Only `node:net` is used. Outbound data (stdin) is buffered by the socket without
 * backpressure; callers feeding large stdin should pace themselves.
 */
import net from 'node:net';
import { performance } from 'node:perf_hooks';
import {
  CONTROL_STREAM,
  FrameDecoder,
  FrameType,
  PROTOCOL_VERSION,
  decodeExecError,
  decodeExit,
  decodeU32,
  encodeExecRequest,
  encodeFrame,
  encodeU32,
  type Frame,
  type ExecRequestFields,
} from './protocol.js';
import { DsecError, deadlineExceeded, failedPrecondition, internal, invalidArgument, unavailable } from '../errors.js';

/** What the agent says about itself in its HELLO reply. */
export interface AgentInfo {
  /** Always "dsec-agent". */
  agent: string;
  /** Agent release, e.g. "0.1.0". */
  version: string;
  /** Protocol version the agent speaks (1). */
  protocol: number;
  /** The agent's pid as seen in its own pid namespace (1 when it is the sandbox's init). */
  pid: number;
}

/** One command to run inside the sandbox: the fields of one EXEC frame (see protocol.ts). */
export type AgentExecRequest = ExecRequestFields;

/** How an exec ended. */
export type AgentExecOutcome =
  | {
      kind: 'exit';
      /** Exit status 0..255, or null when killed by a signal. */
      exitCode: number | null;
      /** Signal number that killed it, or null when it exited. */
      signal: number | null;
      /** The timeout elapsed and the agent SIGKILLed the process group (signal is then usually 9). */
      timedOut: boolean;
      /** Monotonic time from fork to reap, in milliseconds (fractional, µs resolution). */
      durationMs: number;
    }
  | {
      kind: 'exec_error';
      /** errno of the failing step (e.g. 2 = ENOENT, 13 = EACCES). */
      errno: number;
      /** e.g. "exec: foo: No such file or directory", "chdir: /x: …", "user: bob: unknown user". */
      message: string;
    };

/** Outcome plus captured output of {@link AgentClient.exec}. */
export type AgentExecResult = AgentExecOutcome & {
  /** Captured stdout, at most maxOutputBytes. */
  stdout: Buffer;
  /** Captured stderr, at most maxOutputBytes. */
  stderr: Buffer;
  /** More stdout was produced than maxOutputBytes; the rest was read and discarded. */
  stdoutTruncated: boolean;
  /** More stderr was produced than maxOutputBytes; the rest was read and discarded. */
  stderrTruncated: boolean;
};

/** Output callbacks of {@link AgentClient.startExec}; called in arrival order, before `done` settles. */
export interface AgentExecHandlers {
  /** A chunk of stdout (≤ 64 KiB). */
  onStdout?(b: Buffer): void;
  /** A chunk of stderr (≤ 64 KiB). */
  onStderr?(b: Buffer): void;
}

/** A running exec. */
export interface AgentExecHandle {
  /** Stream id used on the wire (diagnostics). */
  readonly stream: number;
  /**
   * Resolves with the pid inside the sandbox once the program has been exec'd; rejects
   * with the exec_error message, an agent stream error, or connection loss.
   */
  readonly pid: Promise<number>;
  /**
   * Queue bytes for the child's stdin (split into frames ≤ 256 KiB). A no-op once the
   * exec has ended or the connection is gone.
   * @throws DsecError(FailedPrecondition) if the exec was not started with stdin: true,
   *   or after closeStdin()
   */
  writeStdin(b: Buffer): void;
  /** Close the child's stdin (after the queued bytes). Safe to call twice. */
  closeStdin(): void;
  /**
   * Send a signal (1..64) to the exec's process group. A no-op once the exec has ended.
   * @throws DsecError(InvalidArgument) for a signal number outside 1..64
   */
  signal(signo: number): void;
  /**
   * Settles after the last output callback: resolves with the outcome; rejects with
   * DsecError(Unavailable, "agent connection lost: …") if the connection drops first, or
   * DsecError(Internal) if the agent reports an ERROR on this stream.
   */
  readonly done: Promise<AgentExecOutcome>;
}

/** Options of {@link AgentClient.connect}. */
export interface AgentConnectOptions {
  /** Give up on connect + HELLO after this many milliseconds (default 5000). */
  timeoutMs?: number;
}

/** Size of STDIN frames the client sends (the protocol allows up to 1 MiB). */
const STDIN_FRAME_BYTES = 256 * 1024;
const DEFAULT_CONNECT_TIMEOUT_MS = 5000;

interface StreamState {
  handlers: AgentExecHandlers;
  stdin: boolean;
  stdinClosed: boolean;
  resolvePid(pid: number): void;
  rejectPid(e: Error): void;
  resolveDone(o: AgentExecOutcome): void;
  rejectDone(e: Error): void;
}

interface PendingPing {
  t0: number;
  resolve(rtt: number): void;
  reject(e: Error): void;
}

/** A connection to one agent. Create with {@link AgentClient.connect}. */
export class AgentClient {
  private readonly socket: net.Socket;
  private readonly socketPath: string;
  private readonly decoder = new FrameDecoder();
  private readonly streams = new Map<number, StreamState>();
  private readonly pings = new Map<number, PendingPing>();
  private readonly lostListeners = new Set<(err: Error) => void>();
  private nextStream = 1;
  private nextPing = 1;
  private _info: AgentInfo | null = null;
  private _closed = false;
  private closedByUs = false;
  /** Set while the HELLO handshake is in progress. */
  private handshake: { resolve(): void; reject(e: Error): void } | null = null;
  /** Message of a fatal ERROR (stream 0) the agent sent before closing. */
  private fatalMessage: string | null = null;

  private constructor(socket: net.Socket, socketPath: string) {
    this.socket = socket;
    this.socketPath = socketPath;
  }

  /**
   * Connect to the agent listening at `socketPath` and perform the HELLO handshake.
   * @param socketPath host path of the agent's Unix socket
   * @param opts.timeoutMs limit for connect + handshake in ms (default 5000)
   * @returns a ready client; `info` is filled in
   * @throws DsecError(Unavailable) if the socket is missing/refused or closed during the handshake;
   *   DsecError(DeadlineExceeded) on timeout; DsecError(FailedPrecondition) on a protocol
   *   version mismatch or an agent ERROR during the handshake
   */
  static async connect(socketPath: string, opts: AgentConnectOptions = {}): Promise<AgentClient> {
    const timeoutMs = opts.timeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
    const socket = net.createConnection({ path: socketPath });
    const client = new AgentClient(socket, socketPath);
    let timer: NodeJS.Timeout | undefined;
    try {
      await new Promise<void>((resolve, reject) => {
        client.handshake = { resolve, reject };
        timer = setTimeout(() => {
          client.failHandshake(deadlineExceeded(`agent at ${socketPath}: connect and HELLO did not complete within ${timeoutMs} ms`));
        }, timeoutMs);
        socket.once('connect', () => {
          socket.write(encodeFrame(FrameType.HELLO, CONTROL_STREAM, encodeU32(PROTOCOL_VERSION)));
        });
        socket.on('data', (chunk: Buffer) => client.onData(chunk));
        socket.on('error', (err: Error) => client.onSocketGone(err));
        socket.on('close', () => client.onSocketGone(null));
      });
    } finally {
      clearTimeout(timer);
    }
    return client;
  }

  /** The agent's HELLO information (valid once connect() resolved). */
  get info(): AgentInfo {
    if (!this._info) throw internal('AgentClient.info read before the handshake completed');
    return this._info;
  }

  /** True once the connection is closed, by close() or because it was lost. */
  get closed(): boolean {
    return this._closed;
  }

  /**
   * Register a callback for an unexpected loss of the connection (agent died, socket
   * error, protocol error). Not called after close(). Called at most once.
   * @returns a function that unregisters the callback
   */
  onLost(cb: (err: Error) => void): () => void {
    this.lostListeners.add(cb);
    return () => this.lostListeners.delete(cb);
  }

  /**
   * Round trip a PING.
   * @returns round-trip time in milliseconds (fractional)
   * @throws DsecError(Unavailable) if the connection is closed or lost before the PONG
   */
  ping(): Promise<number> {
    if (this._closed) return Promise.reject(this.lostError('connection is closed'));
    const seq = this.nextPing;
    this.nextPing = this.nextPing >= 0xffffffff ? 1 : this.nextPing + 1;
    return new Promise<number>((resolve, reject) => {
      this.pings.set(seq, { t0: performance.now(), resolve, reject });
      this.send(FrameType.PING, CONTROL_STREAM, encodeU32(seq));
    });
  }

  /**
   * Start one exec. Output is delivered to `handlers` as it arrives.
   * @throws DsecError(InvalidArgument) synchronously for a malformed request
   *   (empty argv, NUL in a string, env entry without '=', bad timeout)
   * @returns a handle whose `done` rejects with DsecError(Unavailable) if the
   *   connection is already closed or gets lost
   */
  startExec(req: AgentExecRequest, handlers: AgentExecHandlers = {}): AgentExecHandle {
    let payload: Buffer;
    try {
      payload = encodeExecRequest(req);
    } catch (e) {
      throw invalidArgument(`exec request: ${(e as Error).message}`, e);
    }
    const stream = this.allocStream();
    let resolvePid!: (pid: number) => void;
    let rejectPid!: (e: Error) => void;
    let resolveDone!: (o: AgentExecOutcome) => void;
    let rejectDone!: (e: Error) => void;
    const pid = new Promise<number>((res, rej) => { resolvePid = res; rejectPid = rej; });
    const done = new Promise<AgentExecOutcome>((res, rej) => { resolveDone = res; rejectDone = rej; });
    // Callers may ignore one of the two promises; a rejection there must not become an
    // unhandled rejection. Awaiting them still sees the rejection.
    pid.catch(() => {});
    done.catch(() => {});
    const st: StreamState = {
      handlers, stdin: !!req.stdin, stdinClosed: false, resolvePid, rejectPid, resolveDone, rejectDone,
    };
    if (this._closed) {
      const err = this.lostError('connection is closed');
      rejectPid(err);
      rejectDone(err);
    } else {
      this.streams.set(stream, st);
      this.send(FrameType.EXEC, stream, payload);
    }
    return {
      stream,
      pid,
      done,
      writeStdin: (b: Buffer) => {
        if (!st.stdin) throw failedPrecondition('writeStdin: the exec was started without stdin: true');
        if (st.stdinClosed) throw failedPrecondition('writeStdin: stdin is already closed');
        if (this.streams.get(stream) !== st) return;
        for (let off = 0; off < b.length; off += STDIN_FRAME_BYTES) {
          this.send(FrameType.STDIN, stream, b.subarray(off, Math.min(b.length, off + STDIN_FRAME_BYTES)));
        }
      },
      closeStdin: () => {
        if (!st.stdin || st.stdinClosed) return;
        st.stdinClosed = true;
        if (this.streams.get(stream) === st) this.send(FrameType.STDIN_EOF, stream);
      },
      signal: (signo: number) => {
        if (!Number.isInteger(signo) || signo < 1 || signo > 64) {
          throw invalidArgument(`signal: ${signo} is not a signal number (1..64)`);
        }
        if (this.streams.get(stream) === st) this.send(FrameType.SIGNAL, stream, encodeU32(signo));
      },
    };
  }

  /**
   * Run one exec to completion and collect its output.
   * @param req the request; `stdin` (if given) is written and closed; `maxOutputBytes`
   *   (integer ≥ 0) caps what is kept of stdout and of stderr, each. Output beyond it is
   *   read and discarded, so the child never blocks on a full pipe.
   * @returns outcome + output; an exec_error is a result, not a rejection
   * @throws DsecError(InvalidArgument) for a malformed request; DsecError(Unavailable)
   *   if the connection is lost; DsecError(Internal) for an agent ERROR on the stream
   */
  async exec(req: Omit<AgentExecRequest, 'stdin'> & { stdin?: Buffer; maxOutputBytes: number }): Promise<AgentExecResult> {
    const { stdin, maxOutputBytes, ...rest } = req;
    if (!Number.isInteger(maxOutputBytes) || maxOutputBytes < 0) {
      throw invalidArgument(`exec request: maxOutputBytes must be an integer ≥ 0, got ${maxOutputBytes}`);
    }
    const out = new OutputCollector(maxOutputBytes);
    const err = new OutputCollector(maxOutputBytes);
    const h = this.startExec(
      { ...rest, stdin: stdin !== undefined },
      { onStdout: (b) => out.push(b), onStderr: (b) => err.push(b) },
    );
    if (stdin !== undefined) {
      if (stdin.length) h.writeStdin(stdin);
      h.closeStdin();
    }
    const outcome = await h.done;
    return {
      ...outcome,
      stdout: out.result(),
      stderr: err.result(),
      stdoutTruncated: out.truncated,
      stderrTruncated: err.truncated,
    };
  }

  /**
   * Close the connection. The agent SIGKILLs the process groups of execs still running on
   * it; their `done` promises reject with "agent connection lost (closed by client)".
   * Safe to call twice; onLost callbacks are not called.
   */
  close(): void {
    if (this._closed) return;
    this.closedByUs = true;
    this.socket.destroy();
    this.teardown(this.lostError('closed by client'));
  }

  // ---- internals --------------------------------------------------------------------

  private allocStream(): number {
    for (;;) {
      const s = this.nextStream;
      this.nextStream = this.nextStream >= 0xffffffff ? 1 : this.nextStream + 1;
      if (!this.streams.has(s)) return s;
    }
  }

  private send(type: number, stream: number, payload?: Buffer): void {
    if (this._closed) return;
    this.socket.write(encodeFrame(type, stream, payload));
  }

  private lostError(reason: string, cause?: unknown): DsecError {
    return unavailable(`agent connection lost (${reason}) [${this.socketPath}]`, cause);
  }

  private onData(chunk: Buffer): void {
    let frames: Frame[];
    try {
      frames = this.decoder.push(chunk);
    } catch (e) {
      this.socket.destroy();
      this.onSocketGone(internal(`agent protocol error: ${(e as Error).message}`, e));
      return;
    }
    for (const f of frames) {
      if (this._closed) return;
      try {
        this.onFrame(f);
      } catch (e) {
        // A malformed frame from the agent, or a throwing output handler: either way
        // the stream state can no longer be trusted, so drop the connection.
        this.socket.destroy();
        this.onSocketGone(internal(`agent frame type ${f.type} on stream ${f.stream}: ${(e as Error).message}`, e));
        return;
      }
    }
  }

  private onFrame(f: Frame): void {
    if (f.stream === CONTROL_STREAM) {
      switch (f.type) {
        case FrameType.HELLO: {
          if (!this.handshake) return;
          const version = decodeU32(f.payload, 'HELLO');
          if (version !== PROTOCOL_VERSION) {
            this.failHandshake(failedPrecondition(
              `agent at ${this.socketPath} speaks protocol version ${version}, this client speaks ${PROTOCOL_VERSION}`));
            return;
          }
          let info: AgentInfo;
          try {
            info = JSON.parse(f.payload.subarray(4).toString('utf8')) as AgentInfo;
          } catch (e) {
            this.failHandshake(internal(`agent at ${this.socketPath}: malformed HELLO info`, e));
            return;
          }
          this._info = info;
          const hs = this.handshake;
          this.handshake = null;
          hs.resolve();
          return;
        }
        case FrameType.PONG: {
          if (f.payload.length < 4) return;
          const seq = f.payload.readUInt32BE(0);
          const p = this.pings.get(seq);
          if (!p) return;
          this.pings.delete(seq);
          p.resolve(performance.now() - p.t0);
          return;
        }
        case FrameType.ERROR: {
          // Fatal for the connection: the agent closes it after this frame.
          this.fatalMessage = f.payload.toString('utf8');
          if (this.handshake) {
            this.failHandshake(failedPrecondition(`agent at ${this.socketPath} refused the handshake: ${this.fatalMessage}`));
          }
          return;
        }
        default:
          return; // unknown control frames are ignored (forward compatibility)
      }
    }
    const st = this.streams.get(f.stream);
    if (!st) return; // stream already finished (or never ours)
    switch (f.type) {
      case FrameType.STARTED:
        st.resolvePid(decodeU32(f.payload, 'STARTED'));
        return;
      case FrameType.STDOUT:
        st.handlers.onStdout?.(f.payload);
        return;
      case FrameType.STDERR:
        st.handlers.onStderr?.(f.payload);
        return;
      case FrameType.EXIT: {
        const x = decodeExit(f.payload);
        this.streams.delete(f.stream);
        st.resolveDone({
          kind: 'exit',
          exitCode: x.how === 0 ? x.code : null,
          signal: x.how === 1 ? x.code : null,
          timedOut: x.timedOut,
          durationMs: Number(x.durationUs) / 1000,
        });
        return;
      }
      case FrameType.EXEC_ERROR: {
        const x = decodeExecError(f.payload);
        this.streams.delete(f.stream);
        st.rejectPid(new DsecError('FailedPrecondition', x.message));
        st.resolveDone({ kind: 'exec_error', errno: x.errno, message: x.message });
        return;
      }
      case FrameType.ERROR: {
        const err = internal(`agent error on stream ${f.stream}: ${f.payload.toString('utf8')}`);
        this.streams.delete(f.stream);
        st.rejectPid(err);
        st.rejectDone(err);
        return;
      }
      default:
        return; // unknown stream frames are ignored (forward compatibility)
    }
  }

  private failHandshake(err: Error): void {
    const hs = this.handshake;
    if (!hs) return;
    this.handshake = null;
    this.closedByUs = true; // nobody holds this client yet: no onLost callbacks
    this.socket.destroy();
    this.teardown(err);
    hs.reject(err);
  }

  /** Socket error or close (err null). Idempotent. */
  private onSocketGone(err: Error | null): void {
    if (this._closed) return;
    if (this.handshake) {
      let e: Error;
      if (err instanceof DsecError) e = err;
      else if (err) e = unavailable(`cannot connect to agent at ${this.socketPath}: ${err.message}`, err);
      else e = unavailable(`agent at ${this.socketPath} closed the connection during the handshake`);
      this.failHandshake(e);
      return;
    }
    const reason = this.fatalMessage
      ? `agent reported: ${this.fatalMessage}`
      : err ? err.message : 'agent closed the connection';
    const lost = this.lostError(reason, err ?? undefined);
    this.socket.destroy();
    this.teardown(lost);
    if (!this.closedByUs) {
      for (const cb of [...this.lostListeners]) {
        try {
          cb(lost);
        } catch {
          // a listener's failure must not prevent the others from running
        }
      }
    }
  }

  /** Mark closed and reject everything pending with `err`. */
  private teardown(err: Error): void {
    if (this._closed) return;
    this._closed = true;
    const streams = [...this.streams.values()];
    this.streams.clear();
    for (const st of streams) {
      st.rejectPid(err);
      st.rejectDone(err);
    }
    const pings = [...this.pings.values()];
    this.pings.clear();
    for (const p of pings) p.reject(err);
  }
}

/** Keeps the first `limit` bytes of a stream and counts whether more came. */
class OutputCollector {
  private readonly parts: Buffer[] = [];
  private kept = 0;
  /** True once more than `limit` bytes were pushed. */
  truncated = false;

  constructor(private readonly limit: number) {}

  push(b: Buffer): void {
    const room = this.limit - this.kept;
    if (b.length > room) this.truncated = true;
    if (room <= 0) return;
    const part = b.length > room ? b.subarray(0, room) : b;
    this.parts.push(part);
    this.kept += part.length;
  }

  result(): Buffer {
    return Buffer.concat(this.parts, this.kept);
  }
}
