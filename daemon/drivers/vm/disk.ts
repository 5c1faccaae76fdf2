/**
 * Disks of the vm tier.
 *
 * A VM of a dsec image boots from a **base disk** dsec composes from the image's layers:
 * one raw ext4 filesystem holding the flattened layers (the overlay of the image's EROFS
 * layers, read through overlayfs so whiteouts and opaque directories are applied), built
 * once per (layers, size) and shared read-only by every VM of that image. The filesystem
 * is made by `mkfs.ext4 -d` running as the **builder identity** (daemon/host/builder.ts):
 * the overlay is mounted over lowers idmapped into the builder slot's range, so the
 * builder reads the image's files with their in-image owners and writes the disk file in
 * its staging dir; root only mounts and publishes it. The guest boots it with the Debian
 * kernel and dsec's initramfs (`-kernel`/`-initrd`), whose /init mounts it as the root and
 * runs dsec's agent as PID 1, exactly as in a microVM (docs/ARCHITECTURE.md "The vm tier").
 *
 * Each VM's writable disk is a qcow2 overlay (`disk.qcow2`) whose backing file is the base
 * disk (composed) or an operator-registered disk (`[vm.disks.NAME]`): creating one takes
 * milliseconds and only the blocks the guest writes take host disk; stop/start keep it.
 *
 * Cache: `<root>/vm/disks/base-<sha256 of version, layers, size>.raw`, published by
 * rename, so an interrupted build never leaves a partial file under the final name. A
 * base disk no sandbox dir names any more is removed ({@link BaseDisks.collect}).
 */
import { closeSync, constants as fsc, openSync } from 'node:fs';
import { copyFile, mkdir, readFile, readdir, rename, rm, stat } from 'node:fs/promises';
import { createHash, randomBytes } from 'node:crypto';
import path from 'node:path';
import { execa } from 'execa';
import type { Logger } from 'pino';
import { internal } from '../../errors.js';
import { BUILDER_SLOT_IDS, type Builder } from '../../host/builder.js';
import { prepareRootfs, teardownRootfs } from '../../image/rootfs.js';

/** Bumped whenever the layout of a base disk changes (a new version composes new base disks). */
export const BASE_DISK_VERSION = 1;

/** The file in a vm sandbox dir that names the base disk its qcow2 overlay is backed by. */
export const BASE_FILE = 'base';

/** Mounts of image layers (LayerMounts): a mounted blob dir per digest, reference-counted. */
export interface LayerSource {
  acquire(digest: string): Promise<string>;
  release(digest: string): Promise<void>;
}

/** Dependencies of {@link BaseDisks}. */
export interface BaseDisksDeps {
  /** Instance root: base disks in `<root>/vm/disks`, compose dirs in `<root>/vm/compose`. */
  root: string;
  layers: LayerSource;
  /** The builder identity, or null (`[builder] enabled = false`: mkfs.ext4 runs as root). */
  builder: Builder | null;
  log: Logger;
}

/** Composes, caches and collects base disks; see the module comment. */
export class BaseDisks {
  /** Builds in flight by file, and the lock that orders builds and collection. */
  private readonly inflight = new Map<string, Promise<string>>();
  private lock: Promise<unknown> = Promise.resolve();

  constructor(private readonly d: BaseDisksDeps) {}

  /** `<root>/vm/disks`. */
  get dir(): string {
    return path.join(this.d.root, 'vm', 'disks');
  }

  /** The base disk file of these layers (lowest first) and size, whether or not it exists. */
  fileFor(digests: readonly string[], sizeBytes: number): string {
    const key = createHash('sha256').update(`dsec-vm-base ${BASE_DISK_VERSION}\n${digests.join(',')}\n${sizeBytes}\n`).digest('hex');
    return path.join(this.dir, `base-${key.slice(0, 32)}.raw`);
  }

  /**
   * The base disk of `digests` with an ext4 filesystem of `sizeBytes` (sparse), composing
   * it when the cache has none. `pin` runs under the same lock as {@link collect} once the
   * disk exists (the caller records its use there, so collection never removes it between).
   * @throws DsecError Internal naming what failed (a layer mount, mkfs.ext4's message).
   */
  async ensure(digests: readonly string[], sizeBytes: number, pin: (file: string) => Promise<void>): Promise<string> {
    const file = this.fileFor(digests, sizeBytes);
    return this.locked(async () => {
      if (!(await stat(file).catch(() => null))) {
        let p = this.inflight.get(file);
        if (!p) {
          p = this.compose(digests, sizeBytes, file).finally(() => this.inflight.delete(file));
          this.inflight.set(file, p);
        }
        await p;
      }
      await pin(file);
      return file;
    });
  }

  /**
   * Removes base disks that no `<sandboxes>/<id>/base` file names. Runs under the lock,
   * so a create between composing and pinning is never raced.
   * @returns the removed files.
   */
  async collect(sandboxesDir: string): Promise<string[]> {
    return this.locked(async () => {
      const used = new Set<string>();
      for (const id of await readdir(sandboxesDir).catch(() => [] as string[])) {
        const b = await readFile(path.join(sandboxesDir, id, BASE_FILE), 'utf8').catch(() => null);
        if (b) used.add(b.trim());
      }
      const removed: string[] = [];
      for (const f of await readdir(this.dir).catch(() => [] as string[])) {
        const p = path.join(this.dir, f);
        if (/^base-[0-9a-f]{32}\.raw$/.test(f) && !used.has(p)) {
          await rm(p, { force: true });
          removed.push(p);
        } else if (/\.tmp\d+$/.test(f)) {
          await rm(p, { force: true });
        }
      }
      // Compose dirs of an interrupted build: unmount and remove.
      const cdir = path.join(this.d.root, 'vm', 'compose');
      for (const c of await readdir(cdir).catch(() => [] as string[])) {
        await teardownRootfs(path.join(cdir, c)).catch(() => {});
        await rm(path.join(cdir, c), { recursive: true, force: true }).catch(() => {});
      }
      return removed;
    });
  }

  private locked<T>(fn: () => Promise<T>): Promise<T> {
    const p = this.lock.then(fn, fn);
    this.lock = p.catch(() => {});
    return p;
  }

  private async compose(digests: readonly string[], sizeBytes: number, file: string): Promise<string> {
    const t0 = Date.now();
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    const cdir = path.join(this.d.root, 'vm', 'compose', randomBytes(6).toString('hex'));
    await mkdir(cdir, { recursive: true, mode: 0o700 });
    const got: string[] = [];
    try {
      const lowers: string[] = [];
      for (const dg of digests) {
        lowers.push(await this.d.layers.acquire(dg));
        got.push(dg);
      }
      const mkfsArgs = (src: string, out: string) => ['-q', '-F', '-t', 'ext4', '-m', '0', '-L', 'dsec-root',
        '-E', 'lazy_itable_init=1,lazy_journal_init=1,nodiscard', '-d', src, out, `${Math.floor(sizeBytes / 1024)}k`];
      const tmp = `${file}.tmp${process.pid}`;
      if (this.d.builder) {
        await this.d.builder.withJob(async (job) => {
          const { rootfs } = await prepareRootfs({ dir: cdir, lowers, uidBase: job.uid, gidBase: job.uid, count: BUILDER_SLOT_IDS });
          const fd = openSync(rootfs, fsc.O_RDONLY | fsc.O_DIRECTORY);
          try {
            const r = await job.run([mkfsPath(), ...mkfsArgs('/proc/self/fd/3/.', 'base.raw')], { fds: [fd], env: { LC_ALL: 'C' } });
            if (r.exitCode !== 0) throw internal(`composing the VM base disk: mkfs.ext4 -d as the builder failed (exit ${r.exitCode}): ${r.stderr.trim().split('\n').slice(-3).join(' | ')}`);
          } finally {
            closeSync(fd);
          }
          const out = job.adopt('base.raw', 0o644);
          closeSync(out.fd);
          await rename(out.path, tmp).catch(async (e: NodeJS.ErrnoException) => {
            if (e.code !== 'EXDEV') throw e;
            await copyFile(out.path, tmp);
          });
        });
      } else {
        const { rootfs } = await prepareRootfs({ dir: cdir, lowers, uidBase: 0, gidBase: 0, count: BUILDER_SLOT_IDS });
        const r = await execa(mkfsPath(), mkfsArgs(rootfs, tmp), { reject: false });
        if (r.exitCode !== 0) throw internal(`composing the VM base disk: mkfs.ext4 -d failed (exit ${r.exitCode}): ${String(r.stderr).trim()}`);
      }
      await rename(tmp, file);
      this.d.log.info({ file, layers: digests.length, sizeBytes, ms: Date.now() - t0, builder: !!this.d.builder }, 'composed a VM base disk');
      return file;
    } finally {
      await teardownRootfs(cdir).catch((e) => this.d.log.warn({ err: e, dir: cdir }, 'unmounting a compose dir failed'));
      await rm(cdir, { recursive: true, force: true }).catch(() => {});
      for (const dg of got) await this.d.layers.release(dg).catch(() => {});
    }
  }
}

/** mkfs.ext4 (e2fsprogs), by absolute path: the builder's PATH may not have the sbin dirs. */
function mkfsPath(): string {
  for (const p of ['/usr/sbin/mkfs.ext4', '/sbin/mkfs.ext4']) {
    try {
      closeSync(openSync(p, fsc.O_RDONLY));
      return p;
    } catch { /* next */ }
  }
  return 'mkfs.ext4';
}

/**
 * Creates the qcow2 overlay `file` backed by `backing` (of `backingFormat`), of the
 * backing file's size, by `qemu-img create` (written to a temp name and renamed).
 * @throws DsecError Internal with qemu-img's message.
 */
export async function createOverlay(file: string, backing: string, backingFormat: 'raw' | 'qcow2'): Promise<void> {
  const tmp = `${file}.tmp`;
  const r = await execa('qemu-img', ['create', '-q', '-f', 'qcow2', '-o', 'lazy_refcounts=on', '-F', backingFormat, '-b', backing, tmp], { reject: false });
  if (r.exitCode !== 0) {
    await rm(tmp, { force: true });
    throw internal(`creating the VM's writable disk ${file} over ${backing} failed: ${String(r.stderr).trim() || `qemu-img exit ${r.exitCode}`} (is qemu-utils installed?)`);
  }
  await rename(tmp, file);
}
