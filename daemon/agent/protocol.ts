/**
 * Wire format of the dsec agent protocol, version 1 (docs/AGENT_PROTOCOL.md).
 *
 * Every frame is a 12-byte header followed by its payload:
 *
 *     u32 BE payload length | u8 type | u8 flags (0) | u16 reserved (0) | u32 BE stream id
 *
 * This module is pure encoding/decoding: no I/O, no timers.
 */

/** Protocol version spoken by this client; sent first in HELLO. */
export const PROTOCOL_VERSION = 1;

/** Size of the frame header in bytes. */
export const HEADER_LENGTH = 12;

/**
 * Largest payload either side may send (1 MiB). A peer announcing a larger payload is in
 * protocol error; the agent closes the connection, the decoder throws.
 */
export const MAX_PAYLOAD = 1 << 20;

/** Stream id of the control stream (HELLO, PING/PONG, connection-fatal ERROR). */
export const CONTROL_STREAM = 0;

/** Frame types. 28–31 are reserved for future additions. */
export const FrameType = {
  /** Both directions, stream 0: u32 BE version (+ JSON info from the agent). */
  HELLO: 1,
  /** Client→agent, stream 0: any payload, echoed back in PONG. */
  PING: 2,
  /** Agent→client, stream 0: the PING payload. */
  PONG: 3,
  /** Client→agent, stream s≠0: TLV-encoded exec request. */
  EXEC: 4,
  /** Agent→client: u32 BE pid (as seen inside the sandbox). */
  STARTED: 5,
  /** Agent→client: raw stdout bytes. */
  STDOUT: 6,
  /** Agent→client: raw stderr bytes. */
  STDERR: 7,
  /** Client→agent: raw bytes for the child's stdin. */
  STDIN: 8,
  /** Client→agent, empty: close the child's stdin. */
  STDIN_EOF: 9,
  /** Client→agent: u32 BE signal number, sent to the exec's process group. */
  SIGNAL: 10,
  /** Agent→client, final: u8 how, i32 BE code, u8 timed_out, u64 BE duration (µs). */
  EXIT: 11,
  /** Agent→client, final: u32 BE errno, then a UTF-8 message. */
  EXEC_ERROR: 12,
  /** Agent→client: UTF-8 message; on stream 0 the agent closes the connection. */
  ERROR: 13,
  /** Client→agent, TTY exec stream: u16 BE rows, u16 BE cols (TIOCSWINSZ + SIGWINCH). */
  RESIZE: 14,
  /** Client→agent, new stream: TLV (PATH, USER, OFFSET, LENGTH) → FILE_INFO, FILE_DATA*, FILE_DONE. */
  FILE_READ: 15,
  /** Agent→client: u64 size, u32 st_mode, u32 uid, u32 gid, u64 mtime_ns, u8 type [, symlink target]. */
  FILE_INFO: 16,
  /** Both directions: file bytes (agent: ≤ 256 KiB; client: ≤ 1 MiB). */
  FILE_DATA: 17,
  /**
   * Agent→client: success, final (empty; after a write: u64 bytes written).
   * Client→agent: end of a write's data (commit); on a read/list: cancel.
   */
  FILE_DONE: 18,
  /** Client→agent, new stream: TLV (PATH, USER, MODE, FLAGS), then FILE_DATA*, FILE_DONE. */
  FILE_WRITE: 19,
  /** Agent→client, final: u32 errno, UTF-8 message. Client→agent: abort the operation. */
  FILE_ERROR: 20,
  /** Agent→client, write stream: u64 total bytes written so far (at open: 0, then every 1 MiB). */
  FILE_ACK: 21,
  /** Client→agent, new stream: TLV (PATH, USER, NOFOLLOW) → FILE_INFO, FILE_DONE. */
  FILE_STAT: 22,
  /** Client→agent, new stream: TLV (PATH, USER) → FILE_ENTRY*, FILE_DONE. */
  FILE_LIST: 23,
  /** Agent→client: FILE_INFO fields, u16 name length, name, symlink target (rest). */
  FILE_ENTRY: 24,
  /** Client→agent, new stream: TLV (PATH, USER, MODE, FLAGS 8 = parents) → FILE_DONE. */
  FILE_MKDIR: 25,
  /** Client→agent, new stream: TLV (PATH, USER, RECURSIVE) → FILE_DONE. */
  FILE_REMOVE: 26,
  /** Client→agent, new stream: TLV (PATH, USER, TARGET) → FILE_DONE. */
  FILE_SYMLINK: 27,
} as const;

/** A frame type number (see {@link FrameType}). */
export type FrameTypeValue = (typeof FrameType)[keyof typeof FrameType];

/** Tags of the TLV fields of an EXEC payload. Unknown tags are ignored by the agent. */
export const ExecTag = {
  /** Repeated, in order, at least one: one argv element (UTF-8, no NUL). */
  ARGV: 1,
  /** Repeated: one "K=V" environment entry (no NUL, must contain '='). */
  ENV: 2,
  /** Working directory; default "/". */
  CWD: 3,
  /** "uid", "uid:gid", "name" or "name:group"; default "0". */
  USER: 4,
  /** u32 BE milliseconds; 0 = no timeout. */
  TIMEOUT_MS: 5,
  /** u8: 1 = the client will send STDIN frames then STDIN_EOF; 0/absent = /dev/null. */
  STDIN: 6,
  /** u16 BE rows, u16 BE cols: run on a pseudo-terminal of that size. */
  TTY: 7,
  /** u8 1: keep running when the connection that started it closes. */
  DETACHED: 8,
  /**
   * u64 BE /tmp bytes, u64 BE /dev/shm bytes (0 = 64 MiB each): run in fresh pid, mount,
   * IPC and UTS namespaces (agent feature "isolate"; see {@link IsolateOptions}).
   */
  ISOLATE: 9,
  /** Repeated (≤ 8), needs ISOLATE: u64 BE bytes (> 0), then an absolute path: a fresh tmpfs there. */
  SCRATCH: 10,
} as const;

/** Default size of the per-call tmpfs on /tmp and on /dev/shm of an isolated exec: 64 MiB. */
export const ISOLATE_DEFAULT_TMPFS_BYTES = 64 * 1024 * 1024;
/** Most SCRATCH mounts one isolated exec may ask for. */
export const ISOLATE_MAX_SCRATCH = 8;

/**
 * An isolated exec (EXEC `ISOLATE`, docs/AGENT_PROTOCOL.md "Isolated execs"): the command
 * runs in fresh pid, mount, IPC and UTS namespaces whose init is a small agent process, so
 * nothing of the call survives it: every process it leaves behind is killed when the
 * command exits, every mount of the sandbox is read-only inside the call, /tmp, /dev/shm
 * and the scratch paths are fresh tmpfs mounts that vanish with the call, and SysV IPC
 * objects and POSIX message queues live in the call's own IPC namespace. /proc shows only
 * the call's processes (the namespace init is pid 1, the command pid 2). Needs an agent
 * with the "isolate" feature (an fncall worker sandbox).
 *
 * Sizes are upper bounds of the tmpfs mounts in bytes (rounded up to pages by the
 * kernel); the pages they use are charged to the sandbox's memory cgroup and freed when
 * the call ends.
 */
export interface IsolateOptions {
  /** Size limit of the fresh /tmp in bytes; default (or 0) 64 MiB. Integer, 0..2^53-1. */
  tmpBytes?: number;
  /** Size limit of the fresh /dev/shm in bytes; default (or 0) 64 MiB. Integer, 0..2^53-1. */
  shmBytes?: number;
  /**
   * Up to 8 more fresh tmpfs mounts (mode 1777), mounted in order after /tmp: `path` is
   * absolute, not `/`, without `..` components or NUL; `bytes` > 0 is its size limit. A
   * path that does not exist is created only where it can be: below /tmp or an earlier
   * scratch mount (the image is read-only); elsewhere it must exist in the image.
   */
  scratch?: { path: string; bytes: number }[];
}

/** Tags of the TLV fields of the file requests (FILE_READ … FILE_SYMLINK). */
export const FileTag = {
  /** Absolute path inside the sandbox, no '..' components (UTF-8, no NUL). Required. */
  PATH: 1,
  /** User the operation runs as, like EXEC's USER; default "0". */
  USER: 2,
  /** FILE_READ: u64 BE start offset. */
  OFFSET: 3,
  /** FILE_READ: u64 BE byte count; 0 = to the end. */
  LENGTH: 4,
  /** FILE_WRITE / FILE_MKDIR: u32 BE permission bits (≤ 0o7777), applied exactly. */
  MODE: 5,
  /** FILE_WRITE / FILE_MKDIR: u8, see {@link FileWriteFlag}. */
  FLAGS: 6,
  /** FILE_STAT: u8 1 = do not follow a final symlink. */
  NOFOLLOW: 7,
  /** FILE_REMOVE: u8 1 = remove a directory with its contents. */
  RECURSIVE: 9,
  /** FILE_SYMLINK: the link's target (UTF-8, no NUL). */
  TARGET: 10,
} as const;

/** Bits of FILE_WRITE's FLAGS (FILE_MKDIR accepts PARENTS only). */
export const FileWriteFlag = {
  /** Create PATH if missing (else it must exist); an existing file is replaced. */
  CREATE: 1,
  /** Append in place (not atomic) instead of replacing through a temp file. */
  APPEND: 2,
  /** Fail with EEXIST if PATH exists (implies create). */
  EXCLUSIVE: 4,
  /** Create missing parent directories (0755), like mkdir -p. */
  PARENTS: 8,
} as const;

/** One decoded frame. `payload` is a view that the caller may keep. */
export interface Frame {
  /** Frame type (see {@link FrameType}); unknown numbers are passed through. */
  type: number;
  /** Flags byte (0 in version 1; receivers ignore it). */
  flags: number;
  /** Stream id; 0 is the control stream. */
  stream: number;
  /** Payload bytes (0 .. MAX_PAYLOAD). */
  payload: Buffer;
}

/** Raised for malformed input: oversized frames, truncated TLV or fixed-size payloads. */
export class ProtocolError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ProtocolError';
  }
}

/**
 * Encode a 12-byte frame header.
 * @param type frame type, 0..255
 * @param stream stream id, 0..2^32-1
 * @param payloadLength payload size in bytes, 0..MAX_PAYLOAD
 * @throws ProtocolError if payloadLength exceeds MAX_PAYLOAD
 */
export function encodeHeader(type: number, stream: number, payloadLength: number): Buffer {
  if (payloadLength > MAX_PAYLOAD) {
    throw new ProtocolError(`frame payload of ${payloadLength} bytes exceeds the ${MAX_PAYLOAD} byte limit`);
  }
  const h = Buffer.alloc(HEADER_LENGTH);
  h.writeUInt32BE(payloadLength, 0);
  h.writeUInt8(type, 4);
  h.writeUInt32BE(stream >>> 0, 8);
  return h;
}

/**
 * Decode a frame header from the first 12 bytes of `buf`.
 * @returns type, flags, stream id and payload length (not validated against MAX_PAYLOAD)
 * @throws ProtocolError if `buf` is shorter than 12 bytes
 */
export function decodeHeader(buf: Buffer): { type: number; flags: number; stream: number; length: number } {
  if (buf.length < HEADER_LENGTH) throw new ProtocolError(`frame header needs ${HEADER_LENGTH} bytes, got ${buf.length}`);
  return {
    length: buf.readUInt32BE(0),
    type: buf.readUInt8(4),
    flags: buf.readUInt8(5),
    stream: buf.readUInt32BE(8),
  };
}

/**
 * Encode a whole frame (header + payload) as one Buffer.
 * @throws ProtocolError if the payload exceeds MAX_PAYLOAD
 */
export function encodeFrame(type: number, stream: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  return Buffer.concat([encodeHeader(type, stream, payload.length), payload]);
}

/** One TLV field of an EXEC payload. */
export interface TlvField {
  /** Field tag (see {@link ExecTag}). */
  tag: number;
  /** Field value. */
  value: Buffer;
}

/** Encode TLV fields: u8 tag, u32 BE length, bytes — concatenated in order. */
export function encodeTlv(fields: readonly TlvField[]): Buffer {
  const parts: Buffer[] = [];
  for (const f of fields) {
    const h = Buffer.alloc(5);
    h.writeUInt8(f.tag, 0);
    h.writeUInt32BE(f.value.length, 1);
    parts.push(h, f.value);
  }
  return Buffer.concat(parts);
}

/**
 * Decode TLV fields.
 * @throws ProtocolError if a field header or value runs past the end of `buf`
 */
export function decodeTlv(buf: Buffer): TlvField[] {
  const out: TlvField[] = [];
  let off = 0;
  while (off < buf.length) {
    if (buf.length - off < 5) throw new ProtocolError(`truncated TLV field header at offset ${off}`);
    const tag = buf.readUInt8(off);
    const len = buf.readUInt32BE(off + 1);
    off += 5;
    if (len > buf.length - off) throw new ProtocolError(`TLV field ${tag} overruns the payload`);
    out.push({ tag, value: buf.subarray(off, off + len) });
    off += len;
  }
  return out;
}

/** What the client asks the agent to run (one EXEC frame). */
export interface ExecRequestFields {
  /** Program and arguments; argv[0] is searched along the request's PATH if it has no '/'. */
  argv: string[];
  /** The complete environment ("K=V" entries); nothing is inherited from the agent. */
  env: string[];
  /** Working directory inside the sandbox; default "/". */
  cwd?: string;
  /** "uid", "uid:gid", "name" or "name:group"; default "0" (root). */
  user?: string;
  /** Kill the process group with SIGKILL after this many ms; 0/undefined = never. */
  timeoutMs?: number;
  /** true: the client will send STDIN frames then STDIN_EOF; false/undefined: /dev/null. */
  stdin?: boolean;
  /**
   * Run on a pseudo-terminal of this size (rows, cols: 0..65535): stdin, stdout and stderr
   * are the terminal, all output arrives as STDOUT, input is always accepted.
   */
  tty?: { rows: number; cols: number };
  /** Keep running (output discarded) when the connection that started it closes. */
  detached?: boolean;
  /**
   * Run in fresh namespaces so nothing of the call survives it (see {@link IsolateOptions});
   * `{}` for the defaults. The pid in STARTED is then the call's namespace init's.
   */
  isolate?: IsolateOptions;
}

function checkU16(what: string, v: number): number {
  if (!Number.isInteger(v) || v < 0 || v > 0xffff) throw new TypeError(`${what} must be an integer in 0..65535, got ${v}`);
  return v;
}

/** Encode a RESIZE payload (also the value of EXEC's TTY field): u16 rows, u16 cols. */
export function encodeWinsize(rows: number, cols: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt16BE(checkU16('rows', rows), 0);
  b.writeUInt16BE(checkU16('cols', cols), 2);
  return b;
}

function checkString(what: string, s: string): Buffer {
  if (typeof s !== 'string') throw new TypeError(`${what} must be a string`);
  if (s.includes('\0')) throw new TypeError(`${what} must not contain a NUL character`);
  return Buffer.from(s, 'utf8');
}

function u64Field(what: string, v: number, min: number): Buffer {
  if (!Number.isSafeInteger(v) || v < min) throw new TypeError(`${what} must be an integer in ${min}..2^53-1, got ${v}`);
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(v), 0);
  return b;
}

/** The ISOLATE and SCRATCH fields of an isolated exec. @throws TypeError on bad sizes or paths */
function encodeIsolate(iso: IsolateOptions): TlvField[] {
  if (iso === null || typeof iso !== 'object') throw new TypeError('isolate must be an object');
  const fields: TlvField[] = [{
    tag: ExecTag.ISOLATE,
    value: Buffer.concat([u64Field('isolate.tmpBytes', iso.tmpBytes ?? 0, 0), u64Field('isolate.shmBytes', iso.shmBytes ?? 0, 0)]),
  }];
  const scratch = iso.scratch ?? [];
  if (!Array.isArray(scratch) || scratch.length > ISOLATE_MAX_SCRATCH) {
    throw new TypeError(`isolate.scratch must be an array of at most ${ISOLATE_MAX_SCRATCH} entries`);
  }
  scratch.forEach((m, i) => {
    const p = checkString(`isolate.scratch[${i}].path`, m?.path);
    if (!m.path.startsWith('/') || /^\/+$/.test(m.path) || m.path.split('/').includes('..') || p.length >= 4096) {
      throw new TypeError(`isolate.scratch[${i}].path must be an absolute path other than / without '..' components, got ${JSON.stringify(m.path)}`);
    }
    fields.push({ tag: ExecTag.SCRATCH, value: Buffer.concat([u64Field(`isolate.scratch[${i}].bytes`, m.bytes, 1), p]) });
  });
  return fields;
}

/**
 * Encode an EXEC payload.
 * @throws TypeError on an empty argv, strings with NUL, env entries without '=', an empty
 *   cwd/user, a timeout outside 0..2^32-1 ms, or bad isolate sizes or scratch paths
 * @throws ProtocolError if the encoded request exceeds MAX_PAYLOAD
 */
export function encodeExecRequest(req: ExecRequestFields): Buffer {
  if (!Array.isArray(req.argv) || req.argv.length === 0) throw new TypeError('argv must have at least one element');
  const fields: TlvField[] = [];
  req.argv.forEach((a, i) => fields.push({ tag: ExecTag.ARGV, value: checkString(`argv[${i}]`, a) }));
  (req.env ?? []).forEach((e, i) => {
    const b = checkString(`env[${i}]`, e);
    if (!e.includes('=')) throw new TypeError(`env[${i}] must have the form K=V`);
    fields.push({ tag: ExecTag.ENV, value: b });
  });
  if (req.cwd !== undefined) {
    if (req.cwd === '') throw new TypeError('cwd must not be empty');
    fields.push({ tag: ExecTag.CWD, value: checkString('cwd', req.cwd) });
  }
  if (req.user !== undefined) {
    if (req.user === '') throw new TypeError('user must not be empty');
    fields.push({ tag: ExecTag.USER, value: checkString('user', req.user) });
  }
  if (req.timeoutMs !== undefined && req.timeoutMs !== 0) {
    const t = req.timeoutMs;
    if (!Number.isInteger(t) || t < 0 || t > 0xffffffff) {
      throw new TypeError(`timeoutMs must be an integer in 0..${0xffffffff}, got ${t}`);
    }
    const v = Buffer.alloc(4);
    v.writeUInt32BE(t, 0);
    fields.push({ tag: ExecTag.TIMEOUT_MS, value: v });
  }
  if (req.stdin) fields.push({ tag: ExecTag.STDIN, value: Buffer.from([1]) });
  if (req.tty !== undefined) fields.push({ tag: ExecTag.TTY, value: encodeWinsize(req.tty.rows, req.tty.cols) });
  if (req.detached) fields.push({ tag: ExecTag.DETACHED, value: Buffer.from([1]) });
  if (req.isolate !== undefined) fields.push(...encodeIsolate(req.isolate));
  const payload = encodeTlv(fields);
  if (payload.length > MAX_PAYLOAD) {
    throw new ProtocolError(`exec request of ${payload.length} bytes exceeds the ${MAX_PAYLOAD} byte limit`);
  }
  return payload;
}

/**
 * Decode an EXEC payload (the agent's view; used by tests and tools). Unknown tags are
 * skipped.
 * @throws ProtocolError on malformed TLV or fixed-size fields of the wrong length
 */
export function decodeExecRequest(payload: Buffer): ExecRequestFields {
  const req: ExecRequestFields = { argv: [], env: [] };
  for (const f of decodeTlv(payload)) {
    switch (f.tag) {
      case ExecTag.ARGV: req.argv.push(f.value.toString('utf8')); break;
      case ExecTag.ENV: req.env.push(f.value.toString('utf8')); break;
      case ExecTag.CWD: req.cwd = f.value.toString('utf8'); break;
      case ExecTag.USER: req.user = f.value.toString('utf8'); break;
      case ExecTag.TIMEOUT_MS:
        if (f.value.length !== 4) throw new ProtocolError('TIMEOUT_MS must be 4 bytes');
        req.timeoutMs = f.value.readUInt32BE(0);
        break;
      case ExecTag.STDIN:
        if (f.value.length !== 1) throw new ProtocolError('STDIN must be 1 byte');
        req.stdin = f.value[0] !== 0;
        break;
      case ExecTag.TTY:
        if (f.value.length !== 4) throw new ProtocolError('TTY must be 4 bytes');
        req.tty = { rows: f.value.readUInt16BE(0), cols: f.value.readUInt16BE(2) };
        break;
      case ExecTag.DETACHED:
        if (f.value.length !== 1) throw new ProtocolError('DETACHED must be 1 byte');
        req.detached = f.value[0] !== 0;
        break;
      case ExecTag.ISOLATE: {
        if (f.value.length !== 16) throw new ProtocolError('ISOLATE must be 16 bytes');
        const tmp = Number(f.value.readBigUInt64BE(0));
        const shm = Number(f.value.readBigUInt64BE(8));
        req.isolate = { ...req.isolate, ...(tmp ? { tmpBytes: tmp } : {}), ...(shm ? { shmBytes: shm } : {}) };
        break;
      }
      case ExecTag.SCRATCH: {
        if (f.value.length < 9) throw new ProtocolError('SCRATCH must be a u64 and a path');
        const m = { path: f.value.subarray(8).toString('utf8'), bytes: Number(f.value.readBigUInt64BE(0)) };
        req.isolate = { ...req.isolate, scratch: [...(req.isolate?.scratch ?? []), m] };
        break;
      }
      default: break;
    }
  }
  return req;
}

/** Decoded EXIT payload. */
export interface ExitPayload {
  /** 0 = exited normally, 1 = killed by a signal. */
  how: 0 | 1;
  /** Exit status (how = 0) or signal number (how = 1). */
  code: number;
  /** The exec's timeout elapsed and the agent SIGKILLed its process group. */
  timedOut: boolean;
  /** Monotonic time from fork to reap, in microseconds. */
  durationUs: bigint;
}

/** Size of an EXIT payload: u8 + i32 + u8 + u64. */
export const EXIT_PAYLOAD_LENGTH = 14;

/** Encode an EXIT payload. */
export function encodeExit(e: ExitPayload): Buffer {
  const b = Buffer.alloc(EXIT_PAYLOAD_LENGTH);
  b.writeUInt8(e.how, 0);
  b.writeInt32BE(e.code, 1);
  b.writeUInt8(e.timedOut ? 1 : 0, 5);
  b.writeBigUInt64BE(e.durationUs, 6);
  return b;
}

/**
 * Decode an EXIT payload.
 * @throws ProtocolError if shorter than 14 bytes (extra trailing bytes are ignored)
 */
export function decodeExit(p: Buffer): ExitPayload {
  if (p.length < EXIT_PAYLOAD_LENGTH) throw new ProtocolError(`EXIT payload needs ${EXIT_PAYLOAD_LENGTH} bytes, got ${p.length}`);
  const how = p.readUInt8(0);
  if (how !== 0 && how !== 1) throw new ProtocolError(`EXIT: unknown how=${how}`);
  return { how, code: p.readInt32BE(1), timedOut: p.readUInt8(5) !== 0, durationUs: p.readBigUInt64BE(6) };
}

/**
 * Decode an EXEC_ERROR payload: u32 BE errno, then a UTF-8 message.
 * @throws ProtocolError if shorter than 4 bytes
 */
export function decodeExecError(p: Buffer): { errno: number; message: string } {
  if (p.length < 4) throw new ProtocolError(`EXEC_ERROR payload needs at least 4 bytes, got ${p.length}`);
  return { errno: p.readUInt32BE(0), message: p.subarray(4).toString('utf8') };
}

/** Encode a u32 BE payload (HELLO version, STARTED pid, SIGNAL number). */
export function encodeU32(v: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(v >>> 0, 0);
  return b;
}

/**
 * Decode a payload that starts with a u32 BE (HELLO, STARTED, SIGNAL).
 * @throws ProtocolError if shorter than 4 bytes
 */
export function decodeU32(p: Buffer, what: string): number {
  if (p.length < 4) throw new ProtocolError(`${what} payload needs at least 4 bytes, got ${p.length}`);
  return p.readUInt32BE(0);
}

/**
 * Incremental frame decoder: feed it socket chunks of any size; it returns every frame
 * completed so far and keeps the remainder. Handles frames split across chunks and many
 * frames per chunk; copies only when a frame spans chunks.
 */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private buffered = 0;
  /** Header of the frame being assembled, once its 12 bytes have arrived. */
  private header: { type: number; flags: number; stream: number; length: number } | null = null;
  private readonly maxPayload: number;

  /** @param maxPayload largest accepted payload in bytes (default MAX_PAYLOAD). */
  constructor(maxPayload: number = MAX_PAYLOAD) {
    this.maxPayload = maxPayload;
  }

  /** Bytes received but not yet returned as frames (including a parsed pending header). */
  get pendingBytes(): number {
    return this.buffered + (this.header ? HEADER_LENGTH : 0);
  }

  /**
   * Add a chunk and return the frames it completes, in order. Cost is linear in the bytes
   * pushed, however they are split.
   * @throws ProtocolError if a header announces a payload over maxPayload; the decoder is
   *   then unusable (the connection must be dropped)
   */
  push(chunk: Buffer): Frame[] {
    if (chunk.length) {
      this.chunks.push(chunk);
      this.buffered += chunk.length;
    }
    const frames: Frame[] = [];
    for (;;) {
      if (!this.header) {
        if (this.buffered < HEADER_LENGTH) break;
        const h = decodeHeader(this.take(HEADER_LENGTH));
        if (h.length > this.maxPayload) {
          throw new ProtocolError(`frame payload of ${h.length} bytes exceeds the ${this.maxPayload} byte limit`);
        }
        this.header = h;
      }
      const h = this.header;
      if (this.buffered < h.length) break;
      this.header = null;
      const payload = h.length ? this.take(h.length) : Buffer.alloc(0);
      frames.push({ type: h.type, flags: h.flags, stream: h.stream, payload });
    }
    return frames;
  }

  /** Consume n buffered bytes (n ≤ buffered); touches only the chunks it consumes. */
  private take(n: number): Buffer {
    this.buffered -= n;
    const first = this.chunks[0];
    if (first.length > n) {
      this.chunks[0] = first.subarray(n);
      return first.subarray(0, n);
    }
    if (first.length === n) {
      this.chunks.shift();
      return first;
    }
    const out = Buffer.allocUnsafe(n);
    let off = 0;
    let used = 0;
    while (off < n) {
      const c = this.chunks[used];
      const k = Math.min(c.length, n - off);
      c.copy(out, off, 0, k);
      off += k;
      if (k === c.length) used++;
      else this.chunks[used] = c.subarray(k);
    }
    this.chunks.splice(0, used);
    return out;
  }
}

// ---- files ------------------------------------------------------------------------------

/** Fields of a file request (FILE_READ … FILE_SYMLINK); which ones apply depends on the type. */
export interface FileRequestFields {
  /** Absolute path, no '..' components. */
  path: string;
  /** "uid", "uid:gid", "name" or "name:group"; default "0". */
  user?: string;
  /** FILE_READ: start offset (bytes). */
  offset?: number;
  /** FILE_READ: byte count, 0/undefined = to the end. */
  length?: number;
  /** FILE_WRITE/FILE_MKDIR: permission bits ≤ 0o7777. */
  mode?: number;
  /** FILE_WRITE/FILE_MKDIR: {@link FileWriteFlag} bits. */
  flags?: number;
  /** FILE_STAT: do not follow a final symlink. */
  nofollow?: boolean;
  /** FILE_REMOVE: remove a directory tree. */
  recursive?: boolean;
  /** FILE_SYMLINK: the link's target. */
  target?: string;
}

function u64(what: string, v: number): Buffer {
  if (!Number.isSafeInteger(v) || v < 0) throw new TypeError(`${what} must be a safe integer ≥ 0, got ${v}`);
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(v), 0);
  return b;
}

/**
 * Encode the TLV payload of a file request. The path is checked here only for being a
 * non-empty string without NUL; the agent enforces "absolute, no '..'".
 * @throws TypeError on malformed fields (NUL bytes, mode > 0o7777, negative offsets, …)
 */
export function encodeFileRequest(req: FileRequestFields): Buffer {
  const fields: TlvField[] = [];
  if (typeof req.path !== 'string' || req.path === '') throw new TypeError('path must be a non-empty string');
  fields.push({ tag: FileTag.PATH, value: checkString('path', req.path) });
  if (req.user !== undefined) {
    if (req.user === '') throw new TypeError('user must not be empty');
    fields.push({ tag: FileTag.USER, value: checkString('user', req.user) });
  }
  if (req.offset !== undefined && req.offset !== 0) fields.push({ tag: FileTag.OFFSET, value: u64('offset', req.offset) });
  if (req.length !== undefined && req.length !== 0) fields.push({ tag: FileTag.LENGTH, value: u64('length', req.length) });
  if (req.mode !== undefined) {
    if (!Number.isInteger(req.mode) || req.mode < 0 || req.mode > 0o7777) {
      throw new TypeError(`mode must be an integer in 0..0o7777, got ${req.mode}`);
    }
    fields.push({ tag: FileTag.MODE, value: encodeU32(req.mode) });
  }
  if (req.flags !== undefined) {
    if (!Number.isInteger(req.flags) || req.flags < 0 || req.flags > 0xff) throw new TypeError(`flags must be a u8, got ${req.flags}`);
    fields.push({ tag: FileTag.FLAGS, value: Buffer.from([req.flags]) });
  }
  if (req.nofollow) fields.push({ tag: FileTag.NOFOLLOW, value: Buffer.from([1]) });
  if (req.recursive) fields.push({ tag: FileTag.RECURSIVE, value: Buffer.from([1]) });
  if (req.target !== undefined) {
    if (req.target === '') throw new TypeError('target must not be empty');
    fields.push({ tag: FileTag.TARGET, value: checkString('target', req.target) });
  }
  const payload = encodeTlv(fields);
  if (payload.length > MAX_PAYLOAD) throw new ProtocolError(`file request of ${payload.length} bytes exceeds the ${MAX_PAYLOAD} byte limit`);
  return payload;
}

/** File type in FILE_INFO / FILE_ENTRY. */
export type FileType = 'file' | 'dir' | 'symlink' | 'other';

/** Decoded FILE_INFO (stat of one file, as the requesting user sees it). */
export interface FileInfo {
  /** st_size in bytes (a symlink: its target's length). */
  size: number;
  /** Permission bits (st_mode & 0o7777). */
  mode: number;
  /** The whole st_mode, file type bits included. */
  rawMode: number;
  uid: number;
  gid: number;
  /** Modification time, nanoseconds since the epoch. */
  mtimeNs: bigint;
  /** Modification time, milliseconds since the epoch (fractional). */
  mtimeMs: number;
  type: FileType;
  /** Symlinks only (stat with nofollow, list): the link's target. */
  target?: string;
}

/** One FILE_ENTRY: a directory entry's info and name. */
export interface FileEntry extends FileInfo {
  name: string;
}

/** Size of the fixed FILE_INFO fields. */
export const FILE_INFO_LENGTH = 29;

const FILE_TYPES: readonly FileType[] = ['file', 'dir', 'symlink', 'other'];

function decodeInfoFields(p: Buffer, what: string): FileInfo {
  if (p.length < FILE_INFO_LENGTH) throw new ProtocolError(`${what} payload needs at least ${FILE_INFO_LENGTH} bytes, got ${p.length}`);
  const rawMode = p.readUInt32BE(8);
  const mtimeNs = p.readBigUInt64BE(20);
  return {
    size: Number(p.readBigUInt64BE(0)),
    mode: rawMode & 0o7777,
    rawMode,
    uid: p.readUInt32BE(12),
    gid: p.readUInt32BE(16),
    mtimeNs,
    mtimeMs: Number(mtimeNs) / 1e6,
    type: FILE_TYPES[p.readUInt8(28)] ?? 'other',
  };
}

/** Encode FILE_INFO (tests and tools; the agent is the real producer). */
export function encodeFileInfo(i: Omit<FileInfo, 'mode' | 'mtimeMs'>): Buffer {
  const b = Buffer.alloc(FILE_INFO_LENGTH);
  b.writeBigUInt64BE(BigInt(i.size), 0);
  b.writeUInt32BE(i.rawMode >>> 0, 8);
  b.writeUInt32BE(i.uid >>> 0, 12);
  b.writeUInt32BE(i.gid >>> 0, 16);
  b.writeBigUInt64BE(i.mtimeNs, 20);
  b.writeUInt8(Math.max(0, FILE_TYPES.indexOf(i.type)), 28);
  return i.target !== undefined ? Buffer.concat([b, Buffer.from(i.target, 'utf8')]) : b;
}

/**
 * Decode FILE_INFO; bytes after the fixed fields are a symlink's target.
 * @throws ProtocolError if shorter than 29 bytes
 */
export function decodeFileInfo(p: Buffer): FileInfo {
  const info = decodeInfoFields(p, 'FILE_INFO');
  if (p.length > FILE_INFO_LENGTH) info.target = p.subarray(FILE_INFO_LENGTH).toString('utf8');
  return info;
}

/**
 * Decode FILE_ENTRY: FILE_INFO fields, u16 name length, name, then a symlink's target.
 * @throws ProtocolError if truncated
 */
export function decodeFileEntry(p: Buffer): FileEntry {
  const info = decodeInfoFields(p, 'FILE_ENTRY');
  if (p.length < FILE_INFO_LENGTH + 2) throw new ProtocolError('FILE_ENTRY: missing name length');
  const nl = p.readUInt16BE(FILE_INFO_LENGTH);
  const start = FILE_INFO_LENGTH + 2;
  if (p.length < start + nl) throw new ProtocolError('FILE_ENTRY: name overruns the payload');
  const entry: FileEntry = { ...info, name: p.subarray(start, start + nl).toString('utf8') };
  if (info.type === 'symlink') entry.target = p.subarray(start + nl).toString('utf8');
  return entry;
}

/**
 * Decode FILE_ERROR (u32 errno, UTF-8 message); same layout as EXEC_ERROR.
 * @throws ProtocolError if shorter than 4 bytes
 */
export function decodeFileError(p: Buffer): { errno: number; message: string } {
  if (p.length < 4) throw new ProtocolError(`FILE_ERROR payload needs at least 4 bytes, got ${p.length}`);
  return { errno: p.readUInt32BE(0), message: p.subarray(4).toString('utf8') };
}

/** Encode a u64 BE payload (FILE_ACK, the FILE_DONE of a write). */
export function encodeU64(v: number | bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(v), 0);
  return b;
}

/**
 * Decode a u64 BE payload (FILE_ACK, the FILE_DONE of a write) as a number.
 * @throws ProtocolError if shorter than 8 bytes
 */
export function decodeU64(p: Buffer, what: string): number {
  if (p.length < 8) throw new ProtocolError(`${what} payload needs 8 bytes, got ${p.length}`);
  return Number(p.readBigUInt64BE(0));
}
