import { describe, expect, it } from 'vitest';
import { buildAddressAnswer, buildError, buildQuery, clientAnswer, DnsFormatError, parseAnswer, parseQuestion, QTYPE, RCODE, upstreamQuery, withId } from '../../daemon/net/dnswire.js';

describe('DNS messages of the resolver (over dns-packet)', () => {
  it('reads the question of a query', () => {
    const q = buildQuery('PyPI.org', QTYPE.AAAA, 0xbeef);
    expect(parseQuestion(q)).toMatchObject({ id: 0xbeef, opcode: 0, response: false, qdcount: 1, name: 'pypi.org', type: QTYPE.AAAA, qclass: 1 });
  });
  it('answers REFUSED with the question and nothing else', () => {
    const q = Buffer.concat([buildQuery('leak.example.com', QTYPE.TXT, 7), Buffer.from([0, 0, 41, 16, 0, 0, 0, 0, 0, 0, 0])]);
    q.writeUInt16BE(1, 10); // an EDNS OPT record in the additional section
    const r = buildError(q);
    expect(r.readUInt16BE(0)).toBe(7);
    expect(r.readUInt16BE(2) & 0x8000).toBe(0x8000);
    expect(r.readUInt16BE(2) & 0xf).toBe(RCODE.REFUSED);
    expect([r.readUInt16BE(6), r.readUInt16BE(8), r.readUInt16BE(10)]).toEqual([0, 0, 0]);
    expect(parseQuestion(r).name).toBe('leak.example.com');
  });
  it('reads addresses and TTLs of an answer, through compression pointers', () => {
    const q = buildQuery('pypi.org', QTYPE.A, 1);
    const a = buildAddressAnswer(q, [{ bytes: Buffer.from([192, 0, 2, 1]), ttl: 30 }, { bytes: Buffer.from([192, 0, 2, 2]), ttl: 300 }, { bytes: Buffer.alloc(16), ttl: 5 }]);
    const p = parseAnswer(a);
    expect(p.rcode).toBe(0);
    expect(p.addresses).toEqual([{ name: 'pypi.org', family: 4, address: '192.0.2.1', ttl: 30 }, { name: 'pypi.org', family: 4, address: '192.0.2.2', ttl: 300 }]);
    expect(parseAnswer(withId(a, 9)).id).toBe(9);
    const a6 = parseAnswer(buildAddressAnswer(buildQuery('pypi.org', QTYPE.AAAA, 2), [{ bytes: Buffer.from('20010db8000000000000000000000001', 'hex'), ttl: 60 }]));
    expect(a6.addresses).toHaveLength(1);
    expect(a6.addresses[0]).toMatchObject({ family: 6, ttl: 60 });
  });
  it('refuses malformed messages: short, truncated, pointer loops', () => {
    expect(() => parseQuestion(Buffer.alloc(5))).toThrow(DnsFormatError);
    const loop = Buffer.from([0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1]);
    expect(() => parseQuestion(loop)).toThrow(DnsFormatError);
    const q = buildQuery('pypi.org', QTYPE.A, 1);
    expect(() => parseQuestion(q.subarray(0, q.length - 3))).toThrow(DnsFormatError);
    // A name whose first label has the reserved 0x40 type bits.
    expect(() => parseQuestion(Buffer.from([0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 1, 0, 1]))).toThrow(DnsFormatError);
    expect(() => parseAnswer(Buffer.alloc(3))).toThrow(DnsFormatError);
  });
  it('rebuilds the upstream query from the question alone and maps the answer back to the client', () => {
    // A client query carrying data besides its question: its id, 0x20 case, AD/CD flags,
    // an EDNS OPT record with an option, and trailing bytes.
    const base = buildQuery('PyPI.ORG', QTYPE.A, 0xabcd);
    const opt = Buffer.from([0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 8, 0, 10, 0, 4, 0xde, 0xad, 0xbe, 0xef]);
    const q = Buffer.concat([base, opt, Buffer.from('trailing-secret')]);
    q.writeUInt16BE(0x0130, 2); // RD, AD, CD
    q.writeUInt16BE(1, 10);
    const up = upstreamQuery(q, 0x1234);
    // Exactly the question, lowercased, new id, RD only, nothing else.
    expect(up.msg.equals(buildQuery('pypi.org', QTYPE.A, 0x1234))).toBe(true);
    expect(up.questionBytes).toBe(base.length - 12);
    // The upstream answers with its own case (0x20 echo) and id; the client gets its own.
    const upAns = buildAddressAnswer(up.msg, [{ bytes: Buffer.from([192, 0, 2, 7]), ttl: 30 }]);
    upAns.write('pYpI', 13, 'latin1');
    const a = clientAnswer(upAns, q, up);
    expect(a.readUInt16BE(0)).toBe(0xabcd);
    expect(a.subarray(12, base.length).equals(base.subarray(12))).toBe(true); // the client's question bytes, its case
    expect(a.readUInt16BE(2) & 0x8100).toBe(0x8100); // QR, and RD as the client set it
    expect(parseAnswer(a).addresses).toEqual([{ name: 'pypi.org', family: 4, address: '192.0.2.7', ttl: 30 }]);
    const noRd = Buffer.from(base);
    noRd.writeUInt16BE(0, 2);
    expect(clientAnswer(upAns, noRd, upstreamQuery(noRd, 0x1234)).readUInt16BE(2) & 0x0100).toBe(0);
    // Not an answer to that query: another id, another name, a query.
    expect(() => clientAnswer(withId(upAns, 0x1235), q, up)).toThrow(DnsFormatError);
    expect(() => clientAnswer(buildAddressAnswer(buildQuery('pypi.orh', QTYPE.A, 0x1234), []), q, up)).toThrow(DnsFormatError);
    expect(() => clientAnswer(up.msg, q, up)).toThrow(DnsFormatError);
    expect(() => clientAnswer(upAns.subarray(0, 20), q, up)).toThrow(DnsFormatError);
  });
  it('refuses to rebuild a question that would not map back byte for byte', () => {
    // A label holding a dot ("a.b" as one label) and a question name that is a compression pointer.
    const dotted = Buffer.from([0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 3, 0x61, 0x2e, 0x62, 3, 0x63, 0x6f, 0x6d, 0, 0, 1, 0, 1]);
    expect(() => upstreamQuery(dotted, 1)).toThrow(DnsFormatError);
    const ptr = Buffer.from([0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0xc0, 25, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0x63, 0x6f, 0x6d, 0]);
    expect(() => upstreamQuery(ptr, 1)).toThrow(DnsFormatError);
  });
});
