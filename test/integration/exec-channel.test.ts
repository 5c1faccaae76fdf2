/**
 * The exec channel (GET /v1/sandboxes/{id}/exec/channel, daemon/api/routes/exec-channel.ts)
 * against a real dsecd and sandbox: its answers are POST .../exec's, many requests in
 * flight are answered by id, errors are per request, protocol violations close it, a
 * client that stops reading holds dsecd at the in-flight bound, and over the TCP door it
 * is authenticated, scoped to the tenant and audited per request.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import WebSocket from 'ws';
import { DsecClient } from '../../sdk/index.js';
import { CHANNEL_AUDIT_ACTION } from '../../daemon/api/routes/exec-channel.js';
import { MAX_IN_FLIGHT } from '../../daemon/api/channel.js';
import { IS_ROOT, TestDaemon } from './harness.js';
import { auditLines, makeToken } from './remote-helpers.js';
import { waitFor } from '../fixtures/agent.js';

/** A raw WebSocket to the channel on the socket; messages collected in `got`. */
async function rawChannel(d: TestDaemon, sb: string): Promise<{ ws: WebSocket; got: Array<Record<string, unknown>>; closed: Promise<number> }> {
  const ws = new WebSocket(`ws+unix://${d.socket}:/v1/sandboxes/${sb}/exec/channel`);
  const got: Array<Record<string, unknown>> = [];
  ws.on('message', (m) => got.push(JSON.parse(String(m))));
  const closed = new Promise<number>((r) => ws.on('close', (code) => r(code)));
  await new Promise((r, j) => {
    ws.once('open', r);
    ws.once('error', j);
  });
  return { ws, got, closed };
}

describe.skipIf(!IS_ROOT)('exec channel', () => {
  let d: TestDaemon;
  let sb: string;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 47, listen: true });
    sb = (await d.client.createSandbox({ image: 'busybox' })).id;
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('answers as POST .../exec does: status, output, stdin, env, cwd, timeout, trajectory steps', async () => {
    const ch = d.client.execChannel(sb);
    await ch.opened;
    const cmd = { argv: ['sh', '-c', 'cat; echo "$X $(pwd)"; echo oops >&2; exit 3'], stdin: 'in\n', env: { X: 'ex' }, cwd: '/tmp' };
    const [viaChannel, viaHttp] = await Promise.all([ch.exec(cmd), d.client.exec(sb, cmd)]);
    for (const r of [viaChannel, viaHttp]) {
      expect(r.stdout.toString()).toBe('in\nex /tmp\n');
      expect(r.stderr.toString()).toBe('oops\n');
      expect(r.exit_code).toBe(3);
    }
    expect(Object.keys(viaChannel).sort()).toEqual(Object.keys(viaHttp).sort());
    const slow = await ch.exec({ argv: ['sleep', '5'], timeoutMs: 200 });
    expect(slow.timed_out).toBe(true);
    expect(slow.signal).toBe('SIGKILL');
    // A trajectory step is recorded once and replayed after, on the channel as on HTTP.
    const step = { argv: ['sh', '-c', 'echo $$ >> /tmp/steps; wc -l < /tmp/steps'], trajectory: 'chan-traj', step: 0 };
    const first = await ch.exec(step);
    const again = await ch.exec(step);
    expect(again.replayed).toBe(true);
    expect(again.stdout.toString()).toBe(first.stdout.toString());
    expect((await d.client.exec(sb, { argv: ['wc', '-l', '/tmp/steps'] })).stdout.toString()).toMatch(/^1 /);
    ch.close();
  });

  it('runs requests side by side and answers each by its id, in the order they finish', async () => {
    const ch = d.client.execChannel(sb);
    await d.client.exec(sb, { argv: ['rm', '-f', '/tmp/order-gate'] });
    const slow = ch.exec({ argv: ['sh', '-c', 'while [ ! -e /tmp/order-gate ]; do sleep 0.05; done; echo slow'] });
    const fast = await Promise.all(Array.from({ length: 8 }, (_, i) => ch.exec({ argv: ['echo', `fast-${i}`] })));
    expect(fast.map((r) => r.stdout.toString())).toEqual(Array.from({ length: 8 }, (_, i) => `fast-${i}\n`));
    expect(ch.inFlight).toBe(1); // the first one still waits for its gate after all eight answered
    await d.client.exec(sb, { argv: ['touch', '/tmp/order-gate'] });
    expect((await slow).stdout.toString()).toBe('slow\n');
    ch.close();
  });

  it('errors are per request: a bad request or a stopped sandbox refuses that one, the channel stays usable', async () => {
    const ch = d.client.execChannel(sb);
    await expect(ch.exec({ argv: [] })).rejects.toMatchObject({ code: 'InvalidArgument' });
    await expect(ch.exec({ argv: ['true'], cwd: 'relative' })).rejects.toMatchObject({ code: 'InvalidArgument' });
    expect((await ch.exec({ argv: ['true'] })).exit_code).toBe(0);
    const other = (await d.client.createSandbox({ image: 'busybox' })).id;
    const ch2 = d.client.execChannel(other);
    await ch2.opened;
    await d.client.pauseSandbox(other);
    await expect(ch2.exec({ argv: ['true'] })).rejects.toMatchObject({ code: 'FailedPrecondition' });
    await d.client.resumeSandbox(other);
    expect((await ch2.exec({ argv: ['true'] })).exit_code).toBe(0);
    await d.client.deleteSandbox(other, { force: true });
    await expect(ch2.exec({ argv: ['true'] })).rejects.toMatchObject({ code: 'NotFound' });
    ch2.close();
    await expect(ch2.exec({ argv: ['true'] })).rejects.toMatchObject({ code: 'Unavailable' });
    ch.close();
  });

  it('an unknown sandbox is refused at the handshake', async () => {
    const ch = d.client.execChannel('0123456789abcdef');
    await expect(ch.opened).rejects.toMatchObject({ code: 'NotFound' });
    await expect(ch.exec({ argv: ['true'] })).rejects.toMatchObject({ code: 'NotFound' });
  });

  it('protocol violations are answered with id null and close the channel with 1008', async () => {
    const bad: Array<string | Buffer> = [
      'not json',
      '[1,2]',
      JSON.stringify({ request: { argv: ['true'] } }),
      JSON.stringify({ id: 'x'.repeat(129), request: { argv: ['true'] } }),
      JSON.stringify({ id: 1.5, request: { argv: ['true'] } }),
      '{"id":1,"request":{"argv":["true"],"env":{"__proto__":{"polluted":"1"}}}}',
      '{"id":1,"request":{"argv":["true"],"env":{"\\u005f_proto__":{"polluted":"1"}}}}',
      Buffer.from([1, 2, 3]),
    ];
    for (const m of bad) {
      const c = await rawChannel(d, sb);
      c.ws.send(m);
      expect(await c.closed, String(m)).toBe(1008);
      expect(c.got, String(m)).toHaveLength(1);
      expect(c.got[0]).toMatchObject({ id: null, error: { code: 'InvalidArgument' } });
    }
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    // A duplicate id in flight is a violation too; the first request still runs to its end.
    const c = await rawChannel(d, sb);
    c.ws.send(JSON.stringify({ id: 'a', request: { argv: ['sh', '-c', 'sleep 0.5; echo > /tmp/dup-ran'] } }));
    c.ws.send(JSON.stringify({ id: 'a', request: { argv: ['true'] } }));
    expect(await c.closed).toBe(1008);
    expect(c.got[0]).toMatchObject({ id: null, error: { code: 'InvalidArgument', message: expect.stringMatching(/already in flight/) } });
    let ran = false;
    for (let i = 0; i < 200 && !ran; i++) {
      ran = (await d.client.exec(sb, { argv: ['test', '-e', '/tmp/dup-ran'] })).exit_code === 0;
      if (!ran) await new Promise((r) => setTimeout(r, 100));
    }
    expect(ran).toBe(true);
    // An unknown key beside id and request refuses that request only.
    const k = await rawChannel(d, sb);
    k.ws.send(JSON.stringify({ id: 7, request: { argv: ['true'] }, extra: 1 }));
    await waitFor('the answer', () => k.got.length === 1);
    expect(k.got[0]).toMatchObject({ id: 7, error: { code: 'InvalidArgument' } });
    k.ws.send(JSON.stringify({ id: 8, request: { argv: ['true'] } }));
    await waitFor('the second answer', () => k.got.length === 2);
    expect(k.got[1]).toMatchObject({ id: 8, result: { exit_code: 0 } });
    k.ws.close();
  });

  it(`runs at most ${MAX_IN_FLIGHT} requests at once; the rest wait and all are answered`, async () => {
    const c = await rawChannel(d, sb);
    // Each request records that it started, then waits for a file the test makes.
    await d.client.exec(sb, { argv: ['sh', '-c', 'rm -rf /tmp/gate /tmp/started; mkdir /tmp/started'] });
    const n = MAX_IN_FLIGHT + 8;
    for (let i = 0; i < n; i++) {
      c.ws.send(JSON.stringify({ id: i, request: { argv: ['sh', '-c', `touch /tmp/started/${i}; while [ ! -e /tmp/gate ]; do sleep 0.05; done`] } }));
    }
    const started = async () => Number((await d.client.exec(sb, { argv: ['sh', '-c', 'ls /tmp/started | wc -l'] })).stdout.toString().trim());
    let s = 0;
    for (let i = 0; i < 100 && s < MAX_IN_FLIGHT; i++) {
      s = await started();
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(s).toBe(MAX_IN_FLIGHT);
    // Settled there: no more start while the first ones wait.
    await new Promise((r) => setTimeout(r, 500));
    expect(await started()).toBe(MAX_IN_FLIGHT);
    await d.client.exec(sb, { argv: ['touch', '/tmp/gate'] });
    await waitFor('every answer', () => c.got.length === n);
    expect(new Set(c.got.map((m) => m.id)).size).toBe(n);
    expect(c.got.every((m) => (m.result as { exit_code?: number })?.exit_code === 0)).toBe(true);
    c.ws.close();
  });

  it('over the TCP door: another tenant gets NotFound, a reader PermissionDenied, each request is audited', async () => {
    const ca = readFileSync(d.caFile);
    const remote = (token: string) => new DsecClient({ remote: { url: `https://127.0.0.1:${d.remotePort}`, token, ca } });
    const owner = await makeToken(d, 'chan-a', 'user');
    const otherTenant = await makeToken(d, 'chan-b', 'user');
    const reader = await makeToken(d, 'chan-a', 'reader');
    const mine = (await remote(owner.token).createSandbox({ image: 'busybox' })).id;
    const ch = remote(owner.token).execChannel(mine);
    expect((await ch.exec({ argv: ['echo', 'over tls'] })).stdout.toString()).toBe('over tls\n');
    await expect(ch.exec({ argv: [] })).rejects.toMatchObject({ code: 'InvalidArgument' });
    ch.close();
    await expect(remote(otherTenant.token).execChannel(mine).opened).rejects.toMatchObject({ code: 'NotFound' });
    await expect(remote(reader.token).execChannel(mine).opened).rejects.toMatchObject({ code: 'PermissionDenied' });
    await expect(remote('e2b_' + 'f'.repeat(48)).execChannel(mine).opened).rejects.toMatchObject({ code: 'Unauthenticated' });
    let lines: Array<Record<string, unknown>> = [];
    await waitFor('the audit lines', () => {
      lines = auditLines(d);
      return lines.filter((x) => x.action === CHANNEL_AUDIT_ACTION && x.token === owner.id).length >= 2;
    });
    const mineLines = lines.filter((x) => x.token === owner.id && String(x.action).includes('/exec/channel'));
    expect(mineLines[0]).toMatchObject({ action: 'GET /v1/sandboxes/:id/exec/channel', result: 101, tenant: 'chan-a', object: { id: mine } });
    expect(mineLines.filter((x) => x.action === CHANNEL_AUDIT_ACTION).map((x) => [x.result, x.error])).toEqual([[200, null], [400, 'InvalidArgument']]);
    // A command still running when its channel closes is audited at the close (499), once.
    const quitter = await makeToken(d, 'chan-a', 'user');
    const qch = remote(quitter.token).execChannel(mine);
    await qch.opened;
    const running = qch.exec({ argv: ['sh', '-c', 'while [ ! -e /tmp/quit-gate ]; do sleep 0.05; done'] });
    running.catch(() => {});
    const gateRunning = async () => (await d.client.exec(mine, { argv: ['sh', '-c', 'ps | grep -q "[q]uit-gate"'] })).exit_code === 0;
    for (let i = 0; i < 200 && !(await gateRunning()); i++) await new Promise((r) => setTimeout(r, 50));
    expect(await gateRunning()).toBe(true);
    qch.close();
    await expect(running).rejects.toMatchObject({ code: 'Unavailable' });
    const quitterLines = () => auditLines(d).filter((x) => x.token === quitter.id && x.action === CHANNEL_AUDIT_ACTION);
    await waitFor('the close-time audit line', () => quitterLines().length === 1);
    expect(quitterLines()[0]).toMatchObject({ result: 499, error: 'ClientClosed', object: { id: mine } });
    // The command ends afterwards: no second line for it.
    await d.client.exec(mine, { argv: ['touch', '/tmp/quit-gate'] });
    for (let i = 0; i < 200 && (await gateRunning()); i++) await new Promise((r) => setTimeout(r, 50));
    await new Promise((r) => setTimeout(r, 300));
    expect(quitterLines()).toHaveLength(1);
    await remote(owner.token).deleteSandbox(mine, { force: true });
  });

  it('a request over the 1 MiB message limit is refused by the SDK alone; the channel stays usable', async () => {
    const ch = d.client.execChannel(sb);
    const other = ch.exec({ argv: ['sh', '-c', 'sleep 0.2; echo still'] });
    await expect(ch.exec({ argv: ['wc', '-c'], stdin: Buffer.alloc(900 * 1024) })).rejects.toMatchObject({ code: 'InvalidArgument', message: expect.stringMatching(/client\.exec/) });
    expect((await other).stdout.toString()).toBe('still\n');
    expect((await ch.exec({ argv: ['wc', '-c'], stdin: Buffer.alloc(700 * 1024) })).stdout.toString().trim()).toBe(String(700 * 1024));
    ch.close();
  });
});
