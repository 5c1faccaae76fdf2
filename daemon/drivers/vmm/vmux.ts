/**
 * The host side of the agent stream multiplexer (docs/AGENT_PROTOCOL.md, "The VM
 * transport: stream multiplexer"; the guest side is native/agent/vmux.c).
 *
 * A microVM's agent is reached through one virtio-serial port, which QEMU exposes as a
 * Unix socket (its chardev, `vmux.sock`). One {@link VmuxSession} is one connection to
 * that socket after a successful handshake; it carries any number of independent
 * streams, each the byte stream of one agent connection. The driver attaches every
 * connection accepted on the VM's `agent.sock` as a new stream ({@link VmuxSession.attach}),
 * so `AgentClient.connect(<dir>/agent.sock)` and everything above it work as for a
 * container.
 *
 * Contracts (mirrored by the guest):
 *   - Credits per stream and direction: we send at most the guest's window (HELLO_ACK)
 *     beyond what it has acknowledged with CREDIT, and pause reading that client socket
 *     meanwhile; the guest may send us at most our window ({@link MUX_WINDOW}) beyond
 *     what we acknowledged, and we acknowledge bytes only once the client socket has
 *     taken them (its write callback). A client that does not read therefore holds at
 *     most one window in dsecd's memory, and the port is always read: one stalled reader
 *     never blocks another stream. A guest that exceeds its window gets that stream closed.
 *   - Handshake: on connect we send {@link MUX_BREAK_BYTES} zero bytes (which complete and
 *     invalidate any frame a previous dsecd left half-written in the guest's buffers),
 *     then HELLO with a random nonce, repeated every {@link HELLO_RETRY_MS} until the
 *     guest answers HELLO_ACK with that nonce (the guest agent may still be booting).
 *     Everything before that HELLO_ACK is stale and is skipped, wherever it ends.
 *   - Version negotiation: HELLO carries the range of mux versions we speak, HELLO_ACK
 *     the version chosen (0: no common version, with the guest's range; the session then
 *     fails with FailedPrecondition).
 *   - A lost port connection (QEMU exited, or dsecd closes the session) ends every
 *     stream: each client socket is destroyed, so its AgentClient fails pending execs
 *     with "agent connection lost".
 */
import { randomBytes } from 'node:crypto';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import { crc32 } from 'node:zlib';
import { deadlineExceeded, failedPrecondition, internal, unavailable } from '../../errors.js';

/** Frame header bytes: magic (2), type, flags, stream (u32), length (u32), CRC-32 (u32). */
export const MUX_HEADER = 16;
/** First two header bytes of every frame. */
export const MUX_MAGIC = Buffer.from([0xd5, 0x58]);
/** Largest payload of one frame: 64 KiB. */
export const MUX_MAX_PAYLOAD = 65536;
/** Zero bytes sent before the first HELLO: one maximal frame, so any truncated frame ahead of it ends inside them. */
export const MUX_BREAK_BYTES = MUX_HEADER + MUX_MAX_PAYLOAD;
/** Per-stream receive window we announce, bytes (the guest's is in its HELLO_ACK): 256 KiB, as the guest's. */
export const MUX_WINDOW = 256 * 1024;
/** Credit is returned in batches of a quarter window, so small request/response exchanges send no CREDIT frames at all. */
export const MUX_CREDIT_BATCH = MUX_WINDOW / 4;
/** Mux protocol versions this side speaks. */
export const MUX_VERSION_MIN = 1;
export const MUX_VERSION_MAX = 1;
/** HELLO is repeated this often until the guest answers: 250 ms, small next to a TCG boot and cheap (one 32-byte frame). */
export const HELLO_RETRY_MS = 250;

/** Frame types. */
export enum MuxType {
  HELLO = 1,
  HELLO_ACK = 2,
  OPEN = 3,
  DATA = 4,
  CREDIT = 5,
  CLOSE = 6,
  OP = 7,
  OP_REPLY = 8,
}

/** Guest operations (OP frames on stream 0), run by the guest agent as the guest's init. */
export enum GuestOp {
  /** sync(2): flush the guest's dirty pages and filesystem journals to the disks. Result 0. */
  SYNC = 1,
  /** kill(-1, sig) from the guest's PID 1: every guest process but the agent. Result 0 or -errno. */
  KILL_ALL = 2,
  /** Number of guest user processes other than the agent (no kernel threads, no zombies). */
  PROCS = 3,
  /** clock_settime(CLOCK_REALTIME) to the given ns since the epoch (after a pause). Result 0 or -errno. */
  SET_TIME = 4,
  /** Mix the given 16-256 host random bytes into the guest's pool as entropy and reseed its CRNG (after a restore). Result 0 or -errno. */
  RESEED = 5,
  /**
   * The confinement of the guest's commands (daemon/drivers/microvm/confine.ts
   * confinePayload; native/agent/confine.c guest_confine), once per boot. Result: the
   * Landlock ABI the commands get (0: none), or -errno (nothing runs then).
   */
  CONFINE = 6,
  /**
   * Start (or replace, or with a 1-byte argument 0 stop) the guest's DAMON reclaim scheme
   * (daemon/drivers/microvm/reclaim.ts encodeReclaimStart; native/agent/damon.c). Result 0
   * or -errno (ENOENT: the guest kernel has no DAMON; EBUSY: kdamonds the agent did not make).
   */
  RECLAIM = 7,
  /** The reclaim scheme's stats and the guest's memory, appended to the reply (reclaim.ts decodeReclaimStats). Result 0, or -ENOENT when no scheme was started. */
  RECLAIM_STATS = 8,
}

/** One decoded frame. */
export interface MuxFrame {
  type: number;
  stream: number;
  payload: Buffer;
}

/** Encodes one frame (header with the CRC-32 over header bytes 0–11 and the payload). */
export function encodeMuxFrame(type: number, stream: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  if (payload.length > MUX_MAX_PAYLOAD) throw internal(`mux frame payload of ${payload.length} bytes exceeds ${MUX_MAX_PAYLOAD}`);
  const f = Buffer.allocUnsafe(MUX_HEADER + payload.length);
  MUX_MAGIC.copy(f, 0);
  f[2] = type;
  f[3] = 0;
  f.writeUInt32BE(stream >>> 0, 4);
  f.writeUInt32BE(payload.length, 8);
  payload.copy(f, MUX_HEADER);
  f.writeUInt32BE(crc32(payload, crc32(f.subarray(0, 12))), 12);
  return f;
}

/** The frame starting at `off` if it is complete and valid; 'partial' if it may still become one; null if it is not a frame. */
function frameAt(buf: Buffer, off: number): { frame: MuxFrame; end: number } | 'partial' | null {
  if (buf.length - off < 2) return 'partial';
  if (buf[off] !== MUX_MAGIC[0] || buf[off + 1] !== MUX_MAGIC[1]) return null;
  if (buf.length - off < MUX_HEADER) return 'partial';
  const len = buf.readUInt32BE(off + 8);
  if (len > MUX_MAX_PAYLOAD) return null;
  if (buf.length - off < MUX_HEADER + len) return 'partial';
  const payload = buf.subarray(off + MUX_HEADER, off + MUX_HEADER + len);
  if (crc32(payload, crc32(buf.subarray(off, off + 12))) !== buf.readUInt32BE(off + 12)) return null;
  return { frame: { type: buf[off + 2], stream: buf.readUInt32BE(off + 4), payload: Buffer.from(payload) }, end: off + MUX_HEADER + len };
}

/**
 * Sequential frame decoder with resynchronisation: bytes that do not start a complete,
 * CRC-valid frame are skipped one at a time (`skipped` counts them), so garbage between
 * frames (a break, stale bytes) costs nothing but the scan.
 */
export class MuxDecoder {
  private buf: Buffer = Buffer.alloc(0);
  /** Bytes skipped because they started no valid frame, in total. */
  skipped = 0;

  /** Adds bytes; returns the frames completed by them, in order. */
  push(chunk: Buffer): MuxFrame[] {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    const out: MuxFrame[] = [];
    let off = 0;
    while (off < this.buf.length) {
      const r = frameAt(this.buf, off);
      if (r === 'partial') break;
      if (r === null) {
        const next = this.buf.indexOf(MUX_MAGIC[0], off + 1);
        const to = next < 0 ? this.buf.length : next;
        this.skipped += to - off;
        off = to;
        continue;
      }
      out.push(r.frame);
      off = r.end;
    }
    this.buf = this.buf.subarray(off);
    return out;
  }

  /** Bytes held while waiting for the rest of a frame. */
  get pendingBytes(): number {
    return this.buf.length;
  }
}

/**
 * Finds the first valid frame anywhere in `buf` for which `match` is true, trying every
 * position (so a stale frame that claims a long payload cannot hide a later match).
 * @returns the frame and the offset just after it, or null.
 */
export function findFrame(buf: Buffer, match: (f: MuxFrame) => boolean): { frame: MuxFrame; end: number } | null {
  for (let off = buf.indexOf(MUX_MAGIC[0]); off >= 0 && off < buf.length; off = buf.indexOf(MUX_MAGIC[0], off + 1)) {
    const r = frameAt(buf, off);
    if (r && r !== 'partial' && match(r.frame)) return r;
  }
  return null;
}

/** HELLO payload: u16 min version, u16 max version, u64 nonce, u32 our window. */
export function encodeHello(nonce: Buffer, vmin = MUX_VERSION_MIN, vmax = MUX_VERSION_MAX, window = MUX_WINDOW): Buffer {
  const p = Buffer.alloc(16);
  p.writeUInt16BE(vmin, 0);
  p.writeUInt16BE(vmax, 2);
  nonce.copy(p, 4, 0, 8);
  p.writeUInt32BE(window, 12);
  return p;
}

/** What HELLO_ACK says. */
export interface HelloAck {
  /** Version chosen, 0 = no common version. */
  version: number;
  guestMin: number;
  guestMax: number;
  nonce: Buffer;
  /** The guest's per-stream receive window, bytes: our initial credit per stream. */
  window: number;
}

/** Decodes a HELLO_ACK payload (u16 version, u16 min, u16 max, u64 nonce, u32 window); null if too short. */
export function decodeHelloAck(p: Buffer): HelloAck | null {
  if (p.length < 18) return null;
  return { version: p.readUInt16BE(0), guestMin: p.readUInt16BE(2), guestMax: p.readUInt16BE(4), nonce: p.subarray(6, 14), window: p.readUInt32BE(14) };
}

/** Options of {@link VmuxSession.start}. */
export interface VmuxSessionOptions {
  /** How long to wait for HELLO_ACK, ms (a booting guest needs seconds under TCG). */
  timeoutMs: number;
  /** What the session is for, in error messages (e.g. `sandbox 3f2a…`). */
  what: string;
  /** Called for events worth a log line (guest exceeded a window, bytes skipped). */
  log?: (msg: string) => void;
}

interface HostStream {
  id: number;
  sock: net.Socket;
  /** Bytes we may still send the guest on this stream. */
  credit: number;
  /** Client data waiting for credit. */
  pending: Buffer[];
  /** Guest data handed to sock.write and not yet flushed. */
  inflight: number;
  /** Guest bytes flushed to the client and not yet returned as credit. */
  unreported: number;
  closed: boolean;
}

interface PendingOp {
  resolve(v: number, data: Buffer): void;
  reject(e: Error): void;
  timer: NodeJS.Timeout;
}

/** One mux session over one connection to the guest's port. Create with {@link VmuxSession.start}. */
export class VmuxSession {
  /** Mux version in use. */
  readonly version: number;
  private readonly streams = new Map<number, HostStream>();
  private readonly decoder = new MuxDecoder();
  private readonly ops = new Map<number, PendingOp>();
  private readonly lostListeners = new Set<(e: Error) => void>();
  private nextStream = 1;
  private nextOp = 1;
  private _closed = false;

  private constructor(private readonly port: Duplex, private readonly guestWindow: number, version: number, private readonly opts: VmuxSessionOptions) {
    this.version = version;
  }

  /**
   * Runs the handshake on `port` (a connected byte stream to the guest's port) and
   * returns the session. The port is owned by the session from then on.
   * @throws DsecError DeadlineExceeded (no HELLO_ACK within `timeoutMs`: the agent is not
   *   running or not reading its port), FailedPrecondition (no common mux version),
   *   Unavailable (the port closed first).
   */
  static start(port: Duplex, opts: VmuxSessionOptions): Promise<VmuxSession> {
    const nonce = randomBytes(8);
    const hello = encodeMuxFrame(MuxType.HELLO, 0, encodeHello(nonce));
    return new Promise<VmuxSession>((resolve, reject) => {
      let buf: Buffer = Buffer.alloc(0);
      let done = false;
      const finish = (err: Error | null, s?: VmuxSession, rest?: Buffer) => {
        if (done) return;
        done = true;
        clearInterval(retry);
        clearTimeout(timer);
        port.off('data', onData);
        port.off('close', onClose);
        port.off('error', onError);
        if (err) {
          port.destroy();
          reject(err);
          return;
        }
        resolve(s!);
        s!.wire(rest!);
      };
      const onData = (d: Buffer) => {
        buf = buf.length ? Buffer.concat([buf, d]) : d;
        const hit = findFrame(buf, (f) => f.type === MuxType.HELLO_ACK && f.stream === 0 && (decodeHelloAck(f.payload)?.nonce.equals(nonce) ?? false));
        if (!hit) {
          // Keep at most one maximal frame plus a header: a match cannot start earlier than that and still be incomplete.
          if (buf.length > 2 * MUX_BREAK_BYTES) buf = buf.subarray(buf.length - MUX_BREAK_BYTES - MUX_HEADER);
          return;
        }
        const ack = decodeHelloAck(hit.frame.payload)!;
        if (ack.version === 0) {
          finish(failedPrecondition(`${opts.what}: the guest agent speaks mux versions ${ack.guestMin}..${ack.guestMax}, dsecd ${MUX_VERSION_MIN}..${MUX_VERSION_MAX}; rebuild the guest's initramfs with a matching agent (restart the sandbox after upgrading dsec)`));
          return;
        }
        finish(null, new VmuxSession(port, Math.max(1, ack.window), ack.version, opts), buf.subarray(hit.end));
      };
      const onClose = () => finish(unavailable(`${opts.what}: the guest port closed during the mux handshake`));
      const onError = (e: Error) => finish(unavailable(`${opts.what}: guest port: ${e.message}`, e));
      const timer = setTimeout(() => finish(deadlineExceeded(`${opts.what}: the guest agent did not answer the mux HELLO within ${opts.timeoutMs} ms`)), opts.timeoutMs);
      const retry = setInterval(() => port.write(hello), HELLO_RETRY_MS);
      port.on('data', onData);
      port.on('close', onClose);
      port.on('error', onError);
      port.write(Buffer.alloc(MUX_BREAK_BYTES));
      port.write(hello);
    });
  }

  /** True once the session ended (port lost or {@link close}). */
  get closed(): boolean {
    return this._closed;
  }

  /** Number of open streams. */
  get streamCount(): number {
    return this.streams.size;
  }

  /** Calls `cb` once when the port is lost (not after {@link close}). */
  onLost(cb: (e: Error) => void): () => void {
    this.lostListeners.add(cb);
    return () => this.lostListeners.delete(cb);
  }

  /**
   * Makes `sock` (a connected client, e.g. accepted on agent.sock) a new stream: the guest
   * agent gets a new connection, and bytes flow both ways with credits. When either side
   * closes, so does the other. On a closed session the socket is destroyed.
   * @returns the stream id.
   */
  attach(sock: net.Socket): number {
    if (this._closed) {
      sock.destroy();
      return 0;
    }
    const id = this.nextStream++;
    const st: HostStream = { id, sock, credit: this.guestWindow, pending: [], inflight: 0, unreported: 0, closed: false };
    this.streams.set(id, st);
    this.send(MuxType.OPEN, id);
    sock.on('data', (d: Buffer) => this.fromClient(st, d));
    sock.on('end', () => this.closeStream(st, true));
    sock.on('close', () => this.closeStream(st, true));
    sock.on('error', () => this.closeStream(st, true));
    return id;
  }

  /**
   * Runs a guest operation and resolves with its result (≥ 0; see {@link GuestOp}).
   * @throws DsecError DeadlineExceeded after `timeoutMs`, Unavailable when the session
   *   ends first, Internal for a negative result (an errno from the guest).
   */
  op(op: GuestOp, arg: Buffer = Buffer.alloc(0), timeoutMs = 10_000): Promise<number> {
    return this.opReply(op, arg, timeoutMs).then(({ result }) => {
      if (result < 0) throw internal(`${this.opts.what}: guest operation ${GuestOp[op] ?? op} failed with errno ${-result}`);
      return result;
    });
  }

  /**
   * Runs a guest operation and resolves with its raw result (≥ 0, or −errno: not an
   * error here, the caller decides) and the bytes the guest appended to its reply
   * (`data`; empty for the ops that append none, see {@link GuestOp}).
   * @throws DsecError DeadlineExceeded after `timeoutMs`, Unavailable when the session
   *   ends first.
   */
  opReply(op: GuestOp, arg: Buffer = Buffer.alloc(0), timeoutMs = 10_000): Promise<{ result: number; data: Buffer }> {
    if (this._closed) return Promise.reject(unavailable(`${this.opts.what}: the agent mux session is closed`));
    const seq = this.nextOp++;
    const p = Buffer.alloc(6 + arg.length);
    p.writeUInt32BE(seq, 0);
    p.writeUInt16BE(op, 4);
    arg.copy(p, 6);
    return new Promise<{ result: number; data: Buffer }>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.ops.delete(seq);
        reject(deadlineExceeded(`${this.opts.what}: guest operation ${GuestOp[op] ?? op} did not answer within ${timeoutMs} ms`));
      }, timeoutMs);
      this.ops.set(seq, {
        resolve: (v, data) => resolve({ result: v, data }),
        reject, timer,
      });
      this.send(MuxType.OP, 0, p);
    });
  }

  /** Ends the session: every stream's client socket is destroyed and the port closed. Safe to call twice. */
  close(): void {
    this.end(null);
  }

  private wire(rest: Buffer): void {
    this.port.on('data', (d: Buffer) => this.fromGuest(d));
    this.port.on('close', () => this.end(unavailable(`${this.opts.what}: the guest port closed`)));
    this.port.on('error', (e: Error) => this.end(unavailable(`${this.opts.what}: guest port: ${e.message}`, e)));
    if (rest.length) this.fromGuest(rest);
  }

  private send(type: MuxType, stream: number, payload?: Buffer): void {
    if (!this._closed) this.port.write(encodeMuxFrame(type, stream, payload));
  }

  private fromClient(st: HostStream, d: Buffer): void {
    if (st.closed) return;
    if (st.pending.length) {
      st.pending.push(d);
      return;
    }
    this.sendData(st, d);
  }

  /** Sends as much of `d` as credit allows; queues the rest and pauses the client. */
  private sendData(st: HostStream, d: Buffer): void {
    let off = 0;
    while (off < d.length && st.credit > 0) {
      const n = Math.min(d.length - off, st.credit, MUX_MAX_PAYLOAD);
      this.send(MuxType.DATA, st.id, d.subarray(off, off + n));
      st.credit -= n;
      off += n;
    }
    if (off < d.length) {
      st.pending.unshift(d.subarray(off));
      st.sock.pause();
    }
  }

  private fromGuest(d: Buffer): void {
    const before = this.decoder.skipped;
    for (const f of this.decoder.push(d)) this.onFrame(f);
    if (this.decoder.skipped > before) this.opts.log?.(`${this.opts.what}: skipped ${this.decoder.skipped - before} byte(s) from the guest port that were no valid mux frame`);
  }

  private onFrame(f: MuxFrame): void {
    const st = this.streams.get(f.stream);
    switch (f.type) {
      case MuxType.DATA:
        if (!st || st.closed || f.payload.length === 0) return;
        if (st.inflight + f.payload.length > MUX_WINDOW) {
          this.opts.log?.(`${this.opts.what}: stream ${st.id}: the guest sent beyond its ${MUX_WINDOW}-byte window; closing the stream`);
          this.closeStream(st, true);
          return;
        }
        st.inflight += f.payload.length;
        st.sock.write(f.payload, () => {
          st.inflight -= f.payload.length;
          st.unreported += f.payload.length;
          if (st.unreported >= MUX_CREDIT_BATCH && !st.closed) {
            const c = Buffer.alloc(4);
            c.writeUInt32BE(st.unreported, 0);
            st.unreported = 0;
            this.send(MuxType.CREDIT, st.id, c);
          }
        });
        return;
      case MuxType.CREDIT: {
        if (!st || st.closed || f.payload.length < 4) return;
        st.credit += f.payload.readUInt32BE(0);
        while (st.pending.length && st.credit > 0) this.sendData(st, st.pending.shift()!);
        if (!st.pending.length) st.sock.resume();
        return;
      }
      case MuxType.CLOSE:
        if (st) this.closeStream(st, false);
        return;
      case MuxType.OP_REPLY: {
        if (f.stream !== 0 || f.payload.length < 8) return;
        const op = this.ops.get(f.payload.readUInt32BE(0));
        if (!op) return;
        this.ops.delete(f.payload.readUInt32BE(0));
        clearTimeout(op.timer);
        op.resolve(f.payload.readInt32BE(4), f.payload.subarray(8));
        return;
      }
      default:
        return; // HELLO_ACK repeats (answers to HELLO retries) and types of later versions
    }
  }

  /** Ends one stream; `notify`: tell the guest (the client side closed). */
  private closeStream(st: HostStream, notify: boolean): void {
    if (st.closed) return;
    st.closed = true;
    st.pending = [];
    this.streams.delete(st.id);
    if (notify) this.send(MuxType.CLOSE, st.id);
    // The guest closed: let the client read what is queued, then see end of file.
    if (notify) st.sock.destroy();
    else st.sock.end();
  }

  private end(err: Error | null): void {
    if (this._closed) return;
    this._closed = true;
    for (const st of [...this.streams.values()]) {
      st.closed = true;
      st.sock.destroy();
    }
    this.streams.clear();
    const e = err ?? unavailable(`${this.opts.what}: the agent mux session was closed`);
    for (const op of this.ops.values()) {
      clearTimeout(op.timer);
      op.reject(e);
    }
    this.ops.clear();
    this.port.destroy();
    if (err) for (const cb of [...this.lostListeners]) cb(err);
    this.lostListeners.clear();
  }
}
