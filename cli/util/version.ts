/**
 * The client's own version, read from the package.json of the dsec package (found by
 * walking up from this file, so it works both from source and from dist/).
 */
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

let cached: string | undefined;

/** The dsec package version, e.g. `0.1.0`; `unknown` if package.json cannot be found. */
export function clientVersion(): string {
  if (cached !== undefined) return cached;
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 6; i++) {
    try {
      const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'dsec' && typeof pkg.version === 'string') return (cached = pkg.version);
    } catch {
      // No package.json here: keep walking up.
    }
    const up = dirname(dir);
    if (up === dir) break;
    dir = up;
  }
  return (cached = 'unknown');
}
