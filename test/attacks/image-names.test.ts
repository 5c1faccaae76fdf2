/**
 * Attacks on per-tenant image names over the TCP door (docs/SECURITY.md "Tenancy",
 * "Image names" and "Layers"): tenant B, holding a `user` token, against tenant A's
 * committed image. Layers are content-addressed and shared, so B can make a layer of the
 * same digest as one of A's by committing the same content; what B is told about that
 * layer must still be B's view of it. And a name dsecd cannot store must be refused as
 * the caller's mistake, never answered with an internal error naming dsecd's host paths.
 */
import { mkdirSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, TestDaemon } from '../integration/harness.js';
import { doorRequest, makeToken, type DoorAnswer } from '../integration/remote-helpers.js';

describe.skipIf(!IS_ROOT)('attacks on per-tenant image names', () => {
  let d: TestDaemon;
  let a: string;
  let b: string;
  const as = (token: string, method: string, path: string, json?: unknown): Promise<DoorAnswer> => doorRequest(d, { method, path, token, json });
  const ok = async (p: Promise<DoorAnswer>, status = 200) => {
    const r = await p;
    expect(r.status, r.body).toBe(status);
    return JSON.parse(r.body);
  };
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 61, listen: true });
    a = (await makeToken(d, 'team-a', 'user')).token;
    b = (await makeToken(d, 'team-b', 'user')).token;
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it("B committing the content of A's private layer learns neither A's image names nor A's sandbox id", async () => {
    const commitSame = async (token: string, image: string) => {
      const sb = await ok(as(token, 'POST', '/v1/sandboxes', { image: 'busybox' }), 201);
      const ex = await ok(as(token, 'POST', `/v1/sandboxes/${sb.id}/exec`, { argv: ['sh', '-c', 'mkdir -p /root && echo guessed > /root/secret'] }));
      expect(ex.exit_code).toBe(0);
      return { id: sb.id as string, commit: await ok(as(token, 'POST', `/v1/sandboxes/${sb.id}/commit`, { image, security: { writable_paths: ['/root'] } }), 201) };
    };
    const fromA = await commitSame(a, 'a-private:v1');
    const fromB = await commitSame(b, 'b-guess:v1');
    // The same content packs to the same layer (the premise of the attack).
    expect(fromB.commit.layer.digest).toBe(fromA.commit.layer.digest);
    const seen = JSON.stringify(fromB.commit);
    expect(seen).not.toContain('a-private');
    expect(seen).not.toContain(fromA.id);
    // B's commit answer tells what GET /v1/layers/:digest tells B.
    const view = await ok(as(b, 'GET', `/v1/layers/${fromB.commit.layer.digest}`));
    expect(fromB.commit.layer).toEqual(view);
    expect(view.images).toEqual(['b-guess:v1']);
    // Nor when A packed it: B's layer dates from B's image (the blob's own time is A's commit).
    expect(view.created_at).toBe(fromB.commit.image.created_at);
    expect(view.created_at).not.toBe(fromA.commit.layer.created_at);
    // A still sees its own name and its own sandbox's commit.
    expect(fromA.commit.layer.images).toEqual(['a-private:v1']);
  });

  it('an image name too long to store is InvalidArgument, naming no host path', async () => {
    const long = 'a'.repeat(300);
    const answers = [
      await as(b, 'GET', `/v1/images/${long}`),
      await as(b, 'POST', '/v1/images/busybox/tag', { target: long }),
      await as(b, 'POST', '/v1/images', { image: `${long}:v1`, layers: (await ok(as(b, 'GET', '/v1/images/busybox'))).layers }),
      await as(b, 'POST', '/v1/sandboxes', { image: long }),
    ];
    for (const r of answers) {
      expect(r.status, r.body).toBe(400);
      expect(JSON.parse(r.body).error.code).toBe('InvalidArgument');
      expect(r.body).not.toContain(d.root);
    }
    // The longest name allowed is stored and found.
    const longest = `${'a'.repeat(127)}/${'b'.repeat(127)}`;
    expect((await ok(as(b, 'POST', '/v1/images/busybox/tag', { target: longest }), 201)).name).toBe(longest);
    expect((await ok(as(b, 'GET', `/v1/images/${encodeURIComponent(longest)}`))).tenant).toBe('team-b');
  });
  it("an unexpected failure tells a tenant's token its kind and request id, not dsecd's paths; an admin gets the detail", async () => {
    // A manifest dsecd cannot open (a symlink loop): an Internal error whose text names the path.
    const dir = join(d.root, 'images', 'tenants', 'team-b', 'manifests', 'loop');
    mkdirSync(dir, { recursive: true });
    symlinkSync('@v1.json', join(dir, '@v1.json'));
    const byB = await as(b, 'GET', '/v1/images/loop:v1');
    expect(byB.status).toBe(500);
    const err = JSON.parse(byB.body).error;
    expect(err.code).toBe('Internal');
    expect(err.message).toMatch(/^internal error \(dsecd logged it as request [^)]+\); tell dsecd's operator$/);
    expect(byB.body).not.toContain(d.root);
    const admin = (await makeToken(d, 'team-b', 'admin')).token;
    expect(JSON.parse((await as(admin, 'GET', '/v1/images/loop:v1')).body).error.message).toContain(dir);
  });
});
