/**
 * bench/on-demand: how much of an EROFS layer blob is read from storage when a process
 * reads a few small files and one big file inside the mounted layer, for three ways of
 * mounting the blob. Kernel behaviour only (no dsecd): builds one blob, then per mode
 * evicts it from the page cache, mounts, reads, measures, unmounts.
 *
 * Modes:
 *   file-buffered  mount(2) of the blob file (no loop device), no options: what dsecd does
 *   file-directio  the same with `-o directio` (EROFS reads the blob with O_DIRECT)
 *   loop           mount(8) `-o loop`: a loop device over the blob (the pre-6.12 way)
 *
 * Numbers per mode (bytes): `blob_resident` = the blob file's pages in the page cache
 * after the reads settle (fincore, i.e. mincore(2); starts at 0, so this is what was read
 * from storage through that cache, readahead included); `file_resident` = the big file's
 * pages in the EROFS inode's own cache; `disk_read` = sectors read by the blob's block
 * device during the reads (/proc/diskstats; device-wide, so other activity adds noise).
 *
 * Usage: node dist/bench/on-demand.js [--files 40] [--size-mib 8] [--dir /var/tmp]
 * Needs root, fincore and GNU dd; removes everything it creates.
 */
import { randomFillSync } from 'node:crypto';
import { mkdtempSync, readFileSync, statSync } from 'node:fs';
import { mkdir, open, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { Command } from 'commander';
import { execa } from 'execa';
import * as native from '../daemon/host/native.js';
import { buildErofs } from '../daemon/image/erofs.js';

const MiB = 2 ** 20;

/** Resident bytes of `file` per `fincore --bytes --json` (util-linux). */
export async function residentBytes(file: string): Promise<number> {
  const r = await execa('fincore', ['--bytes', '--json', file]);
  return Number((JSON.parse(String(r.stdout)) as { fincore: { res: number | string }[] }).fincore[0].res);
}

/** {@link residentBytes} once two samples 200 ms apart agree (in-flight readahead has landed), at most ~10 s. */
async function settled(file: string): Promise<number> {
  let prev = await residentBytes(file);
  for (let i = 0; i < 50; i++) {
    await new Promise((r) => setTimeout(r, 200));
    const now = await residentBytes(file);
    if (now === prev) break;
    prev = now;
  }
  return prev;
}

/** major:minor of the device holding `file`. */
function devOf(file: string): { major: number; minor: number } {
  const dev = statSync(file).dev;
  return { major: ((dev >> 8) & 0xfff) | (Math.floor(dev / 2 ** 32) & ~0xfff), minor: (dev & 0xff) | ((dev >> 12) & ~0xff) };
}

/** Sectors read (field 6 of /proc/diskstats, 512-byte units) by device major:minor, in bytes. */
function diskReadBytes(d: { major: number; minor: number }): number {
  for (const line of readFileSync('/proc/diskstats', 'utf8').split('\n')) {
    const f = line.trim().split(/\s+/);
    if (Number(f[0]) === d.major && Number(f[1]) === d.minor) return Number(f[5]) * 512;
  }
  return NaN;
}

type Mode = 'file-buffered' | 'file-directio' | 'loop';

async function main(): Promise<void> {
  const cmd = new Command()
    .option('--files <n>', 'big files in the layer', '40')
    .option('--size-mib <n>', 'size of each big file, MiB', '8')
    .option('--dir <path>', 'scratch dir on a real block device', '/var/tmp')
    .parse(process.argv);
  const o = cmd.opts<{ files: string; sizeMib: string; dir: string }>();
  const files = Number(o.files);
  const size = Number(o.sizeMib) * MiB;
  const base = mkdtempSync(path.join(o.dir, 'dsec-bench-ondemand-'));
  const mnt = path.join(base, 'mnt');
  try {
    const tree = path.join(base, 'tree');
    await mkdir(path.join(tree, 'data'), { recursive: true });
    const chunk = Buffer.alloc(MiB);
    for (let i = 0; i < files; i++) {
      const fh = await open(path.join(tree, 'data', `big-${i}.bin`), 'w');
      for (let off = 0; off < size; off += MiB) await fh.write(randomFillSync(chunk), 0, Math.min(MiB, size - off));
      await fh.close();
    }
    for (let i = 0; i < 12; i++) await writeFile(path.join(tree, `small-${i}.txt`), 'x'.repeat(100 * (i + 1)));
    const blob = path.join(base, 'layer.erofs');
    const { sizeBytes } = await buildErofs(tree, blob, { allRoot: true });
    await rm(tree, { recursive: true, force: true });
    await mkdir(mnt);
    const dev = devOf(blob);
    const raKb = Number(readFileSync(`/sys/class/bdi/${dev.major}:${dev.minor}/read_ahead_kb`, 'utf8').trim());
    const target = `data/big-${Math.floor(files / 2)}.bin`;

    const results: Record<string, unknown> = {};
    for (const mode of ['file-buffered', 'file-directio', 'loop'] as Mode[]) {
      await execa('sync', ['--data', blob]);
      await execa('dd', [`if=${blob}`, 'iflag=nocache', 'count=0', 'status=none']);
      const before = await residentBytes(blob);
      const c = native.constants();
      if (mode === 'loop') await execa('mount', ['-t', 'erofs', '-o', 'ro,loop', blob, mnt]);
      else native.mount(blob, mnt, 'erofs', c.MS_RDONLY | c.MS_NODEV | c.MS_NOSUID, mode === 'file-directio' ? 'directio' : null);
      try {
        const d0 = diskReadBytes(dev);
        for (const n of (await readdir(mnt)).filter((x) => x.startsWith('small-'))) await readFile(path.join(mnt, n));
        await readFile(path.join(mnt, target));
        const blobResident = await settled(blob);
        const d1 = diskReadBytes(dev);
        results[mode] = {
          blob_resident_before: before,
          blob_resident: blobResident,
          blob_fraction: Math.round((blobResident / sizeBytes) * 10000) / 10000,
          file_resident: await residentBytes(path.join(mnt, target)),
          disk_read: d1 - d0,
        };
      } finally {
        // mount(8) -o loop sets autoclear: unmounting frees the loop device.
        native.unmountAll(mnt);
      }
    }
    process.stdout.write(
      `${JSON.stringify({ kernel: readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim(), blob_bytes: sizeBytes, read_bytes: size, read_ahead_kb: raKb, modes: results }, null, 2)}\n`,
    );
  } finally {
    native.unmountAll(mnt);
    await rm(base, { recursive: true, force: true });
  }
}

await main();
