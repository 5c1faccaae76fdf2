/**
 * What reaches inside a running sandbox: commands run to completion (optionally recorded
 * as trajectory steps), exec sessions, isolated calls of fncall workers, the agent for
 * file operations, and a VM's serial console. Every command is resolved against the
 * sandbox once: env = image env < sandbox env < request env; cwd and user default to the
 * image's.
 */
import path from 'node:path';
import { constants as osConstants } from 'node:os';
import { conflict, failedPrecondition, invalidArgument, isDsecError } from '../errors.js';
import { signalName } from '../host/proc.js';
import type { AgentExecHandle } from '../agent/client.js';
import type { IsolateOptions } from '../agent/protocol.js';
import type { DaemonConfig } from '../config.js';
import type { AgentFiles, ConsoleAttachment, ConsoleClientHandlers } from '../drivers/types.js';
import type { FncallCall } from '../fncall/pool.js';
import type { SandboxRepo } from '../db/sandboxes.js';
import type { CommandInput, ExecInput, ExecResult, StartExecInput } from '../model/exec.js';
import { LIMITS } from '../model/resources.js';
import type { SandboxRecord } from '../model/sandbox.js';
import { assertRunning } from '../model/state.js';
import type { ExecActivity } from './activity.js';
import type { Backends } from './backends.js';
import type { ExecRegistry, ExecSession } from './exec-sessions.js';
import type { Failpoints } from './failpoints.js';
import type { LivenessWatch } from './liveness.js';
import { trajectoryKey, type TrajectoryLog } from './trajectory.js';

const { ENOENT, E2BIG } = osConstants.errno;

/** Wall-clock limit of an fncall that names none: 60 s, so a runaway call cannot hold a worker forever. */
export const FNCALL_DEFAULT_TIMEOUT_MS = 60_000;

/** What the exec service reads and acts through. */
export interface ExecDeps {
  /** The state root (console logs) and the per-stream output cap of an exec to completion. */
  config: Pick<DaemonConfig, 'root' | 'maxOutputBytes'>;
  repo: Pick<SandboxRepo, 'get' | 'find' | 'touchActive' | 'event'>;
  backends: Backends;
  /** Exec sessions of every sandbox. */
  sessions: ExecRegistry;
  trajectories: TrajectoryLog;
  /** Tells a dead init from a lost connection (an exec that lost its agent). */
  liveness: Pick<LivenessWatch, 'markDead'>;
  failpoints: Failpoints;
  /** Where execs are recorded as they start and end (the idle policy of host reclaim reads it); absent: not recorded. */
  activity?: ExecActivity;
}

/** A command as the agent runs it. */
interface ResolvedCommand {
  argv: string[];
  /** Full environment, `K=V`. */
  env: string[];
  cwd: string;
  user: string;
  timeoutMs?: number;
}

/** Commands, sessions, files and consoles of running sandboxes. */
export class ExecService {
  constructor(private readonly d: ExecDeps) {}

  /** The command as the agent runs it: env = image env < sandbox env < request env; cwd and user default to the image's. */
  private resolveCommand(sb: SandboxRecord, cmd: CommandInput): ResolvedCommand {
    const env = new Map<string, string>();
    for (const kv of sb.imageConfig.env) {
      const i = kv.indexOf('=');
      if (i > 0) env.set(kv.slice(0, i), kv.slice(i + 1));
    }
    for (const [k, v] of Object.entries(sb.env)) env.set(k, v);
    for (const [k, v] of Object.entries(cmd.env ?? {})) env.set(k, v);
    return {
      argv: cmd.argv,
      env: [...env].map(([k, v]) => `${k}=${v}`),
      cwd: cmd.cwd ?? sb.imageConfig.cwd ?? '/',
      user: cmd.user ?? sb.imageConfig.user ?? '0',
      timeoutMs: cmd.timeoutMs,
    };
  }

  /**
   * Runs a command to completion in a running sandbox. With `input.trajectory` the run is
   * a recorded step (docs/TRAJECTORIES.md): a step recorded before is replayed (in any
   * state of the sandbox) instead of run again.
   * @throws DsecError NotFound, FailedPrecondition (not running), InvalidArgument (stdin
   *   over 16 MiB, a cwd or user the sandbox lacks, argv and env too long for execve),
   *   Conflict (a trajectory step out of order, or the sandbox stopped or destroyed
   *   while the command ran), Unavailable (agent unreachable or lost mid-exec).
   */
  async exec(id: string, input: ExecInput): Promise<ExecResult> {
    const sb = this.d.repo.get(id);
    const stdin = input.stdin;
    if (stdin && stdin.length > LIMITS.maxStdinBytes) throw invalidArgument('stdin_b64 decodes to more than 16 MiB');
    const t = input.trajectory;
    if (!t) {
      assertRunning(sb);
      return this.runExec(sb, input, stdin);
    }
    // A replay touches nothing in the sandbox, so it is answered in any state; a step
    // that must run needs a running sandbox, checked before `started` is recorded.
    const canonical = { argv: input.argv, env: input.env, cwd: input.cwd, user: input.user, timeout_ms: input.timeoutMs, stdin };
    // The trajectory belongs to the sandbox's tenant: another tenant's same id is another trajectory.
    const decision = this.d.trajectories.begin(trajectoryKey(sb.tenant, t.id), t.step, id, canonical, t.truncate, Date.now(), () => assertRunning(sb));
    if (decision.kind === 'replay') return decision.result;
    const tok = decision.token;
    let r: ExecResult;
    try {
      r = await this.runExec(sb, input, stdin);
    } catch (e) {
      // InvalidArgument comes from checks that run before the command (cwd, user, execve
      // limits): nothing ran. Anything else may have broken off a running command.
      if (isDsecError(e, 'InvalidArgument')) this.d.trajectories.abandon(tok);
      else this.d.trajectories.unknown(tok, `the command was cut off: ${(e as Error).message}`);
      throw e;
    }
    this.d.failpoints.hit('trajectory.before-record');
    this.d.trajectories.finish(tok, r);
    return { ...r, trajectory: t.id, step: t.step, replayed: false };
  }

  /**
   * Runs one isolated call in an fncall worker (daemon/fncall/pool.ts): fresh pid,
   * mount, IPC and UTS namespaces, the image read-only, fresh /tmp and /dev/shm.
   * @throws as {@link exec}.
   */
  async execIsolated(sb: SandboxRecord, call: FncallCall): Promise<ExecResult> {
    const cmd: CommandInput = {
      argv: call.argv, ...(call.env ? { env: call.env } : {}), ...(call.cwd ? { cwd: call.cwd } : {}), ...(call.user ? { user: call.user } : {}),
      timeoutMs: call.timeoutMs ?? FNCALL_DEFAULT_TIMEOUT_MS,
    };
    return this.runExec(sb, cmd, call.stdin, { ...(call.tmpBytes ? { tmpBytes: call.tmpBytes } : {}), ...(call.scratch ? { scratch: call.scratch } : {}) });
  }

  /** Runs a command in a running sandbox through its driver (the exec path without the trajectory log). */
  private async runExec(sb: SandboxRecord, cmd: CommandInput, stdin: Buffer | undefined, isolate?: IsolateOptions): Promise<ExecResult> {
    const id = sb.id;
    if (sb.idleTimeoutS !== null) this.d.repo.touchActive(id);
    const drv = this.d.backends.driver(sb.backend);
    this.d.activity?.begin(id);
    const r = await drv.exec(sb, {
      ...this.resolveCommand(sb, cmd),
      stdin,
      maxOutputBytes: this.d.config.maxOutputBytes,
      ...(isolate ? { isolate } : {}),
    }).catch(async (e) => {
      if (!isDsecError(e, 'Unavailable')) throw e;
      // The agent connection dropped: tell a stop/destroy that raced the command from a dead init.
      const now = this.d.repo.find(id);
      if (!now) throw conflict(`sandbox ${id} was destroyed while the command ran`);
      if (now.state === 'failed') {
        throw failedPrecondition(`sandbox ${id} is failed: ${now.error ?? 'its init exited'}; start it again with \`dsec start ${id}\` or destroy it`);
      }
      if (now.desired === 'destroyed' || now.desired === 'stopped' || now.state !== 'running') {
        throw conflict(`sandbox ${id} was ${now.desired ?? now.state} while the command ran`);
      }
      // The connection can drop a moment before the dying init is visibly gone (exit in
      // progress, not yet a zombie): look again for up to 1 s before calling it alive.
      for (let i = 0; i < 20; i++) {
        if (!(await drv.isAlive(sb))) throw await this.d.liveness.markDead(id);
        await new Promise((res) => setTimeout(res, 50));
      }
      throw e;
    }).finally(() => this.d.activity?.end(id));
    if (r.kind === 'exec_error') {
      if (r.errno === E2BIG) throw invalidArgument(`sandbox ${id}: argument list and environment are too long for execve (${r.message})`);
      // Shell conventions: 127 command not found, 126 found but not executable.
      const code = r.errno === ENOENT ? 127 : 126;
      return {
        exit_code: code, signal: null, stdout_b64: '', stderr_b64: Buffer.from(`dsec: ${r.message}\n`).toString('base64'),
        stdout_truncated: false, stderr_truncated: false, duration_ms: 0, oom: false, oom_kills: r.oomKills, timed_out: false,
      };
    }
    return {
      exit_code: r.exitCode,
      signal: r.signal === null ? null : signalName(r.signal),
      stdout_b64: r.stdout.toString('base64'),
      stderr_b64: r.stderr.toString('base64'),
      stdout_truncated: r.stdoutTruncated,
      stderr_truncated: r.stderrTruncated,
      duration_ms: Math.round(r.durationMs * 1000) / 1000,
      oom: r.oom,
      oom_kills: r.oomKills,
      timed_out: r.timedOut,
    };
  }

  /**
   * Starts an exec session: the command runs on its own, owned by `ownerUid`, its
   * output spooled for any number of readers, or with `paced` held for them and the
   * command paused while they are behind (daemon/sandbox/exec-sessions.ts). Resolves once
   * the program started or failed to (not found, not executable: an exited session with
   * its error). The session's `oom_kills` is the sandbox's OOM kill count after it ended
   * minus before it started.
   * @throws DsecError NotFound, FailedPrecondition (not running), Unavailable (agent
   *   unreachable), InvalidArgument (a cwd or user the sandbox does not have, or argv and
   *   env too long for execve; no session is kept).
   */
  async startExec(id: string, input: StartExecInput, ownerUid: number): Promise<ExecSession> {
    const sb = this.d.repo.get(id);
    assertRunning(sb);
    if (sb.idleTimeoutS !== null) this.d.repo.touchActive(id);
    const cmd = this.resolveCommand(sb, input);
    if (input.tty && !cmd.env.some((e) => e.startsWith('TERM='))) cmd.env.push('TERM=xterm');
    // Output may arrive before the session exists; it is held until the sink is set.
    const early: ['stdout' | 'stderr', Buffer][] = [];
    let sink: ((s: 'stdout' | 'stderr', b: Buffer) => void) | null = null;
    const drv = this.d.backends.driver(sb.backend);
    // The sandbox's OOM kill counter before and after the command (ExecInfo.oom_kills).
    const oomBefore = drv.oomKillCount ? await drv.oomKillCount(sb) : null;
    let session: ExecSession | null = null;
    this.d.activity?.begin(id);
    let ended = false;
    const endActivity = () => {
      if (!ended) this.d.activity?.end(id);
      ended = true;
    };
    const started = await drv.startExec(sb, { ...cmd, stdin: input.stdin, tty: input.tty, paced: input.paced }, {
      onStdout: (b) => (sink ? sink('stdout', b) : early.push(['stdout', b])),
      onStderr: (b) => (sink ? sink('stderr', b) : early.push(['stderr', b])),
    }).catch((e) => {
      endActivity();
      throw e;
    });
    started.done.then(endActivity, endActivity);
    // The session ends once the count after is read, so its ExecInfo at the end has it.
    const done = started.done.then(async (outcome) => {
      const after = oomBefore === null || !drv.oomKillCount ? null : await drv.oomKillCount(sb);
      if (session) session.oomKills = after === null || oomBefore === null ? null : Math.max(0, after - oomBefore);
      return outcome;
    });
    done.catch(() => {});
    const handle: AgentExecHandle = { ...started, done };
    session = this.d.sessions.create(id, ownerUid, input.argv, !!input.tty, input.stdin, (handlers) => {
      sink = (s, b) => (s === 'stdout' ? handlers.onStdout(b) : handlers.onStderr(b));
      for (const [s, b] of early.splice(0)) sink(s, b);
      return handle;
    }, input.paced);
    // A cwd or user the sandbox does not have is the request's fault, as for an exec to
    // completion (runExec): InvalidArgument, and no session is left behind.
    const startFailed = await started.pid.then(() => false, () => true);
    if (startFailed) {
      await session.wait();
      const o = session.outcome;
      if (o?.kind === 'exec_error' && (/^(chdir|user)\b/.test(o.message) || o.errno === E2BIG)) {
        await this.d.sessions.remove(id, session.id, 0).catch(() => {});
        throw invalidArgument(o.errno === E2BIG ? `sandbox ${id}: argument list and environment are too long for execve (${o.message})` : `sandbox ${id}: ${o.message}`);
      }
    }
    this.d.repo.event('exec.started', sb, `${session.id} ${JSON.stringify(input.argv).slice(0, 200)}`);
    void session.wait().then(() => {
      const i = session.info();
      const row = this.d.repo.find(id);
      if (row) this.d.repo.event('exec.finished', row, `${session.id} exit=${i.exit_code ?? 'none'} signal=${i.signal ?? 'none'}`);
    });
    return session;
  }

  /**
   * File operations inside a running sandbox (through its agent).
   * @throws DsecError NotFound, FailedPrecondition (not running), Unavailable.
   */
  async files(id: string): Promise<AgentFiles> {
    const sb = this.d.repo.get(id);
    assertRunning(sb);
    return this.d.backends.driver(sb.backend).files(sb);
  }

  /**
   * Attaches to the serial console of a sandbox whose tier has one (`dsec console`):
   * guest output goes to `c`; the returned writer sends input to the guest.
   * @throws DsecError NotFound, FailedPrecondition (a tier without a serial console; not
   *   running or paused), Unavailable (console not connected).
   */
  attachConsole(id: string, c: ConsoleClientHandlers): ConsoleAttachment {
    const sb = this.d.repo.get(id);
    const drv = this.d.backends.driver(sb.backend);
    if (!drv.capabilities(sb.backend).console || !drv.attachConsole) {
      throw failedPrecondition(`sandbox ${id} is a ${sb.backend} sandbox: only vm sandboxes have a serial console; use \`dsec exec -it ${id} -- sh\` for a terminal in it`);
    }
    if (sb.state !== 'running' && sb.state !== 'paused') throw failedPrecondition(`sandbox ${id} is ${sb.state}; its serial console exists only while the VM runs (dsec start ${id})`);
    return drv.attachConsole(sb, c);
  }

  /**
   * Host path of the serial console log of a sandbox whose tier has one
   * (`<root>/sandboxes/<id>/console.log`).
   * @throws DsecError NotFound, FailedPrecondition (a tier without a serial console).
   */
  consoleLogPath(id: string): string {
    const sb = this.d.repo.get(id);
    if (!this.d.backends.caps(sb.backend).console) throw failedPrecondition(`sandbox ${sb.id} is a ${sb.backend} sandbox: only vm sandboxes have a serial console`);
    return path.join(this.d.config.root, 'sandboxes', sb.id, 'console.log');
  }
}
