import { describe, expect, it } from 'vitest';
import { addressForSlot, contains, formatAddr, formatPrefix, parse6, parsePrefix, parseSubnet } from '../../daemon/net/addr.js';
import { attachBatches, macFor, slotOfVeth, vethName } from '../../daemon/net/veth.js';
import { nftRuleset } from '../../daemon/net/instance.js';

describe('addresses and prefixes', () => {
  it('parses IPv6 text forms, embedded dotted quads included', () => {
    expect(formatAddr(parse6('2001:db8::1')!)).toBe('2001:db8::1');
    expect(formatAddr(parse6('::')!)).toBe('::');
    expect(formatAddr(parse6('::1')!)).toBe('::1');
    expect(formatAddr(parse6('1:0:0:2:0:0:0:3')!)).toBe('1:0:0:2::3');
    expect([...parse6('::ffff:1.2.3.4')!.subarray(10)]).toEqual([0xff, 0xff, 1, 2, 3, 4]);
    expect(formatAddr(parse6('::ffff:1.2.3.4')!)).toBe('::ffff:1.2.3.4');
    expect(parse6('fe80::1%eth0')).toBeNull();
    expect(parse6('1.2.3.4')).toBeNull();
  });
  it('parses prefixes, refusing host bits with a suggestion', () => {
    expect(formatPrefix(parsePrefix('10.0.0.0/8'))).toBe('10.0.0.0/8');
    expect(formatPrefix(parsePrefix('192.0.2.7'))).toBe('192.0.2.7/32');
    expect(formatPrefix(parsePrefix('2001:db8::/32'))).toBe('2001:db8::/32');
    expect(() => parsePrefix('10.0.0.1/8')).toThrow(/did you mean 10.0.0.0\/8/);
    expect(() => parsePrefix('10.0.0.0/33')).toThrow(/prefix length must be 0-32/);
    expect(() => parsePrefix('example.org')).toThrow(/not an IPv4 or IPv6 address/);
  });
  it('turns IPv4-mapped IPv6 prefixes into IPv4 ones (the programs check mapped destinations against v4 rules)', () => {
    const p = parsePrefix('::ffff:10.0.0.0/104');
    expect(p.family).toBe(4);
    expect(formatPrefix(p)).toBe('10.0.0.0/8');
  });
  it('containment', () => {
    expect(contains(parsePrefix('10.0.0.0/8'), parsePrefix('10.1.0.0/16'))).toBe(true);
    expect(contains(parsePrefix('10.1.0.0/16'), parsePrefix('10.0.0.0/8'))).toBe(false);
    expect(contains(parsePrefix('0.0.0.0/0'), parsePrefix('192.0.2.1'))).toBe(true);
    expect(contains(parsePrefix('::/0'), parsePrefix('192.0.2.1'))).toBe(false);
  });
  it('derives sandbox addresses from uid-range slots: network + 2 + slot', () => {
    const s = parseSubnet('10.201.0.0/16');
    expect(formatAddr(s.gateway)).toBe('10.201.0.1');
    expect(s.capacity).toBe(65533);
    expect(formatAddr(addressForSlot(s, 0))).toBe('10.201.0.2');
    expect(formatAddr(addressForSlot(s, 300))).toBe('10.201.1.46');
    expect(formatAddr(addressForSlot(s, 65532))).toBe('10.201.255.254');
    expect(() => addressForSlot(s, 65533)).toThrow(/has no address/);
    expect(() => parseSubnet('10.0.0.0/31')).toThrow(/length 8 to 30/);
  });
});

describe('veth plumbing commands', () => {
  const s = parseSubnet('10.201.0.0/16');
  it('names bridge ends after slots and back', () => {
    expect(vethName(16383)).toBe('v16383');
    expect(slotOfVeth('v42')).toBe(42);
    expect(slotOfVeth('dsec0')).toBeNull();
    expect(macFor(Buffer.from([10, 201, 0, 3]))).toBe('02:00:0a:c9:00:03');
  });
  it('one batch per namespace: the pair with its peer in the sandbox netns on an isolated port; address and default route inside', () => {
    const b = attachBatches(s, 1, addressForSlot(s, 1), 4242);
    expect(b.instance).toContain('link add v1 type veth peer name eth0 address 02:00:0a:c9:00:03 netns 4242');
    expect(b.instance).toContain('link set dev v1 type bridge_slave isolated on');
    expect(b.sandbox).toContain('addr add 10.201.0.3/16 dev eth0');
    expect(b.sandbox).toContain('route add default via 10.201.0.1');
  });
  it('the instance nft table forwards nothing between bridge ports and lets sandboxes reach only DNS on the gateway', () => {
    const r = nftRuleset(s);
    expect(r).toContain('iifname "dsec0" oifname "dsec0" drop');
    expect(r).toContain('iifname "dsec0" ip daddr 10.201.0.1 meta l4proto { tcp, udp } th dport 53 accept');
    expect(r).toContain('ip saddr 10.201.0.0/16 oifname != "dsec0" masquerade');
    expect(r.indexOf('delete table ip dsec')).toBeLessThan(r.indexOf('table ip dsec {'));
  });
});
