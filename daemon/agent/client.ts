/**
 * Client for the in-sandbox agent (native/agent, protocol in docs/AGENT_PROTOCOL.md).
 *
 * One {@link AgentClient} is one Unix-socket connection to one agent. Many execs run over
 * it at once, each on its own stream id. Errors are {@link DsecError}s:
 *   - `Unavailable`: cannot connect, or the connection was lost (message says
 *     "agent connection lost");
 *   - `DeadlineExceeded`: the HELLO handshake did not finish in time;
 *   - `FailedPrecondition`: the agent speaks another protocol version or refused HELLO;
 *   - `InvalidArgument`: a malformed exec or file request (thrown before anything is sent);
 *   - `Unimplemented`: the agent predates a feature (tty, detached, files), or cannot
 *     isolate (`isolate`: only fncall worker sandboxes can);
 *   - `Internal`: the agent sent an ERROR for one stream (a bug on one side);
 *   - file operations fail with an {@link AgentFileError} whose kind follows the errno
 *     (see {@link fileErrorKind}).
 *
 * Only `node:net` is used. Stdin is buffered by the socket without backpressure; callers
 * feeding large stdin should pace themselves. File writes are flow-controlled (FILE_ACK,
 * at most 4 MiB in flight); file reads are flow-controlled by pausing the whole socket
 * when a reader's stream is full (see {@link AgentClient.readFile}).
 */
import net from 'node:net';
import { performance } from 'node:perf_hooks';
import { Readable } from 'node:stream';
import {
  CONTROL_STREAM,
  FileWriteFlag,
  FrameDecoder,
  FrameType,
  PROTOCOL_VERSION,
  decodeExecError,
  decodeExit,
  decodeFileEntry,
  decodeFileError,
  decodeFileInfo,
  decodeU32,
  decodeU64,
  encodeExecRequest,
  encodeFileRequest,
  encodeFrame,
  encodeU32,
  encodeWinsize,
  type ExecRequestFields,
  type FileEntry,
  type FileInfo,
  type FileRequestFields,
  type Frame,
} from './protocol.js';
import {
  DsecError, deadlineExceeded, failedPrecondition, internal, invalidArgument, unavailable, unimplemented,
  type ErrorKind,
} from '../errors.js';

export type { FileEntry, FileInfo, FileType, IsolateOptions } from './protocol.js';
export { FileWriteFlag } from './protocol.js';

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
  /**
   * Optional protocol-1 additions the agent implements: "tty", "detached", "files", and
   * "isolate" when it can run isolated execs (an fncall worker: it holds CAP_SYS_ADMIN).
   * Absent on agents that predate them.
   */
  features?: string[];
  /**
   * Whether the agent restricts file access with Landlock (native/agent/landlock.c). Absent on agents that predate it.
   */
  landlock?: AgentLandlockInfo;
}

/** The `landlock` object of the agent's HELLO. */
export interface AgentLandlockInfo {
  /** True when a Landlock ruleset is in force: on the agent itself (scope `agent`) or on every isolated call (`isolated_execs`). */
  enforced: boolean;
  /** The kernel's Landlock ABI version (7 on Linux 6.18); 0 when the kernel has no Landlock. */
  abi: number;
  /** `agent` (restricted at start, inherited by every exec and file operation), `isolated_execs` (a worker: each call's namespace init), or `off`. */
  scope: 'agent' | 'isolated_execs' | 'off';
  /** Number of `--writable` paths the ruleset grants every right on. */
  writable: number;
  /** Why not enforced (empty when enforced): not requested, or the kernel's reason. */
  reason: string;
}

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

/** Options of {@link AgentClient.connect}. */
export interface AgentConnectOptions {
  /** Give up on connect + HELLO after this many milliseconds (default 5000). */
  timeoutMs?: number;
}

/** Options shared by the file operations. */
export interface AgentFileOptions {
  /** "uid", "uid:gid", "name" or "name:group" inside the sandbox; default "0" (root). */
  user?: string;
}

/** Options of {@link AgentClient.readFile}. */
export interface AgentReadFileOptions extends AgentFileOptions {
  /** Start at this byte offset (default 0). */
  offset?: number;
  /** Read at most this many bytes (default / 0: to the end). */
  length?: number;
  /** Called after each chunk of the file is queued in the stream (buffer accounting, daemon/api/transfer.ts). */
  onPush?: () => void;
}

/** Options of {@link AgentClient.writeFile}. */
export interface AgentWriteFileOptions extends AgentFileOptions {
  /**
   * Permission bits (≤ 0o7777), applied exactly (no umask). Default: the replaced file's
   * mode, or 0o644 for a new file.
   */
  mode?: number;
  /** {@link FileWriteFlag} bits; default CREATE (create or atomically replace). */
  flags?: number;
  /**
   * Called with the bytes sent but not yet acknowledged, after each FILE_DATA frame sent
   * and each FILE_ACK (buffer accounting, daemon/api/transfer.ts): an upper bound on what
   * of this write waits in the connection's send queue.
   */
  onProgress?: (unacked: number) => void;
}

/** A file being read: see {@link AgentClient.readFile}. */
export interface AgentFileRead {
  /** Resolves with the file's stat once it is open; rejects with the open failure. */
  readonly info: Promise<FileInfo>;
  /** The bytes (chunks ≤ 256 KiB); ends after the last byte, is destroyed on failure. */
  readonly stream: Readable;
  /** Resolves after the last byte was received; rejects on any failure or cancellation. */
  readonly done: Promise<void>;
}

/** Size of STDIN frames the client sends (the protocol allows up to 1 MiB). */
const STDIN_FRAME_BYTES = 256 * 1024;
/** Size of FILE_DATA frames the client sends. */
export const FILE_FRAME_BYTES = 256 * 1024;
/** A writeFile keeps at most this many bytes sent but not acknowledged by FILE_ACK. */
export const WRITE_WINDOW_BYTES = 4 * 1024 * 1024;
/** highWaterMark of a readFile stream; above it the socket is paused. */
export const READ_STREAM_HWM = 256 * 1024;
const DEFAULT_CONNECT_TIMEOUT_MS = 5000;

/** Linux errno values the agent reports in FILE_ERROR. */
const ERRNO = {
  EPERM: 1, ENOENT: 2, EIO: 5, ENOMEM: 12, EACCES: 13, EBUSY: 16, EEXIST: 17, EXDEV: 18, ENOTDIR: 20,
  EISDIR: 21, EINVAL: 22, ENFILE: 23, EMFILE: 24, EFBIG: 27, ENOSPC: 28, EROFS: 30, ENAMETOOLONG: 36,
  ENOTEMPTY: 39, ELOOP: 40, EDQUOT: 122, ECANCELED: 125,
} as const;

/**
 * Error kind for a FILE_ERROR errno: ENOENT → NotFound; EEXIST → AlreadyExists;
 * EACCES/EPERM, EISDIR/ENOTDIR, ENOTEMPTY, EBUSY, EROFS → FailedPrecondition;
 * EINVAL/ELOOP/EXDEV/ENAMETOOLONG (relative paths, '..', magic links) → InvalidArgument;
 * ENOSPC/EDQUOT/EFBIG/ENOMEM/EMFILE/ENFILE → ResourceExhausted; anything else → Internal.
 */
export function fileErrorKind(errno: number): ErrorKind {
  switch (errno) {
    case ERRNO.ENOENT: return 'NotFound';
    case ERRNO.EEXIST: return 'AlreadyExists';
    case ERRNO.EACCES: case ERRNO.EPERM: case ERRNO.EISDIR: case ERRNO.ENOTDIR: case ERRNO.ENOTEMPTY:
    case ERRNO.EBUSY: case ERRNO.EROFS: case ERRNO.ECANCELED:
      return 'FailedPrecondition';
    case ERRNO.EINVAL: case ERRNO.ELOOP: case ERRNO.EXDEV: case ERRNO.ENAMETOOLONG: return 'InvalidArgument';
    case ERRNO.ENOSPC: case ERRNO.EDQUOT: case ERRNO.EFBIG: case ERRNO.ENOMEM: case ERRNO.EMFILE: case ERRNO.ENFILE:
      return 'ResourceExhausted';
    default: return 'Internal';
  }
}

/** A file operation the agent refused or that failed (FILE_ERROR). */
export class AgentFileError extends DsecError {
  /** The Linux errno the agent reported (e.g. 2 = ENOENT, 13 = EACCES). */
  readonly errno: number;

  constructor(errno: number, message: string) {
    super(fileErrorKind(errno), message);
    this.errno = errno;
  }
}

/** Per-stream receiver of frames (exec or file operation). */
interface StreamSink {
  /** A frame on this stream; throwing drops the connection. */
  onFrame(f: Frame): void;
  /** The connection is gone. */
  fail(err: Error): void;
}

/** What an ERROR frame on a stream means for the caller. */
function streamError(stream: number, payload: Buffer): DsecError {
  const msg = payload.toString('utf8');
  if (/unknown or unexpected frame type/.test(msg)) {
    return unimplemented(`the agent does not support this operation (stream ${stream}: ${msg})`);
  }
  return internal(`agent error on stream ${stream}: ${msg}`);
}

function toBuffer(chunk: unknown): Buffer {
  if (Buffer.isBuffer(chunk)) return chunk;
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  if (typeof chunk === 'string') return Buffer.from(chunk, 'utf8');
  throw invalidArgument(`writeFile: source yielded a ${typeof chunk}, expected Buffer, Uint8Array or string`);
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
  private readonly streams = new Map<number, StreamSink>();
  /** readFile streams whose consumer is behind; the socket is paused while non-empty. */
  private readonly pausers = new Set<number>();
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

  /** Bytes this connection's send queue holds in the process now (written, not yet taken by the kernel), whatever stream they belong to. */
  get outboundQueuedBytes(): number {
    return this._closed ? 0 : this.socket.writableLength;
  }

  /** Bytes of the frame being received that this connection holds now (not yet complete), whatever stream it belongs to. */
  get inboundPendingBytes(): number {
    return this.decoder.pendingBytes;
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
   * Start one exec. Output is delivered to `handlers` as it arrives (for a tty exec,
   * everything arrives as stdout).
   * @throws DsecError(InvalidArgument) synchronously for a malformed request
   *   (empty argv, NUL in a string, env entry without '=', bad timeout, bad tty size,
   *   bad isolate sizes or scratch paths); DsecError(Unimplemented) if `tty`, `detached`
   *   or `isolate` is asked of an agent without them (an agent that predates an EXEC field
   *   would silently ignore it, which for `isolate` would mean no isolation at all)
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
    if (req.tty !== undefined) this.requireFeature('tty', 'exec with a tty');
    if (req.detached) this.requireFeature('detached', 'detached exec');
    if (req.isolate !== undefined) this.requireFeature('isolate', 'isolated exec');
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
            this.streams.delete(f.stream);
            this.unpauseFor(f.stream);
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
            this.streams.delete(f.stream);
            this.unpauseFor(f.stream);
            rejectPid(new DsecError('FailedPrecondition', x.message));
            resolveDone({ kind: 'exec_error', errno: x.errno, message: x.message });
            return;
          }
          case FrameType.ERROR: {
            const err = streamError(f.stream, f.payload);
            this.streams.delete(f.stream);
            this.unpauseFor(f.stream);
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
    if (this._closed) {
      sink.fail(this.lostError('connection is closed'));
    } else {
      this.streams.set(stream, sink);
      this.send(FrameType.EXEC, stream, payload);
    }
    const live = () => this.streams.get(stream) === sink;
    return {
      stream,
      pid,
      done,
      writeStdin: (b: Buffer) => {
        if (!acceptsInput) throw failedPrecondition('writeStdin: the exec was started without stdin: true');
        if (stdinClosed) throw failedPrecondition('writeStdin: stdin is already closed');
        if (!live()) return;
        for (let off = 0; off < b.length; off += STDIN_FRAME_BYTES) {
          this.send(FrameType.STDIN, stream, b.subarray(off, Math.min(b.length, off + STDIN_FRAME_BYTES)));
        }
      },
      drained: () => this.drained(),
      closeStdin: () => {
        if (tty || !req.stdin || stdinClosed) return;
        stdinClosed = true;
        if (live()) this.send(FrameType.STDIN_EOF, stream);
      },
      signal: (signo: number) => {
        if (!Number.isInteger(signo) || signo < 1 || signo > 64) {
          throw invalidArgument(`signal: ${signo} is not a signal number (1..64)`);
        }
        if (live()) this.send(FrameType.SIGNAL, stream, encodeU32(signo));
      },
      pauseOutput: () => {
        if (live()) this.pauseFor(stream);
      },
      resumeOutput: () => this.unpauseFor(stream),
      resize: (rows: number, cols: number) => {
        if (!tty) throw failedPrecondition('resize: exec has no tty');
        let p: Buffer;
        try {
          p = encodeWinsize(rows, cols);
        } catch (e) {
          throw invalidArgument(`resize: ${(e as Error).message}`, e);
        }
        if (live()) this.send(FrameType.RESIZE, stream, p);
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

  // ---- files ------------------------------------------------------------------------

  /**
   * Stream a regular file out of the sandbox.
   *
   * Flow control: the agent stops reading the file while this connection's outbound queue
   * is above 4 MiB. The client cannot pause one stream of a shared socket, so when
   * `stream`'s buffer is above 256 KiB (its highWaterMark: the consumer is slower than the
   * agent) the whole socket is paused until the consumer reads again; every other stream
   * of this connection (exec output, other files, pings) waits meanwhile. Memory stays
   * bounded on both ends; a consumer that waits for another stream of the same
   * connection before reading this one deadlocks, so use a connection of its own for it.
   *
   * Destroying `stream` early cancels the read on the agent; `done` then rejects with
   * the destroy error, or FailedPrecondition "cancelled" when there was none.
   * @throws DsecError(InvalidArgument) synchronously for a malformed request
   * @returns info (on open), the bytes, and completion; failures reject `info` (if not
   *   yet open) and `done`, and destroy `stream`, with an {@link AgentFileError}
   *   (e.g. NotFound, FailedPrecondition for EACCES/EISDIR, InvalidArgument for '..' or a
   *   /proc magic link), DsecError(Unavailable) on connection loss, or
   *   DsecError(Unimplemented) for an agent without files
   */
  readFile(path: string, opts: AgentReadFileOptions = {}): AgentFileRead {
    const payload = this.encodeFile('readFile', { path, user: opts.user, offset: opts.offset, length: opts.length });
    const stream = this.allocStream();
    let resolveInfo!: (i: FileInfo) => void;
    let rejectInfo!: (e: Error) => void;
    let resolveDone!: () => void;
    let rejectDone!: (e: Error) => void;
    const info = new Promise<FileInfo>((res, rej) => { resolveInfo = res; rejectInfo = rej; });
    const done = new Promise<void>((res, rej) => { resolveDone = res; rejectDone = rej; });
    info.catch(() => {});
    done.catch(() => {});
    let finished = false;
    const fail = (err: Error) => {
      if (finished) return;
      finished = true;
      this.unpauseFor(stream);
      rejectInfo(err);
      rejectDone(err);
      if (!readable.destroyed) readable.destroy(err);
    };
    const readable = new Readable({
      highWaterMark: READ_STREAM_HWM,
      read: () => this.unpauseFor(stream),
      destroy: (err, cb) => {
        if (!finished) {
          // The consumer gave up: tell the agent (FILE_DONE on a read = cancel).
          finished = true;
          this.unpauseFor(stream);
          if (this.streams.get(stream) === sink) {
            this.streams.delete(stream);
            this.send(FrameType.FILE_DONE, stream);
          }
          const e = err ?? failedPrecondition(`read ${path}: cancelled by the reader`);
          rejectInfo(e);
          rejectDone(e);
        }
        cb(err);
      },
    });
    // Failures are reported through `done`; without this, destroying a stream nobody
    // listens to would crash the process with an unhandled 'error' event.
    readable.on('error', () => {});
    const sink = this.fileSink((f) => {
      switch (f.type) {
        case FrameType.FILE_INFO:
          resolveInfo(decodeFileInfo(f.payload));
          return;
        case FrameType.FILE_DATA:
          if (!finished && !readable.push(f.payload)) this.pauseFor(stream);
          opts.onPush?.();
          return;
        case FrameType.FILE_DONE:
          this.streams.delete(f.stream);
          if (finished) return;
          finished = true;
          this.unpauseFor(stream);
          readable.push(null);
          resolveDone();
          return;
        default:
          return;
      }
    }, fail);
    this.startFileOp(stream, sink, FrameType.FILE_READ, payload);
    return { info, stream: readable, done };
  }

  /**
   * Write a file inside the sandbox from `source` (a Readable, any async iterable of
   * Buffer/Uint8Array/string, or one Buffer). By default (flags CREATE) the bytes go to a
   * temp file in the same directory that atomically replaces `path` once the source has
   * ended; with APPEND they are appended in place. The agent acknowledges every MiB
   * written (FILE_ACK) and this client keeps at most 4 MiB unacknowledged, so a fast
   * source never floods the socket. If the agent fails first, the source is destroyed.
   * @returns the number of bytes written
   * @throws DsecError(InvalidArgument) for a malformed request; an {@link AgentFileError}
   *   (e.g. FailedPrecondition "Permission denied", AlreadyExists with EXCLUSIVE,
   *   ResourceExhausted for ENOSPC); the source's own error (the write is then aborted
   *   and nothing replaces `path`); DsecError(Unavailable) on connection loss
   */
  async writeFile(
    path: string,
    source: Readable | AsyncIterable<Buffer | Uint8Array | string> | Buffer,
    opts: AgentWriteFileOptions = {},
  ): Promise<{ bytes: number }> {
    const payload = this.encodeFile('writeFile', {
      path, user: opts.user, mode: opts.mode, flags: opts.flags ?? FileWriteFlag.CREATE,
    });
    const stream = this.allocStream();
    let acked = 0;
    let sent = 0;
    let settled = false;
    let wake: (() => void) | null = null;
    const wakeUp = () => {
      const w = wake;
      wake = null;
      w?.();
    };
    let resolveResult!: (r: { bytes: number }) => void;
    let rejectResult!: (e: Error) => void;
    const result = new Promise<{ bytes: number }>((res, rej) => { resolveResult = res; rejectResult = rej; });
    result.catch(() => {});
    const fail = (err: Error) => {
      if (settled) return;
      settled = true;
      rejectResult(err);
      wakeUp();
      // Stop a source that may be waiting for its producer (the pump below would
      // otherwise only notice at its next chunk).
      if (source instanceof Readable && !source.destroyed) source.destroy();
    };
    const sink = this.fileSink((f) => {
      switch (f.type) {
        case FrameType.FILE_ACK:
          acked = decodeU64(f.payload, 'FILE_ACK');
          opts.onProgress?.(sent - acked);
          wakeUp();
          return;
        case FrameType.FILE_DONE:
          this.streams.delete(f.stream);
          if (!settled) {
            settled = true;
            resolveResult({ bytes: decodeU64(f.payload, 'FILE_DONE') });
            wakeUp();
          }
          return;
        default:
          return;
      }
    }, fail);
    this.startFileOp(stream, sink, FrameType.FILE_WRITE, payload);
    const iterable: AsyncIterable<unknown> = Buffer.isBuffer(source) ? [source] as unknown as AsyncIterable<unknown> : source;
    // The pump runs on its own: `result` settles on the agent's answer or on connection
    // loss even while the source is stalled.
    const pump = async () => {
      try {
        for await (const chunk of iterable) {
          if (settled) break; // the agent failed (or the connection is gone): stop reading
          const buf = toBuffer(chunk);
          for (let off = 0; off < buf.length && !settled; off += FILE_FRAME_BYTES) {
            while (!settled && sent - acked >= WRITE_WINDOW_BYTES) {
              await new Promise<void>((r) => { wake = r; });
            }
            if (settled) break;
            const part = buf.subarray(off, Math.min(buf.length, off + FILE_FRAME_BYTES));
            this.send(FrameType.FILE_DATA, stream, part);
            sent += part.length;
            opts.onProgress?.(sent - acked);
          }
        }
      } catch (e) {
        if (!settled) {
          // The source failed: abort on the agent (its temp file is removed).
          if (this.streams.get(stream) === sink) {
            this.streams.delete(stream);
            this.send(FrameType.FILE_ERROR, stream);
          }
          fail(e instanceof Error ? e : new Error(String(e)));
        }
      }
      if (!settled) this.send(FrameType.FILE_DONE, stream);
    };
    void pump();
    return result;
  }

  /**
   * stat (or lstat, with nofollow) a path inside the sandbox.
   * @returns its info; `target` is set for a symlink (nofollow)
   * @throws an {@link AgentFileError} (NotFound, FailedPrecondition, InvalidArgument, …)
   */
  async stat(path: string, opts: AgentFileOptions & { nofollow?: boolean } = {}): Promise<FileInfo> {
    const payload = this.encodeFile('stat', { path, user: opts.user, nofollow: opts.nofollow });
    let info: FileInfo | null = null;
    await this.simpleFileOp(FrameType.FILE_STAT, payload, (f) => {
      if (f.type === FrameType.FILE_INFO) info = decodeFileInfo(f.payload);
    });
    if (!info) throw internal(`stat ${path}: the agent sent no FILE_INFO`);
    return info;
  }

  /**
   * List a directory (entries other than "." and "..", in directory order, not sorted).
   * @returns each entry's lstat info and name; `target` for symlinks
   * @throws an {@link AgentFileError} (NotFound, FailedPrecondition for ENOTDIR/EACCES, …)
   */
  async list(path: string, opts: AgentFileOptions = {}): Promise<FileEntry[]> {
    const payload = this.encodeFile('list', { path, user: opts.user });
    const entries: FileEntry[] = [];
    await this.simpleFileOp(FrameType.FILE_LIST, payload, (f) => {
      if (f.type === FrameType.FILE_ENTRY) entries.push(decodeFileEntry(f.payload));
    });
    return entries;
  }

  /**
   * Create a directory (mode default 0o755, exact). With parents, missing parents are
   * created (0o755) and an existing directory is not an error.
   * @throws an {@link AgentFileError} (AlreadyExists, NotFound for a missing parent, …)
   */
  async mkdir(path: string, opts: AgentFileOptions & { mode?: number; parents?: boolean } = {}): Promise<void> {
    const payload = this.encodeFile('mkdir', {
      path, user: opts.user, mode: opts.mode, flags: opts.parents ? FileWriteFlag.PARENTS : undefined,
    });
    await this.simpleFileOp(FrameType.FILE_MKDIR, payload, () => {});
  }

  /**
   * Remove a file, symlink or empty directory; with recursive, a directory tree (symlinks
   * are removed, never followed).
   * @throws an {@link AgentFileError} (NotFound, FailedPrecondition for ENOTEMPTY/EACCES, …)
   */
  async remove(path: string, opts: AgentFileOptions & { recursive?: boolean } = {}): Promise<void> {
    const payload = this.encodeFile('remove', { path, user: opts.user, recursive: opts.recursive });
    await this.simpleFileOp(FrameType.FILE_REMOVE, payload, () => {});
  }

  /**
   * Create a symlink at `path` pointing to `target` (stored as is, may be relative).
   * @throws an {@link AgentFileError} (AlreadyExists, NotFound for a missing parent, …)
   */
  async symlink(path: string, target: string, opts: AgentFileOptions = {}): Promise<void> {
    const payload = this.encodeFile('symlink', { path, user: opts.user, target });
    await this.simpleFileOp(FrameType.FILE_SYMLINK, payload, () => {});
  }

  /**
   * Close the connection. The agent SIGKILLs the process groups of execs still running on
   * it (except detached ones, which keep running); their `done` promises reject with
   * "agent connection lost (closed by client)". File operations in progress fail the
   * same way (an unfinished write leaves nothing behind).
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

  /** @throws DsecError(Unimplemented) if the agent's HELLO does not list the feature. */
  private requireFeature(feature: string, what: string): void {
    const features = this._info?.features;
    if (!features || !features.includes(feature)) {
      throw unimplemented(`${what}: the agent at ${this.socketPath} (version ${this._info?.version ?? '?'}) does not support "${feature}"`);
    }
  }

  private encodeFile(op: string, fields: FileRequestFields): Buffer {
    try {
      return encodeFileRequest(fields);
    } catch (e) {
      throw invalidArgument(`${op}: ${(e as Error).message}`, e);
    }
  }

  /** Register a file stream and send its request, or fail it at once. */
  private startFileOp(stream: number, sink: StreamSink, type: number, payload: Buffer): void {
    if (this._closed) {
      sink.fail(this.lostError('connection is closed'));
      return;
    }
    try {
      this.requireFeature('files', 'file operations');
    } catch (e) {
      sink.fail(e as Error);
      return;
    }
    this.streams.set(stream, sink);
    this.send(type, stream, payload);
  }

  /** A file request answered by some frames (passed to onFrame) and FILE_DONE / FILE_ERROR. */
  private simpleFileOp(type: number, payload: Buffer, onFrame: (f: Frame) => void): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const stream = this.allocStream();
      const sink = this.fileSink((f) => {
        if (f.type === FrameType.FILE_DONE) {
          this.streams.delete(f.stream);
          resolve();
        } else {
          onFrame(f);
        }
      }, reject);
      this.startFileOp(stream, sink, type, payload);
    });
  }

  /**
   * The sink of a file stream. FILE_ERROR and ERROR end the stream the same way for every
   * operation: it is forgotten and `fail` gets an {@link AgentFileError} or the stream
   * error (see streamError). Every other frame goes to `onFrame`; `fail` also receives
   * connection loss.
   */
  private fileSink(onFrame: (f: Frame) => void, fail: (err: Error) => void): StreamSink {
    return {
      onFrame: (f) => {
        if (f.type !== FrameType.FILE_ERROR && f.type !== FrameType.ERROR) {
          onFrame(f);
          return;
        }
        this.streams.delete(f.stream);
        if (f.type === FrameType.ERROR) {
          fail(streamError(f.stream, f.payload));
        } else {
          const x = decodeFileError(f.payload);
          fail(new AgentFileError(x.errno, x.message));
        }
      },
      fail,
    };
  }

  /** A readFile consumer is behind: stop reading the socket (all streams). */
  private pauseFor(stream: number): void {
    if (this._closed) return;
    if (this.pausers.size === 0) this.socket.pause();
    this.pausers.add(stream);
  }

  /** A readFile consumer caught up (or its stream ended): resume when nobody is behind. */
  private unpauseFor(stream: number): void {
    if (!this.pausers.delete(stream)) return;
    if (this.pausers.size === 0 && !this._closed) this.socket.resume();
  }

  /** Resolves once the socket's write buffer is below its high-water mark, or the connection closed. */
  drained(): Promise<void> {
    if (this._closed || !this.socket.writableNeedDrain) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        this.socket.off('drain', done);
        this.socket.off('close', done);
        resolve();
      };
      this.socket.on('drain', done);
      this.socket.on('close', done);
    });
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
    const sink = this.streams.get(f.stream);
    if (!sink) return; // stream already finished (or never ours)
    sink.onFrame(f);
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
    this.pausers.clear();
    for (const sink of streams) sink.fail(err);
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
