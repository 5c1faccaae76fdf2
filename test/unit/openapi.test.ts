import { describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import { renderOpenApi, buildOpenApi } from '../../daemon/api/openapi.js';
import { DSEC_VERSION } from '../../daemon/version.js';

describe('OpenAPI document', () => {
  it('docs/api/openapi.json matches the schemas (run `npm run openapi` after changing them)', () => {
    const committed = readFileSync(new URL('../../docs/api/openapi.json', import.meta.url), 'utf8');
    expect(committed).toBe(renderOpenApi());
  });
  it('describes the contract routes', () => {
    const paths = Object.keys((buildOpenApi() as any).paths);
    for (const p of ['/v1/sandboxes', '/v1/sandboxes/{id}', '/v1/sandboxes/{id}/exec', '/v1/sandboxes/{id}/stop', '/v1/sandboxes/{id}/start', '/v1/events', '/v1/version', '/v1/host']) {
      expect(paths).toContain(p);
    }
    const create = (buildOpenApi() as any).paths['/v1/sandboxes'].post;
    expect(create.requestBody.content['application/json'].schema.additionalProperties).toBe(false);
  });
  it('version matches package.json', () => {
    expect(JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')).version).toBe(DSEC_VERSION);
  });
});
