/**
 * The CLI's access to dsec's N-API addon (native/addon/dsec_native.c), for the one call it
 * uses: `resolveBeneath` (openat2 with RESOLVE_BENEATH), the kernel's guard under the
 * link checks of `dsec cp` (cli/util/extract.ts). The CLI runs on machines without the
 * addon too (a laptop with the remote door), so loading is best effort: {@link cliAddon}
 * answers null where the file is absent or does not load, never throws.
 *
 * Located as dsecd locates it: `$DSEC_NATIVE_ADDON`, else
 * `<package root>/native/addon/build/Release/dsec_native.node`, the package root being the
 * nearest ancestor of this file with a package.json (source and compiled trees alike).
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Path of the compiled addon relative to the package root (as daemon/host/native.ts has it). */
const ADDON_RELATIVE_PATH = 'native/addon/build/Release/dsec_native.node';

let cached: Record<string, unknown> | null | undefined;

/** The nearest ancestor of this file holding a package.json, or null. */
function packageRoot(): string | null {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, 'package.json'))) return dir;
    const parent = dirname(dir);
    if (parent === dir) return null;
    dir = parent;
  }
}

/** The addon's exports, loaded once; null where it is not built, fails to load, or the platform is not Linux. */
export function cliAddon(): Record<string, unknown> | null {
  if (cached !== undefined) return cached;
  cached = null;
  if (process.platform !== 'linux') return cached;
  const root = packageRoot();
  const file = process.env.DSEC_NATIVE_ADDON || (root ? join(root, ADDON_RELATIVE_PATH) : null);
  if (!file || !existsSync(file)) return cached;
  try {
    cached = createRequire(root ? join(root, 'package.json') : file)(file) as Record<string, unknown>;
  } catch {
    cached = null;
  }
  return cached;
}
