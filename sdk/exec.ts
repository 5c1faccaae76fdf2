/**
 * Running commands in a sandbox: {@link DsecClient.exec} (run to completion, output
 * returned whole) and exec sessions (started in the background, optionally with stdin and
 * a PTY; output read from an offset, streamed, or over an attachment's WebSocket), plus
 * the serial console of a vm sandbox, attached the same way.
 */
import type { Readable } from 'node:stream';
import type { ExecAttachment, AttachOptions } from './attach.js';
import type { ExecInfo, ExecResult } from './types.js';
import { decodeExecResult, execRequestBody, type ExecOptions, type ExecOutput } from './exec-types.js';
import { ExecChannel } from './exec-channel.js';
import { execPath, execsPath, query, sandboxPath } from './paths.js';
import { OCTET_STREAM, type TransportClass } from './transport.js';



/** A command to start as an exec session with {@link DsecClient.startExec}. */
export interface StartExecOptions {
  /** Program and arguments; `argv[0]` is looked up in the sandbox PATH. At least one element. */
  argv: string[];
  /** Extra environment, merged over the sandbox env. */
  env?: Record<string, string>;
  /** Absolute working directory inside the sandbox; default the image's. */
  cwd?: string;
  /** User name or `uid[:gid]` inside the sandbox; default the image's. */
  user?: string;
  /** Open stdin for streaming ({@link DsecClient.writeExecStdin} or an attachment); default /dev/null. */
  stdin?: boolean;
  /** Run under a pseudo-terminal of this size; stdout and stderr are then one stream (stdout). */
  tty?: { rows: number; cols: number };
  /** Kill the command (SIGKILL) after this many ms; its ExecInfo then has `timed_out: true`. */
  timeoutMs?: number;
  /**
   * Pace the command by its readers instead of spooling its output: dsecd holds at most
   * 1 MiB per stream that no reader has taken, and the command blocks while its readers
   * are behind (or none is attached yet). No size limit; output once taken cannot be read
   * again. Attach right after starting (what `dsec exec` does). Default false: spooled,
   * up to 1 GiB per stream, readable again from any offset.
   */
  paced?: boolean;
  /** Abort the HTTP call (the promise rejects with the signal's reason); the session may still start. */
  signal?: AbortSignal;
}

/** Query of {@link DsecClient.execOutput}. */
export interface ExecOutputQuery {
  /** Which stream; default `stdout`. */
  stream?: 'stdout' | 'stderr';
  /** Start at this byte of what dsecd kept; default 0. */
  offset?: number;
  /** Keep streaming until the command ends. */
  follow?: boolean;
  /** Closes the stream when aborted (the Readable is destroyed with the signal's reason). */
  signal?: AbortSignal;
}

export { decodeExecResult, type ExecOptions, type ExecOutput } from './exec-types.js';

/** Options of {@link DsecClient.writeExecStdin}. */
export interface WriteStdinOptions {
  /** Close the command's stdin after these bytes. */
  eof?: boolean;
  /** Abort the upload (rejects with the signal's reason). */
  signal?: AbortSignal;
}

/** Options of {@link DsecClient.waitExec}. */
export interface WaitExecOptions {
  /** Give up after this many ms: rejects with `DeadlineExceeded` (the command keeps running). Default: wait as long as it runs. */
  timeoutMs?: number;
  /** Stop waiting (rejects with the signal's reason). */
  signal?: AbortSignal;
}

/** Options of {@link DsecClient.attachExec}; see {@link AttachOptions}. */
export type AttachExecOptions = AttachOptions;

/** The attachment type {@link DsecClient.attachExec} returns, typed with {@link ExecInfo}. */
export type ExecAttachmentHandle = ExecAttachment<ExecInfo>;

/** How a console attachment ended on dsecd's side: the console closed (the VM stopped). */
export interface ConsoleEnd {
  reason: string;
}

/** The attachment type {@link DsecClient.attachConsole} returns. */
export type ConsoleAttachmentHandle = ExecAttachment<ConsoleEnd>;


/** Mixes exec, exec sessions and console attachments into a {@link Transport} class (composed into DsecClient by sdk/client.ts). */
export function withExecCalls<B extends TransportClass>(Base: B) {
  return class ExecCalls extends Base {
    /**
     * POST /v1/sandboxes/{id}/exec: runs a command to completion and returns its status and
     * output. A command that fails is not an error: look at `exit_code` (127 not found,
     * 126 not executable), `signal`, `timed_out`, `oom` (the command itself was OOM-killed)
     * and `oom_kills` (OOM kills of any process in the sandbox while it ran, e.g. a stage of
     * its pipeline; null when the backend cannot see them). Output is capped at dsecd's
     * `max_output_bytes` per stream; for uncapped output start a paced session
     * ({@link startExec} with `paced: true`) and attach to it. The HTTP deadline is the
     * command's `timeoutMs` plus the client's `timeoutMs`; without a command timeout there
     * is no HTTP deadline (the command may legitimately run long).
     *
     * With `trajectory` and `step` the command is recorded as that step (docs/TRAJECTORIES.md):
     * a rerun of a finished step with the same request resolves with the recorded result
     * and `replayed: true` (nothing runs); the result also names its `trajectory` and `step`.
     * Refusals carry a {@link DsecApiError.reason}: `Conflict` with `outcome_unknown` (the
     * step started and never finished: whether it took effect is unknown), `step_mismatch`
     * (the step is recorded with another request), `out_of_order` (a later step is
     * recorded) or `in_progress` (running now); pass `truncate` to discard the step and the
     * later ones and run it. `FailedPrecondition` with `trajectory_removed`: the id was
     * removed and stays reserved; use a new one. A replay is answered in any sandbox state.
     * Errors: `NotFound`, `FailedPrecondition` (sandbox not running), `InvalidArgument`
     * (including `trajectory` without `step`, or `truncate` without both), `Conflict`.
     */
    async exec(id: string, req: ExecOptions): Promise<ExecOutput> {
      const body = execRequestBody(req);
      const deadline = req.timeoutMs !== undefined && this.timeoutMs > 0 ? req.timeoutMs + this.timeoutMs : 0;
      const res = await this.request<ExecResult>('POST', sandboxPath(id) + '/exec', body, { signal: req.signal, timeoutMs: deadline });
      return decodeExecResult(res);
    }

    /**
     * Opens an exec channel to sandbox `id` (GET /v1/sandboxes/{id}/exec/channel, a
     * WebSocket): {@link ExecChannel.exec} then runs commands to completion as
     * {@link exec} does, many in flight on one connection, without an HTTP request,
     * authentication and tenancy check per command (docs/BENCHMARKS.md "Exec p50": the
     * latency of a short command). Returns at once; `opened` settles with the handshake.
     * Close it when done. Errors (on `opened` and every request): `NotFound` (unknown
     * sandbox, or another tenant's), `Unauthenticated`, `PermissionDenied` (a reader
     * token), `Unavailable` (dsecd unreachable, the connection dropped).
     */
    execChannel(id: string): ExecChannel {
      const path = sandboxPath(id) + '/exec/channel';
      const ws = this.endpoint.webSocket(path);
      return new ExecChannel(ws.url, this.webSocketErrors(path), ws.options);
    }

    /**
     * POST /v1/sandboxes/{id}/execs: starts an exec session and resolves with its ExecInfo
     * once the program started (or failed to: see `error`, `exit_code` 127/126). The
     * session runs until its command exits, whoever is connected; read its output with
     * {@link execOutput} or {@link attachExec}. Errors: `NotFound`, `FailedPrecondition`
     * (sandbox not running), `InvalidArgument`, `Unavailable` (agent unreachable).
     */
    startExec(id: string, req: StartExecOptions): Promise<ExecInfo> {
      const body: Record<string, unknown> = { argv: req.argv };
      if (req.env !== undefined) body.env = req.env;
      if (req.cwd !== undefined) body.cwd = req.cwd;
      if (req.user !== undefined) body.user = req.user;
      if (req.stdin !== undefined) body.stdin = req.stdin;
      if (req.tty !== undefined) body.tty = { rows: req.tty.rows, cols: req.tty.cols };
      if (req.timeoutMs !== undefined) body.timeout_ms = req.timeoutMs;
      if (req.paced !== undefined) body.paced = req.paced;
      return this.request<ExecInfo>('POST', execsPath(id), body, { signal: req.signal });
    }

    /** GET /v1/sandboxes/{id}/execs: the caller's exec sessions in the sandbox (running, and exited ones dsecd still keeps). Errors: `NotFound`. */
    async listExecs(id: string): Promise<ExecInfo[]> {
      return (await this.request<{ execs: ExecInfo[] }>('GET', execsPath(id))).execs;
    }

    /** GET /v1/sandboxes/{id}/execs/{exec_id}: one session. Errors: `NotFound` (unknown, forgotten, or another user's). */
    getExec(id: string, execId: string): Promise<ExecInfo> {
      return this.request<ExecInfo>('GET', execPath(id, execId));
    }

    /**
     * GET .../execs/{exec_id}/output: one output stream as raw bytes from `offset`, as a
     * Readable (it streams with backpressure; nothing is buffered here). With `follow` it
     * ends when the command ends. Resolves once dsecd answered; errors: `NotFound`,
     * `InvalidArgument`; a dropped connection is an `error` event on the Readable.
     */
    async execOutput(id: string, execId: string, q: ExecOutputQuery = {}): Promise<Readable> {
      const qs = query({ stream: q.stream, offset: q.offset === undefined ? undefined : String(q.offset), follow: q.follow ? 'true' : undefined });
      return this.openStream('GET', execPath(id, execId) + '/output' + qs, q.signal);
    }

    /**
     * POST .../execs/{exec_id}/stdin: writes `data` (bytes, or a Readable streamed with
     * backpressure) to the command's stdin, then closes it when `eof`. Errors: `NotFound`,
     * `FailedPrecondition` (started without stdin); a failing Readable rejects with its own error.
     */
    async writeExecStdin(id: string, execId: string, data: Buffer | Uint8Array | Readable, opts: WriteStdinOptions = {}): Promise<void> {
      await this.upload('POST', execPath(id, execId) + '/stdin' + query({ eof: opts.eof ? 'true' : undefined }), data, OCTET_STREAM, opts.signal);
    }

    /** POST .../execs/{exec_id}/signal: sends `signal` (`SIGTERM`, `TERM` or a number) to the command's process group; resolves with the ExecInfo. Errors: `NotFound`, `InvalidArgument`. */
    signalExec(id: string, execId: string, signal: string | number): Promise<ExecInfo> {
      return this.request<ExecInfo>('POST', execPath(id, execId) + '/signal', { signal });
    }

    /** POST .../execs/{exec_id}/resize: resizes the PTY of a tty session. Errors: `NotFound`, `InvalidArgument` (no tty, size out of 1..1000). */
    resizeExec(id: string, execId: string, rows: number, cols: number): Promise<ExecInfo> {
      return this.request<ExecInfo>('POST', execPath(id, execId) + '/resize', { rows, cols });
    }

    /**
     * POST .../execs/{exec_id}/wait: resolves with the ExecInfo once the command has ended.
     * With `timeoutMs`, dsecd gives up after that long (`DeadlineExceeded`; the command
     * keeps running). No HTTP deadline beyond it. Errors: `NotFound`, `DeadlineExceeded`.
     */
    waitExec(id: string, execId: string, opts: WaitExecOptions = {}): Promise<ExecInfo> {
      const qs = query({ timeout_ms: opts.timeoutMs === undefined ? undefined : String(opts.timeoutMs) });
      const deadline = opts.timeoutMs !== undefined && this.timeoutMs > 0 ? opts.timeoutMs + this.timeoutMs : 0;
      return this.request<ExecInfo>('POST', execPath(id, execId) + '/wait' + qs, undefined, { signal: opts.signal, timeoutMs: deadline });
    }

    /** DELETE .../execs/{exec_id}: kills the command if it runs and forgets the session and its output; resolves with its last ExecInfo. Errors: `NotFound`. */
    removeExec(id: string, execId: string): Promise<ExecInfo> {
      return this.request<ExecInfo>('DELETE', execPath(id, execId));
    }

    /**
     * Attaches to an exec session over a WebSocket (GET .../execs/{exec_id}/attach): returns
     * at once an {@link ExecAttachment} emitting `stdout`/`stderr` chunks and `exit` (the
     * final ExecInfo), with `write(bytes)`, `eof()`, `resize(rows, cols)`, `signal(name)` and
     * `close()`; `opened` and `done` are its promises (see sdk/attach.ts). Output dsecd kept
     * is replayed from `stdoutOffset`/`stderrOffset` (default 0). With `killOnDetach` the
     * command is killed when the connection closes before it ends.
     * Errors (on `done`): `NotFound`, `FailedPrecondition` (stdin written to a session started
     * without it), `Unavailable` (socket unreachable, connection dropped).
     */
    attachExec(id: string, execId: string, opts: AttachExecOptions = {}): ExecAttachmentHandle {
      const qs = query({
        stdout_offset: opts.stdoutOffset ? String(opts.stdoutOffset) : undefined,
        stderr_offset: opts.stderrOffset ? String(opts.stderrOffset) : undefined,
        kill_on_detach: opts.killOnDetach === undefined ? undefined : String(opts.killOnDetach),
      });
      const path = execPath(id, execId) + '/attach' + qs;
      return this.attach<ExecInfo>(path, opts.signal);
    }

    /**
     * WebSocket to the serial console of a vm sandbox (GET /v1/sandboxes/{id}/console,
     * daemon/api/routes/console.ts): `stdout` events carry console output, `write()` sends
     * input to the guest, `done` resolves with `{ reason }` when the console ends (the VM
     * stopped), `null` after {@link ExecAttachment.close} (detach). `tailLines` replays the
     * last lines of the console log first (as `tail -n` counts them), `tailBytes` its last
     * bytes (give one). Errors: `NotFound`, `FailedPrecondition` (not a vm sandbox, or not
     * running), `InvalidArgument` (both tails), `Unavailable`.
     */
    attachConsole(id: string, opts: { tailLines?: number; tailBytes?: number; signal?: AbortSignal } = {}): ConsoleAttachmentHandle {
      const path = sandboxPath(id) + '/console' + query({
        tail_bytes: opts.tailBytes ? String(opts.tailBytes) : undefined,
        tail_lines: opts.tailLines ? String(opts.tailLines) : undefined,
      });
      return this.attach<ConsoleEnd>(path, opts.signal);
    }

    /** GET /v1/sandboxes/{id}/console/log: the serial console log of a vm sandbox (raw bytes). Errors: `NotFound`, `FailedPrecondition`. */
    async consoleLog(id: string): Promise<Buffer> {
      const parts: Buffer[] = [];
      for await (const c of await this.openStream('GET', sandboxPath(id) + '/console/log')) parts.push(Buffer.from(c as Buffer));
      return Buffer.concat(parts);
    }
  };
}
