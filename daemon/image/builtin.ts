/**
 * The built-in `busybox` image: a minimal root filesystem made on the host from Debian's
 * busybox-static, so dsecd can run sandboxes with no image import and no network.
 *
 * Layout: /bin/busybox plus one symlink per applet at the path busybox itself suggests
 * (`busybox --list-full`: bin/, sbin/, usr/bin/, usr/sbin/), /etc/passwd, /etc/group, and
 * the usual empty directories. Every entry gets an explicit mode (the host umask never
 * leaks in) and, when the builder is root, owner 0:0; the blob is also built with
 * `--all-root`, so the image is identical whoever built it, for a given busybox binary.
 */
import { chmod, chown, copyFile, lchown, lstat, mkdir, symlink, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { execa } from 'execa';
import { DsecError } from '../errors.js';

/** Where Debian's busybox-static installs its binary. */
export const BUSYBOX_HOST_PATH = '/bin/busybox';

/** PATH for the busybox image: every directory its applets are linked into. */
export const BUSYBOX_PATH_ENV = 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** Directories created empty, with their modes. /tmp and /var/tmp are sticky and world-writable. */
const DIRS: Array<[string, number]> = [
  ['bin', 0o755],
  ['sbin', 0o755],
  ['usr', 0o755],
  ['usr/bin', 0o755],
  ['usr/sbin', 0o755],
  ['usr/local', 0o755],
  ['usr/local/bin', 0o755],
  ['usr/local/sbin', 0o755],
  ['etc', 0o755],
  ['proc', 0o555],
  ['sys', 0o555],
  ['dev', 0o755],
  ['tmp', 0o1777],
  ['root', 0o700],
  ['home', 0o755],
  ['var', 0o755],
  ['var/tmp', 0o1777],
  ['run', 0o755],
];

/** /etc/passwd: root and nobody (65534, the overflow id, so unmapped owners show as a name). */
const PASSWD = 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n';
/** /etc/group: root and nogroup (65534). */
const GROUP = 'root:x:0:\nnogroup:x:65534:\n';

/**
 * Lists busybox's applets with their install paths relative to `/` (e.g. `bin/sh`,
 * `usr/bin/awk`), from `busybox --list-full`. Throws an Internal DsecError if busybox
 * cannot be run or reports nothing.
 */
export async function busyboxApplets(busybox = BUSYBOX_HOST_PATH): Promise<string[]> {
  const r = await execa(busybox, ['--list-full'], { reject: false, stdin: 'ignore' });
  if (r.failed) throw new DsecError('Internal', `${busybox} --list-full failed: ${String(r.stderr || r.message).trim()}`);
  const applets = String(r.stdout)
    .split('\n')
    .map((l) => l.trim().replace(/^\/+/, ''))
    .filter((l) => l !== '' && !l.includes('..') && l !== 'bin/busybox');
  if (applets.length === 0) throw new DsecError('Internal', `${busybox} --list-full listed no applets`);
  return applets.sort();
}

/**
 * Fills `dir` (created if missing; should be empty) with the busybox root filesystem
 * described above. `dir` itself becomes mode 0755 (it is the image's `/`).
 * Applets whose path already exists (busybox lists a few twice) are skipped.
 * Throws a FailedPrecondition DsecError when `/bin/busybox` is missing (install
 * busybox-static), and fs errors as they come.
 */
export async function prepareBusyboxTree(dir: string, opts: { busybox?: string } = {}): Promise<void> {
  const busybox = opts.busybox ?? BUSYBOX_HOST_PATH;
  const bst = await lstat(busybox).catch(() => undefined);
  if (!bst?.isFile()) {
    throw new DsecError('FailedPrecondition', `${busybox} not found: install Debian's busybox-static to get the built-in image`);
  }
  const applets = await busyboxApplets(busybox);
  const asRoot = process.getuid?.() === 0;

  await mkdir(dir, { recursive: true });
  await chmod(dir, 0o755);
  for (const [d, mode] of DIRS) {
    await mkdir(join(dir, d), { recursive: true });
    await chmod(join(dir, d), mode);
  }
  await copyFile(busybox, join(dir, 'bin/busybox'));
  await chmod(join(dir, 'bin/busybox'), 0o755);
  await writeFile(join(dir, 'etc/passwd'), PASSWD, { mode: 0o644 });
  await chmod(join(dir, 'etc/passwd'), 0o644);
  await writeFile(join(dir, 'etc/group'), GROUP, { mode: 0o644 });
  await chmod(join(dir, 'etc/group'), 0o644);

  for (const rel of applets) {
    const at = join(dir, rel);
    await mkdir(dirname(at), { recursive: true, mode: 0o755 });
    try {
      await symlink('/bin/busybox', at);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
  }

  if (asRoot) await chownTree(dir, applets);
}

/** chown 0:0 everything prepareBusyboxTree created (lchown semantics for the applet symlinks). */
async function chownTree(dir: string, applets: string[]): Promise<void> {
  await chown(dir, 0, 0);
  for (const [d] of DIRS) await chown(join(dir, d), 0, 0);
  for (const f of ['bin/busybox', 'etc/passwd', 'etc/group']) await chown(join(dir, f), 0, 0);
  for (const rel of applets) await lchown(join(dir, rel), 0, 0);
}
