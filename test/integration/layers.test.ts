/**
 * The layer store end to end through dsecd: composing images from independently
 * versioned layers, replacing one, commit with stripping and whiteouts, prune that
 * never takes a blob in use, digest verification before mount, and a crash between
 * publishing a blob and its manifest.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync, chmodSync, openSync, writeSync, closeSync, statSync, utimesSync } from 'node:fs';
import path from 'node:path';
import { IS_ROOT, TestDaemon } from './harness.js';

interface Img { ref: string; layers: string[]; config: { env: string[] } }

describe.skipIf(!IS_ROOT)('layer store', () => {
  let d: TestDaemon;
  let work: string;
  const req = <T>(method: string, p: string, body?: unknown) => d.client.request<T>(method, p, body);
  const tree = (name: string, files: Record<string, string>, modes: Record<string, number> = {}): string => {
    const dir = path.join(work, name);
    for (const [rel, content] of Object.entries(files)) {
      mkdirSync(path.dirname(path.join(dir, rel)), { recursive: true });
      writeFileSync(path.join(dir, rel), content);
      if (modes[rel]) chmodSync(path.join(dir, rel), modes[rel]);
    }
    return dir;
  };
  const sh = async (id: string, script: string) => (await d.client.exec(id, { argv: ['sh', '-c', script] })).stdout.toString();

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 11, config: '[images]\nprune_grace_s = 0\n' });
    work = mkdtempSync('/tmp/dsec-layers-');
    chmodSync(work, 0o755);
  });
  afterAll(async () => {
    await d?.cleanup();
    rmSync(work, { recursive: true, force: true });
  });

  it('composes base + workspace + toolkit; replacing the toolkit keeps the other digests', async () => {
    const base = await req<Img>('GET', '/v1/images/busybox');
    const ws = await req<Img>('POST', '/v1/images/import', { type: 'dir', path: tree('ws', { 'workspace/repo/README': 'task 17\n' }), image: 'ws-only:1' });
    const tk1 = await req<Img>('POST', '/v1/images/import', { type: 'dir', path: tree('tk1', { 'opt/tool/bin/tool': '#!/bin/sh\necho tool v1\n' }, { 'opt/tool/bin/tool': 0o755 }), image: 'tk:1' });
    const tk2 = await req<Img>('POST', '/v1/images/import', { type: 'dir', path: tree('tk2', { 'opt/tool/bin/tool': '#!/bin/sh\necho tool v2\n' }, { 'opt/tool/bin/tool': 0o755 }), image: 'tk:2' });
    const [b, w, t1, t2] = [base.layers[0], ws.layers[0], tk1.layers[0], tk2.layers[0]];
    expect(new Set([b, w, t1, t2]).size).toBe(4);
    const env1 = await req<Img>('POST', '/v1/images', { image: 'env:1', layers: [b, w, t1], from: 'busybox' });
    const env2 = await req<Img>('POST', '/v1/images', { image: 'env:2', layers: [b, w, t2], from: 'busybox' });
    expect(env2.layers.slice(0, 2)).toEqual(env1.layers.slice(0, 2));
    expect(env2.layers[2]).not.toBe(env1.layers[2]);
    const s1 = await d.client.createSandbox({ image: 'env:1' });
    const s2 = await d.client.createSandbox({ image: 'env:2' });
    try {
      expect(await sh(s1.id, 'cat /workspace/repo/README; /opt/tool/bin/tool; ls /bin/busybox')).toBe('task 17\ntool v1\n/bin/busybox\n');
      expect(await sh(s2.id, 'cat /workspace/repo/README; /opt/tool/bin/tool')).toBe('task 17\ntool v2\n');
      // The shared layers are mounted once for both sandboxes: 4 distinct blobs in use.
      expect(d.layerMounts().length).toBe(4);
    } finally {
      await d.client.deleteSandbox(s1.id, { force: true });
      await d.client.deleteSandbox(s2.id, { force: true });
    }
  });

  it('long image refs (beyond 100 characters) can be tagged, inspected and removed', async () => {
    const ref = `team/${'a'.repeat(180)}:v1`;
    await req('POST', '/v1/images/busybox/tag', { target: ref });
    expect((await req<Img>('GET', `/v1/images/${encodeURIComponent(ref)}`)).ref).toBe(ref);
    await req('DELETE', `/v1/images/${encodeURIComponent(ref)}`);
    await expect(req('GET', `/v1/images/${encodeURIComponent(ref)}`)).rejects.toMatchObject({ code: 'NotFound' });
  });

  it('builds reproducibly: the same tree twice gives the same digest and one blob', async () => {
    const a = await req<Img>('POST', '/v1/images/import', { type: 'dir', path: tree('rep', { 'a/b/c': 'x', 'z': 'y' }), image: 'rep:1' });
    const b = await req<Img>('POST', '/v1/images/import', { type: 'dir', path: path.join(work, 'rep'), image: 'rep:2' });
    expect(b.layers).toEqual(a.layers);
    const layer = await req<{ digest: string; images: string[]; source: string }>('GET', `/v1/layers/${a.layers[0]}`);
    expect(layer.images.sort()).toEqual(['rep:1', 'rep:2']);
    expect(layer.source).toMatch(/^dir:/);
  });

  it('commit packs the writable layer with whiteouts and opaque dirs, and strips temp files and histories', async () => {
    const img = await req<Img>('POST', '/v1/images/import', {
      type: 'dir', base: 'busybox', image: 'proj:1',
      path: tree('proj', { 'srv/keep': 'keep\n', 'srv/drop': 'drop\n', 'srv/dir/old1': '1', 'srv/dir/old2': '2' }),
    });
    const sb = await d.client.createSandbox({ image: 'proj:1', env: { TASK: '17' } });
    try {
      await sh(sb.id, [
        'echo added > /srv/new', 'rm /srv/drop', 'rm -rf /srv/dir && mkdir /srv/dir && echo fresh > /srv/dir/n',
        'echo secret > /tmp/answer', 'echo "cat /answer" > /root/.ash_history', 'adduser -D -u 1234 agent 2>/dev/null || true',
        'mkdir -p /home/agent && echo mine > /home/agent/f && chown -R 1234:1234 /home/agent', 'echo x > /srv/cache.bin',
        'mkdir -p /var/log/app && echo "GET /answer" > /var/log/access.log && echo x > /var/log/app/run.log',
      ].join('; '));
      const r = await req<{ image: Img; layer: { digest: string; source: string }; stripped: string[]; warnings: string[] }>('POST', `/v1/sandboxes/${sb.id}/commit`, { image: 'proj:2', exclude: ['srv/*.bin'] });
      expect(r.image.layers.slice(0, -1)).toEqual(img.layers);
      expect(r.layer.source).toBe(`commit:${sb.id}`);
      expect(r.stripped).toEqual(expect.arrayContaining(['tmp/answer', 'root/.ash_history', 'srv/cache.bin', 'var/log/access.log', 'var/log/app']));
      expect(r.stripped).not.toContain('var/log');
      // The create env is a runtime secret: the image keeps its own env, and the caller is told.
      expect(r.image.config.env).toEqual(img.config.env);
      expect(r.image.config.env.join('\n')).not.toMatch(/TASK/);
      expect(r.warnings).toEqual([expect.stringMatching(/create env \(TASK\) is not part of the image/)]);
      // The source sandbox keeps running (it was frozen only while its layer was copied).
      expect(await sh(sb.id, 'cat /tmp/answer')).toBe('secret\n');
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
    const c = await d.client.createSandbox({ image: 'proj:2' });
    try {
      const out = await sh(c.id, 'cat /srv/keep /srv/new; ls /srv/dir; ls /srv/drop /tmp/answer /root/.ash_history /srv/cache.bin 2>&1 | grep -c "No such"; stat -c "%u:%g" /home/agent/f /srv/new');
      expect(out).toBe('keep\nadded\nn\n4\n1234:1234\n0:0\n');
      // /var/log ships empty: the directory, none of what the sandbox logged.
      expect(await sh(c.id, 'test -d /var/log && ls -A /var/log | wc -l')).toBe('0\n');
    } finally {
      await d.client.deleteSandbox(c.id, { force: true });
    }
  });

  it('prune keeps blobs of live sandboxes (running or stopped) and of images, removes the rest', async () => {
    const a = await req<Img>('POST', '/v1/images/import', { type: 'dir', path: tree('pa', { 'a': 'only in a' }), base: 'busybox', image: 'pa:1' });
    const b = await req<Img>('POST', '/v1/images/import', { type: 'dir', path: tree('pb', { 'b': 'only in b' }), base: 'busybox', image: 'pb:1' });
    const la = a.layers[1];
    const lb = b.layers[1];
    const sb = await d.client.createSandbox({ image: 'pa:1' });
    await d.client.stopSandbox(sb.id);
    await req('DELETE', '/v1/images/pa:1');
    await req('DELETE', '/v1/images/pb:1');
    const dry = await req<{ removed: { digest: string }[]; dry_run: boolean }>('POST', '/v1/images/prune', { dry_run: true });
    expect(dry.dry_run).toBe(true);
    expect(dry.removed.map((x) => x.digest)).toContain(lb);
    expect((await req<{ layers: { digest: string }[] }>('GET', '/v1/layers')).layers.map((l) => l.digest)).toContain(lb);
    const rep = await req<{ removed: { digest: string }[]; freed_bytes: number }>('POST', '/v1/images/prune', {});
    const removed = rep.removed.map((x) => x.digest);
    expect(removed).toContain(lb);
    expect(removed).not.toContain(la);
    expect(removed).not.toContain(a.layers[0]);
    expect(rep.freed_bytes).toBeGreaterThan(0);
    // The stopped sandbox starts again on its kept layer.
    await d.client.startSandbox(sb.id);
    expect(await sh(sb.id, 'cat /a')).toBe('only in a');
    await d.client.deleteSandbox(sb.id, { force: true });
    const rep2 = await req<{ removed: { digest: string }[] }>('POST', '/v1/images/prune', {});
    expect(rep2.removed.map((x) => x.digest)).toContain(la);
  });

  it('refuses to mount a blob whose bytes do not match its digest, and names a missing layer', async () => {
    const img = await req<Img>('POST', '/v1/images/import', { type: 'dir', path: tree('corrupt', { 'f': 'x'.repeat(10000) }), base: 'busybox', image: 'bad:1' });
    const digest = img.layers[1];
    const blob = path.join(d.root, 'images', 'blobs', 'sha256', digest.slice(7));
    chmodSync(blob, 0o644);
    const fd = openSync(blob, 'r+');
    writeSync(fd, Buffer.from('corrupt!'), 0, 8, 4096 + 100);
    closeSync(fd);
    const before = d.layerMounts().length;
    await expect(d.client.createSandbox({ image: 'bad:1' })).rejects.toMatchObject({ code: 'FailedPrecondition', message: expect.stringContaining(digest) });
    expect(d.layerMounts().length).toBe(before);
    rmSync(blob);
    await expect(d.client.createSandbox({ image: 'bad:1' })).rejects.toMatchObject({ code: 'NotFound', message: expect.stringContaining(digest) });
    const t = await d.traces();
    expect(t).toMatchObject({ mounts: [], cgroups: [], runtime: [], dirs: [], rows: [] });
  });

  it('an image that repeats a layer still starts; HOME comes from passwd when the image sets none', async () => {
    const base = await req<Img>('GET', '/v1/images/busybox');
    const extra = await req<Img>('POST', '/v1/images/import', { type: 'dir', path: tree('dup', { 'same.txt': 'same\n' }), image: 'dupl:1' });
    const img = await req<Img>('POST', '/v1/images', {
      image: 'dupl:2', layers: [base.layers[0], extra.layers[0], extra.layers[0]],
      config: { env: ['PATH=/bin:/usr/bin:/sbin'], cwd: '/', user: '0', cmd: ['/bin/sh'] },
    });
    expect(img.layers.length).toBe(3);
    const sb = await d.client.createSandbox({ image: 'dupl:2' });
    try {
      expect(await sh(sb.id, 'cat /same.txt; echo $HOME')).toBe('same\n/root\n');
      const asNobody = await d.client.exec(sb.id, { argv: ['sh', '-c', 'echo $HOME'], user: 'nobody' });
      expect(asNobody.stdout.toString()).toBe('/nonexistent\n'); // busybox image: nobody's home
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('commit excludes: a leading / and a trailing / are normalised, negations refused, unmatched ones reported', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    try {
      await sh(sb.id, 'mkdir -p /root/work/sub && echo s > /root/work/secret && echo x > /root/work/sub/y && echo k > /root/keep');
      await expect(req('POST', `/v1/sandboxes/${sb.id}/commit`, { image: 'ex:0', exclude: ['!root/**'] })).rejects.toMatchObject({ code: 'InvalidArgument' });
      const r = await req<{ stripped: string[]; warnings: string[] }>('POST', `/v1/sandboxes/${sb.id}/commit`, { image: 'ex:1', exclude: ['/root/work/secret', 'root/work/sub/', 'nothing/here'] });
      expect(r.stripped).toEqual(expect.arrayContaining(['root/work/secret', 'root/work/sub']));
      expect(r.warnings).toEqual(['exclude pattern "nothing/here" matched nothing']);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
    const c = await d.client.createSandbox({ image: 'ex:1' });
    try {
      expect(await sh(c.id, 'cat /root/keep; ls /root/work')).toBe('k\n');
    } finally {
      await d.client.deleteSandbox(c.id, { force: true });
    }
  });

  it('an in-place edit that restores the mtime is still caught before mount', async () => {
    const img = await req<Img>('POST', '/v1/images/import', { type: 'dir', path: tree('touched', { 'f': 'y'.repeat(10000) }), base: 'busybox', image: 'touched:1' });
    const digest = img.layers[1];
    const blob = path.join(d.root, 'images', 'blobs', 'sha256', digest.slice(7));
    const st = statSync(blob);
    chmodSync(blob, 0o644);
    const fd = openSync(blob, 'r+');
    writeSync(fd, Buffer.from('XX'), 0, 2, 4096 + 10);
    closeSync(fd);
    chmodSync(blob, 0o444);
    utimesSync(blob, st.atime, st.mtime);
    await expect(d.client.createSandbox({ image: 'touched:1' })).rejects.toMatchObject({ code: 'FailedPrecondition', message: expect.stringContaining(digest) });
  });

  it('a blob reused by a new build is protected by the grace period even if it was old', async () => {
    const d2 = await TestDaemon.start({ slot: 20, config: '[images]\nprune_grace_s = 3600\n' });
    try {
      const src = tree('graced', { 'g': 'graced' });
      const a = await d2.client.request<Img>('POST', '/v1/images/import', { type: 'dir', path: src, image: 'g:1' });
      const hex = a.layers[0].slice(7);
      const old = new Date(Date.now() - 7200_000);
      utimesSync(path.join(d2.root, 'images', 'blobs', 'sha256', hex), old, old);
      utimesSync(path.join(d2.root, 'images', 'layers', `${hex}.json`), old, old);
      await d2.client.request('DELETE', '/v1/images/g:1');
      // The same tree built again reuses the blob: it is "just used" now.
      await d2.client.request<Img>('POST', '/v1/images/import', { type: 'dir', path: src, image: 'g:2' });
      await d2.client.request('DELETE', '/v1/images/g:2');
      const rep = await d2.client.request<{ removed: { digest: string }[]; kept_young: string[] }>('POST', '/v1/images/prune', {});
      expect(rep.removed.map((x) => x.digest)).not.toContain(a.layers[0]);
      expect(rep.kept_young).toContain(a.layers[0]);
    } finally {
      await d2.cleanup();
    }
  });

  it('a sandbox frozen when dsecd died (mid-commit) is thawed at restart', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    const cg = await d.cgroups();
    await cg.freeze(sb.id);
    await d.kill9();
    await d.launch();
    expect((await d.client.exec(sb.id, { argv: ['echo', 'thawed'] })).stdout.toString()).toBe('thawed\n');
    await d.client.deleteSandbox(sb.id, { force: true });
  });

  it('a crash between publishing a blob and its manifest leaves no image, and prune collects the blob', async () => {
    await d.restart({ DSEC_FAILPOINT: 'image.after-blob' });
    await expect(req('POST', '/v1/images/import', { type: 'dir', path: tree('crash', { 'c': 'crash' }), image: 'crash:1' })).rejects.toBeDefined();
    expect((await d.waitExit()).signal).toBe('SIGKILL');
    await d.launch();
    await expect(req('GET', '/v1/images/crash:1')).rejects.toMatchObject({ code: 'NotFound' });
    const blobsBefore = readdirSync(path.join(d.root, 'images', 'blobs', 'sha256'));
    const rep = await req<{ removed: { digest: string; source: string }[] }>('POST', '/v1/images/prune', {});
    expect(rep.removed.some((r) => r.source.includes('crash'))).toBe(true);
    expect(readdirSync(path.join(d.root, 'images', 'blobs', 'sha256')).length).toBe(blobsBefore.length - rep.removed.length);
  });
});
