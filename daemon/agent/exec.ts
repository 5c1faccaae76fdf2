/**
 * Execs over an agent connection (docs/AGENT_PROTOCOL.md "Exec"): starting one (output
 * through callbacks, stdin, signals, a terminal's size, pausing output), and running one
 * to completion with its output collected up to a cap.
 */
import {
  FrameType, decodeExecError, decodeExit, decodeU32, encodeExecRequest, encodeU32, encodeWinsize, type ExecRequestFields,
} from './protocol.js';
import { DsecError, failedPrecondition, invalidArgument } from '../errors.js';
import { streamError, type StreamHost, type StreamSink } from './streams.js';

/**
 * One command to run inside the sandbox: the fields of one EXEC frame (see protocol.ts).
 * With `isolate` the command runs in fresh pid/mount/IPC/UTS namespaces and nothing of it
 * survives the call ({@link IsolateOptions}: /tmp and /dev/shm are fresh tmpfs mounts of
 * `tmpBytes`/`shmBytes`, default 64 MiB each, plus up to 8 `scratch` mounts; everything
 * else is read-only; processes left behind are killed when the command exits). Its exit
 * code, signal and timeout are reported exactly as for a plain exec.
 */
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
   * Queue bytes for the child's stdin (split into frames ≤ 256 KiB); for a tty exec, bytes
   * typed into the terminal (always allowed; "\x03" is Ctrl-C, "\x04" Ctrl-D). A no-op once
   * the exec has ended or the connection is gone.
   * @throws DsecError(FailedPrecondition) if the exec was started with neither stdin: true
   *   nor a tty, or after closeStdin()
   */
  writeStdin(b: Buffer): void;
  /**
   * Resolves when the connection can take more data: its socket's buffer is below its
   * high-water mark (or the connection is gone). Callers feeding stdin await it after
   * each write, so stdin is paced by what the agent (and the command) consume.
   */
  drained(): Promise<void>;
  /**
   * Close the child's stdin (after the queued bytes). Safe to call twice. A no-op for a tty
   * exec: a terminal has no end of input; write "\x04" (Ctrl-D) instead.
   */
  closeStdin(): void;
  /**
   * Set the terminal size of a tty exec (the foreground process group gets SIGWINCH).
   * A no-op once the exec has ended.
   * @throws DsecError(FailedPrecondition) "resize: exec has no tty" for a non-tty exec;
   *   DsecError(InvalidArgument) for rows/cols outside 0..65535
   */
  resize(rows: number, cols: number): void;
  /**
   * Send a signal (1..64) to the exec's process group. A no-op once the exec has ended.
   * @throws DsecError(InvalidArgument) for a signal number outside 1..64
   */
  signal(signo: number): void;
  /**
   * Stops reading this exec's connection until {@link resumeOutput}: no more output
   * callbacks, the agent's queue for the connection fills, the agent stops reading the
   * command's pipes (docs/AGENT_PROTOCOL.md "Flow control") and the command blocks on
   * its next write. It pauses every stream of the connection (as a slow readFile
   * consumer does), so an exec paced this way needs a connection of its own. Idempotent;
   * a no-op once the connection is closed.
   */
  pauseOutput(): void;
  /** Reads this exec's connection again after {@link pauseOutput} (when no other stream holds it paused). Idempotent. */
  resumeOutput(): void;
  /**
   * Settles after the last output callback: resolves with the outcome; rejects with
   * DsecError(Unavailable, "agent connection lost: …") if the connection drops first, or
   * DsecError(Internal) if the agent reports an ERROR on this stream.
   */
  readonly done: Promise<AgentExecOutcome>;
}

/** Size of STDIN frames the client sends (the protocol allows up to 1 MiB). */
const STDIN_FRAME_BYTES = 256 * 1024;

/**
 * Starts one exec on the connection of `host`. Output is delivered to `handlers` as it arrives (for a tty exec,
 * everything arrives as stdout).
 * @throws DsecError(InvalidArgument) synchronously for a malformed request
 *   (empty argv, NUL in a string, env entry without '=', bad timeout, bad tty size,
 *   bad isolate sizes or scratch paths); DsecError(Unimplemented) if `tty`, `detached`
 *   or `isolate` is asked of an agent without them (an agent that predates an EXEC field
 *   would silently ignore it, which for `isolate` would mean no isolation at all)
 * @returns a handle whose `done` rejects with DsecError(Unavailable) if the
 *   connection is already closed or gets lost
 */
export function startExec(host: StreamHost, req: AgentExecRequest, handlers: AgentExecHandlers = {}): AgentExecHandle {
  let payload: Buffer;
  try {
    payload = encodeExecRequest(req);
  } catch (e) {
    throw invalidArgument(`exec request: ${(e as Error).message}`, e);
  }
  if (req.tty !== undefined) host.requireFeature('tty', 'exec with a tty');
  if (req.detached) host.requireFeature('detached', 'detached exec');
  if (req.isolate !== undefined) host.requireFeature('isolate', 'isolated exec');
  const stream = host.alloc();
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
  const tty = req.tty !== undefined;
  const acceptsInput = !!req.stdin || tty;
  let stdinClosed = false;
  const sink: StreamSink = {
    onFrame: (f) => {
      switch (f.type) {
        case FrameType.STARTED:
          resolvePid(decodeU32(f.payload, 'STARTED'));
          return;
        case FrameType.STDOUT:
          handlers.onStdout?.(f.payload);
          return;
        case FrameType.STDERR:
          handlers.onStderr?.(f.payload);
          return;
        case FrameType.EXIT: {
          const x = decodeExit(f.payload);
          host.forget(f.stream);
          host.unpauseFor(f.stream);
          resolveDone({
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
          host.forget(f.stream);
          host.unpauseFor(f.stream);
          rejectPid(new DsecError('FailedPrecondition', x.message));
          resolveDone({ kind: 'exec_error', errno: x.errno, message: x.message });
          return;
        }
        case FrameType.ERROR: {
          const err = streamError(f.stream, f.payload);
          host.forget(f.stream);
          host.unpauseFor(f.stream);
          rejectPid(err);
          rejectDone(err);
          return;
        }
        default:
          return; // unknown stream frames are ignored (forward compatibility)
      }
    },
    fail: (err) => {
      rejectPid(err);
      rejectDone(err);
    },
  };
  if (host.isClosed()) {
    sink.fail(host.lostError('connection is closed'));
  } else {
    host.open(stream, sink);
    host.send(FrameType.EXEC, stream, payload);
  }
  const live = () => host.owns(stream, sink);
  return {
    stream,
    pid,
    done,
    writeStdin: (b: Buffer) => {
      if (!acceptsInput) throw failedPrecondition('writeStdin: the exec was started without stdin: true');
      if (stdinClosed) throw failedPrecondition('writeStdin: stdin is already closed');
      if (!live()) return;
      for (let off = 0; off < b.length; off += STDIN_FRAME_BYTES) {
        host.send(FrameType.STDIN, stream, b.subarray(off, Math.min(b.length, off + STDIN_FRAME_BYTES)));
      }
    },
    drained: () => host.drained(),
    closeStdin: () => {
      if (tty || !req.stdin || stdinClosed) return;
      stdinClosed = true;
      if (live()) host.send(FrameType.STDIN_EOF, stream);
    },
    signal: (signo: number) => {
      if (!Number.isInteger(signo) || signo < 1 || signo > 64) {
        throw invalidArgument(`signal: ${signo} is not a signal number (1..64)`);
      }
      if (live()) host.send(FrameType.SIGNAL, stream, encodeU32(signo));
    },
    pauseOutput: () => {
      if (live()) host.pauseFor(stream);
    },
    resumeOutput: () => host.unpauseFor(stream),
    resize: (rows: number, cols: number) => {
      if (!tty) throw failedPrecondition('resize: exec has no tty');
      let p: Buffer;
      try {
        p = encodeWinsize(rows, cols);
      } catch (e) {
        throw invalidArgument(`resize: ${(e as Error).message}`, e);
      }
      if (live()) host.send(FrameType.RESIZE, stream, p);
    },
  };
}

/**
 * Runs one exec to completion on the connection of `host` and collects its output.
 * @param req the request; `stdin` (if given) is written and closed; `maxOutputBytes`
 *   (integer ≥ 0) caps what is kept of stdout and of stderr, each. Output beyond it is
 *   read and discarded, so the child never blocks on a full pipe.
 * @returns outcome + output; an exec_error is a result, not a rejection
 * @throws DsecError(InvalidArgument) for a malformed request; DsecError(Unavailable)
 *   if the connection is lost; DsecError(Internal) for an agent ERROR on the stream
 */
export async function runExec(host: StreamHost, req: Omit<AgentExecRequest, 'stdin'> & { stdin?: Buffer; maxOutputBytes: number }): Promise<AgentExecResult> {
  const { stdin, maxOutputBytes, ...rest } = req;
  if (!Number.isInteger(maxOutputBytes) || maxOutputBytes < 0) {
    throw invalidArgument(`exec request: maxOutputBytes must be an integer ≥ 0, got ${maxOutputBytes}`);
  }
  const out = new OutputCollector(maxOutputBytes);
  const err = new OutputCollector(maxOutputBytes);
  const h = startExec(
    host,
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

/** Keeps the first `limit` bytes of a stream and counts whether more came. */
class OutputCollector {
  private readonly parts: Buffer[] = [];
  private kept = 0;
  /** True once more than `limit` bytes were pushed. */
  truncated = false;

  constructor(private readonly limit: number) {}

  /** Takes the next chunk: kept up to the limit, the rest only counted. */
  push(b: Buffer): void {
    const room = this.limit - this.kept;
    if (b.length > room) this.truncated = true;
    if (room <= 0) return;
    const part = b.length > room ? b.subarray(0, room) : b;
    this.parts.push(part);
    this.kept += part.length;
  }

  /** The bytes kept, in order. */
  result(): Buffer {
    return Buffer.concat(this.parts, this.kept);
  }
}
