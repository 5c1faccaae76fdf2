import { describe, expect, it } from 'vitest';
import { readFileSync, readdirSync } from 'node:fs';
// @ts-expect-error -- a plain ES module without type declarations (a build script)
import { renderSdkTypes } from '../../scripts/sdk-types.mjs';

const read = (rel: string) => readFileSync(new URL(`../../${rel}`, import.meta.url), 'utf8');

describe('SDK wire types', () => {
  it('sdk/types.gen.ts matches a fresh generation from docs/api/openapi.json (run `npm run openapi` after changing the schemas)', async () => {
    const doc = JSON.parse(read('docs/api/openapi.json')) as unknown;
    expect(read('sdk/types.gen.ts')).toBe(await renderSdkTypes(doc));
  });

  it('names every component the SDK aliases (a renamed schema fails here, not only in the build)', () => {
    const doc = JSON.parse(read('docs/api/openapi.json')) as { components: { schemas: Record<string, unknown> } };
    const used = [...read('sdk/types.ts').matchAll(/Schemas\['([A-Za-z]+)'\]/g)].map((m) => m[1]);
    expect(used.length).toBeGreaterThan(30);
    for (const name of used) expect(Object.keys(doc.components.schemas)).toContain(name);
  });

  it('no SDK module imports the daemon', () => {
    for (const f of readdirSync(new URL('../../sdk/', import.meta.url))) {
      if (!f.endsWith('.ts')) continue;
      const imports = [...read(`sdk/${f}`).matchAll(/^(?:import|export)[^;]*?from '([^']+)'/gms)].map((m) => m[1]);
      expect(imports.filter((p) => !p.startsWith('./') && !p.startsWith('node:') && p !== 'ws'), `sdk/${f}`).toEqual([]);
    }
  });
});
