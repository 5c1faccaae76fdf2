/**
 * A microVM's agent endpoint on the host: the Unix socket `<dir>/agent.sock` that dsecd
 * listens on, and the mux session (vmux.ts) over QEMU's chardev `<dir>/vmux.sock` that its
 * connections become streams of. To everything above it (AgentClient, the files API, exec
 * sessions) `agent.sock` behaves like a container's: connect, HELLO, frames.
 *
 * Lifecycle contracts:
 *   - The session is opened on first need (the first accepted connection, or
 *     {@link VmEndpoint.session}) and reopened after it is lost; at most one is being
 *     opened at a time. A restarted dsecd opens a new one, and the guest drops the
 *     streams of the old (native/agent/vmux.c).
 *   - A connection accepted while no session can be had (the VM is gone or its agent does
 *     not answer) is closed at once: the client sees the connection end during its HELLO.
 *   - {@link VmEndpoint.close} closes the listener, the session and with it every
 *     stream; the VM keeps running. Safe to call twice.
 */
import net from 'node:net';
import { rm } from 'node:fs/promises';
import type { Logger } from 'pino';
import { unavailable } from '../../errors.js';
import { vmPaths } from './qemu.js';
import { VmuxSession } from './vmux.js';

/** How long the mux handshake may take with a VM that is up: 10 s (a TCG guest answers in ~100 ms; a loaded host needs more). */
export const SESSION_TIMEOUT_MS = 10_000;

/** See the module comment. */
export class VmEndpoint {
  private server: net.Server | null = null;
  private current: Promise<VmuxSession> | null = null;
  private closed = false;

  constructor(private readonly o: { dir: string; what: string; log: Logger }) {}

  /** Binds `<dir>/agent.sock` (replacing a stale file a previous dsecd left). Safe to call twice. */
  async listen(): Promise<void> {
    if (this.server) return;
    const p = vmPaths(this.o.dir).agentSock;
    await rm(p, { force: true });
    const server = net.createServer((sock) => this.accept(sock));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen({ path: p, backlog: 128 }, () => resolve());
    });
    server.on('error', (e) => this.o.log.warn({ err: e, path: p }, 'agent endpoint listener error'));
    this.server = server;
  }

  /**
   * The mux session, opening it when there is none.
   * @param timeoutMs for the handshake (a booting guest needs its boot time).
   * @throws DsecError Unavailable (no chardev socket: QEMU is not running), DeadlineExceeded
   *   (the agent did not answer), FailedPrecondition (no common mux version).
   */
  session(timeoutMs = SESSION_TIMEOUT_MS): Promise<VmuxSession> {
    if (this.closed) return Promise.reject(unavailable(`${this.o.what}: agent endpoint is closed`));
    if (!this.current) {
      const p = this.open(timeoutMs);
      this.current = p;
      p.then((s) => {
        s.onLost((e) => {
          this.o.log.info({ what: this.o.what, err: e.message }, 'agent mux session lost');
          if (this.current === p) this.current = null;
        });
      }, () => {
        if (this.current === p) this.current = null;
      });
    }
    return this.current;
  }

  /** Closes the listener and the session (every stream). The VM keeps running. Safe to call twice. */
  async close(): Promise<void> {
    this.closed = true;
    const s = this.current;
    this.current = null;
    if (s) await s.then((x) => x.close(), () => {});
    const srv = this.server;
    this.server = null;
    if (srv) await new Promise<void>((resolve) => srv.close(() => resolve()));
  }

  private async open(timeoutMs: number): Promise<VmuxSession> {
    const path = vmPaths(this.o.dir).vmux;
    const port = net.createConnection({ path });
    await new Promise<void>((resolve, reject) => {
      port.once('connect', resolve);
      port.once('error', (e) => reject(unavailable(`${this.o.what}: cannot reach the VM's agent port ${path}: ${e.message}`, e)));
    });
    if (this.closed) {
      port.destroy();
      throw unavailable(`${this.o.what}: agent endpoint is closed`);
    }
    return VmuxSession.start(port, { timeoutMs, what: this.o.what, log: (m) => this.o.log.warn(m) });
  }

  private accept(sock: net.Socket): void {
    // Hold the client's first bytes (its HELLO) until the stream exists.
    sock.pause();
    this.session().then((s) => {
      s.attach(sock);
      sock.resume();
    }, (e: Error) => {
      this.o.log.warn({ what: this.o.what, err: e.message }, 'agent connection refused: no mux session');
      sock.destroy();
    });
  }
}
