import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { NetworkInput } from '../../sdk/index.js';
import { fakeSandbox, json, runCli, startFakeDsecd, type FakeDsecd } from '../fixtures/fake-dsecd.js';
import { NETWORK_CHANGE_ATTEMPTS, networkRequest, parseRule } from '../../cli/util/network.js';
import { networkRevision } from '../../daemon/model/network.js';
import { formatRule, renderNetwork } from '../../cli/ui/network.js';
import { createRequest } from '../../cli/commands/create.js';

const ID = '0123456789abcdef';

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

describe('dsec network add / rm (against the fake dsecd)', () => {
  let fake: FakeDsecd;
  let stored: NetworkInput | null;
  const view = (n: NetworkInput | null) => ({
    id: ID, mode: n?.mode ?? 'none', policy: n?.policy ?? null, allow: n?.allow ?? [], deny: n?.deny ?? [], address: '10.201.0.2', gateway: '10.201.0.1',
    resolver: '10.201.0.1:53', attached: true, hosts: {}, learned: 0, denied: { connect: 0, sendmsg: 0, sock_create: 0, dns_refused: 0, last: null },
  });
  beforeEach(async () => {
    fake = await startFakeDsecd();
    stored = { mode: 'allow', policy: 'pypi', allow: [{ host: 'pypi.org', ports: [443], protocol: 'tcp' }] };
    fake.routes['GET /v1/sandboxes/:id'] = (req, res) => json(res, 200, fakeSandbox({ id: req.params.id, network: stored }));
    fake.routes['GET /v1/sandboxes/:id/network'] = (_req, res) => json(res, 200, view(stored));
    fake.routes['PUT /v1/sandboxes/:id/network'] = (req, res) => {
      stored = req.body;
      json(res, 200, view(stored));
    };
  });
  afterEach(async () => {
    await fake.close();
  });
  const puts = () => fake.seen.filter((s) => s.method === 'PUT').map((s) => s.body);

  it('add appends to the own rules and keeps the mode, the policy and the rules there (set would replace them)', async () => {
    const r = await runCli(['network', 'add', ID, '--allow', 'files.pythonhosted.org:443/tcp', '--deny', '10.0.0.0/8'], { socket: fake.socketPath });
    expect(r.err).toBe('');
    expect(r.code).toBe(0);
    expect(puts()).toEqual([{
      mode: 'allow', policy: 'pypi',
      allow: [{ host: 'pypi.org', ports: [443], protocol: 'tcp' }, { host: 'files.pythonhosted.org', ports: [443], protocol: 'tcp' }],
      deny: [{ cidr: '10.0.0.0/8' }],
    }]);
    expect(r.out).toMatch(/allow\s+files\.pythonhosted\.org:443\/tcp/);
    expect(r.out).toMatch(/allow\s+pypi\.org:443\/tcp/);
    // A rule it has (host names compare case-insensitively) is not added twice.
    const again = await runCli(['network', 'add', ID, '--allow', 'PyPI.org:443/tcp'], { socket: fake.socketPath });
    expect(again.code).toBe(0);
    expect(again.err).toBe(`dsec: PyPI.org:443/tcp was already a rule of ${ID}\n`);
    expect(puts()[1].allow).toHaveLength(2);
  });

  it('rm removes exactly the rules named; a rule the sandbox does not have changes nothing', async () => {
    stored = { mode: 'allow', allow: [{ host: 'pypi.org', ports: [443], protocol: 'tcp' }, { host: 'files.pythonhosted.org' }], deny: [{ cidr: '10.0.0.0/8' }] };
    const r = await runCli(['--json', 'network', 'rm', ID, '--allow', 'pypi.org:443/tcp', '--deny', '10.0.0.0/8'], { socket: fake.socketPath });
    expect(r.code).toBe(0);
    expect(puts()).toEqual([{ mode: 'allow', allow: [{ host: 'files.pythonhosted.org' }] }]);
    expect(JSON.parse(r.out)).toMatchObject({ id: ID, allow: [{ host: 'files.pythonhosted.org' }], deny: [] });

    const miss = await runCli(['network', 'rm', ID, '--allow', 'pypi.org:443'], { socket: fake.socketPath });
    expect(miss.code).toBe(125);
    expect(miss.err).toMatch(/^dsec: the sandbox has no such rule of its own: --allow pypi\.org:443\nhint: its own rules are: --allow files\.pythonhosted\.org/);
    expect(puts()).toHaveLength(1);
    const none = await runCli(['network', 'add', ID], { socket: fake.socketPath });
    expect(none.err).toMatch(/^dsec: nothing to add/);
  });

  /**
   * The fake with dsecd's optimistic concurrency: GET .../network answers the stored
   * spec's revision, a PUT with a stale `if_revision` is refused with Conflict. The first
   * `readers` reads of the sandbox wait for each other, so that many CLIs have all read
   * the same rules before any writes: the race, every time.
   */
  function withRevisions(readers: number) {
    fake.routes['GET /v1/sandboxes/:id/network'] = (_req, res) => json(res, 200, { ...view(stored), revision: networkRevision(stored) });
    let arrived = 0;
    let release: () => void = () => undefined;
    const all = new Promise<void>((r) => (release = r));
    fake.routes['GET /v1/sandboxes/:id'] = async (req, res) => {
      const snapshot = stored;
      if (++arrived <= readers) {
        if (arrived === readers) release();
        await all;
      }
      json(res, 200, fakeSandbox({ id: req.params.id, network: snapshot }));
    };
    const refused: string[] = [];
    fake.routes['PUT /v1/sandboxes/:id/network'] = (req, res) => {
      const want = req.query.get('if_revision');
      if (want !== null && want !== networkRevision(stored)) {
        refused.push(want);
        return json(res, 409, { error: { code: 'Conflict', message: 'the network changed since it was read' } });
      }
      stored = req.body;
      json(res, 200, { ...view(stored), revision: networkRevision(stored) });
    };
    return refused;
  }

  it('two network add racing on one sandbox both take effect: the write that read stale rules is refused (Conflict) and made again from fresh ones', async () => {
    const refused = withRevisions(2);
    const [a, b] = await Promise.all([
      runCli(['network', 'add', ID, '--allow', 'a.example.org'], { socket: fake.socketPath }),
      runCli(['network', 'add', ID, '--deny', '10.0.0.0/8'], { socket: fake.socketPath }),
    ]);
    expect([a.code, a.err, b.code, b.err]).toEqual([0, '', 0, '']);
    expect(refused).toHaveLength(1);
    expect(stored).toEqual({ mode: 'allow', policy: 'pypi', allow: [{ host: 'pypi.org', ports: [443], protocol: 'tcp' }, { host: 'a.example.org' }], deny: [{ cidr: '10.0.0.0/8' }] });
    // Every write named the revision it was computed from.
    expect(fake.seen.filter((s) => s.method === 'PUT').every((s) => /[?&]if_revision=[0-9a-f]{16}\b/.test(s.url))).toBe(true);
  });

  it('an add and an rm racing: the rule removed stays removed and the rule added stays added', async () => {
    stored = { mode: 'allow', allow: [{ host: 'old.example.org' }] };
    withRevisions(2);
    const [a, r] = await Promise.all([
      runCli(['network', 'add', ID, '--allow', 'new.example.org'], { socket: fake.socketPath }),
      runCli(['network', 'rm', ID, '--allow', 'old.example.org'], { socket: fake.socketPath }),
    ]);
    expect([a.code, a.err, r.code, r.err]).toEqual([0, '', 0, '']);
    expect(stored).toEqual({ mode: 'allow', allow: [{ host: 'new.example.org' }] });
  });

  it('a sandbox whose rules change under every attempt: Conflict after a bounded number of attempts, said as an error', async () => {
    fake.routes['GET /v1/sandboxes/:id/network'] = (_req, res) => json(res, 200, { ...view(stored), revision: '0123456789abcdef' });
    fake.routes['PUT /v1/sandboxes/:id/network'] = (_req, res) => json(res, 409, { error: { code: 'Conflict', message: 'the network of sandbox x changed since it was read' } });
    const r = await runCli(['network', 'add', ID, '--allow', 'a.example.org'], { socket: fake.socketPath });
    expect(r.code).not.toBe(0);
    expect(r.err).toMatch(/changed since it was read/);
    expect(fake.seen.filter((s) => s.method === 'PUT')).toHaveLength(NETWORK_CHANGE_ATTEMPTS);
  });

  it('set still replaces: the rules and the policy not given are dropped', async () => {
    const r = await runCli(['network', 'set', ID, '--allow', 'files.pythonhosted.org:443/tcp'], { socket: fake.socketPath });
    expect(r.code).toBe(0);
    expect(puts()).toEqual([{ mode: 'allow', allow: [{ host: 'files.pythonhosted.org', ports: [443], protocol: 'tcp' }] }]);
  });
});
