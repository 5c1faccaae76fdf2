/**
 * The DNS messages the sandbox resolver handles, over the `dns-packet` library (RFC 1035
 * wire format): read a query's question, answer it with an error code, read the A/AAAA
 * and CNAME records and TTLs of an upstream answer, change a message's id, and build
 * queries and address answers (the latter for tests' fake upstreams). A forwarded
 * query is rebuilt from its question alone ({@link upstreamQuery}) and the upstream's
 * answer is mapped back to the client's id and question ({@link clientAnswer}); the
 * answer's records pass through as the bytes they came as.
 *
 * Every parser throws {@link DnsFormatError} on a message the library cannot decode
 * (too short, truncated, a compression-pointer loop, an unknown label type), so the
 * resolver answers FORMERR/SERVFAIL instead of failing. Unit-tested in
 * test/unit/dnswire.test.ts.
 */
import dnsPacket from 'dns-packet';
import net from 'node:net';

/** Record types by number (the ones dsec names; others are shown as TYPEn). */
export const QTYPE = { A: 1, NS: 2, CNAME: 5, SOA: 6, PTR: 12, MX: 15, TXT: 16, AAAA: 28, SRV: 33, OPT: 41, SVCB: 64, HTTPS: 65, ANY: 255 } as const;

/** Response codes used here. */
export const RCODE = { NOERROR: 0, FORMERR: 1, SERVFAIL: 2, NXDOMAIN: 3, REFUSED: 5 } as const;

/** Thrown for a message that cannot be decoded: too short, a bad name, a pointer loop. */
export class DnsFormatError extends Error {}

/** Header length, bytes (RFC 1035 §4.1.1). */
const HEADER = 12;
/** QR (response), RD (recursion desired) and RA (recursion available) bits of the header flags. */
const QR = 0x8000;
const RD = 0x0100;
const RA = 0x0080;

/** Name of a record type, e.g. `A`, `AAAA`, `TYPE99`. */
export function typeName(t: number): string {
  for (const [k, v] of Object.entries(QTYPE)) if (v === t) return k;
  return `TYPE${t}`;
}

/** Number of a record type name as dns-packet decodes it (`A`, `AAAA`, `UNKNOWN_99`), or 0. */
function typeNumber(name: string): number {
  if (name in QTYPE) return QTYPE[name as keyof typeof QTYPE];
  const m = /^UNKNOWN_(\d+)$/.exec(name);
  return m ? Number(m[1]) : 0;
}

/** Decodes `b`, turning the library's errors into {@link DnsFormatError}. */
function decode(b: Buffer): dnsPacket.Packet & { flags: number } {
  if (b.length < HEADER) throw new DnsFormatError('message shorter than a header');
  try {
    return dnsPacket.decode(b) as dnsPacket.Packet & { flags: number };
  } catch (e) {
    throw new DnsFormatError(`malformed DNS message: ${(e as Error).message}`);
  }
}

/** Lowercase, without a trailing dot (`` for the root). */
function normName(n: string): string {
  return n.replace(/\.$/, '').toLowerCase();
}

/** The header fields and first question of a message. */
export interface DnsQuestion {
  id: number;
  opcode: number;
  /** Whether the message is a response (QR set): a resolver never answers those. */
  response: boolean;
  qdcount: number;
  /** The first question: name (lowercase, no trailing dot), type and class. */
  name: string;
  type: number;
  qclass: number;
}

/** Class numbers by the names dns-packet decodes them to (RFC 1035 §3.2.4, RFC 2136 for NONE). */
const CLASS: Record<string, number> = { IN: 1, CS: 2, CH: 3, HS: 4, NONE: 254, ANY: 255 };

/** Parses the header and first question of a message. @throws DnsFormatError. */
export function parseQuestion(b: Buffer): DnsQuestion {
  const p = decode(b);
  const q = p.questions?.[0];
  if (!q) throw new DnsFormatError('no question');
  const qclass = CLASS[(q as { class?: string }).class ?? 'IN'] ?? 0;
  return {
    id: p.id ?? 0, opcode: (p.flags >> 11) & 0xf, response: (p.flags & QR) !== 0, qdcount: p.questions!.length,
    name: normName(q.name), type: typeNumber(q.type), qclass,
  };
}

/**
 * An answer with no records to `query`: its id and question, QR and RA set, RD copied,
 * and `rcode` (REFUSED by default). EDNS and every other section are dropped.
 * @throws DnsFormatError when the query has no readable question.
 */
export function buildError(query: Buffer, rcode: number = RCODE.REFUSED): Buffer {
  const p = decode(query);
  if (!p.questions?.length) throw new DnsFormatError('no question');
  const opcode = (p.flags >> 11) & 0xf;
  return dnsPacket.encode({
    type: 'response', id: p.id, flags: QR | (opcode << 11) | (p.flags & RD) | RA | (rcode & 0xf), questions: [p.questions[0]],
  });
}

/** ASCII-lowercases the name of a wire question (all but its last 4 bytes, type and class) in place; length bytes (<= 63) are below 'A'. */
function lowerName(q: Buffer): Buffer {
  for (let i = 0; i < q.length - 4; i++) if (q[i] >= 0x41 && q[i] <= 0x5a) q[i] += 0x20;
  return q;
}

/**
 * The query dsec sends upstream for a client's `query`: built from its first question
 * only, with a new `id`, flags RD alone, the name lowercased, and no answer, authority
 * or additional records (no EDNS). Nothing the client chose besides the question's
 * name, type and class reaches the upstream: not its id, the case of its name (0x20
 * bits), its flags, EDNS options, extra records or trailing bytes (each a covert
 * channel to whoever watches the upstream's traffic).
 * @param id 0-65535, random per query (the answer must echo it).
 * @returns the message, and the question's length in bytes (name, type, class), which
 *   {@link clientAnswer} needs.
 * @throws DnsFormatError when the query has no question, or its question does not
 *   survive a decode/encode round trip byte for byte up to case (a compressed name, a
 *   label holding a dot or bytes that are not UTF-8): such a name could not be mapped
 *   back safely.
 */
export function upstreamQuery(query: Buffer, id: number): { msg: Buffer; questionBytes: number } {
  const p = decode(query);
  const q = p.questions?.[0];
  if (!q) throw new DnsFormatError('no question');
  const msg = dnsPacket.encode({ type: 'query', id: id & 0xffff, flags: RD, questions: [{ type: q.type, class: q.class, name: q.name.toLowerCase() } as dnsPacket.Question] });
  const len = msg.length - HEADER;
  const theirs = lowerName(Buffer.from(query.subarray(HEADER, HEADER + len)));
  lowerName(msg.subarray(HEADER));
  if (theirs.length !== len || !theirs.equals(msg.subarray(HEADER))) throw new DnsFormatError('the question does not re-encode to the same bytes');
  return { msg, questionBytes: len };
}

/**
 * The upstream's `answer` to {@link upstreamQuery}`(query, id)` as the client gets it:
 * the client's id, its RD bit and its question bytes (its own case) in place of the
 * upstream's; flags, counts and records as the upstream sent them (compression
 * pointers into the question stay valid: it has the same length and labels).
 * @throws DnsFormatError when `answer` is not a response to that query: shorter than
 *   header and question, another id, QR clear, not exactly one question, or another
 *   question (compared up to case).
 */
export function clientAnswer(answer: Buffer, query: Buffer, up: { msg: Buffer; questionBytes: number }): Buffer {
  const end = HEADER + up.questionBytes;
  if (answer.length < end) throw new DnsFormatError('answer shorter than header and question');
  if (answer.readUInt16BE(0) !== up.msg.readUInt16BE(0)) throw new DnsFormatError('answer id does not match the query');
  if (!(answer.readUInt16BE(2) & QR) || answer.readUInt16BE(4) !== 1) throw new DnsFormatError('not a response to one question');
  if (!lowerName(Buffer.from(answer.subarray(HEADER, end))).equals(up.msg.subarray(HEADER, end))) throw new DnsFormatError('answer is for another question');
  const out = Buffer.concat([answer.subarray(0, HEADER), query.subarray(HEADER, end), answer.subarray(end)]);
  out.writeUInt16BE(query.readUInt16BE(0), 0);
  out.writeUInt16BE((answer.readUInt16BE(2) & ~RD) | (query.readUInt16BE(2) & RD), 2);
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
  /** Address text (dotted quad, or IPv6 text; callers normalise with daemon/net/addr.ts when they compare). */
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
  /** CNAME records in the answer section (owner -> target), in order. */
  cnames: { name: string; target: string }[];
}

/** Parses the answer section's A, AAAA and CNAME records. @throws DnsFormatError. */
export function parseAnswer(b: Buffer): DnsAnswer {
  const p = decode(b);
  const addresses: AnswerAddress[] = [];
  const cnames: { name: string; target: string }[] = [];
  for (const a of p.answers ?? []) {
    if (a.type === 'A' && typeof a.data === 'string' && net.isIPv4(a.data)) addresses.push({ name: normName(a.name), family: 4, address: a.data, ttl: a.ttl ?? 0 });
    else if (a.type === 'AAAA' && typeof a.data === 'string' && net.isIPv6(a.data)) addresses.push({ name: normName(a.name), family: 6, address: a.data, ttl: a.ttl ?? 0 });
    else if (a.type === 'CNAME' && typeof a.data === 'string') cnames.push({ name: normName(a.name), target: normName(a.data) });
  }
  return { id: p.id ?? 0, rcode: p.flags & 0xf, truncated: (p.flags & 0x0200) !== 0, addresses, cnames };
}

/** Text of an address record type as dns-packet names it. */
const TYPE_TEXT: Record<number, dnsPacket.RecordType> = { [QTYPE.A]: 'A', [QTYPE.AAAA]: 'AAAA', [QTYPE.TXT]: 'TXT', [QTYPE.CNAME]: 'CNAME', [QTYPE.MX]: 'MX', [QTYPE.NS]: 'NS' };

/** A standard query with RD set (for tests and probes). `type` is one of A, AAAA, TXT, CNAME, MX, NS. */
export function buildQuery(name: string, type: number, id: number): Buffer {
  const t = TYPE_TEXT[type];
  if (!t) throw new DnsFormatError(`buildQuery does not know type ${typeName(type)}`);
  return dnsPacket.encode({ type: 'query', id: id & 0xffff, flags: RD, questions: [{ type: t, name }] });
}

/**
 * An answer to `query` with the given address records for its question name (a fake
 * upstream's answer; tests only need A and AAAA).
 * @param records address bytes (4 or 16) and TTLs; a record whose family does not match
 *   the question type is skipped, so one list can serve A and AAAA questions.
 */
export function buildAddressAnswer(query: Buffer, records: { bytes: Buffer; ttl: number }[]): Buffer {
  const p = decode(query);
  const q = p.questions?.[0];
  if (!q) throw new DnsFormatError('no question');
  const answers: dnsPacket.Answer[] = [];
  for (const r of records) {
    const type = r.bytes.length === 4 ? 'A' : 'AAAA';
    if (type !== q.type) continue;
    const data = r.bytes.length === 4 ? [...r.bytes].join('.') : Array.from({ length: 8 }, (_, i) => r.bytes.readUInt16BE(i * 2).toString(16)).join(':');
    answers.push({ type, name: q.name, ttl: r.ttl, data } as dnsPacket.Answer);
  }
  return dnsPacket.encode({ type: 'response', id: p.id, flags: QR | (p.flags & RD) | RA, questions: [q], answers });
}
