/**
 * What a sandbox is made of: an image's layers and process defaults, as resolved at its
 * create and recorded with it (a later change of the image never alters the sandbox).
 * The image store's own formats (manifests, layer metadata) are daemon/image/layer-store.ts.
 */
import type { FilesystemOptions } from './filesystem.js';

/**
 * Per-image or per-sandbox change to the default seccomp profile. `allow`: drop every
 * denial of these syscalls; `deny`: add an unconditional EPERM denial (validated by
 * daemon/security/seccomp.ts SeccompOverrideSchema).
 */
export interface SeccompOverride {
  allow?: string[];
  deny?: string[];
}

/**
 * An image's security defaults (daemon/image/security.ts): a seccomp override and
 * filesystem options, each applied unless the create request names its own.
 */
export interface ImageSecurity extends FilesystemOptions {
  seccomp?: SeccompOverride;
}

/** An image's process defaults, recorded with each sandbox at create. */
export interface ImageConfig {
  /** Environment, `KEY=value` each. */
  env: string[];
  /** Working directory of execs (absolute). */
  cwd: string;
  /** Default user, a name or `uid[:gid]`. */
  user: string;
  /** Default command (argv). */
  cmd: string[];
  /** The image's security defaults; its seccomp override applies to the sandbox. */
  security?: ImageSecurity;
}

/** An image reference resolved to its content: what a new sandbox mounts and runs with. */
export interface ImageSource {
  /** Canonical reference as stored with the sandbox: `name:tag`, or a reference a backend owns (`disk:NAME`). */
  image: string;
  /** Layer digests (`sha256:<hex>`), lowest first; none for a disk image. */
  layers: string[];
  config: ImageConfig;
}

/**
 * The layer stack to mount: a layer that occurs twice (an image that repeats a blob,
 * e.g. two identical COPY steps) is kept only at its topmost position. That yields the
 * same tree: the upper copy covers every path of the lower one, and the lower copy's
 * whiteouts only hide layers that the upper copy's whiteouts hide too. overlayfs
 * refuses the same lower twice (ELOOP); a VM attaches one disk per layer.
 * @param layers digests, lowest first.
 * @returns the digests to mount, lowest first.
 */
export function effectiveLayers(layers: readonly string[]): string[] {
  return layers.filter((d, i) => layers.indexOf(d, i + 1) === -1);
}
