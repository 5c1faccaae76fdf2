/**
 * Client for the in-sandbox agent (native/agent, protocol in docs/AGENT_PROTOCOL.md).
 *
 * One {@link AgentClient} is one Unix-socket connection to one agent: the socket, the
 * framing, the HELLO handshake and the table of streams are here; execs (./exec.ts) and
 * file operations (./files.ts) run over it, each on its own stream id, through a
 * {@link StreamHost} only the client holds. Errors are {@link DsecError}s:
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
import type { Readable } from 'node:stream';
import {
  CONTROL_STREAM, FrameDecoder, FrameType, PROTOCOL_VERSION, decodeU32, encodeFrame, encodeU32,
  type FileEntry, type FileInfo, type Frame,
} from './protocol.js';
import { DsecError, deadlineExceeded, failedPrecondition, internal, unavailable, unimplemented } from '../errors.js';
import { runExec, startExec, type AgentExecHandle, type AgentExecHandlers, type AgentExecRequest, type AgentExecResult } from './exec.js';
import {
  list, mkdir, readFile, remove, stat, symlink, writeFile,
  type AgentFileOptions, type AgentFileRead, type AgentReadFileOptions, type AgentWriteFileOptions,
} from './files.js';
import type { StreamHost, StreamSink } from './streams.js';

export type { FileEntry, FileInfo, FileType, IsolateOptions } from './protocol.js';
export { FileWriteFlag } from './protocol.js';
export type { AgentExecHandle, AgentExecHandlers, AgentExecOutcome, AgentExecRequest, AgentExecResult } from './exec.js';
export {
  AgentFileError, FILE_FRAME_BYTES, READ_STREAM_HWM, WRITE_WINDOW_BYTES, fileErrorKind,
  type AgentFileOptions, type AgentFileRead, type AgentReadFileOptions, type AgentWriteFileOptions,
} from './files.js';

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

/** Options of {@link AgentClient.connect}. */
export interface AgentConnectOptions {
  /** Give up on connect + HELLO after this many milliseconds (default 5000). */
  timeoutMs?: number;
}

/** Connect + HELLO timeout when none is given: 5 s. */
const DEFAULT_CONNECT_TIMEOUT_MS = 5000;

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

  /** The stream plumbing execs and file operations use (./streams.ts), over this client's privates. */
  private readonly host: StreamHost = {
    isClosed: () => this._closed,
    alloc: () => this.allocStream(),
    open: (stream, sink) => { this.streams.set(stream, sink); },
    forget: (stream) => { this.streams.delete(stream); },
    owns: (stream, sink) => this.streams.get(stream) === sink,
    send: (type, stream, payload) => this.send(type, stream, payload),
    pauseFor: (stream) => this.pauseFor(stream),
    unpauseFor: (stream) => this.unpauseFor(stream),
    requireFeature: (feature, what) => this.requireFeature(feature, what),
    lostError: (reason) => this.lostError(reason),
    drained: () => this.drained(),
  };

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
   * everything arrives as stdout). See ./exec.ts startExec for the errors.
   */
  startExec(req: AgentExecRequest, handlers: AgentExecHandlers = {}): AgentExecHandle {
    return startExec(this.host, req, handlers);
  }

  /** Run one exec to completion and collect its output, each stream capped at `maxOutputBytes`. See ./exec.ts runExec. */
  exec(req: Omit<AgentExecRequest, 'stdin'> & { stdin?: Buffer; maxOutputBytes: number }): Promise<AgentExecResult> {
    return runExec(this.host, req);
  }

  /** Stream a regular file out of the sandbox (flow control and errors: ./files.ts readFile). */
  readFile(path: string, opts: AgentReadFileOptions = {}): AgentFileRead {
    return readFile(this.host, path, opts);
  }

  /** Write a file inside the sandbox from `source`, atomically replacing `path` by default (./files.ts writeFile). */
  writeFile(path: string, source: Readable | AsyncIterable<Buffer | Uint8Array | string> | Buffer, opts: AgentWriteFileOptions = {}): Promise<{ bytes: number }> {
    return writeFile(this.host, path, source, opts);
  }

  /** stat (or lstat, with nofollow) a path inside the sandbox. @throws AgentFileError. */
  stat(path: string, opts: AgentFileOptions & { nofollow?: boolean } = {}): Promise<FileInfo> {
    return stat(this.host, path, opts);
  }

  /** List a directory (entries other than "." and "..", in directory order). @throws AgentFileError. */
  list(path: string, opts: AgentFileOptions = {}): Promise<FileEntry[]> {
    return list(this.host, path, opts);
  }

  /** Create a directory (mode default 0o755; with parents, like `mkdir -p`). @throws AgentFileError. */
  mkdir(path: string, opts: AgentFileOptions & { mode?: number; parents?: boolean } = {}): Promise<void> {
    return mkdir(this.host, path, opts);
  }

  /** Remove a file, symlink or empty directory; with recursive, a tree (symlinks never followed). @throws AgentFileError. */
  remove(path: string, opts: AgentFileOptions & { recursive?: boolean } = {}): Promise<void> {
    return remove(this.host, path, opts);
  }

  /** Create a symlink at `path` pointing to `target` (stored as is). @throws AgentFileError. */
  symlink(path: string, target: string, opts: AgentFileOptions = {}): Promise<void> {
    return symlink(this.host, path, target, opts);
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
