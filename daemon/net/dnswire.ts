/**
 * The subset of the DNS wire format (RFC 1035) the sandbox resolver needs: read a
 * query's question, answer REFUSED, read the A/AAAA records and TTLs of an upstream
 * answer, change a message's id, and build queries and answers (the latter for tests'
 * fake upstreams). Everything else of a message is passed through as bytes.
 *
 * Written here because no DNS wire library is among the project's dependencies (the
 * well-kept `dns-packet` would replace it). Unit-tested in test/unit/dnswire.test.ts.
 * Every parser is bounds-checked and throws {@link DnsFormatError} on malformed input,
 * including compression-pointer loops.
 */

/** Record types by number (the ones dsec names; others are shown as TYPEn). */
export const QTYPE = { A: 1, NS: 2, CNAME: 5, SOA: 6, PTR: 12, MX: 15, TXT: 16, AAAA: 28, SRV: 33, OPT: 41, SVCB: 64, HTTPS: 65, ANY: 255 } as const;

/** Response codes used here. */
export const RCODE = { NOERROR: 0, FORMERR: 1, SERVFAIL: 2, NXDOMAIN: 3, REFUSED: 5 } as const;

/** Thrown for a message that is too short, has a bad name or pointer loop. */
export class DnsFormatError extends Error {}

/** Header length, bytes. */
const HEADER = 12;
/** Most compression pointers followed in one name: 64 (a name has at most 127 labels; real ones use a few). */
const MAX_POINTERS = 64;

/** Name of a record type, e.g. `A`, `AAAA`, `TYPE99`. */
export function typeName(t: number): string {
  for (const [k, v] of Object.entries(QTYPE)) if (v === t) return k;
  return `TYPE${t}`;
}

/**
 * Reads a (possibly compressed) name at `off`.
 * @returns the name in lowercase dotted form without the trailing dot (`` for the root)
 *   and the offset after the name as it appears at `off`.
 */
export function readName(b: Buffer, off: number): { name: string; end: number } {
  const labels: string[] = [];
  let pos = off;
  let end = -1;
  let jumps = 0;
  let len = 0;
  for (;;) {
    if (pos >= b.length) throw new DnsFormatError('name runs past the message');
    const l = b[pos];
    if ((l & 0xc0) === 0xc0) {
      if (pos + 1 >= b.length) throw new DnsFormatError('truncated compression pointer');
      if (++jumps > MAX_POINTERS) throw new DnsFormatError('compression pointer loop');
      if (end < 0) end = pos + 2;
      pos = ((l & 0x3f) << 8) | b[pos + 1];
      continue;
    }
    if ((l & 0xc0) !== 0) throw new DnsFormatError('unsupported label type');
    if (l === 0) {
      if (end < 0) end = pos + 1;
      break;
    }
    if (pos + 1 + l > b.length) throw new DnsFormatError('label runs past the message');
    len += l + 1;
    if (len > 255) throw new DnsFormatError('name longer than 255 bytes');
    labels.push(b.toString('latin1', pos + 1, pos + 1 + l).toLowerCase());
    pos += 1 + l;
  }
  return { name: labels.join('.'), end };
}

/** Encodes a dotted name as labels (no compression). @throws DnsFormatError for a label over 63 bytes. */
export function encodeName(name: string): Buffer {
  const parts = name.replace(/\.$/, '').split('.').filter((p) => p.length > 0);
  const bufs: Buffer[] = [];
  for (const p of parts) {
    const l = Buffer.from(p, 'latin1');
    if (l.length > 63) throw new DnsFormatError(`label ${JSON.stringify(p)} longer than 63 bytes`);
    bufs.push(Buffer.from([l.length]), l);
  }
  bufs.push(Buffer.from([0]));
  return Buffer.concat(bufs);
}

/** What the resolver reads from a query. */
export interface DnsQuestion {
  id: number;
  /** Opcode (0: standard query). */
  opcode: number;
  /** Whether the message is a response (QR set): a resolver never answers those. */
  response: boolean;
  qdcount: number;
  /** The first question: name (lowercase, no trailing dot), type and class. */
  name: string;
  type: number;
  qclass: number;
  /** Offset just after the first question. */
  questionEnd: number;
}

/** Parses the header and first question of a message. @throws DnsFormatError. */
export function parseQuestion(b: Buffer): DnsQuestion {
  if (b.length < HEADER) throw new DnsFormatError('message shorter than a header');
  const id = b.readUInt16BE(0);
  const flags = b.readUInt16BE(2);
  const qdcount = b.readUInt16BE(4);
  if (qdcount < 1) throw new DnsFormatError('no question');
  const { name, end } = readName(b, HEADER);
  if (end + 4 > b.length) throw new DnsFormatError('question runs past the message');
  return { id, opcode: (flags >> 11) & 0xf, response: (flags & 0x8000) !== 0, qdcount, name, type: b.readUInt16BE(end), qclass: b.readUInt16BE(end + 2), questionEnd: end + 4 };
}

/**
 * An answer with no records to `query`: its id and question, QR and RA set, RD copied,
 * and `rcode` (REFUSED by default). EDNS and other sections are dropped.
 * @throws DnsFormatError when the query has no readable question.
 */
export function buildError(query: Buffer, rcode: number = RCODE.REFUSED): Buffer {
  const q = parseQuestion(query);
  const out = Buffer.alloc(q.questionEnd);
  query.copy(out, 0, 0, q.questionEnd);
  const rd = query.readUInt16BE(2) & 0x0100;
  out.writeUInt16BE(0x8000 | (q.opcode << 11) | rd | 0x0080 | (rcode & 0xf), 2);
  out.writeUInt16BE(1, 4);
  out.writeUInt16BE(0, 6);
  out.writeUInt16BE(0, 8);
  out.writeUInt16BE(0, 10);
  return out;
}

/** A copy of `msg` with its id replaced. */
export function withId(msg: Buffer, id: number): Buffer {
  const out = Buffer.from(msg);
  out.writeUInt16BE(id & 0xffff, 0);
  return out;
}

/** One address record of an answer section. */
export interface AnswerAddress {
  /** Owner name of the record (lowercase). */
  name: string;
  family: 4 | 6;
  /** Address text (dotted quad, or the compressed IPv6 form of node's net module). */
  address: string;
  /** TTL, seconds, as the upstream gave it. */
  ttl: number;
}

/** What the resolver reads from an upstream answer. */
export interface DnsAnswer {
  id: number;
  rcode: number;
  truncated: boolean;
  addresses: AnswerAddress[];
  /** Names of CNAME records in the answer section (owner -> target), in order. */
  cnames: { name: string; target: string }[];
}

/** Parses the answer section's A, AAAA and CNAME records. @throws DnsFormatError. */
export function parseAnswer(b: Buffer): DnsAnswer {
  if (b.length < HEADER) throw new DnsFormatError('message shorter than a header');
  const id = b.readUInt16BE(0);
  const flags = b.readUInt16BE(2);
  const qd = b.readUInt16BE(4);
  const an = b.readUInt16BE(6);
  let pos = HEADER;
  for (let i = 0; i < qd; i++) {
    pos = readName(b, pos).end + 4;
    if (pos > b.length) throw new DnsFormatError('question runs past the message');
  }
  const addresses: AnswerAddress[] = [];
  const cnames: { name: string; target: string }[] = [];
  for (let i = 0; i < an; i++) {
    const { name, end } = readName(b, pos);
    if (end + 10 > b.length) throw new DnsFormatError('record header runs past the message');
    const type = b.readUInt16BE(end);
    const ttl = b.readUInt32BE(end + 4);
    const rdlen = b.readUInt16BE(end + 8);
    const rdata = end + 10;
    if (rdata + rdlen > b.length) throw new DnsFormatError('record data runs past the message');
    if (type === QTYPE.A && rdlen === 4) addresses.push({ name, family: 4, address: [...b.subarray(rdata, rdata + 4)].join('.'), ttl });
    else if (type === QTYPE.AAAA && rdlen === 16) addresses.push({ name, family: 6, address: ipv6Text(b.subarray(rdata, rdata + 16)), ttl });
    else if (type === QTYPE.CNAME) cnames.push({ name, target: readName(b, rdata).name });
    pos = rdata + rdlen;
  }
  return { id, rcode: flags & 0xf, truncated: (flags & 0x0200) !== 0, addresses, cnames };
}

/** Full (uncompressed-zero) IPv6 text; callers normalise with daemon/net/addr.ts when they compare. */
function ipv6Text(b: Buffer): string {
  return Array.from({ length: 8 }, (_, i) => b.readUInt16BE(i * 2).toString(16)).join(':');
}

/** A standard query with RD set (for tests and probes). */
export function buildQuery(name: string, type: number, id: number): Buffer {
  const h = Buffer.alloc(HEADER);
  h.writeUInt16BE(id & 0xffff, 0);
  h.writeUInt16BE(0x0100, 2);
  h.writeUInt16BE(1, 4);
  const q = Buffer.alloc(4);
  q.writeUInt16BE(type, 0);
  q.writeUInt16BE(1, 2);
  return Buffer.concat([h, encodeName(name), q]);
}

/**
 * An answer to `query` with the given address records for its question name (a fake
 * upstream's answer; tests only need A and AAAA).
 * @param records address bytes (4 or 16) and TTLs; a record whose family does not match
 *   the question type is skipped, so one list can serve A and AAAA questions.
 */
export function buildAddressAnswer(query: Buffer, records: { bytes: Buffer; ttl: number }[]): Buffer {
  const q = parseQuestion(query);
  const head = Buffer.from(query.subarray(0, q.questionEnd));
  head.writeUInt16BE(0x8000 | (query.readUInt16BE(2) & 0x0100) | 0x0080, 2);
  head.writeUInt16BE(1, 4);
  head.writeUInt16BE(0, 8);
  head.writeUInt16BE(0, 10);
  const rrs: Buffer[] = [];
  for (const r of records) {
    const type = r.bytes.length === 4 ? QTYPE.A : QTYPE.AAAA;
    if (type !== q.type) continue;
    const rr = Buffer.alloc(12 + r.bytes.length);
    rr.writeUInt16BE(0xc00c, 0); // pointer to the question name at offset 12
    rr.writeUInt16BE(type, 2);
    rr.writeUInt16BE(1, 4);
    rr.writeUInt32BE(r.ttl, 6);
    rr.writeUInt16BE(r.bytes.length, 10);
    r.bytes.copy(rr, 12);
    rrs.push(rr);
  }
  head.writeUInt16BE(rrs.length, 6);
  return Buffer.concat([head, ...rrs]);
}
