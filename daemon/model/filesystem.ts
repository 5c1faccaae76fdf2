/**
 * A sandbox's filesystem options (docs/SECURITY.md "Filesystem" and "Landlock"): which
 * system paths are read-only, which places stay writable, and whether Landlock confines
 * its processes. The option paths' validation is daemon/security/filesystem.ts
 * (FilesystemOptionsSchema), the mount plan that enforces them too; this module holds the
 * shapes and their precedence.
 *
 * Precedence, field by field: the create request > the image's security defaults >
 * `[filesystem]` in dsecd's config > {@link DEFAULT_FILESYSTEM}. A sandbox stores the
 * resolved options at create, so a later change of config or image never alters it.
 */

/** Filesystem options as a request, an image or the config gives them: every field optional. */
export interface FilesystemOptions {
  /** System paths read-only even to root inside (`*`/`?` in the last component); [] turns read-only paths off. */
  readonly_paths?: string[];
  /** Paths kept writable: exceptions below read-only paths, or directories dsecd creates. */
  writable_paths?: string[];
  /** Restrict file access with Landlock where the kernel has it. */
  landlock?: boolean;
}

/** Filesystem options with every field decided: what a sandbox row stores. */
export interface ResolvedFilesystem {
  readonly_paths: string[];
  writable_paths: string[];
  landlock: boolean;
}

/** Default `readonly_paths`: the system paths an agent under RL pressure tried to overwrite (/bin/bash), and the libraries and config they load. */
export const DEFAULT_READONLY_PATHS: readonly string[] = ['/bin', '/sbin', '/usr', '/lib*', '/etc'];

/** The built-in defaults, below `[filesystem]` in the config. */
export const DEFAULT_FILESYSTEM: Readonly<ResolvedFilesystem> = Object.freeze({
  readonly_paths: [...DEFAULT_READONLY_PATHS],
  writable_paths: [],
  landlock: true,
});

/**
 * The options in force for a new sandbox, field by field: `request` > `image` >
 * `config` (itself already resolved over {@link DEFAULT_FILESYSTEM}). Pure.
 * @returns fresh arrays (never aliases of the inputs).
 */
export function resolveFilesystem(request: FilesystemOptions | null | undefined, image: FilesystemOptions | null | undefined, config: ResolvedFilesystem): ResolvedFilesystem {
  const pick = <K extends keyof ResolvedFilesystem>(k: K): ResolvedFilesystem[K] => (request?.[k] ?? image?.[k] ?? config[k]) as ResolvedFilesystem[K];
  return { readonly_paths: [...pick('readonly_paths')], writable_paths: [...pick('writable_paths')], landlock: pick('landlock') };
}
