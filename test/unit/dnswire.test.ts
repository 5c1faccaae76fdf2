import { describe, expect, it } from 'vitest';
import { buildAddressAnswer, buildError, buildQuery, DnsFormatError, parseAnswer, parseQuestion, QTYPE, RCODE, withId } from '../../daemon/net/dnswire.js';

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
});
