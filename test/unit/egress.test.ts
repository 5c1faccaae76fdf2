import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { parsePrefix, parseSubnet } from '../../daemon/net/addr.js';
import { builtinDeny, dnsDecision } from '../../daemon/net/decisions.js';
import { slirpArgv, slirpArgvDiff } from '../../daemon/net/instance.js';
import {
  cgroupKey, compileEgress, confValue, effectiveNetwork, exactHosts, hostMatches, normaliseHost, normaliseRanges, parseCounters, parseTrieKey, portsetValue,
  PROTO_ANY, PROTO_TCP, PROTO_UDP, policyWarnings, rulePorts, trieKey, type EffectiveNetwork,
} from '../../daemon/security/egress.js';
import { parsePolicyFile, PolicySet, shippedPolicyDir } from '../../daemon/security/egress-policy.js';
import { EgressRule, NetworkSpec } from '../../daemon/api/schema.js';

const noHosts = { addressesOf: () => [] as string[], infraDeny: [] };

describe('egress rules: validation', () => {
  const bad = (r: unknown) => {
    const p = EgressRule.safeParse(r);
    return p.success ? null : p.error.issues.map((i) => i.message).join('; ');
  };
  it('needs exactly one of cidr and host', () => {
    expect(bad({ cidr: '10.0.0.0/8', host: 'a.org' })).toMatch(/exactly one of cidr and host/);
    expect(bad({ ports: [80] })).toMatch(/exactly one of cidr and host/);
  });
  it('checks prefixes, host names and port ranges', () => {
    expect(bad({ cidr: '10.0.0.1/8' })).toMatch(/did you mean 10.0.0.0\/8/);
    expect(bad({ host: 'a..org' })).toMatch(/not a DNS name/);
    expect(bad({ host: 'foo.*.org' })).toMatch(/\* only as the whole first label/);
    expect(bad({ host: '*.org' })).toMatch(/top-level domain/);
    expect(bad({ cidr: '10.0.0.0/8', ports: ['90-80'] })).toMatch(/low <= high/);
    expect(bad({ cidr: '10.0.0.0/8', ports: [0] })).toBeTruthy();
    expect(bad({ host: 'PyPI.org.', ports: [443, '8000-8080'], protocol: 'tcp' })).toBeNull();
  });
  it('rule ports: every port by default, per protocol', () => {
    expect(rulePorts({ cidr: '10.0.0.0/8' })).toEqual([{ lo: 0, hi: 65535, protos: PROTO_ANY }]);
    expect(rulePorts({ cidr: '10.0.0.0/8', ports: [53, '60-70'], protocol: 'udp' })).toEqual([{ lo: 53, hi: 53, protos: PROTO_UDP }, { lo: 60, hi: 70, protos: PROTO_UDP }]);
  });
});

describe('host patterns', () => {
  it('exact names match themselves, case and a trailing dot aside', () => {
    expect(hostMatches('pypi.org', 'PyPI.org.')).toBe(true);
    expect(hostMatches('pypi.org', 'www.pypi.org')).toBe(false);
    expect(hostMatches('pypi.org', 'xpypi.org')).toBe(false);
  });
  it('a wildcard matches every name below, not the name itself', () => {
    expect(hostMatches('*.pythonhosted.org', 'files.pythonhosted.org')).toBe(true);
    expect(hostMatches('*.pythonhosted.org', 'a.b.pythonhosted.org')).toBe(true);
    expect(hostMatches('*.pythonhosted.org', 'pythonhosted.org')).toBe(false);
    expect(hostMatches('*.pythonhosted.org', 'evilpythonhosted.org')).toBe(false);
  });
  it('normalises and refuses what is not a name', () => {
    expect(normaliseHost('Files.PythonHosted.org.')).toBe('files.pythonhosted.org');
    expect(() => normaliseHost('-bad.org')).toThrow();
    expect(normaliseHost('_http._tcp.example.org')).toBe('_http._tcp.example.org');
  });
});

describe('settling a network', () => {
  const pol = { name: 'p', mode: 'open' as const, allow: [], deny: [{ host: 'pypi.org' }] };
  it('takes the mode from the request, else the policy; policy rules come first', () => {
    const e = effectiveNetwork({ policy: 'p', deny: [{ cidr: '10.0.0.0/8' }] }, pol);
    expect(e.mode).toBe('open');
    expect(e.deny).toEqual([{ host: 'pypi.org' }, { cidr: '10.0.0.0/8' }]);
    expect(effectiveNetwork({ mode: 'allow', policy: 'p' }, pol).mode).toBe('allow');
  });
  it('refuses rules or a policy with mode none, and rules without any mode', () => {
    expect(() => effectiveNetwork({ mode: 'none', allow: [{ cidr: '10.0.0.0/8' }] })).toThrow(/mode none has no route out/);
    expect(() => effectiveNetwork({ allow: [{ cidr: '10.0.0.0/8' }] })).toThrow(/need a mode/);
    expect(effectiveNetwork(null).mode).toBe('none');
  });
  it('the API schema leaves mode out when a policy gives it', () => {
    expect(NetworkSpec.parse({ policy: 'p' })).toEqual({ policy: 'p' });
  });
});

describe('prefix compilation with port unions', () => {
  const net = (allow: EgressRule[], deny: EgressRule[] = []): EffectiveNetwork => ({ mode: 'allow', allow, deny });
  it('merges ranges per protocol into the fewest ranges', () => {
    expect(normaliseRanges([{ lo: 80, hi: 80, protos: PROTO_TCP }, { lo: 81, hi: 90, protos: PROTO_TCP }, { lo: 85, hi: 100, protos: PROTO_UDP }])).toEqual([
      { lo: 80, hi: 84, protos: PROTO_TCP }, { lo: 85, hi: 90, protos: PROTO_ANY }, { lo: 91, hi: 100, protos: PROTO_UDP },
    ]);
  });
  it('the longest prefix carries the ports of every rule containing it, so one LPM lookup is exact', () => {
    const c = compileEgress(net([
      { cidr: '10.0.0.0/8', ports: [22], protocol: 'tcp' },
      { cidr: '10.1.0.0/16', ports: [80], protocol: 'tcp' },
      { cidr: '10.1.2.0/24', ports: [53], protocol: 'udp' },
      { cidr: '192.0.2.0/24' },
    ]), noHosts);
    expect(c.allow4.get('10.0.0.0/8')!.ports).toEqual([{ lo: 22, hi: 22, protos: PROTO_TCP }]);
    expect(c.allow4.get('10.1.0.0/16')!.ports).toEqual([{ lo: 22, hi: 22, protos: PROTO_TCP }, { lo: 80, hi: 80, protos: PROTO_TCP }]);
    expect(c.allow4.get('10.1.2.0/24')!.ports).toEqual([{ lo: 22, hi: 22, protos: PROTO_TCP }, { lo: 53, hi: 53, protos: PROTO_UDP }, { lo: 80, hi: 80, protos: PROTO_TCP }]);
    expect(c.allow4.get('192.0.2.0/24')!.ports).toEqual([{ lo: 0, hi: 65535, protos: PROTO_ANY }]);
  });
  it('deny entries are compiled alike, infrastructure denials included; open mode has no allow entries', () => {
    const c = compileEgress({ mode: 'open', allow: [{ cidr: '10.0.0.0/8' }], deny: [{ cidr: '10.9.0.0/16', ports: [443] }] },
      { addressesOf: () => [], infraDeny: [parsePrefix('10.201.0.0/16')], extraDeny: [{ prefix: parsePrefix('0.0.0.0/0'), ports: [{ lo: 53, hi: 53, protos: PROTO_ANY }] }] });
    expect(c.allow4.size).toBe(0);
    expect(c.deny4.get('10.201.0.0/16')!.ports).toEqual([{ lo: 0, hi: 65535, protos: PROTO_ANY }]);
    expect(c.deny4.get('10.9.0.0/16')!.ports).toEqual([{ lo: 53, hi: 53, protos: PROTO_ANY }, { lo: 443, hi: 443, protos: PROTO_ANY }]);
  });
  it('host rules contribute one /32 or /128 per current address; v6 goes to the v6 tries', () => {
    const c = compileEgress(net([{ host: 'pypi.org', ports: [443] }]), { addressesOf: (h) => (h === 'pypi.org' ? ['192.0.2.10', '2001:db8::10'] : []), infraDeny: [] });
    expect([...c.allow4.keys()]).toEqual(['192.0.2.10/32']);
    expect([...c.allow6.keys()]).toEqual(['2001:db8::10/128']);
    expect(exactHosts(net([{ host: 'PyPI.org' }, { host: '*.pythonhosted.org' }]))).toEqual(['pypi.org']);
  });
  it('refuses a union larger than one entry can carry', () => {
    const rules = Array.from({ length: 3 }, (_, i) => ({ cidr: `10.${i}.0.0/16`, ports: Array.from({ length: 16 }, (_, j) => 1000 + i * 100 + j * 2) }));
    expect(() => compileEgress(net([...rules, { cidr: '10.0.0.0/8', ports: [1] }, { cidr: '10.0.1.0/24', ports: Array.from({ length: 16 }, (_, j) => 5000 + j * 2) }]), noHosts)).toThrow(/more than the 32 one prefix can carry/);
  });
});

describe('map layouts shared with egress.bpf.c', () => {
  it('trie keys: prefixlen 64 + len, cgroup id, address', () => {
    const k = trieKey(0x1122334455667788n, parsePrefix('10.1.0.0/16'));
    expect(k.length).toBe(16);
    expect(k.readUInt32LE(0)).toBe(80);
    expect(k.readBigUInt64LE(4)).toBe(0x1122334455667788n);
    expect([...k.subarray(12)]).toEqual([10, 1, 0, 0]);
    expect(parseTrieKey(k).prefix.len).toBe(16);
    expect(trieKey(1n, parsePrefix('2001:db8::/32')).length).toBe(28);
    expect(cgroupKey(7n).readBigUInt64LE(0)).toBe(7n);
  });
  it('port sets and conf values', () => {
    const v = portsetValue([{ lo: 80, hi: 81, protos: PROTO_TCP }]);
    expect(v.length).toBe(264);
    expect([v.readUInt32LE(0), v.readUInt16LE(8), v.readUInt16LE(10), v.readUInt32LE(12)]).toEqual([1, 80, 81, PROTO_TCP]);
    const c = confValue('open', Buffer.from([10, 201, 0, 1]));
    expect(c.readUInt32LE(0)).toBe(2);
    expect([...c.subarray(4, 8)]).toEqual([10, 201, 0, 1]);
  });
  it('decodes counters and the last denied destination', () => {
    const b = Buffer.alloc(64);
    b.writeBigUInt64LE(3n, 0);
    b.writeBigUInt64LE(1n, 8);
    Buffer.from([10, 9, 9, 9]).copy(b, 32);
    b.writeUInt16LE(8080, 48);
    b.writeUInt8(4, 50);
    b.writeUInt8(6, 51);
    b.writeUInt32LE(1, 52);
    expect(parseCounters(b)).toEqual({ connect: 3, sendmsg: 1, sockCreate: 0, last: { kind: 'connect', address: '10.9.9.9', port: 8080, protocol: 'tcp', socketType: null } });
  });
});

describe('DNS policy decisions', () => {
  const allow: EffectiveNetwork = { mode: 'allow', allow: [{ host: 'pypi.org', ports: [443] }, { host: '*.pythonhosted.org' }, { cidr: '192.0.2.0/24' }], deny: [{ host: 'evil.pythonhosted.org' }] };
  const open: EffectiveNetwork = { mode: 'open', allow: [], deny: [{ host: '*.npmjs.org' }] };
  it('allow mode forwards only names of allow host rules, naming the rules to pin under', () => {
    expect(dnsDecision(allow, 'pypi.org')).toEqual({ action: 'forward', patterns: ['pypi.org'] });
    expect(dnsDecision(allow, 'files.pythonhosted.org')).toEqual({ action: 'forward', patterns: ['*.pythonhosted.org'] });
    expect(dnsDecision(allow, 'secret-data.attacker.example').action).toBe('refuse');
    expect(dnsDecision(allow, '2.0.192.in-addr.arpa').action).toBe('refuse');
  });
  it('deny host rules win in both modes', () => {
    expect(dnsDecision(allow, 'evil.pythonhosted.org').action).toBe('refuse');
    expect(dnsDecision(open, 'registry.npmjs.org')).toEqual({ action: 'refuse', reason: 'deny *.npmjs.org' });
    expect(dnsDecision(open, 'example.org')).toEqual({ action: 'forward', patterns: [] });
    expect(dnsDecision({ mode: 'none', allow: [], deny: [] }, 'example.org').action).toBe('refuse');
  });
});

describe('network policy files', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'dsec-pol-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  it('the shipped examples load, block-package-proxies among them', () => {
    const s = new PolicySet([shippedPolicyDir()]);
    expect(s.loadInitial()).toEqual([]);
    const p = s.require('block-package-proxies');
    expect(p.mode).toBe('open');
    for (const h of ['pypi.org', 'files.pythonhosted.org', 'registry.npmjs.org', 'proxy.golang.org', 'sum.golang.org', 'crates.io', 'static.crates.io', 'rubygems.org', 'repo.maven.apache.org', 'deb.debian.org', 'security.debian.org', 'codeload.github.com', 'objects.githubusercontent.com']) {
      expect(p.deny.some((r) => r.host === h), h).toBe(true);
    }
  });
  it('a malformed file is refused naming the file and field', () => {
    const f = path.join(dir, 'bad.json');
    const r = parsePolicyFile(f, JSON.stringify({ mode: 'open', deny: [{ cidr: '10.0.0.1/8' }] }));
    expect(r).toMatchObject({ file: f });
    expect((r as { message: string }).message).toMatch(/^deny\.0: .*did you mean 10\.0\.0\.0\/8/);
    expect((parsePolicyFile(f, '{"mode":"open","denny":[]}') as { message: string }).message).toMatch(/unknown field denny/);
    expect((parsePolicyFile(path.join(dir, 'Bad Name.json'), '{"mode":"open"}') as { message: string }).message).toMatch(/file name/);
    expect((parsePolicyFile(f, '{') as { message: string }).message).toMatch(/not JSON/);
  });
  it('reload is all or nothing: a malformed file keeps the previous version in force', () => {
    writeFileSync(path.join(dir, 'p.json'), JSON.stringify({ mode: 'allow', allow: [{ cidr: '192.0.2.0/24' }] }));
    const s = new PolicySet([dir]);
    expect(s.loadInitial()).toEqual([]);
    writeFileSync(path.join(dir, 'p.json'), JSON.stringify({ mode: 'allow', allow: [{ cidr: '192.0.2.0/99' }] }));
    expect(() => s.reload(new Set())).toThrow(/reload refused.*p\.json: allow\.0: .*prefix length/);
    expect(s.require('p').allow).toEqual([{ cidr: '192.0.2.0/24' }]);
    writeFileSync(path.join(dir, 'p.json'), JSON.stringify({ mode: 'allow', allow: [{ cidr: '198.51.100.0/24' }] }));
    expect(s.reload(new Set())).toEqual({ changed: ['p'], loaded: ['p'], shadowed: [], warnings: [] });
    expect(s.require('p').allow).toEqual([{ cidr: '198.51.100.0/24' }]);
    // In use and malformed: the file is there, and the refusal says it is invalid, not gone.
    writeFileSync(path.join(dir, 'p.json'), '{ "mode": ');
    let msg = '';
    try { s.reload(new Set(['p'])); } catch (e) { msg = (e as Error).message; }
    expect(msg).toMatch(/p\.json: not JSON/);
    expect(msg).toMatch(/policy p is in use by a sandbox and its file is invalid/);
    expect(msg).not.toMatch(/gone/);
    rmSync(path.join(dir, 'p.json'));
    expect(() => s.reload(new Set(['p']))).toThrow(/policy p is in use by a sandbox but its file is gone/);
    writeFileSync(path.join(dir, 'p.json'), JSON.stringify({ mode: 'allow', allow: [{ cidr: '198.51.100.0/24' }] }));
    // A symbolic link to a file elsewhere is refused unread: nothing of its content is quoted.
    const secret = path.join(mkdtempSync(path.join(os.tmpdir(), 'dsec-secret-')), 'shadow');
    writeFileSync(secret, 'root:TOPSECRETHASH:19000:0:99999:7:::\n');
    symlinkSync(secret, path.join(dir, 'leak.json'));
    try { s.reload(new Set()); msg = ''; } catch (e) { msg = (e as Error).message; }
    expect(msg).toMatch(/leak\.json: a symbolic link; policy files must be regular files/);
    expect(msg).not.toContain('TOPSECRET');
    expect(msg).not.toContain('root:');
    rmSync(path.join(dir, 'leak.json'));
    rmSync(path.dirname(secret), { recursive: true });
    expect(() => s.require('nope')).toThrow(/unknown network policy "nope"; loaded: p/);
  });
});

describe('built-in denials and policy warnings', () => {
  const ifaces = {
    lo: [{ address: '127.0.0.1', netmask: '255.0.0.0', family: 'IPv4', mac: '00:00:00:00:00:00', internal: true, cidr: '127.0.0.1/8' }],
    eth0: [
      { address: '192.0.2.10', netmask: '255.255.255.0', family: 'IPv4', mac: '02:00:00:00:00:01', internal: false, cidr: '192.0.2.10/24' },
      { address: 'fe80::1', netmask: 'ffff:ffff:ffff:ffff::', family: 'IPv6', mac: '02:00:00:00:00:01', internal: false, cidr: 'fe80::1/64', scopeid: 2 },
    ],
  } as unknown as NodeJS.Dict<os.NetworkInterfaceInfo[]>;
  const subnet = parseSubnet('10.201.0.0/16');
  const denied = builtinDeny(subnet, false, ifaces);

  it('built-in denials: bridge subnet, slirp DNS, link-local metadata, host gateway unless host_loopback, host addresses (not loopback or link-local v6)', () => {
    const texts = denied.map((d) => `${d.prefix.family}/${d.prefix.len}/${d.prefix.bytes.toString('hex')}`);
    expect(texts).toEqual([
      `4/16/${parsePrefix('10.201.0.0/16').bytes.toString('hex')}`, `4/32/${parsePrefix('10.0.2.3/32').bytes.toString('hex')}`,
      `4/16/${parsePrefix('169.254.0.0/16').bytes.toString('hex')}`, `4/32/${parsePrefix('10.0.2.2/32').bytes.toString('hex')}`,
      `4/32/${parsePrefix('192.0.2.10/32').bytes.toString('hex')}`,
    ]);
    expect(denied[4].reason).toMatch(/this host \(eth0\)/);
    expect(builtinDeny(subnet, true, ifaces).some((d) => d.reason.includes('host_loopback'))).toBe(false);
  });

  it('an allow cidr inside a built-in denial never matches: bridge subnet, metadata address, host address, host gateway', () => {
    const w = policyWarnings({ mode: 'allow', allow: [
      { cidr: '10.201.3.0/24' }, { cidr: '169.254.169.254/32', ports: [80] }, { cidr: '192.0.2.10/32' }, { cidr: '10.0.2.2/32' }, { cidr: '198.51.100.0/24' }, { cidr: '10.0.0.0/8' },
    ], deny: [] }, denied);
    expect(w).toEqual([
      expect.stringMatching(/^allow\.0 \(10\.201\.3\.0\/24\) can never match: 10\.201\.0\.0\/16 is the sandbox bridge subnet/),
      expect.stringMatching(/^allow\.1 \(169\.254\.169\.254\/32\) can never match: 169\.254\.0\.0\/16 is link-local addresses, where cloud instance metadata/),
      expect.stringMatching(/^allow\.2 .*an address of this host \(eth0\)/),
      expect.stringMatching(/^allow\.3 \(10\.0\.2\.2\/32\) .*\[network\] host_loopback is off/),
    ]);
    // With host loopback on, the gateway is reachable: no warning for it.
    expect(policyWarnings({ mode: 'allow', allow: [{ cidr: '10.0.2.2/32' }], deny: [] }, builtinDeny(subnet, true, ifaces))).toEqual([]);
  });

  it('an allow rule covered by a deny rule of the policy never matches; partial cover (ports, prefix) is not reported', () => {
    const w = policyWarnings({ mode: 'allow', allow: [
      { cidr: '198.51.100.7/32', ports: [443], protocol: 'tcp' }, { cidr: '198.51.100.0/24', ports: [443] }, { cidr: '203.0.113.5/32', ports: [80] },
      { host: 'a.example.org', ports: [443] }, { host: '*.cdn.example.org' }, { host: 'example.net' },
    ], deny: [{ cidr: '198.51.100.0/25', ports: ['1-1024'] }, { cidr: '203.0.113.0/24', ports: [443] }, { host: '*.example.org' }] }, []);
    expect(w).toEqual([
      'allow.0 (198.51.100.7/32) can never match: deny.0 (198.51.100.0/25) covers it and deny wins over allow',
      'allow.3 (a.example.org) can never match: deny.2 (*.example.org) covers it and deny wins over allow',
      'allow.4 (*.cdn.example.org) can never match: deny.2 (*.example.org) covers it and deny wins over allow',
    ]);
    // A UDP-only deny does not cover a TCP-and-UDP allow.
    expect(policyWarnings({ mode: 'allow', allow: [{ cidr: '198.51.100.7/32', ports: [53] }], deny: [{ cidr: '198.51.100.7/32', ports: [53], protocol: 'udp' }] }, [])).toEqual([]);
  });

  it('an open policy with allow rules is warned about once (and its unreachable cidrs too); the shipped examples have no warnings', () => {
    expect(policyWarnings({ mode: 'open', allow: [{ cidr: '198.51.100.0/24' }, { host: 'x.org' }], deny: [] }, denied)).toEqual([expect.stringMatching(/mode open .* its 2 allow rules take effect only for a sandbox that names this policy with mode allow/)]);
    expect(policyWarnings({ mode: 'open', allow: [{ cidr: '10.201.0.9/32' }], deny: [] }, denied)).toEqual([expect.stringMatching(/^mode open .* its 1 allow rule takes effect/), expect.stringMatching(/^allow\.0 .*bridge subnet/)]);
    const s = new PolicySet([shippedPolicyDir()], () => denied);
    expect(s.loadInitial()).toEqual([]);
    expect(s.report()).toEqual({ shadowed: [], warnings: [] });
  });

  it('a policy of the operator named like a shipped one is reported as shadowing it, at load and at reload; warnings come with the reload', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'dsec-polsh-'));
    try {
      const file = path.join(dir, 'pypi-only.json');
      writeFileSync(file, JSON.stringify({ mode: 'allow', allow: [{ cidr: '169.254.169.254/32' }] }));
      const s = new PolicySet([shippedPolicyDir(), dir], () => denied);
      expect(s.loadInitial()).toEqual([]);
      const sh = [{ name: 'pypi-only', file, shadows: path.join(shippedPolicyDir(), 'pypi-only.json') }];
      expect(s.report().shadowed).toEqual(sh);
      expect(s.report().warnings).toEqual([{ policy: 'pypi-only', file, message: expect.stringMatching(/^allow\.0 .*metadata/) }]);
      expect(s.require('pypi-only').file).toBe(file);
      writeFileSync(path.join(dir, 'mine.json'), JSON.stringify({ mode: 'open', allow: [{ cidr: '198.51.100.0/24' }] }));
      const r = s.reload(new Set());
      expect(r.changed).toEqual(['mine']);
      expect(r.shadowed).toEqual(sh);
      expect(r.warnings.map((w) => w.policy)).toEqual(['mine', 'pypi-only']);
      rmSync(file);
      const r2 = s.reload(new Set());
      expect(r2.shadowed).toEqual([]);
      expect(s.require('pypi-only').file).toBe(path.join(shippedPolicyDir(), 'pypi-only.json'));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('slirp4netns settings', () => {
  it('the argv follows host_loopback; a difference is described in the config\'s words', () => {
    const off = slirpArgv('/run/netns/dsec-x', false), on = slirpArgv('/run/netns/dsec-x', true);
    expect(off).toContain('--disable-host-loopback');
    expect(on).not.toContain('--disable-host-loopback');
    expect(off.at(-2)).toBe('/run/netns/dsec-x');
    expect(slirpArgvDiff(off, off)).toBeNull();
    expect(slirpArgvDiff(off, on)).toBe('host_loopback off -> on');
    expect(slirpArgvDiff(on, off)).toBe('host_loopback on -> off');
    expect(slirpArgvDiff(off.map((a) => (a.startsWith('--mtu=') ? '--mtu=1500' : a)), off)).toBe('arguments ---mtu=1500 +--mtu=65520');
  });
});
