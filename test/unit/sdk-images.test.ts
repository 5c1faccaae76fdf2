import { afterEach, describe, expect, it } from 'vitest';
import { DsecApiError, DsecClient, type CommitResult, type Image, type ImageProgress, type Layer, type PruneResult } from '../../sdk/index.js';
import { sdkFixtures, json, ndjson, ok, startFakeDsecd, type FakeDsecd } from '../fixtures/fake-dsecd.js';

// The image, layer and commit calls of the SDK against the fake dsecd
// (test/fixtures/fake-dsecd.ts), including the NDJSON mode of the long operations.

const { fake, client } = sdkFixtures();

const HEX_A = 'a'.repeat(64);
const HEX_B = 'b'.repeat(64);

const image = (over: Partial<Image> = {}): Image => ({
  ref: 'team/py:1',
  name: 'team/py',
  tag: '1',
  layers: [`sha256:${HEX_A}`, `sha256:${HEX_B}`],
  config: { env: ['PATH=/usr/bin:/bin'], cwd: '/', user: '0', cmd: ['/bin/sh'] },
  size_bytes: 3 * 1024 ** 2,
  created_at: 1_700_000_000_000,
  ...over,
});

const layer = (over: Partial<Layer> = {}): Layer => ({
  digest: `sha256:${HEX_A}`,
  size_bytes: 1024 ** 2,
  created_at: 1_700_000_000_000,
  source: 'dir:/srv/py',
  builder: 'host1/default',
  images: ['team/py:1'],
  sandboxes: 2,
  ...over,
});

const tick = (ms = 5) => new Promise((r) => setTimeout(r, ms));

describe('image and layer calls', () => {
  it('call the right method, path and body; refs and digests are URL-encoded', async () => {
    const f = await fake();
    const prune: PruneResult = { removed: [], freed_bytes: 0, kept_young: [], tmp_removed: 0, dry_run: true };
    const commit: CommitResult = { image: image({ ref: 'team/py:2', tag: '2' }), layer: layer({ source: 'commit:0123456789abcdef' }), stripped: ['root/.bash_history'] };
    f.routes['GET /v1/images'] = ok({ images: [image()] });
    f.routes['GET /v1/images/:ref'] = ok(image());
    f.routes['DELETE /v1/images/:ref'] = ok(image());
    f.routes['POST /v1/images'] = ok(image(), 201);
    f.routes['POST /v1/images/:ref/tag'] = ok(image({ ref: 'team/py:latest', tag: 'latest' }), 201);
    f.routes['POST /v1/images/prune'] = ok(prune);
    f.routes['GET /v1/layers'] = ok({ layers: [layer()] });
    f.routes['GET /v1/layers/:digest'] = ok(layer());
    f.routes['POST /v1/sandboxes/:id/commit'] = ok(commit, 201);
    const c = client(f);

    expect(await c.listImages()).toEqual([image()]);
    expect(await c.getImage('team/py:1')).toEqual(image());
    expect(await c.removeImage('team/py:1')).toEqual(image());
    expect(await c.composeImage({ image: 'team/py:1', layers: [`sha256:${HEX_A}`], from: 'busybox' })).toEqual(image());
    expect((await c.tagImage('team/py:1', 'team/py:latest')).ref).toBe('team/py:latest');
    expect(await c.pruneImages({ dryRun: true })).toEqual(prune);
    await c.pruneImages();
    expect(await c.listLayers()).toEqual([layer()]);
    expect(await c.getLayer(`sha256:${HEX_A}`)).toEqual(layer());
    expect(await c.commit('0123456789abcdef', { image: 'team/py:2', exclude: ['srv/cache/**'] })).toEqual(commit);
    await c.commit('0123456789abcdef', { image: 'team/py:3' });

    expect(f.seen.map((s) => `${s.method} ${s.url}`)).toEqual([
      'GET /v1/images',
      'GET /v1/images/team%2Fpy%3A1',
      'DELETE /v1/images/team%2Fpy%3A1',
      'POST /v1/images',
      'POST /v1/images/team%2Fpy%3A1/tag',
      'POST /v1/images/prune',
      'POST /v1/images/prune',
      'GET /v1/layers',
      `GET /v1/layers/sha256%3A${HEX_A}`,
      'POST /v1/sandboxes/0123456789abcdef/commit',
      'POST /v1/sandboxes/0123456789abcdef/commit',
    ]);
    expect(f.seen[1].params.ref).toBe('team/py:1');
    expect(f.seen[3].body).toEqual({ image: 'team/py:1', layers: [`sha256:${HEX_A}`], from: 'busybox' });
    expect(f.seen[4].body).toEqual({ target: 'team/py:latest' });
    expect(f.seen[5].body).toEqual({ dry_run: true });
    expect(f.seen[6].body).toEqual({});
    expect(f.seen[9].body).toEqual({ image: 'team/py:2', exclude: ['srv/cache/**'] });
    expect(f.seen[10].body).toEqual({ image: 'team/py:3' });
  });

  it('errors carry the daemon code, status and message', async () => {
    const f = await fake();
    f.routes['GET /v1/images/:ref'] = (req, res) => json(res, 404, { error: { code: 'NotFound', message: `image ${req.params.ref} not found` } });
    const e = await client(f).getImage('a/b:c').catch((x) => x);
    expect(e).toBeInstanceOf(DsecApiError);
    expect(e).toMatchObject({ code: 'NotFound', status: 404, message: 'image a/b:c not found' });
  });

  it('commit has no HTTP deadline (packing a large layer takes a while)', async () => {
    const f = await fake();
    f.routes['POST /v1/sandboxes/:id/commit'] = async (_req, res) => {
      await tick(60);
      json(res, 201, { image: image(), layer: layer(), stripped: [] });
    };
    expect((await client(f, 20).commit('abc', { image: 'x' })).image.ref).toBe('team/py:1');
  });
});

describe('long operations (NDJSON)', () => {
  const progress: ImageProgress[] = [
    { type: 'progress', phase: 'layer', layer: 1, layers: 2, bytes: 1024 },
    { type: 'progress', phase: 'layer', layer: 2, layers: 2, message: 'naïve ✓ 日本 unpacking', bytes: 5 * 1024 ** 2 },
    { type: 'progress', phase: 'pack', message: 'packing' },
  ];

  it('asks for NDJSON, calls onProgress per line across 3-byte chunks (cutting UTF-8), resolves with the result', async () => {
    const f = await fake();
    f.routes['POST /v1/images/import'] = ndjson([...progress, '', { type: 'result', result: image() }], { chunk: 3 });
    const got: ImageProgress[] = [];
    const img = await client(f).importImage({ type: 'oci', path: '/srv/x.tar', image: 'team/py:1' }, { onProgress: (p) => got.push(p) });
    expect(img).toEqual(image());
    expect(got).toEqual(progress);
    expect(f.seen[0].headers.accept).toBe('application/x-ndjson');
    expect(f.seen[0].body).toEqual({ type: 'oci', path: '/srv/x.tar', image: 'team/py:1' });
  });

  it('works without onProgress, and with a final result line lacking its newline', async () => {
    const f = await fake();
    f.routes['POST /v1/images/import'] = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.end(JSON.stringify(progress[0]) + '\n' + JSON.stringify({ type: 'result', result: image() }));
    };
    expect(await client(f).importImage({ type: 'dir', path: '/srv/py', image: 'team/py:1' })).toEqual(image());
  });

  it('an error line mid-stream rejects with its code and message, after the earlier progress', async () => {
    const f = await fake();
    f.routes['POST /v1/images/import'] = ndjson([progress[0], { type: 'error', error: { code: 'InvalidArgument', message: 'layer 2 is not a tar' } }, progress[2]], { chunk: 5 });
    const got: ImageProgress[] = [];
    const e = await client(f)
      .importImage({ type: 'oci', path: '/x', image: 'y' }, { onProgress: (p) => got.push(p) })
      .catch((x) => x);
    expect(e).toBeInstanceOf(DsecApiError);
    expect(e).toMatchObject({ code: 'InvalidArgument', message: 'layer 2 is not a tar', status: 200 });
    expect(got).toEqual([progress[0]]);
  });

  it('an error line with an unknown code is Internal', async () => {
    const f = await fake();
    f.routes['POST /v1/images/bootstrap'] = ndjson([{ type: 'error', error: { code: 'Weird', message: 'boom' } }]);
    expect(await client(f).bootstrapImage().catch((x) => x)).toMatchObject({ code: 'Internal', message: 'boom' });
  });

  it('bootstrapImage sends {distro: "debian"} by default and the given fields otherwise', async () => {
    const f = await fake();
    f.routes['POST /v1/images/bootstrap'] = ndjson([{ type: 'progress', phase: 'debootstrap', message: 'I: Retrieving InRelease' }, { type: 'result', result: image({ ref: 'debian:bookworm' }) }]);
    const lines: string[] = [];
    expect((await client(f).bootstrapImage(undefined, { onProgress: (p) => lines.push(p.message!) })).ref).toBe('debian:bookworm');
    await client(f).bootstrapImage({ distro: 'debian', image: 'deb:py', include: ['python3', 'curl'] });
    expect(lines).toEqual(['I: Retrieving InRelease']);
    expect(f.seen.map((s) => s.body)).toEqual([{ distro: 'debian' }, { distro: 'debian', image: 'deb:py', include: ['python3', 'curl'] }]);
  });

  it('an error status before the stream is the usual DsecApiError', async () => {
    const f = await fake();
    f.routes['POST /v1/images/import'] = (_req, res) => json(res, 400, { error: { code: 'InvalidArgument', message: 'import request: path must be absolute' } });
    expect(await client(f).importImage({ type: 'dir', path: 'rel', image: 'x' }).catch((x) => x)).toMatchObject({ code: 'InvalidArgument', status: 400 });
  });

  it('a daemon that answers with one JSON document (no NDJSON) is accepted', async () => {
    const f = await fake();
    f.routes['POST /v1/images/import'] = ok(image(), 201);
    const got: ImageProgress[] = [];
    expect(await client(f).importImage({ type: 'tar', path: '/x.tar', image: 'team/py:1' }, { onProgress: (p) => got.push(p) })).toEqual(image());
    expect(got).toEqual([]);
  });

  it('a stream that ends without a result is Unavailable; a malformed line is Internal', async () => {
    const f = await fake();
    f.routes['POST /v1/images/import'] = ndjson([progress[0]]);
    f.routes['POST /v1/images/bootstrap'] = ndjson([progress[0], 'not json']);
    const c = client(f);
    const e = await c.importImage({ type: 'tar', path: '/x.tar', image: 'x' }).catch((x) => x);
    expect(e).toMatchObject({ code: 'Unavailable' });
    expect(e.message).toMatch(/without a result; the operation may still finish on dsecd/);
    const m = await c.bootstrapImage().catch((x) => x);
    expect(m).toMatchObject({ code: 'Internal' });
    expect(m.message).toContain('not json');
  });

  it('a connection dropped mid-stream is Unavailable and says the operation may still finish', async () => {
    const f = await fake();
    f.routes['POST /v1/images/import'] = async (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(JSON.stringify(progress[0]) + '\n');
      await tick();
      res.socket!.destroy();
    };
    const got: ImageProgress[] = [];
    const e = await client(f)
      .importImage({ type: 'tar', path: '/x.tar', image: 'x' }, { onProgress: (p) => got.push(p) })
      .catch((x) => x);
    expect(e).toMatchObject({ code: 'Unavailable' });
    expect(e.message).toMatch(/may still finish on dsecd/);
    expect(got).toEqual([progress[0]]);
  });

  it('has no deadline: a slow stream outlives the client timeoutMs', async () => {
    const f = await fake();
    f.routes['POST /v1/images/import'] = ndjson([progress[0], progress[1], { type: 'result', result: image() }], { chunk: 64, delayMs: 30 });
    expect(await client(f, 10).importImage({ type: 'tar', path: '/x.tar', image: 'x' })).toEqual(image());
  });

  it('onProgress throwing rejects with its error', async () => {
    const f = await fake();
    f.routes['POST /v1/images/import'] = ndjson([progress[0], { type: 'result', result: image() }]);
    const boom = new Error('consumer failed');
    const e = await client(f)
      .importImage({ type: 'tar', path: '/x.tar', image: 'x' }, {
        onProgress: () => {
          throw boom;
        },
      })
      .catch((x) => x);
    expect(e).toBe(boom);
  });

  it('an abort signal rejects with its reason', async () => {
    const f = await fake();
    f.routes['POST /v1/images/import'] = ndjson([progress[0]], { keepOpen: true });
    const ac = new AbortController();
    const p = client(f).importImage({ type: 'tar', path: '/x.tar', image: 'x' }, { signal: ac.signal, onProgress: () => ac.abort() });
    const e = await p.catch((x) => x);
    expect(e).not.toBeInstanceOf(DsecApiError);
    expect(e.name).toBe('AbortError');
  });
});
