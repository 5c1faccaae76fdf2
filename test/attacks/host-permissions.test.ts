/**
 * Local users on the host cannot read sandbox secrets or files: the store (which holds
 * sandbox env), the layer store, blob mounts and every sandbox's dirs are root-only
 * (sandbox dirs belong to the sandbox's own uid), and the API socket is 0660.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execa } from 'execa';
import path from 'node:path';
import { statSync } from 'node:fs';
import { IS_ROOT, TestDaemon } from '../integration/harness.js';

/** Runs a shell command as `nobody` (uid/gid 65534); resolves with exit code and output. */
async function asNobody(cmd: string): Promise<{ code: number; out: string }> {
  const r = await execa('/bin/sh', ['-c', cmd], { uid: 65534, gid: 65534, reject: false, all: true });
  return { code: r.exitCode ?? -1, out: String(r.all) };
}

describe.skipIf(!IS_ROOT)('attack: a local user reads sandbox data on the host', () => {
  let d: TestDaemon;
  let id: string;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 15 });
    id = (await d.client.createSandbox({ image: 'busybox', env: { API_KEY: 'sk-supersecret123' } })).id;
    await d.client.exec(id, { argv: ['sh', '-c', 'echo answer-42 > /root/solution'] });
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('cannot read the store or its WAL (which hold sandbox env)', async () => {
    for (const f of ['dsec.db', 'dsec.db-wal']) {
      expect(statSync(path.join(d.root, f)).mode & 0o077).toBe(0);
    }
    const r = await asNobody(`cat ${d.root}/dsec.db ${d.root}/dsec.db-wal | grep -a -c sk-supersecret123`);
    expect(r.out).not.toMatch(/^[1-9]/m);
  });

  it('cannot list or enter sandbox dirs or writable layers, even knowing the id', async () => {
    const r = await asNobody(`ls ${d.root}/sandboxes ${d.root}/storage/mnt/sb; cat ${d.root}/sandboxes/${id}/rootfs/root/solution ${d.upperDir(id)}/root/solution; ls ${d.root}/sandboxes/${id}`);
    expect(r.out).not.toContain('answer-42');
    expect(r.out).not.toContain(id + '\n');
    expect(r.out).toMatch(/Permission denied/);
  });

  it('cannot read image blobs or the mounted layers', async () => {
    const sb = await d.client.getSandbox(id);
    const hex = sb.image_layers[0].slice(7);
    const r = await asNobody(`ls ${d.root}/layers/${hex}/bin ${d.root}/images/blobs/sha256 2>&1; head -c 10 ${d.root}/images/blobs/sha256/${hex} >/dev/null && echo READ`);
    expect(r.out).not.toContain('busybox');
    expect(r.out).not.toContain('READ');
  });

  it('cannot use the API socket', async () => {
    expect(statSync(d.socket).mode & 0o007).toBe(0);
    const r = await asNobody(`echo | nc -U ${d.socket} 2>&1 || echo refused`);
    expect(r.out).not.toMatch(/HTTP\/1\.1/);
  });
});
