/**
 * The built-in `e2b-base` image: what E2B's SDKs assume of the default `base` template,
 * on top of the built-in busybox image, so an unmodified SDK works on a fresh install:
 * - `/bin/bash`: the SDKs start every command as `/bin/bash -l -c CMD`; Debian's
 *   bash-static (a static binary, so it needs nothing from the image) is copied in;
 * - a user `user`, uid/gid 1000, home `/home/user` owned by it: the user the SDKs run
 *   commands and file operations as by default.
 * One extra layer over busybox's: `/bin/bash`, `/etc/passwd` and `/etc/group` (busybox's
 * entries plus `user`), `/home/user`. The image's default user stays root, so `dsec exec`
 * into an E2B sandbox behaves as for any image; the E2B front runs as `user` when the
 * sandbox has that account (docs/E2B.md).
 */
import { chmod, chown, copyFile, lstat, mkdir, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { DsecError } from '../errors.js';
import { BUILTIN_BUSYBOX, DEFAULT_TAG, type LayerStore } from './layer-store.js';
import { BUSYBOX_PATH_ENV } from './builtin.js';

/** Name of the image (`e2b-base:latest`). */
export const E2B_BASE_IMAGE = 'e2b-base';

/** Where Debian's bash-static installs its binary. */
export const BASH_STATIC_HOST_PATH = '/bin/bash-static';

/** The E2B SDKs' default user: name, uid and gid, home. */
export const E2B_USER = { name: 'user', uid: 1000, gid: 1000, home: '/home/user' } as const;

/** /etc/passwd of the image: busybox's root and nobody, plus `user` with bash as its shell. */
const PASSWD = 'root:x:0:0:root:/root:/bin/bash\n'
  + `${E2B_USER.name}:x:${E2B_USER.uid}:${E2B_USER.gid}:${E2B_USER.name}:${E2B_USER.home}:/bin/bash\n`
  + 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n';
/** /etc/group: root, user, nogroup. */
const GROUP = `root:x:0:\n${E2B_USER.name}:x:${E2B_USER.gid}:\nnogroup:x:65534:\n`;

/**
 * Builds `e2b-base:latest` when it is missing (or a blob of it is gone): the busybox image
 * first (LayerStore.ensureBuiltinImages), then the layer above. Idempotent and cheap when
 * present.
 * @param bash the static bash binary (default {@link BASH_STATIC_HOST_PATH})
 * @throws DsecError FailedPrecondition when the bash binary is missing (install Debian's
 *   bash-static), or what building a layer throws.
 */
export async function ensureE2bBaseImage(store: LayerStore, opts: { bash?: string } = {}): Promise<void> {
  try {
    const m = await store.get(E2B_BASE_IMAGE);
    let complete = true;
    for (const d of m.layers) complete &&= (await stat(store.blobPath(d)).catch(() => undefined))?.isFile() ?? false;
    if (complete) return;
  } catch (e) {
    if (!(e instanceof DsecError && e.kind === 'NotFound')) throw e;
  }
  const bash = opts.bash ?? BASH_STATIC_HOST_PATH;
  if (!(await lstat(bash).catch(() => undefined))?.isFile()) {
    throw new DsecError('FailedPrecondition', `${bash} not found: install Debian's bash-static to get the E2B base template (e2b-base image)`);
  }
  await store.ensureBuiltinImages();
  const busybox = await store.get(BUILTIN_BUSYBOX);
  const tree = store.tmpPath('-e2b-base-tree');
  try {
    for (const d of ['bin', 'etc', 'home']) {
      await mkdir(join(tree, d), { recursive: true });
      await chmod(join(tree, d), 0o755);
    }
    await chmod(tree, 0o755);
    await copyFile(bash, join(tree, 'bin/bash'));
    await chmod(join(tree, 'bin/bash'), 0o755);
    await writeFile(join(tree, 'etc/passwd'), PASSWD);
    await chmod(join(tree, 'etc/passwd'), 0o644);
    await writeFile(join(tree, 'etc/group'), GROUP);
    await chmod(join(tree, 'etc/group'), 0o644);
    const home = join(tree, E2B_USER.home);
    await mkdir(home, { recursive: true });
    await chmod(home, 0o755);
    await chown(home, E2B_USER.uid, E2B_USER.gid);
    // Owners are kept (no --all-root): /home/user must belong to uid 1000 in the image.
    const { digest } = await store.addLayerFromDir(tree, { source: 'builtin:e2b-base' });
    await store.putManifest({
      name: E2B_BASE_IMAGE,
      tag: DEFAULT_TAG,
      layers: [...busybox.layers, digest],
      // No HOME: the agent sets it from the user's passwd entry, so `user` gets /home/user.
      config: { env: [BUSYBOX_PATH_ENV], cwd: '/', user: '0:0', cmd: ['/bin/bash'] },
      created_ms: Date.now(),
    });
  } finally {
    await rm(tree, { recursive: true, force: true });
  }
}
