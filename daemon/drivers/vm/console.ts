/**
 * The serial console of one full VM, as dsecd holds it: QEMU's serial port is a chardev
 * socket (`<dir>/console.sock`, server, `wait=off`) and dsecd keeps the one connection it
 * accepts. Everything the guest writes is appended to a bounded log (`console.log`, rotated
 * to `console.log.1` at {@link ConsoleHubOptions.logCapBytes}, so at most twice that on
 * disk) and broadcast to every attached client (`dsec console`, the console WebSocket);
 * what any client types goes to the guest.
 *
 * Lifecycle contracts:
 *   - {@link ConsoleHub.connect} retries while QEMU has not created the socket yet (it is
 *     called right after QEMU is spawned, with the vCPUs stopped by `-S`, so no output of
 *     the boot is lost); safe to call again after the connection was lost (adopt after a
 *     dsecd restart). While no dsecd is connected QEMU drops the guest's output: the guest
 *     never blocks on its console.
 *   - When QEMU goes (the VM stopped or died) the connection ends; every attached client
 *     gets `onEnd` and is detached.
 *   - {@link ConsoleHub.close} ends the connection and detaches every client. Safe to call
 *     twice.
 */
import net from 'node:net';
import { appendFileSync, renameSync, statSync } from 'node:fs';
import { unavailable } from '../../errors.js';

/** Options of a {@link ConsoleHub}. */
export interface ConsoleHubOptions {
  /** QEMU's chardev socket. */
  socket: string;
  /** The console log file and its rotated predecessor. */
  logFile: string;
  oldLogFile: string;
  /** Rotate the log when it reaches this many bytes (`[vm] console_log_bytes`; default 1 MiB). */
  logCapBytes: number;
  /** Names the sandbox in errors. */
  what: string;
}

/** One attached client of a console. */
export interface ConsoleClient {
  /** Guest output, as it arrives. */
  onData(b: Buffer): void;
  /** The console ended (QEMU went, or the hub closed). Called once. */
  onEnd(reason: string): void;
}

/** See the module comment. */
export class ConsoleHub {
  private sock: net.Socket | null = null;
  private readonly clients = new Set<ConsoleClient>();
  private logBytes = 0;
  private closed = false;
  /** Output observers used during boot (the `ready` pattern of a disk). */
  private readonly watchers = new Set<(b: Buffer) => void>();

  constructor(private readonly o: ConsoleHubOptions) {
    try {
      this.logBytes = statSync(o.logFile).size;
    } catch { /* no log yet */ }
  }

  /** True while dsecd holds QEMU's console connection. */
  get connected(): boolean {
    return this.sock !== null;
  }

  /**
   * Connects to QEMU's console socket, retrying every 20 ms until `deadline` (ms since
   * the epoch) while the socket does not exist or refuses.
   * @throws DsecError Unavailable when it could not connect in time.
   */
  async connect(deadline: number): Promise<void> {
    if (this.sock) return;
    for (;;) {
      try {
        const s = await new Promise<net.Socket>((resolve, reject) => {
          const c = net.createConnection({ path: this.o.socket });
          c.once('connect', () => resolve(c));
          c.once('error', reject);
        });
        this.attachSocket(s);
        return;
      } catch (e) {
        if (this.closed || Date.now() >= deadline) throw unavailable(`${this.o.what}: cannot connect to the VM's serial console ${this.o.socket}: ${(e as Error).message}`, e);
        await new Promise((r) => setTimeout(r, 20));
      }
    }
  }

  private attachSocket(s: net.Socket): void {
    this.sock = s;
    s.on('data', (b: Buffer) => this.output(b));
    s.on('error', () => {});
    s.on('close', () => {
      if (this.sock === s) this.sock = null;
      this.endClients('the VM\'s serial console closed (the VM stopped)');
    });
  }

  private output(b: Buffer): void {
    this.log(b);
    for (const w of this.watchers) w(b);
    for (const c of this.clients) c.onData(b);
  }

  /** Appends to the log, rotating it at the cap (synchronous: console output is small and a boot failure reads the tail at once). */
  private log(b: Buffer): void {
    try {
      if (this.logBytes + b.length > this.o.logCapBytes && this.logBytes > 0) {
        renameSync(this.o.logFile, this.o.oldLogFile);
        this.logBytes = 0;
      }
      appendFileSync(this.o.logFile, b, { mode: 0o600 });
      this.logBytes += b.length;
    } catch { /* the sandbox dir is going away */ }
  }

  /**
   * Resolves once the console output (from now on) matches `re`, searching a sliding
   * window of the last 64 KiB. The returned `cancel` stops watching.
   */
  waitFor(re: RegExp): { done: Promise<void>; cancel(): void } {
    let window = '';
    let cancel = () => {};
    const done = new Promise<void>((resolve) => {
      const w = (b: Buffer) => {
        window = (window + b.toString('latin1')).slice(-65536);
        if (re.test(window)) {
          this.watchers.delete(w);
          resolve();
        }
      };
      this.watchers.add(w);
      cancel = () => this.watchers.delete(w);
    });
    return { done, cancel };
  }

  /**
   * Attaches a client; returns the function that writes its input to the guest and the
   * one that detaches it.
   * @throws DsecError Unavailable when dsecd holds no console connection (the VM is not running).
   */
  attach(c: ConsoleClient): { write(b: Buffer): boolean; detach(): void; drained(): Promise<void> } {
    if (!this.sock) throw unavailable(`${this.o.what}: the VM's serial console is not connected (is the VM running?)`);
    this.clients.add(c);
    return {
      write: (b) => this.sock?.write(b) ?? false,
      detach: () => { this.clients.delete(c); },
      drained: () => new Promise<void>((resolve) => {
        const s = this.sock;
        if (!s || !s.writableNeedDrain) return resolve();
        s.once('drain', () => resolve());
        s.once('close', () => resolve());
      }),
    };
  }

  private endClients(reason: string): void {
    const cs = [...this.clients];
    this.clients.clear();
    for (const c of cs) c.onEnd(reason);
  }

  /** Ends the connection and detaches every client; the VM is not touched. Safe to call twice. */
  close(): void {
    this.closed = true;
    const s = this.sock;
    this.sock = null;
    s?.destroy();
    this.endClients('dsecd closed the console');
  }
}
