/**
 * Every bad input of the spine contract gets its error code and HTTP status, leaves
 * nothing half-created, and the daemon keeps serving; the CLI prints one line and a
 * hint and exits 125.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import http from 'node:http';
import { IS_ROOT, TestDaemon, runCli } from './harness.js';

/** Raw HTTP over the daemon socket (the SDK would refuse some of these requests). */
function raw(d: TestDaemon, method: string, url: string, body?: string, headers: Record<string, string> = {}): Promise<{ status: number; json: any }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath: d.socket, method, path: url, headers: { 'content-type': 'application/json', ...headers } }, (res) => {
      let s = '';
      res.on('data', (c) => (s += c));
      res.on('end', () => {
        let json: any = null;
        try { json = JSON.parse(s); } catch { json = s; }
        resolve({ status: res.statusCode!, json });
      });
    });
    req.on('error', reject);
    if (body !== undefined) req.write(body);
    req.end();
  });
}

describe.skipIf(!IS_ROOT)('bad input', () => {
  let d: TestDaemon;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 2 });
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  const cases: [string, string, string, string | undefined, number, string][] = [
    ['unknown image', 'POST', '/v1/sandboxes', JSON.stringify({ image: 'no-such-image' }), 404, 'NotFound'],
    ['malformed JSON', 'POST', '/v1/sandboxes', '{"image": ', 400, 'InvalidArgument'],
    ['unknown field', 'POST', '/v1/sandboxes', JSON.stringify({ image: 'busybox', colour: 'red' }), 400, 'InvalidArgument'],
    ['memory 0', 'POST', '/v1/sandboxes', JSON.stringify({ memory_bytes: 0 }), 400, 'InvalidArgument'],
    ['negative memory', 'POST', '/v1/sandboxes', JSON.stringify({ memory_bytes: -5 }), 400, 'InvalidArgument'],
    ['cpus 1000', 'POST', '/v1/sandboxes', JSON.stringify({ cpus: 1000 }), 400, 'InvalidArgument'],
    ['negative pids', 'POST', '/v1/sandboxes', JSON.stringify({ pids: -1 }), 400, 'InvalidArgument'],
    ['wrong type', 'POST', '/v1/sandboxes', JSON.stringify({ cpus: 'two' }), 400, 'InvalidArgument'],
    ['unregistered vm disk', 'POST', '/v1/sandboxes', JSON.stringify({ backend: 'vm', image: 'disk:no-such-disk' }), 404, 'NotFound'],
    ['unknown backend', 'POST', '/v1/sandboxes', JSON.stringify({ backend: 'mainframe' }), 400, 'InvalidArgument'],
    ['bad label', 'POST', '/v1/sandboxes', JSON.stringify({ labels: { 'a b': 'c' } }), 400, 'InvalidArgument'],
    ['missing id', 'GET', '/v1/sandboxes/0000000000000000', undefined, 404, 'NotFound'],
    ['delete missing id', 'DELETE', '/v1/sandboxes/0000000000000000?force=true', undefined, 404, 'NotFound'],
    ['exec missing id', 'POST', '/v1/sandboxes/0000000000000000/exec', JSON.stringify({ argv: ['true'] }), 404, 'NotFound'],
    ['bad selector', 'GET', '/v1/sandboxes?selector==x', undefined, 400, 'InvalidArgument'],
    ['unknown route', 'GET', '/v1/nothing', undefined, 404, 'NotFound'],
    ['cpus above the host', 'POST', '/v1/sandboxes', JSON.stringify({ cpus: 200 }), 400, 'InvalidArgument'],
    ['memory above the host', 'POST', '/v1/sandboxes', JSON.stringify({ memory_bytes: 1024 ** 4 }), 400, 'InvalidArgument'],
    ['__proto__ label', 'POST', '/v1/sandboxes', '{"labels": {"__proto__": "x"}}', 400, 'InvalidArgument'],
    ['__proto__ env', 'POST', '/v1/sandboxes', '{"env": {"__proto__": "x"}}', 400, 'InvalidArgument'],
    ['__proto__ label spelled with an escape', 'POST', '/v1/sandboxes', '{"labels": {"\\u005f_proto__": "x"}}', 400, 'InvalidArgument'],
    ['too many labels', 'POST', '/v1/sandboxes', JSON.stringify({ labels: Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, 'v'])) }), 400, 'InvalidArgument'],
    ['env too large', 'POST', '/v1/sandboxes', JSON.stringify({ env: { BIG: 'x'.repeat(200_000) } }), 400, 'InvalidArgument'],
    ['PUT on a resource', 'PUT', '/v1/sandboxes', '{}', 405, 'InvalidArgument'],
    ['a null body', 'POST', '/v1/sandboxes', 'null', 400, 'InvalidArgument'],
    // A `dsec.pool` label would hide the sandbox from listings and admission as a warm-pool shell.
    ['a reserved dsec.pool label', 'POST', '/v1/sandboxes', JSON.stringify({ labels: { 'dsec.pool': 'x' } }), 400, 'InvalidArgument'],
    ['a reserved dsec.fork label', 'POST', '/v1/sandboxes', JSON.stringify({ labels: { 'dsec.fork': 'fork-0000000000000000' } }), 400, 'InvalidArgument'],
  ];
  it.each(cases)('%s -> %s %s answers %i %s', async (_name, method, url, body, status, code) => {
    const before = await d.traces();
    const r = await raw(d, method, url, body);
    expect(r.status).toBe(status);
    expect(r.json.error.code).toBe(code);
    expect(typeof r.json.error.message).toBe('string');
    expect(r.json.error.message.length).toBeGreaterThan(5);
    const after = await d.traces();
    expect(after).toEqual(before);
  });

  it('oversized headers and malformed requests get the error shape', async () => {
    const r = await raw(d, 'GET', '/v1/version', undefined, { 'x-big': 'x'.repeat(100_000) });
    expect(r.status).toBe(431);
    expect(r.json.error.code).toBe('InvalidArgument');
    for (const url of [`/v1/trajectories/${'t'.repeat(2000)}`, `/v1/sandboxes/${'a'.repeat(2000)}`]) {
      const long = await raw(d, 'GET', url);
      expect(long.status).toBe(400);
      expect(long.json.error).toMatchObject({ code: 'InvalidArgument', message: expect.any(String) });
    }
  });

  it('DELETE on the collection is 405', async () => {
    const r = await raw(d, 'DELETE', '/v1/sandboxes');
    expect(r.status).toBe(405);
    expect(r.json.error.message).toMatch(/not allowed/);
  });

  it('exec: empty argv, unknown field, bad timeout, bad base64 are InvalidArgument; exec in a stopped sandbox is FailedPrecondition', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    try {
      for (const body of [{ argv: [] }, { argv: ['true'], shell: true }, { argv: ['true'], timeout_ms: -1 }, { argv: ['true'], stdin_b64: '***' }, {}]) {
        const r = await raw(d, 'POST', `/v1/sandboxes/${sb.id}/exec`, JSON.stringify(body));
        expect(r.status, JSON.stringify(body)).toBe(400);
        expect(r.json.error.code).toBe('InvalidArgument');
      }
      await d.client.stopSandbox(sb.id);
      const r = await raw(d, 'POST', `/v1/sandboxes/${sb.id}/exec`, JSON.stringify({ argv: ['true'] }));
      expect(r.status).toBe(412);
      expect(r.json.error.code).toBe('FailedPrecondition');
      // Destroy without force on a running sandbox is refused; with force it works.
      await d.client.startSandbox(sb.id);
      const nf = await raw(d, 'DELETE', `/v1/sandboxes/${sb.id}`);
      expect(nf.status).toBe(412);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('the daemon keeps serving after all of the above', async () => {
    const v = await d.client.version();
    expect(v.api).toBe('v1');
    const sb = await d.client.createSandbox({ image: 'busybox' });
    expect((await d.client.exec(sb.id, { argv: ['echo', 'ok'] })).stdout.toString()).toBe('ok\n');
    await d.client.deleteSandbox(sb.id, { force: true });
    const t = await d.traces();
    expect(t).toMatchObject({ mounts: [], cgroups: [], runtime: [], dirs: [], rows: [], uidRanges: 0 });
  });

  it('the CLI prints one line and a hint, exits 125, and never a stack trace', async () => {
    for (const args of [['inspect', '0000000000000000'], ['create', '--image', 'nope'], ['create', '--memory', '0'], ['create', '--cpus', '1000'], ['exec', '0000000000000000', '--', 'true']]) {
      const r = await runCli(d, args);
      expect(r.code, args.join(' ')).toBe(125);
      const lines = r.stderr.trim().split('\n');
      expect(lines[0]).toMatch(/^dsec: /);
      expect(r.stderr).toMatch(/hint: /);
      expect(r.stderr).not.toMatch(/\n\s+at /);
      expect(lines.length).toBeLessThanOrEqual(2);
    }
    const missing = await runCli({ socket: '/tmp/dsec-no-such.sock' } as TestDaemon, ['ls']);
    expect(missing.code).toBe(125);
    expect(missing.stderr).toMatch(/dsec-no-such\.sock/);
    expect(missing.stderr).toMatch(/hint: /);
  });
});
