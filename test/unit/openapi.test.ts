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
    const doc = buildOpenApi() as any;
    const create = doc.paths['/v1/sandboxes'].post;
    expect(create.requestBody.content['application/json'].schema).toEqual({ $ref: '#/components/schemas/CreateSandboxRequest' });
    expect(doc.components.schemas.CreateSandboxRequest.additionalProperties).toBe(false);
  });
  it('names the shared schemas as components and refers to them, so generated clients get one type per shape', () => {
    const doc = buildOpenApi() as any;
    const schemas = doc.components.schemas;
    expect(doc.paths['/v1/sandboxes/{id}'].get.responses['200'].content['application/json'].schema).toEqual({ $ref: '#/components/schemas/Sandbox' });
    expect(schemas.Sandbox.properties.state).toEqual({ $ref: '#/components/schemas/SandboxState' });
    expect(schemas.SandboxList.properties.sandboxes.items).toEqual({ $ref: '#/components/schemas/Sandbox' });
    // Request-only defaults stay optional in the request component.
    expect(schemas.CreateSandboxRequest.required ?? []).not.toContain('backend');
    // Every $ref resolves.
    const text = JSON.stringify(doc);
    for (const m of text.matchAll(/"\$ref":"#\/components\/schemas\/([^"]+)"/g)) expect(Object.keys(schemas)).toContain(m[1]);
  });
  it('version matches package.json', () => {
    expect(JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')).version).toBe(DSEC_VERSION);
  });
});
