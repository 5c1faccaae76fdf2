/**
 * dsecd's side of the sandbox resolver: starts daemon/net/resolver-child.js in the
 * instance netns (`nsenter --net=<path> -- node ...` with an IPC channel), answers its
 * questions through a {@link ResolverHandler}, and restarts it if it dies.
 *
 * Restart safety. The child exits when dsecd does (its IPC channel closes), so while
 * dsecd restarts, sandboxes' DNS questions get no answer (their libc retries: glibc
 * waits 5 s per attempt, 2 attempts by default). Connections already allowed are
 * unaffected, since the egress maps stay pinned in the kernel. The child's pid and
 * starttime are recorded in `<root>/net/resolver.pid`, so a child that outlived its
 * dsecd (it should not: it exits on disconnect) is killed by pid before a new one binds.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Logger } from 'pino';
import { unavailable } from '../errors.js';
import { procStartTime } from '../host/proc.js';
import type { ChildToParent, ParentToChild, QueryMsg } from './resolver-ipc.js';

/** How long start waits for the child to bind: 10 s (a cold node start on a loaded 2-core host). */
const READY_MS = 10_000;
/** Questions awaiting an answer past which old ones (30 s, beyond every child timeout) are swept: 4,096. */
const QUESTIONS_SWEEP_AT = 4096;
/** Delay before restarting a child that died: 1 s, so a crash loop cannot spin the host. */
const RESTART_DELAY_MS = 1000;

/** What the resolver asks dsecd; implemented by daemon/net/network.ts. */
export interface ResolverHandler {
  /** Decides a question from `src` (a sandbox address on the bridge). */
  decide(src: string, name: string, type: number): { action: 'refuse' | 'forward'; report: boolean };
  /** Puts the answered addresses of `name` into the egress maps of the sandbox at `src`; resolves when they are in force. */
  pin(src: string, name: string, addresses: { family: 4 | 6; address: string; ttl: number }[]): Promise<void>;
}

/** Options of {@link SandboxResolver}. */
export interface ResolverOptions {
  /** Path of the instance netns (/run/netns/dsec-<instance>). */
  netnsPath: string;
  /** Gateway address the child binds (port 53). */
  gateway: string;
  /** Upstreams the child forwards to, `host[:port]`, as seen from the instance netns. */
  upstreams: string[];
  /** `<root>/net`. */
  stateDir: string;
  log: Logger;
}

/** Path of the compiled child script (next to this file in dist/). */
function childScript(): string {
  return path.join(path.dirname(fileURLToPath(import.meta.url)), 'resolver-child.js');
}

/** The resolver child's lifecycle; see the module comment. */
export class SandboxResolver {
  private child: ChildProcess | null = null;
  private closed = false;
  /** Questions in flight, by the child's number, for {@link ResolverHandler.pin}. */
  private readonly questions = new Map<number, QueryMsg & { at: number }>();

  constructor(private readonly o: ResolverOptions, private readonly handler: ResolverHandler) {}

  private get pidFile(): string {
    return path.join(this.o.stateDir, 'resolver.pid');
  }

  /** Kills a recorded child that is still alive (matched by pid and starttime). */
  private killStale(): void {
    try {
      const rec = JSON.parse(readFileSync(this.pidFile, 'utf8')) as { pid: number; start: number };
      if (procStartTime(rec.pid) === rec.start) process.kill(rec.pid, 'SIGKILL');
    } catch { /* none recorded */ }
  }

  /**
   * Starts the child and waits until it serves.
   * @throws DsecError Unavailable when it cannot bind or does not start in time.
   */
  async start(): Promise<void> {
    this.killStale();
    const logFd = openSync(path.join(this.o.stateDir, 'resolver.log'), 'a', 0o600);
    let child: ChildProcess;
    try {
      child = spawn('nsenter', [`--net=${this.o.netnsPath}`, '--', process.execPath, childScript(), this.o.gateway, JSON.stringify(this.o.upstreams)], {
        stdio: ['ignore', logFd, logFd, 'ipc'],
      });
    } finally {
      closeSync(logFd);
    }
    this.child = child;
    child.on('message', (m: ChildToParent) => this.onMessage(child, m));
    const ready = await new Promise<string | null>((resolve) => {
      const t = setTimeout(() => resolve('did not start within 10 s'), READY_MS);
      child.on('message', (m: ChildToParent) => {
        if (m.t === 'ready') { clearTimeout(t); resolve(null); }
        if (m.t === 'error') { clearTimeout(t); resolve(m.message); }
      });
      child.once('exit', (code, sig) => { clearTimeout(t); resolve(`exited (${sig ?? code})`); });
    });
    if (ready !== null) {
      child.kill('SIGKILL');
      throw unavailable(`sandbox DNS resolver in ${this.o.netnsPath}: ${ready}; see ${path.join(this.o.stateDir, 'resolver.log')}`);
    }
    const start = child.pid ? procStartTime(child.pid) : null;
    if (child.pid && start !== null) writeFileSync(this.pidFile, JSON.stringify({ pid: child.pid, start }));
    child.once('exit', (code, sig) => {
      if (this.closed || this.child !== child) return;
      this.o.log.error({ code, signal: sig }, 'sandbox DNS resolver exited; restarting');
      this.child = null;
      setTimeout(() => { if (!this.closed) this.start().catch((e) => this.o.log.error({ err: e }, 'restarting the sandbox DNS resolver failed')); }, RESTART_DELAY_MS).unref();
    });
  }

  private reply(child: ChildProcess, m: ParentToChild): void {
    if (child.connected) child.send(m);
  }

  private onMessage(child: ChildProcess, m: ChildToParent): void {
    if (m.t === 'query') {
      let v: { action: 'refuse' | 'forward'; report: boolean };
      try {
        v = this.handler.decide(m.src, m.name, m.type);
      } catch (e) {
        this.o.log.error({ err: e, name: m.name }, 'DNS decision failed; refusing');
        v = { action: 'refuse', report: false };
      }
      if (v.report) {
        // Questions whose upstream never answered are forgotten after the child's own timeouts.
        if (this.questions.size > QUESTIONS_SWEEP_AT) for (const [k, q] of this.questions) if (Date.now() - q.at > 30_000) this.questions.delete(k);
        this.questions.set(m.n, { ...m, at: Date.now() });
      }
      this.reply(child, { t: 'verdict', n: m.n, action: v.action, report: v.report });
    } else if (m.t === 'answer') {
      const q = this.questions.get(m.n);
      this.questions.delete(m.n);
      if (!q) return;
      this.handler.pin(q.src, q.name, m.addresses).then(
        () => this.reply(child, { t: 'pinned', n: m.n }),
        (e) => this.o.log.error({ err: e, name: q.name }, 'pinning DNS answer failed; the client gets SERVFAIL'),
      );
    }
  }

  /** Whether the child is running. */
  get running(): boolean {
    return !!this.child && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Stops the child (dsecd shutdown or purge). Safe to call twice. */
  async close(): Promise<void> {
    this.closed = true;
    const c = this.child;
    this.child = null;
    if (c && c.exitCode === null && c.signalCode === null) {
      const exited = new Promise((r) => c.once('exit', r));
      c.kill('SIGTERM');
      await exited;
    }
  }
}
