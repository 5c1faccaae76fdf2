import { describe, expect, it } from 'vitest';
import { networkRequest, parseRule } from '../../cli/util/network.js';
import { formatRule, renderNetwork } from '../../cli/ui/network.js';
import { createRequest } from '../../cli/commands/create.js';

describe('dsec network flags', () => {
  it('parses DEST[:PORTS][/PROTO] for CIDRs, addresses, host names and bracketed IPv6', () => {
    expect(parseRule('10.0.0.0/8')).toEqual({ cidr: '10.0.0.0/8' });
    expect(parseRule('10.0.0.0/8:443,8000-8080/tcp')).toEqual({ cidr: '10.0.0.0/8', ports: [443, '8000-8080'], protocol: 'tcp' });
    expect(parseRule('pypi.org:443')).toEqual({ host: 'pypi.org', ports: [443] });
    expect(parseRule('*.pythonhosted.org/udp')).toEqual({ host: '*.pythonhosted.org', protocol: 'udp' });
    expect(parseRule('2001:db8::/32')).toEqual({ cidr: '2001:db8::/32' });
    expect(parseRule('[2001:db8::/32]:53/udp')).toEqual({ cidr: '2001:db8::/32', ports: [53], protocol: 'udp' });
    expect(() => parseRule('pypi.org:http')).toThrow(/invalid port "http"/);
    expect(() => parseRule('[::1')).toThrow(/unclosed \[/);
    expect(() => parseRule(':443')).toThrow(/names no destination/);
  });
  it('--allow implies mode allow; --deny alone needs a mode; a policy brings its own', () => {
    expect(networkRequest({ allow: [{ host: 'pypi.org' }] })).toEqual({ mode: 'allow', allow: [{ host: 'pypi.org' }] });
    expect(() => networkRequest({ deny: [{ host: 'pypi.org' }] })).toThrow(/--deny needs a network mode/);
    expect(networkRequest({ networkPolicy: 'block-package-proxies' })).toEqual({ policy: 'block-package-proxies' });
    expect(networkRequest({})).toBeUndefined();
    expect(createRequest({ network: 'open', deny: [{ cidr: '10.0.0.0/8' }] }).network).toEqual({ mode: 'open', deny: [{ cidr: '10.0.0.0/8' }] });
  });
  it('renders rules the way the flags write them, and a network view', () => {
    expect(formatRule({ cidr: '2001:db8::/32', ports: [53], protocol: 'udp' })).toBe('[2001:db8::/32]:53/udp');
    const text = renderNetwork({
      id: 'x', mode: 'allow', policy: null, allow: [{ host: 'pypi.org', ports: [443] }, { host: '*.pythonhosted.org' }], deny: [], address: '10.201.0.2', gateway: '10.201.0.1',
      resolver: '10.201.0.1:53', attached: true, hosts: { 'pypi.org': ['192.0.2.1'] }, learned: 0, denied: { connect: 1, sendmsg: 0, sock_create: 0, dns_refused: 2, last: '192.0.2.9:80/tcp (connect)' },
    });
    expect(text).toContain('connect=1 sendmsg=0 sock_create=0 dns_refused=2');
    expect(text).toMatch(/allow\s+pypi\.org:443\s+192\.0\.2\.1/);
    expect(text).toMatch(/allow\s+\*\.pythonhosted\.org\s+\(from DNS answers\)/);
  });
});
