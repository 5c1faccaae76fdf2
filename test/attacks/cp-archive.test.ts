/**
 * Attack: desynchronise the tar stream of `dsec cp ID:DIR ...` (GET .../archive) from
 * inside the sandbox. A tar entry's header gives its size and the next header starts right
 * after that many bytes, so a file that reads as more than it stat'ed as would, copied
 * as it reads, put bytes the sandbox chose where the consumer expects the next header:
 * members dsecd's walk never sends (devices, hard links, absolute names) for whoever
 * unpacks the stream (`dsec cp ID:DIR - | tar x`), and one that reads as less leaves
 * the archive cut. The sandbox has both kinds at hand: a file it keeps growing while it
 * is copied, /proc files (0 bytes in stat, text when read) and sysfs files (4096 bytes
 * in stat, a few when read).
 *
 * Against a real dsecd, each archive must parse to the end with exactly the members of
 * the directory, each as long as its header says (daemon/api/routes/files.ts `exactly`).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import type { Readable } from 'node:stream';
import tarStream from 'tar-stream';
import { IS_ROOT, TestDaemon, out, runCli } from '../integration/harness.js';

/** Members of a tar stream: name, header size and body length; rejects on a malformed stream. */
async function members(s: Readable): Promise<Array<{ name: string; type: string; size: number; body: number }>> {
  const found: Array<{ name: string; type: string; size: number; body: number }> = [];
  const ex = tarStream.extract();
  const done = new Promise<void>((resolve, reject) => {
    ex.on('entry', (h, stream, next) => {
      let body = 0;
      stream.on('data', (c: Buffer) => { body += c.length; });
      stream.on('end', () => {
        found.push({ name: h.name, type: h.type ?? '', size: h.size ?? 0, body });
        next();
      });
    });
    ex.on('finish', () => resolve());
    ex.on('error', reject);
    s.on('error', reject);
  });
  s.pipe(ex);
  await done;
  return found;
}

describe.skipIf(!IS_ROOT)('attack: a sandbox file that changes size while it is archived', () => {
  let d: TestDaemon;
  let sb: string;
  let tmp: string;
  const sh = (script: string) => d.client.exec(sb, { argv: ['sh', '-c', script] });

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 32 });
    tmp = mkdtempSync('/tmp/dsec-cp-archive-');
    sb = (await d.client.createSandbox({ image: 'busybox' })).id;
  }, 180_000);
  afterAll(async () => {
    if (tmp) rmSync(tmp, { recursive: true, force: true });
    await d?.cleanup();
  });

  it('/proc files (0 bytes in stat, text when read): the archive parses to the end, every file as long as its header', async () => {
    const names = out(await sh('ls /proc/sys/kernel/random')).trim().split('\n');
    expect(names).toContain('boot_id');
    const got = await members(await d.client.getArchive(sb, '/proc/sys/kernel/random'));
    expect(got.map((m) => m.name).sort()).toEqual(['random', ...names.map((n) => `random/${n}`)].sort());
    for (const m of got) expect(m.body, m.name).toBe(m.size);
    // The CLI copies them (as GNU tar does, as the empty files they stat as).
    const r = await runCli(d, ['cp', `${sb}:/proc/sys/kernel/random`, path.join(tmp, 'random')]);
    expect(r.code, r.stderr).toBe(0);
    expect(readdirSync(path.join(tmp, 'random')).sort()).toEqual([...names].sort());
  });

  it('sysfs files (4096 bytes in stat, a few when read): padded to their header, the archive parses to the end', async () => {
    const dir = '/sys/devices/system/cpu/cpu0/topology';
    const names = out(await sh(`ls ${dir}`)).trim().split('\n');
    expect(names).toContain('core_id');
    const got = await members(await d.client.getArchive(sb, dir));
    expect(got.map((m) => m.name).sort()).toEqual(['topology', ...names.map((n) => `topology/${n}`)].sort());
    for (const m of got) expect(m.body, m.name).toBe(m.size);
  });

  it('a file the sandbox keeps growing as it is copied: exactly its size at open, then the next member and the end of the archive', async () => {
    const plant = await sh('mkdir -p /root/g && dd if=/dev/zero of=/root/g/a bs=1M count=8 2>/dev/null && echo after > /root/g/b && ls /root/g');
    expect(out(plant)).toBe('a\nb\n');
    // A byte at a time (a shell builtin, no fork): tens of KiB a second, so the read of
    // the 8 MiB reaches the end while bytes keep coming.
    const grower = await d.client.startExec(sb, { argv: ['sh', '-c', 'while :; do echo -n x >> /root/g/a; done'] });
    try {
      // Growing now: the read below meets a file longer than its stat at open.
      while (Number(out(await sh('stat -c %s /root/g/a')).trim()) <= 8 << 20) await new Promise((r) => setTimeout(r, 50));
      const got = await members(await d.client.getArchive(sb, '/root/g'));
      expect(got.map((m) => m.name)).toEqual(['g', 'g/a', 'g/b']);
      for (const m of got) expect(m.body, m.name).toBe(m.size);
      expect(got[1].size).toBeGreaterThan(8 << 20);
      expect(got[2].size).toBe(6);
      // Through the CLI to a local directory: the same two files.
      const dest = path.join(tmp, 'g');
      const r = await runCli(d, ['cp', `${sb}:/root/g`, dest]);
      expect(r.code, r.stderr).toBe(0);
      expect(readdirSync(dest).sort()).toEqual(['a', 'b']);
      expect(readFileSync(path.join(dest, 'b'), 'utf8')).toBe('after\n');
    } finally {
      await d.client.signalExec(sb, grower.exec_id, 'SIGKILL').catch(() => undefined);
    }
  });
});
