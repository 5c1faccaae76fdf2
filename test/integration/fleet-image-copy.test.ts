/**
 * An image that only another host has (issue 21, gateway/image-copy.ts): real etcd, three
 * dsecd hosts each in a network namespace of its own, one gateway.
 *
 * - Tenant demo commits a sandbox into its own image on host A only; with A cordoned, a
 *   create of that image through the gateway succeeds on another host, which then holds
 *   the image (in tenant demo) and the committed layer's content.
 * - A blob whose bytes do not hash to the digest named is refused by the receiving host
 *   (FailedPrecondition naming both digests) and never stored.
 * Order of events is asserted, never time.
 */
import http from 'node:http';
import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT } from './harness.js';
import { FLEET_PREFIX, TestFleet } from '../fixtures/fleet.js';

const run = IS_ROOT ? describe : describe.skip;

/** PUT of `bytes` as blob `digest` on a host's own socket: status and parsed answer. */
function putBlob(socketPath: string, digest: string, bytes: Buffer): Promise<{ status: number; json: any }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath, path: `/v1/layers/${digest}/blob`, method: 'PUT', headers: { 'content-type': 'application/octet-stream', 'content-length': String(bytes.length) } }, (res) => {
      let t = '';
      res.on('data', (c: Buffer) => (t += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, json: t ? JSON.parse(t) : null }));
    });
    req.on('error', reject);
    req.end(bytes);
  });
}

run('an image only another host has', () => {
  const f = TestFleet.create({ gateways: 1 });
  let home = '';

  /** Image mine:v1 as host `h` reports it in etcd, or null. */
  const imageOn = async (h: string): Promise<{ ref: string; digest: string | null; tenant?: string } | null> => {
    const rec = await f.etcdctl(['get', '--print-value-only', `${FLEET_PREFIX}/v1/hosts/${h}/images`]);
    return (JSON.parse(rec.trim() || '{"images":[]}').images as Array<{ ref: string; digest: string | null; tenant?: string }>).find((i) => i.ref === 'mine:v1') ?? null;
  };
  const untilImage = async (h: string) => {
    for (;;) {
      const i = await imageOn(h);
      if (i) return i;
      await new Promise((r) => setTimeout(r, 200));
    }
  };

  beforeAll(() => f.up(), 300_000);
  afterAll(() => f.stop(), 240_000);

  it('copies a tenant image from the only host that has it to the host the create is placed on', async () => {
    const src = await f.request('POST', '/v1/sandboxes', { json: { image: 'busybox', labels: { job: 'copy-src' } } });
    expect(src.status, src.body).toBe(201);
    const hosts = (await f.request('GET', '/v1/hosts', { token: f.tokens.admin })).json.hosts as Array<{ name: string; tag: string }>;
    home = hosts.find((h) => h.tag === src.json.id.slice(0, 6))!.name;
    const w = await f.request('POST', `/v1/sandboxes/${src.json.id}/exec`, { json: { argv: ['sh', '-c', 'echo only-on-one-host > /home/marker'] } });
    expect(w.status, w.body).toBe(200);
    expect(w.json.exit_code, w.body).toBe(0);
    const c = await f.request('POST', `/v1/sandboxes/${src.json.id}/commit`, { json: { image: 'mine:v1' } });
    expect(c.status, c.body).toBe(201);
    // The gateway learns of the image from home's images record.
    const homeImage = await untilImage(home);
    for (const h of hosts) if (h.name !== home) expect(await imageOn(h.name)).toBeNull();
    const cordon = await f.request('POST', `/v1/hosts/${home}/cordon`, { token: f.tokens.admin });
    expect(cordon.status, cordon.body).toBe(200);

    const made = await f.request('POST', '/v1/sandboxes', { json: { image: 'mine:v1', labels: { job: 'copy-dst' } } });
    expect(made.status, made.body).toBe(201);
    const there = hosts.find((h) => h.tag === made.json.id.slice(0, 6))!.name;
    expect(there).not.toBe(home);
    const r = await f.request('POST', `/v1/sandboxes/${made.json.id}/exec`, { json: { argv: ['cat', '/home/marker'] } });
    expect(r.status, r.body).toBe(200);
    expect(Buffer.from(r.json.stdout_b64, 'base64').toString(), r.body).toBe('only-on-one-host\n');
    // The host it landed on now holds the image, in tenant demo (not as a system image), with the same layers.
    expect(await untilImage(there)).toEqual(homeImage);
    expect(homeImage.tenant).toBe('demo');
    expect((await f.request('POST', `/v1/hosts/${home}/uncordon`, { token: f.tokens.admin })).status).toBe(200);
  }, 300_000);

  it('refuses a blob whose bytes do not hash to its digest, storing nothing', async () => {
    const other = [...f.hosts.keys()].find((h) => h !== home)!;
    const bytes = Buffer.from('not the layer\n');
    const fake = `sha256:${'0'.repeat(64)}`;
    const bad = await putBlob(f.hosts.get(other)!.socket, fake, bytes);
    expect(bad.status).toBe(412);
    expect(bad.json.error.code).toBe('FailedPrecondition');
    expect(bad.json.error.message).toContain(`layer ${fake}: the bytes received hash to sha256:${createHash('sha256').update(bytes).digest('hex')}`);
    expect((await f.hosts.get(other)!.client.listLayers()).map((l) => l.digest)).not.toContain(fake);
    // The same bytes under their own digest are stored.
    const good = `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
    const ok = await putBlob(f.hosts.get(other)!.socket, good, bytes);
    expect(ok.status, JSON.stringify(ok.json)).toBe(201);
    expect(ok.json).toEqual({ digest: good, size_bytes: bytes.length, stored: true });
  }, 120_000);
});
