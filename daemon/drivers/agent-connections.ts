/**
 * The agent connections of one driver's sandboxes, in one place for every tier: one
 * cached connection per sandbox (many execs and file operations share it, each on its
 * own stream), connected on first use and forgotten when it is lost; a connection of
 * its own for an exec whose stdin, terminal or pacing could stall the shared one; and,
 * once the driver closed, no connection at all (daemon/drivers/shutdown.ts).
 *
 * A container's agent listens on `<sandbox dir>/agent.sock` directly; a VM's socket at
 * the same place is dsecd's own endpoint into the guest's stream multiplexer
 * (daemon/drivers/vmm/endpoint.ts). Both speak the same protocol, so nothing here
 * depends on the tier.
 */
import { AgentClient, type AgentExecHandle, type AgentExecResult } from '../agent/client.js';
import { DsecError, invalidArgument, unavailable } from '../errors.js';
import { refuseAfterClose, shuttingDown } from './shutdown.js';
import type { DriverExecHandlers, DriverExecRequest, DriverStartExecRequest } from './types.js';

/** How long a connection of its own for one exec may take to connect: the driver's default. */
export interface AgentConnectionOptions {
  /** The host path of sandbox `id`'s agent socket. */
  socketPath(id: string): string;
  /** Connect timeout of a connection made without one (including an exec's own), ms. */
  timeoutMs: number;
}

/** Delay before an exec's own connection is closed after a SIGKILL sent through it: 1 s, for the frame to reach the agent first. */
const KILL_CLOSE_DELAY_MS = 1000;

/** The agent connections of one driver; see the module comment. */
export class AgentConnections {
  private readonly cached = new Map<string, Promise<AgentClient>>();
  /** The connections of their own that execs with stdin, a tty or paced output hold ({@link startExec}). */
  private readonly own = new Set<AgentClient>();
  private isClosed = false;

  constructor(private readonly o: AgentConnectionOptions) {}

  /** Whether {@link close} ran: no connection is made any more. */
  get closed(): boolean {
    return this.isClosed;
  }

  /**
   * The cached connection of sandbox `id`, connecting (with HELLO) on first use; a
   * connection that is lost or fails to connect is forgotten, so the next use connects again.
   * @param timeoutMs connect timeout of a new connection (default the driver's).
   * @throws DsecError Unavailable once {@link close} ran; what AgentClient.connect throws.
   */
  get(id: string, timeoutMs = this.o.timeoutMs): Promise<AgentClient> {
    if (this.isClosed) return Promise.reject(shuttingDown());
    let p = this.cached.get(id);
    if (!p) {
      p = refuseAfterClose(() => this.isClosed, AgentClient.connect(this.o.socketPath(id), { timeoutMs })).then((c) => {
        c.onLost(() => {
          if (this.cached.get(id) === p) this.cached.delete(id);
        });
        return c;
      });
      p.catch(() => {
        if (this.cached.get(id) === p) this.cached.delete(id);
      });
      this.cached.set(id, p);
    }
    return p;
  }

  /**
   * As {@link get}, with a failure to connect reported against the sandbox.
   * @throws DsecError Unavailable (`sandbox <id>: cannot reach its agent: ...`).
   */
  async client(id: string): Promise<AgentClient> {
    try {
      return await this.get(id);
    } catch (e) {
      throw unavailable(`sandbox ${id}: cannot reach its agent: ${(e as Error).message}`, e);
    }
  }

  /** Closes and forgets the cached connection of sandbox `id`, if any. */
  async drop(id: string): Promise<void> {
    const p = this.cached.get(id);
    this.cached.delete(id);
    if (p) await p.then((c) => c.close(), () => {});
  }

  /**
   * Closes every connection; from here on none is made (an operation in flight when
   * dsecd shuts down fails Unavailable instead of keeping the process alive). Safe twice.
   */
  async close(): Promise<void> {
    this.isClosed = true;
    for (const id of [...this.cached.keys()]) await this.drop(id);
    // An exec's own connection (an attach with stdin, a tty) would keep the process alive.
    for (const c of [...this.own]) c.close();
    this.own.clear();
  }

  /**
   * Runs a command to completion on sandbox `id`'s cached connection.
   * @returns the agent's outcome as is (an `exec_error` included: see {@link refuseBadCwdOrUser}).
   * @throws DsecError Unavailable (cannot reach the agent; the connection broke mid-exec),
   *   or what the agent answered (InvalidArgument, Unimplemented, ...).
   */
  async exec(id: string, req: DriverExecRequest): Promise<AgentExecResult> {
    const client = await this.client(id);
    try {
      return await client.exec({
        argv: req.argv, env: req.env, cwd: req.cwd, user: req.user, timeoutMs: req.timeoutMs,
        stdin: req.stdin, maxOutputBytes: req.maxOutputBytes, ...(req.isolate ? { isolate: req.isolate } : {}),
      });
    } catch (e) {
      if (e instanceof DsecError) throw e;
      throw unavailable(`sandbox ${id}: exec interrupted: ${(e as Error).message}`, e);
    }
  }

  /**
   * Starts a command and returns its handle at once. An exec that takes stdin gets a
   * connection of its own: the agent stops reading a connection while one of its execs
   * has a large stdin backlog (a command that does not read), and that must never stall
   * the sandbox's other execs and file copies; so do a tty exec and a paced one (pausing
   * its output pauses its whole connection). Its own connection closes when it ends, and
   * one second after a SIGKILL sent through it (a SIGKILL frame can sit behind a stdin
   * backlog the agent is not reading; closing makes the agent kill the exec regardless).
   * @throws DsecError Unavailable when the agent cannot be reached.
   */
  async startExec(id: string, req: DriverStartExecRequest, handlers: DriverExecHandlers): Promise<AgentExecHandle> {
    const fields = { argv: req.argv, env: req.env, cwd: req.cwd, user: req.user, timeoutMs: req.timeoutMs, stdin: req.stdin, ...(req.tty ? { tty: req.tty } : {}) };
    if (!(req.stdin || req.tty || req.paced)) return (await this.client(id)).startExec(fields, handlers);
    if (this.isClosed) throw shuttingDown();
    let own: AgentClient;
    try {
      own = await refuseAfterClose(() => this.isClosed, AgentClient.connect(this.o.socketPath(id), { timeoutMs: this.o.timeoutMs }));
    } catch (e) {
      if (this.isClosed) throw shuttingDown();
      throw unavailable(`sandbox ${id}: cannot reach its agent: ${(e as Error).message}`, e);
    }
    this.own.add(own);
    const h = own.startExec(fields, handlers);
    const done = () => {
      this.own.delete(own);
      own.close();
    };
    void h.done.then(done, done);
    return {
      ...h,
      signal: (signo: number) => {
        h.signal(signo);
        if (signo === 9) setTimeout(() => own.close(), KILL_CLOSE_DELAY_MS).unref();
      },
    };
  }
}

/**
 * Refuses a command the agent could not start because the sandbox lacks its working
 * directory or user: the request's fault, so InvalidArgument (a missing program is an
 * exit status, 127, and stays a result).
 * @throws DsecError InvalidArgument naming the sandbox and the agent's reason.
 */
export function refuseBadCwdOrUser(id: string, res: AgentExecResult): void {
  if (res.kind === 'exec_error' && /^(chdir|user)\b/.test(res.message)) throw invalidArgument(`sandbox ${id}: ${res.message}`);
}
