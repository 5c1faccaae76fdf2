/**
 * The files dsecd bind-mounts into container sandboxes (the agent binary, the
 * resolv.conf of networked sandboxes), kept on a small tmpfs of the instance's own at
 * `<root>/sandbox-files`.
 *
 * Why a filesystem of its own: a bind mount's entry in the sandbox's
 * /proc/self/mountinfo shows the bound file's path inside its filesystem and that
 * filesystem's source. Bound from the host's root filesystem they read
 * `/var/lib/dsec/bin/dsec-agent-… … ext4 /dev/vda`: the state root and the host's block
 * device. Bound from this tmpfs they read `/dsec-agent-<hash> … tmpfs dsec`
 * (docs/SECURITY.md "What a sandbox sees of the host's mounts").
 *
 * Files are content-addressed (`<name>-<sha256 prefix><suffix>`), written once (temp file
 * and rename) and never changed in place, so rebuilding or upgrading dsec never changes a
 * file under a running sandbox or a create in flight; a running sandbox's bind mount
 * keeps its file even after a later dsecd removes the name. The tmpfs stays mounted
 * across dsecd restarts (sandboxes are adopted) and vanishes at reboot, when dsecd mounts
 * it again; `dsecd --purge` unmounts it. Its pages are charged to dsecd's memory cgroup:
 * about 1 MiB for the agent plus one small file per distinct resolv.conf.
 */
import { createHash } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import * as native from './native.js';
import { invalidArgument } from '../errors.js';
import { SANDBOX_ID_RE } from './cgroups/index.js';

/** Directory under the state root where the tmpfs is mounted. */
export const SANDBOX_FILES_DIR = 'sandbox-files';

/** The tmpfs's size limit: 16 MiB (a ceiling, not a reservation: tmpfs uses what it holds). */
export const SANDBOX_FILES_BYTES = 16 * 1024 * 1024;

/**
 * The `source` the tmpfs is mounted with: what a sandbox's mount table shows for a file
 * bound from it, in place of a host device name.
 */
export const SANDBOX_FILES_SOURCE = 'dsec';

/** Directory of the per-sandbox mask directories on the tmpfs. */
const MASKS = 'mask';

/** `id` as a directory name. @throws DsecError InvalidArgument unless it is a plain name. */
function maskName(id: string): string {
  if (!SANDBOX_ID_RE.test(id)) throw invalidArgument(`bad sandbox id for a mask directory: ${JSON.stringify(id)}`);
  return id;
}

/** The instance's tmpfs of files bound into sandboxes; see the module comment. */
export class SandboxFiles {
  private constructor(readonly dir: string) {}

  /**
   * Mounts the tmpfs at `<root>/sandbox-files` unless it is mounted already (a previous
   * dsecd's, kept for its adopted sandboxes), mode 0711: a sandbox's init, an unprivileged
   * host uid, must reach the files it binds, and nobody may list them. Makes the
   * directory of the sandboxes' mask directories ({@link maskDir}), `mask`, the same way.
   * @throws errno-coded Errors of mkdir/mount (EPERM without CAP_SYS_ADMIN).
   */
  static open(root: string): SandboxFiles {
    const dir = path.join(root, SANDBOX_FILES_DIR);
    mkdirSync(dir, { recursive: true, mode: 0o711 });
    if (!native.isMountpoint(dir)) {
      const c = native.constants();
      native.mount(SANDBOX_FILES_SOURCE, dir, 'tmpfs', c.MS_NOSUID | c.MS_NODEV, `mode=0711,size=${SANDBOX_FILES_BYTES}`);
    }
    chmodSync(dir, 0o711);
    const masks = path.join(dir, MASKS);
    mkdirSync(masks, { recursive: true, mode: 0o711 });
    chmodSync(masks, 0o711);
    return new SandboxFiles(dir);
  }

  /**
   * Stores `bytes` as `<name>-<first 16 hex of its sha256><suffix>` with `mode` (once:
   * an existing file of that name has these bytes) and returns its path.
   * @throws errno-coded Errors of the write (ENOSPC past {@link SANDBOX_FILES_BYTES}).
   */
  put(name: string, bytes: Buffer | string, mode: number, suffix = ''): string {
    const hash = createHash('sha256').update(bytes).digest('hex').slice(0, 16);
    const dest = path.join(this.dir, `${name}-${hash}${suffix}`);
    if (!existsSync(dest)) {
      const tmp = `${dest}.tmp${process.pid}`;
      writeFileSync(tmp, bytes, { mode });
      chmodSync(tmp, mode);
      renameSync(tmp, dest);
    }
    return dest;
  }

  /**
   * An empty directory of sandbox `id` on this tmpfs, `mask/<id>`, mode 0555 and owned by
   * host root (made if missing): what the sandbox binds read-only over the sysfs
   * directories it masks (drivers/container/spec.ts SYSFS_MASKED_DIRS), in place of a
   * tmpfs of its own for each. Every tmpfs is a superblock, and the kernel sizes each
   * memory cgroup's shrinker table by the host's superblock count (docs/BENCHMARKS.md
   * "Density"); a bind adds none. One directory per sandbox, not one for all: a shared
   * inode would let one sandbox watch another's reads of it (inotify) or signal it
   * (flock). A sandbox cannot write it: the bind is read-only and its owner is not in any
   * sandbox's user namespace.
   * @throws DsecError InvalidArgument for an id that is not a plain name; errno-coded
   * Errors of mkdir/chmod.
   */
  maskDir(id: string): string {
    const d = path.join(this.dir, MASKS, maskName(id));
    mkdirSync(d, { mode: 0o555, recursive: true });
    chmodSync(d, 0o555);
    return d;
  }

  /** Removes sandbox `id`'s mask directory ({@link maskDir}); nothing when it is gone. */
  removeMaskDir(id: string): void {
    rmSync(path.join(this.dir, MASKS, maskName(id)), { recursive: true, force: true });
  }

  /** Ids that have a mask directory ({@link maskDir}), for the orphan sweep. */
  maskDirIds(): string[] {
    try {
      return readdirSync(path.join(this.dir, MASKS));
    } catch {
      return [];
    }
  }

  /**
   * Stores the agent binary read from `source` (mode 0555) and removes the names of other
   * agent versions (sandboxes that bound one keep it through their mount). Returns the path
   * sandboxes bind at /dev/.dsec-agent.
   * @throws errno-coded Errors of reading `source` or of the write.
   */
  installAgent(source: string): string {
    const dest = this.put('dsec-agent', readFileSync(source), 0o555);
    for (const f of readdirSync(this.dir)) {
      if (f.startsWith('dsec-agent-') && path.join(this.dir, f) !== dest) rmSync(path.join(this.dir, f), { force: true });
    }
    return dest;
  }

  /**
   * Unmounts the tmpfs and removes its directory (`dsecd --purge`). Sandboxes that still
   * bind a file keep it. Safe to call twice.
   * @throws errno-coded Errors of umount other than "not mounted".
   */
  async remove(): Promise<void> {
    await native.unmountAllAsync(this.dir);
    try {
      rmdirSync(this.dir);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    }
  }
}
