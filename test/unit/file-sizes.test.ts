/**
 * Size rule of the daemon and the SDK: no hand-written TypeScript file under daemon/,
 * sdk/ or gateway/ is longer than 800 lines, so each stays readable in one sitting and a
 * growing file is split by responsibility before it becomes a second manager.ts. Generated
 * files (`*.gen.ts`, e.g. sdk/types.gen.ts from docs/api/openapi.json) are exempt: nobody
 * reads or edits them by hand, and test/unit/sdk-types.test.ts keeps them fresh.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
/** Longest a hand-written file may be, lines. */
const MAX_LINES = 800;

/** Every `.ts` file below `dir` (relative to the repository root), generated ones left out. */
function sources(dir: string): string[] {
  const abs = path.join(ROOT, dir);
  if (!fs.existsSync(abs)) return [];
  return (fs.readdirSync(abs, { recursive: true }) as string[])
    .filter((f) => f.endsWith('.ts') && !f.endsWith('.gen.ts'))
    .map((f) => path.join(dir, f));
}

describe('file sizes', () => {
  it(`no hand-written TypeScript file under daemon/, sdk/ or gateway/ is over ${MAX_LINES} lines`, () => {
    const files = ['daemon', 'sdk', 'gateway'].flatMap(sources);
    expect(files.length).toBeGreaterThan(100);
    const over = files
      .map((f) => ({ f, lines: fs.readFileSync(path.join(ROOT, f), 'utf8').split('\n').length }))
      .filter((x) => x.lines > MAX_LINES)
      .map((x) => `${x.f}: ${x.lines} lines`);
    expect(over).toEqual([]);
  });
});
