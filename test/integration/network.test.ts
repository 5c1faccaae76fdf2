/**
 * Sandbox networking on the real kernel: the instance netns and its uplink, veths,
 * the egress programs and their maps, the sandbox resolver, live policy changes,
 * policy files, stop/start, a dsecd SIGKILL, destroy and purge. No mocks.
 *
 * Traffic stays on this host: servers listen on TEST-NET-2 addresses the test adds to
 * the loopback of the instance's own netns (test/integration/net-helpers.ts); dsecd's
 * own resolution of host rules asks a fake DNS server on the host's 127.0.0.1. The
 * sandbox resolver forwards to a fake upstream inside the instance netns, which records
 * every question, so "never forwarded" is checked against what the upstream really saw.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import type dgram from 'node:dgram';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { IS_ROOT, REPO, TestDaemon, netnsOf, networkTraces, rejection, runCli } from './harness.js';
import { NET, NetnsServer, addTestAddresses, eventsOf, hostNetworkState, probeIn } from './net-helpers.js';
import type { Event } from '../../sdk/index.js';
// @ts-expect-error plain JavaScript fixture without types
import { startDns } from '../fixtures/netns-servers.mjs';

const GW = '10.201.0.1';

/** Host-level events (no sandbox) of one type. */
async function hostEvents(d: TestDaemon, type: string): Promise<Event[]> {
  const out: Event[] = [];
  for await (const e of d.client.events()) if (e.sandbox_id === null && e.type === type) out.push(e);
  return out;
}

/** The argv of a live process. */
function argvOf(pid: number): string[] {
  return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
}

describe.skipIf(!IS_ROOT)('sandbox networking and egress control', () => {
  let d: TestDaemon;
  let policyDir: string;
  let hostDns: dgram.Socket;
  const hostQueries: string[] = [];
  let upstream: NetnsServer;
  const servers: NetnsServer[] = [];
  let hostBefore: Awaited<ReturnType<typeof hostNetworkState>>;
  let baseConfig: string;

  beforeAll(async () => {
    hostBefore = await hostNetworkState();
    policyDir = mkdtempSync(path.join(os.tmpdir(), 'dsec-netpol-'));
    writeFileSync(path.join(policyDir, 'only-pypi.json'), JSON.stringify({ description: 'test', mode: 'allow', allow: [{ cidr: `${NET.pypi}/32`, ports: [443], protocol: 'tcp' }] }));
    hostDns = await startDns('127.0.0.1', 0, { 'pypi.org': [NET.pypi] }, (n: string) => hostQueries.push(n), 300);
    baseConfig = `[network]\nupstream_dns = ["${NET.dns}:53"]\nhost_resolvers = ["127.0.0.1:${hostDns.address().port}"]\npolicy_dir = "${policyDir}"\n`;
    d = await TestDaemon.start({ slot: 30, config: baseConfig });
    // The instance netns comes up with the first allow/open sandbox.
    const first = await d.client.createSandbox({ network: { mode: 'open' } });
    await addTestAddresses(d);
    upstream = await NetnsServer.start(d, 'dns', NET.dns, 53, JSON.stringify({ 'pypi.org': [NET.pypi], 'files.pythonhosted.org': [NET.other], 'other.example': [NET.other] }));
    servers.push(await NetnsServer.start(d, 'tcp', NET.pypi, 443, 'pypi-https'));
    servers.push(await NetnsServer.start(d, 'tcp', NET.pypi, 80, 'pypi-http'));
    servers.push(await NetnsServer.start(d, 'tcp', NET.other, 443, 'other-https'));
    servers.push(await NetnsServer.start(d, 'udp', NET.udp, 9999));
    await d.client.deleteSandbox(first.id, { force: true });
  });

  afterAll(async () => {
    for (const s of [upstream, ...servers]) await s?.stop();
    hostDns?.close();
    await d?.cleanup();
    rmSync(policyDir, { recursive: true, force: true });
  });

  it('lives in a network namespace of the instance: the host keeps ip_forward 0, its interfaces and routes', async () => {
    const sb = await d.client.createSandbox({ network: { mode: 'open' } });
    const during = await hostNetworkState();
    expect(during).toEqual(hostBefore);
    expect(during.ipForward).toBe('0');
    expect((await execa('nsenter', [`--net=/run/netns/${netnsOf(d)}`, '--', 'cat', '/proc/sys/net/ipv4/ip_forward'])).stdout.trim()).toBe('1');
    await d.client.deleteSandbox(sb.id, { force: true });
    expect(await hostNetworkState()).toEqual(hostBefore);
  });

  it('open mode reaches a server; the sandbox has its slot address, a default route and the generated resolv.conf', async () => {
    const sb = await d.client.createSandbox({ network: { mode: 'open' } });
    try {
      const view = await d.client.getNetwork(sb.id);
      expect(view).toMatchObject({ mode: 'open', gateway: GW, resolver: `${GW}:53`, attached: true });
      const out = await probeIn(d, sb.id, `/tmp/p tcp ${NET.other} 443; ip -o -4 addr show dev eth0 | awk '{print $4}'; ip route | grep default; cat /etc/resolv.conf | grep nameserver; /tmp/p dns ${GW} other.example`);
      expect(out).toEqual(['ok other-https', `${view.address}/16`, `default via ${GW} dev eth0`, `nameserver ${GW}`, 'rcode=0', `A ${NET.other}`]);
      // Mode none next to it: loopback only, as before.
      const none = await d.client.createSandbox({});
      expect(await probeIn(d, none.id, `/tmp/p tcp ${NET.other} 443; ls /sys/class/net`)).toEqual(['ENETUNREACH', 'lo']);
      await d.client.deleteSandbox(none.id, { force: true });
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('allow mode allows exactly the listed cidr:port, refuses the rest with EPERM, and reports it in events and stats', async () => {
    const sb = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: `${NET.pypi}/32`, ports: [443], protocol: 'tcp' }, { cidr: `${NET.udp}/32`, ports: [9999], protocol: 'udp' }] } });
    try {
      const out = await probeIn(d, sb.id, [
        `/tmp/p tcp ${NET.pypi} 443`, `/tmp/p tcp ${NET.pypi} 80`, `/tmp/p tcp ${NET.other} 443`, `/tmp/p udp ${NET.pypi} 443`,
        `/tmp/p udp ${NET.udp} 9999`, `/tmp/p udp ${NET.udp} 9998`, `/tmp/p udpc ${NET.udp} 9998`, `/tmp/p tcp ::ffff:${NET.other} 443`, '/tmp/p tcp 127.0.0.1 1',
      ].join('; '));
      expect(out).toEqual(['ok pypi-https', 'EPERM', 'EPERM', 'EPERM', 'ok', 'EPERM', 'EPERM', 'EPERM', 'ECONNREFUSED']);
      const view = await d.client.getNetwork(sb.id);
      expect(view.denied).toMatchObject({ connect: 4, sendmsg: 2, sock_create: 0 });
      expect(view.denied.last).toBe(`[::ffff:${NET.other}]:443/tcp (connect)`);
      const stats = (await d.client.stats()).sandboxes.find((s) => s.id === sb.id)!;
      expect(stats.network_denied).toMatchObject({ connect: 4, sendmsg: 2 });
      const ev = await eventsOf(d, sb.id, 'network.denied');
      expect(ev.length).toBeGreaterThan(0);
      const total = ev.reduce((n, e) => n + Number(/connect=(\d+)/.exec(e.message!)![1]), 0);
      expect(total).toBe(4);
      expect(ev.at(-1)!.message).toContain(`last=[::ffff:${NET.other}]:443/tcp (connect)`);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('direct DNS (53 and 853, TCP and UDP) reaches only the resolver, in allow mode with 0.0.0.0/0 as in open mode; AF_VSOCK is refused in both', async () => {
    const want = { allow: ['rcode=5'], open: ['rcode=0', `A ${NET.other}`] };
    for (const network of [{ mode: 'allow' as const, allow: [{ cidr: '0.0.0.0/0' }, { cidr: '::/0' }] }, { mode: 'open' as const }]) {
      const sb = await d.client.createSandbox({ network });
      try {
        // Without the denial: udp 53 is sent ("ok"), tcp 53 and 853 are refused by the host (ECONNREFUSED).
        const out = await probeIn(d, sb.id, [
          `/tmp/p tcp ${NET.other} 443`, `/tmp/p udp ${NET.dns} 53`, `/tmp/p tcp ${NET.dns} 53`, `/tmp/p udp ${NET.dns} 853`, `/tmp/p tcp ${NET.other} 853`,
          `/tmp/p dns ${GW} other.example`, '/tmp/p sock 40 stream 0',
        ].join('; '));
        // The resolver still answers (allow mode refuses a name no host rule names: rcode 5).
        // AF_VSOCK (40), which no egress program sees, is refused by seccomp in these modes too.
        expect(out, network.mode).toEqual(['ok other-https', 'EPERM', 'EPERM', 'EPERM', 'EPERM', ...want[network.mode], 'EPERM']);
      } finally {
        await d.client.deleteSandbox(sb.id, { force: true });
      }
    }
  });

  it('host rules: dsecd resolves exact names; the resolver answers allowed names (wildcards too, pinned before the answer) and refuses the rest without forwarding', async () => {
    const before = upstream.lines.length;
    const sb = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ host: 'pypi.org', ports: [443] }, { host: '*.pythonhosted.org', ports: [443] }] } });
    try {
      expect(hostQueries).toContain('pypi.org');
      expect((await d.client.getNetwork(sb.id)).hosts).toEqual({ 'pypi.org': [NET.pypi] });
      // Exact name: reachable by address at once (dsecd resolved it), port 80 is not in the rule.
      expect(await probeIn(d, sb.id, `/tmp/p tcp ${NET.pypi} 443; /tmp/p tcp ${NET.pypi} 80`)).toEqual(['ok pypi-https', 'EPERM']);
      // Wildcard: nothing is known before the sandbox asks; the answer's address is allowed by the time the answer arrives.
      expect(await probeIn(d, sb.id, `/tmp/p tcp ${NET.other} 443; /tmp/p dns ${GW} files.pythonhosted.org; /tmp/p tcp ${NET.other} 443`)).toEqual(['EPERM', 'rcode=0', `A ${NET.other}`, 'ok other-https']);
      expect(await probeIn(d, sb.id, `/tmp/p dns ${GW} secret-1234.exfil.example; /tmp/p dns ${GW} other.example`)).toEqual(['rcode=5', 'rcode=5']);
      const asked = upstream.lines.slice(before).map((l) => l.split(' ')[1]);
      expect(asked).toContain('files.pythonhosted.org');
      expect(asked).not.toContain('secret-1234.exfil.example');
      expect(asked).not.toContain('other.example');
      const view = await d.client.getNetwork(sb.id);
      expect(view.learned).toBe(1);
      expect(view.denied.dns_refused).toBe(2);
      const ev = await eventsOf(d, sb.id, 'network.dns_refused');
      expect(ev.map((e) => e.message).join(' ')).toContain('other.example A (not in allow rules)');
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('a live update takes effect at once (rules, allow <-> open); none <-> other is refused; stored and evented', async () => {
    const sb = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: `${NET.pypi}/32`, ports: [443] }] } });
    try {
      expect(await probeIn(d, sb.id, `/tmp/p tcp ${NET.pypi} 443; /tmp/p tcp ${NET.other} 443`)).toEqual(['ok pypi-https', 'EPERM']);
      await d.client.setNetwork(sb.id, { mode: 'allow', allow: [{ cidr: `${NET.other}/32`, ports: [443] }] });
      expect(await probeIn(d, sb.id, `/tmp/p tcp ${NET.pypi} 443; /tmp/p tcp ${NET.other} 443`)).toEqual(['EPERM', 'ok other-https']);
      const open = await d.client.setNetwork(sb.id, { mode: 'open', deny: [{ cidr: `${NET.other}/32` }] });
      expect(open).toMatchObject({ mode: 'open', deny: [{ cidr: `${NET.other}/32` }] });
      expect(await probeIn(d, sb.id, `/tmp/p tcp ${NET.pypi} 443; /tmp/p tcp ${NET.pypi} 80; /tmp/p tcp ${NET.other} 443`)).toEqual(['ok pypi-https', 'ok pypi-http', 'EPERM']);
      expect((await d.client.getSandbox(sb.id)).network).toEqual({ mode: 'open', deny: [{ cidr: `${NET.other}/32` }] });
      const e = await rejection(d.client.setNetwork(sb.id, { mode: 'none' }));
      expect(e.code).toBe('FailedPrecondition');
      expect(e.message).toMatch(/cannot become none while it exists/);
      expect((await eventsOf(d, sb.id, 'network.updated')).length).toBe(2);
      const none = await d.client.createSandbox({});
      expect((await rejection(d.client.setNetwork(none.id, { mode: 'open' }))).code).toBe('FailedPrecondition');
      await d.client.deleteSandbox(none.id, { force: true });
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('if_revision: a write computed from rules read before another change is refused with Conflict and changes nothing; with the current revision it goes through', async () => {
    const sb = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: `${NET.pypi}/32`, ports: [443] }] } });
    try {
      const r0 = (await d.client.getNetwork(sb.id)).revision;
      expect(r0).toMatch(/^[0-9a-f]{16}$/);
      // Someone else adds a rule after r0 was read.
      const other = await d.client.setNetwork(sb.id, { mode: 'allow', allow: [{ cidr: `${NET.pypi}/32`, ports: [443] }, { cidr: `${NET.other}/32`, ports: [443] }] }, { ifRevision: r0 });
      expect(other.revision).not.toBe(r0);
      // The stale write (computed from r0) is refused, and the other change stays.
      const e = await rejection(d.client.setNetwork(sb.id, { mode: 'allow', allow: [{ cidr: `${NET.pypi}/32`, ports: [443, 80] }] }, { ifRevision: r0 }));
      expect(e.code).toBe('Conflict');
      expect(e.message).toMatch(/changed since it was read/);
      expect((await d.client.getSandbox(sb.id)).network?.allow).toHaveLength(2);
      expect(await probeIn(d, sb.id, `/tmp/p tcp ${NET.other} 443`)).toEqual(['ok other-https']);
      expect((await d.client.getNetwork(sb.id)).revision).toBe(other.revision);
      // A malformed revision is bad input.
      expect((await rejection(d.client.setNetwork(sb.id, { mode: 'allow' }, { ifRevision: 'x' }))).code).toBe('InvalidArgument');
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('named policies: applied at create, reload refuses a malformed file (the previous version stays in force), a good change is re-applied live', async () => {
    const sb = await d.client.createSandbox({ network: { policy: 'only-pypi' } });
    const shadow = path.join(policyDir, 'pypi-only.json');
    try {
      expect((await d.client.getSandbox(sb.id)).network).toEqual({ mode: 'allow', policy: 'only-pypi' });
      expect(await probeIn(d, sb.id, `/tmp/p tcp ${NET.pypi} 443; /tmp/p tcp ${NET.other} 443`)).toEqual(['ok pypi-https', 'EPERM']);
      const file = path.join(policyDir, 'only-pypi.json');
      writeFileSync(file, JSON.stringify({ mode: 'allow', allow: [{ cidr: `${NET.other}/32`, ports: ['443-80'] }] }));
      const e = await rejection(d.client.reloadNetworkPolicies());
      expect(e.code).toBe('InvalidArgument');
      expect(e.message).toContain(`${file}: allow.0: port range "443-80"`);
      expect(await probeIn(d, sb.id, `/tmp/p tcp ${NET.pypi} 443; /tmp/p tcp ${NET.other} 443`)).toEqual(['ok pypi-https', 'EPERM']);
      writeFileSync(file, JSON.stringify({ mode: 'allow', allow: [{ cidr: `${NET.other}/32`, ports: [443] }] }));
      const r = await d.client.reloadNetworkPolicies();
      expect(r.changed).toEqual(['only-pypi']);
      expect(r.reapplied).toEqual([sb.id]);
      expect(await probeIn(d, sb.id, `/tmp/p tcp ${NET.pypi} 443; /tmp/p tcp ${NET.other} 443`)).toEqual(['EPERM', 'ok other-https']);
      expect([r.shadowed, r.warnings, r.modes]).toEqual([[], [], []]);
      // The policy's mode flips to open, and an operator file hides the shipped pypi-only with an allow rule no sandbox can use.
      writeFileSync(file, JSON.stringify({ mode: 'open', allow: [{ cidr: `${NET.other}/32`, ports: [443] }] }));
      writeFileSync(shadow, JSON.stringify({ mode: 'allow', allow: [{ cidr: '169.254.169.254/32', ports: [80] }] }));
      const r2 = await d.client.reloadNetworkPolicies();
      expect(r2.changed).toEqual(['only-pypi', 'pypi-only']);
      expect(r2.shadowed).toEqual([{ name: 'pypi-only', file: shadow, shadows: path.join(REPO, 'daemon/security/profiles/network/pypi-only.json') }]);
      expect(r2.warnings).toEqual([
        { policy: 'only-pypi', file, message: expect.stringMatching(/^mode open allows every destination that is not denied/) },
        { policy: 'pypi-only', file: shadow, message: expect.stringMatching(/^allow\.0 \(169\.254\.169\.254\/32\) can never match: 169\.254\.0\.0\/16 is link-local addresses, where cloud instance metadata/) },
      ]);
      // The sandbox keeps the mode settled at its create: still allow-listed, not opened up by the reload.
      expect(r2.modes).toEqual([{ id: sb.id, policy: 'only-pypi', mode: 'allow', policy_mode: 'open', changed: false }]);
      expect(await probeIn(d, sb.id, `/tmp/p tcp ${NET.pypi} 443; /tmp/p tcp ${NET.other} 443`)).toEqual(['EPERM', 'ok other-https']);
      expect((await eventsOf(d, sb.id, 'network.policy_mode_changed')).map((e) => e.message)).toEqual([expect.stringContaining('keeps mode allow')]);
      expect((await hostEvents(d, 'network.policies_reloaded')).at(-1)!.message).toMatch(/shadowed=pypi-only warnings=2 \(only-pypi,pypi-only\) mode_changed=.*:kept-allow/);
      expect((await d.client.listNetworkPolicies()).map((p) => p.name)).toEqual(expect.arrayContaining(['block-package-proxies', 'only-pypi', 'pypi-only']));
      const bad = await rejection(d.client.createSandbox({ network: { policy: 'no-such-policy' } }));
      expect(bad.message).toMatch(/unknown network policy "no-such-policy"/);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
      rmSync(shadow, { force: true });
      writeFileSync(path.join(policyDir, 'only-pypi.json'), JSON.stringify({ mode: 'allow', allow: [{ cidr: `${NET.pypi}/32`, ports: [443], protocol: 'tcp' }] }));
      await d.client.reloadNetworkPolicies();
    }
  });

  it('stop and start: the new container gets the same address and policy in its new netns; stopped sandboxes hold no veth', async () => {
    const sb = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: `${NET.pypi}/32`, ports: [443] }] } });
    try {
      const addr = (await d.client.getNetwork(sb.id)).address;
      await d.client.stopSandbox(sb.id, { timeoutMs: 0 });
      expect((await networkTraces(d)).veths).toEqual([]);
      expect((await d.client.getNetwork(sb.id)).attached).toBe(false);
      await d.client.startSandbox(sb.id);
      expect((await d.client.getNetwork(sb.id)).address).toBe(addr);
      expect(await probeIn(d, sb.id, `/tmp/p tcp ${NET.pypi} 443; /tmp/p tcp ${NET.other} 443`)).toEqual(['ok pypi-https', 'EPERM']);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('after dsecd is SIGKILLed and restarted: address, programs, policy, learned addresses, resolver back; slirp4netns adopted', async () => {
    const sb = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: `${NET.pypi}/32`, ports: [443] }, { host: '*.pythonhosted.org', ports: [443] }] } });
    const other = await d.client.createSandbox({ network: { mode: 'open', deny: [{ cidr: `${NET.pypi}/32` }] } });
    try {
      expect(await probeIn(d, sb.id, `/tmp/p dns ${GW} files.pythonhosted.org; /tmp/p tcp ${NET.other} 443`)).toEqual(['rcode=0', `A ${NET.other}`, 'ok other-https']);
      const slirp = (await networkTraces(d)).slirp;
      expect(slirp).not.toBeNull();
      // Let the pins writer record the learned address (it writes at most once a second).
      const pins = path.join(d.root, 'net', 'pins', `${sb.id}.json`);
      while (!existsSync(pins)) await new Promise((r) => setTimeout(r, 100));
      expect(await probeIn(d, sb.id, `/tmp/p dns ${GW} other.example`)).toEqual(['rcode=5']);
      const view = await d.client.getNetwork(sb.id);
      expect(view.denied.dns_refused).toBe(1);
      await d.kill9();
      await d.launch();
      expect((await networkTraces(d)).slirp).toBe(slirp);
      // The refusal shown before the SIGKILL is still counted: counters never go down across a restart.
      expect(await d.client.getNetwork(sb.id)).toMatchObject({ address: view.address, attached: true, learned: 1, denied: { dns_refused: 1, connect: view.denied.connect } });
      expect(await probeIn(d, sb.id, `/tmp/p tcp ${NET.other} 443; /tmp/p tcp ${NET.pypi} 443; /tmp/p tcp ${NET.pypi} 80; /tmp/p dns ${GW} pypi.org`))
        .toEqual(['ok other-https', 'ok pypi-https', 'EPERM', 'rcode=5']);
      expect((await d.client.stats()).sandboxes.find((s) => s.id === sb.id)!.network_denied).toMatchObject({ dns_refused: 2, connect: view.denied.connect + 1 });
      // Only the refusal made after the restart is evented again (reading the network flushes pending events).
      expect((await d.client.getNetwork(sb.id)).denied.dns_refused).toBe(2);
      const refusedEvents = (await eventsOf(d, sb.id, 'network.dns_refused')).map((e) => Number(/refused=(\d+)/.exec(e.message!)![1]));
      expect(refusedEvents.reduce((a, b) => a + b, 0)).toBe(2);
      expect(await probeIn(d, other.id, `/tmp/p tcp ${NET.other} 443; /tmp/p tcp ${NET.pypi} 443; /tmp/p dns ${GW} other.example`))
        .toEqual(['ok other-https', 'EPERM', 'rcode=0', `A ${NET.other}`]);
      expect((await d.client.getSandbox(sb.id)).defences).toMatchObject({ egress_policy: { enforced: true }, dns_policy: { enforced: true }, network_namespace: { enforced: true } });
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
      await d.client.deleteSandbox(other.id, { force: true });
    }
  });

  it('the uplink follows [network] across restarts (host_loopback), and a killed slirp4netns, started or adopted, is restarted with egress through it working again', async () => {
    // The only host service: a TCP server on the host's 127.0.0.1, reached through slirp4netns's gateway 10.0.2.2 when host loopback is on.
    const hostServer = net.createServer((c) => c.end('host-loopback-service\n'));
    await new Promise<void>((r) => hostServer.listen(0, '127.0.0.1', () => r()));
    const hostPort = (hostServer.address() as net.AddressInfo).port;
    const sb = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: '10.0.2.2/32', ports: [hostPort] }] } });
    const restarts = async () => (await hostEvents(d, 'network.uplink_restarted')).map((e) => e.message!);
    /** Waits for the n-th uplink_restarted event of this daemon's log (the check runs every second). */
    const restartedTimes = async (n: number) => {
      while ((await restarts()).length < n) await new Promise((r) => setTimeout(r, 100));
    };
    try {
      const first = (await networkTraces(d)).slirp!;
      expect(argvOf(first)).toContain('--disable-host-loopback');
      expect(await probeIn(d, sb.id, `/tmp/p tcp 10.0.2.2 ${hostPort}`)).toEqual(['EPERM']);
      const n0 = (await restarts()).length;
      // Config change between runs: the live slirp4netns is not adopted with stale settings.
      d.setConfig(`${baseConfig}host_loopback = true\n`);
      await d.restart();
      const second = (await networkTraces(d)).slirp!;
      expect(second).not.toBe(first);
      expect(argvOf(second)).not.toContain('--disable-host-loopback');
      expect((await restarts()).slice(n0)).toEqual([expect.stringContaining('host_loopback off -> on')]);
      expect(await probeIn(d, sb.id, `/tmp/p tcp 10.0.2.2 ${hostPort}`)).toEqual(['ok host-loopback-service']);
      // Killed while it is this dsecd's child: seen at its exit.
      process.kill(second, 'SIGKILL');
      await restartedTimes(n0 + 2);
      const third = (await networkTraces(d)).slirp!;
      expect([third === second, third === null]).toEqual([false, false]);
      expect((await restarts()).at(-1)).toBe(`slirp4netns ${second} was not running; started ${third}`);
      expect(await probeIn(d, sb.id, `/tmp/p tcp 10.0.2.2 ${hostPort}`)).toEqual(['ok host-loopback-service']);
      // Adopted by a restarted dsecd (not its child), then killed: seen by the periodic check.
      await d.restart();
      expect((await networkTraces(d)).slirp).toBe(third);
      expect((await restarts()).length).toBe(n0 + 2);
      process.kill(third, 'SIGKILL');
      await restartedTimes(n0 + 3);
      const fourth = (await networkTraces(d)).slirp!;
      expect([fourth === third, fourth === null]).toEqual([false, false]);
      expect(await probeIn(d, sb.id, `/tmp/p tcp 10.0.2.2 ${hostPort}`)).toEqual(['ok host-loopback-service']);
      expect(await hostNetworkState()).toEqual(hostBefore);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
      hostServer.close();
      d.setConfig(baseConfig);
      await d.restart();
    }
    // And back: host loopback off again, the gateway denied again.
    const back = (await networkTraces(d)).slirp!;
    expect(argvOf(back)).toContain('--disable-host-loopback');
    expect((await restarts()).at(-1)).toContain('host_loopback on -> off');
  });

  it('the CLI: create with network flags, show, set, add, rm, policies, and errors with hints', async () => {
    const c = await runCli(d, ['--json', 'create', '--allow', `${NET.pypi}:443/tcp`]);
    expect(c.code, c.stderr).toBe(0);
    const id = JSON.parse(c.stdout).id as string;
    try {
      expect(JSON.parse(c.stdout).network).toEqual({ mode: 'allow', allow: [{ cidr: NET.pypi, ports: [443], protocol: 'tcp' }] });
      const show = await runCli(d, ['network', 'show', id]);
      expect(show.stdout).toMatch(/mode\s+allow/);
      expect(show.stdout).toMatch(new RegExp(`allow\\s+${NET.pypi.replace(/\./g, '\\.')}:443/tcp`));
      const set = await runCli(d, ['--json', 'network', 'set', id, '--allow', `${NET.other}:443`]);
      expect(set.code, set.stderr).toBe(0);
      expect(JSON.parse(set.stdout)).toMatchObject({ mode: 'allow', allow: [{ cidr: NET.other, ports: [443] }] });
      expect(await probeIn(d, id, `/tmp/p tcp ${NET.other} 443`)).toEqual(['ok other-https']);
      // add keeps the rule there and adds one; rm takes one away and keeps the other; both at once.
      const add = await runCli(d, ['--json', 'network', 'add', id, '--allow', `${NET.pypi}:443/tcp`]);
      expect(add.code, add.stderr).toBe(0);
      expect(JSON.parse(add.stdout).allow).toEqual([{ cidr: NET.other, ports: [443] }, { cidr: NET.pypi, ports: [443], protocol: 'tcp' }]);
      expect(await probeIn(d, id, `/tmp/p tcp ${NET.pypi} 443; /tmp/p tcp ${NET.other} 443`)).toEqual(['ok pypi-https', 'ok other-https']);
      const rm = await runCli(d, ['--json', 'network', 'rm', id, '--allow', `${NET.other}:443`]);
      expect(rm.code, rm.stderr).toBe(0);
      expect(JSON.parse(rm.stdout).allow).toEqual([{ cidr: NET.pypi, ports: [443], protocol: 'tcp' }]);
      expect(await probeIn(d, id, `/tmp/p tcp ${NET.pypi} 443; /tmp/p tcp ${NET.other} 443`)).toEqual(['ok pypi-https', 'EPERM']);
      const bad = await runCli(d, ['network', 'set', id, '--network', 'none']);
      expect(bad.code).toBe(125);
      expect(bad.stderr).toMatch(/cannot become none while it exists/);
      const deny = await runCli(d, ['create', '--deny', 'pypi.org']);
      expect(deny.code).toBe(125);
      expect(deny.stderr).toMatch(/--deny needs a network mode[\s\S]*hint: add --network open/);
      const pols = await runCli(d, ['network', 'policies']);
      expect(pols.stdout).toMatch(/block-package-proxies\s+open\s+0\s+43/);
    } finally {
      await d.client.deleteSandbox(id, { force: true });
    }
  });

  it('snapshots keep the network: a restore gets the same rules (or the ones it asks for)', async () => {
    const sb = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: `${NET.pypi}/32`, ports: [443] }] } });
    const snap = await d.client.snapshot(sb.id);
    await d.client.deleteSandbox(sb.id, { force: true });
    const r1 = await d.client.restore(snap.id);
    const r2 = await d.client.restore(snap.id, { network: { mode: 'open' } });
    try {
      expect(r1.network).toEqual({ mode: 'allow', allow: [{ cidr: `${NET.pypi}/32`, ports: [443] }] });
      expect(await probeIn(d, r1.id, `/tmp/p tcp ${NET.pypi} 443; /tmp/p tcp ${NET.other} 443`)).toEqual(['ok pypi-https', 'EPERM']);
      expect(await probeIn(d, r2.id, `/tmp/p tcp ${NET.other} 443`)).toEqual(['ok other-https']);
    } finally {
      await d.client.deleteSandbox(r1.id, { force: true });
      await d.client.deleteSandbox(r2.id, { force: true });
      await d.client.deleteSnapshot(snap.id);
    }
  });

  it('a create killed after its network was attached is rolled back at restart without leaving a veth or map entries', async () => {
    await d.stop();
    await d.launch({ DSEC_FAILPOINT: 'create.after-agent' });
    await d.client.createSandbox({ network: { mode: 'allow', allow: [{ cidr: `${NET.pypi}/32` }] } }).catch(() => {});
    await d.waitExit();
    expect((await networkTraces(d)).veths.length).toBe(1);
    await d.launch();
    expect((await networkTraces(d)).veths).toEqual([]);
    for (const m of ['egress_conf', 'egress_allow4', 'egress_deny4']) {
      const r = await execa('bpftool', ['-j', 'map', 'dump', 'pinned', path.join(d.root, 'bpf', 'egress', m)]);
      expect(JSON.parse(String(r.stdout)), m).toEqual([]);
    }
    expect((await d.traces()).rows).toEqual([]);
  });

  it('destroy leaves no veth, no map entries, no learned-address file; purge removes the netns and slirp4netns', async () => {
    const sb = await d.client.createSandbox({ network: { mode: 'allow', allow: [{ host: 'pypi.org' }] } });
    await d.client.deleteSandbox(sb.id, { force: true });
    const t = await networkTraces(d);
    expect(t.veths).toEqual([]);
    for (const m of ['egress_conf', 'egress_counters', 'egress_allow4', 'egress_deny4', 'egress_allow6', 'egress_deny6']) {
      const r = await execa('bpftool', ['-j', 'map', 'dump', 'pinned', path.join(d.root, 'bpf', 'egress', m)]);
      expect(JSON.parse(String(r.stdout)), m).toEqual([]);
    }
    expect(existsSync(path.join(d.root, 'net', 'pins', `${sb.id}.json`))).toBe(false);
    const left = await d.traces();
    expect([left.mounts, left.cgroups, left.runtime, left.dirs, left.rows]).toEqual([[], [], [], [], []]);
    const slirp = t.slirp!;
    for (const s of [upstream, ...servers]) await s.stop();
    await d.stop();
    const r = await execa(path.join(REPO, 'bin/dsecd'), ['--root', d.root, '--socket', d.socket, '--config', path.join(d.root, 'dsecd.toml'), '--purge'], { reject: false, env: { DSEC_LOG_LEVEL: 'warn' } });
    expect(r.exitCode, r.stderr).toBe(0);
    expect(await networkTraces(d)).toEqual({ netns: false, slirp: null, veths: [] });
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(path.join(d.root, 'bpf'));
    expect(slirp).toBeGreaterThan(0);
  });
});
