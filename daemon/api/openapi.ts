/**
 * Generates the OpenAPI 3.1 document from the route descriptors and zod schemas, so
 * docs/api/openapi.json is derived, never hand-written. test/unit/openapi.test.ts fails
 * when the committed file differs from what this produces (`npm run openapi` fixes it).
 */
import { z } from 'zod';
import { ERROR_STATUS } from '../errors.js';
import { ErrorBody } from './schema.js';
import { ROUTE_DOCS } from './routes/table.js';
import './routes/host.js';
import './routes/sandboxes.js';
import './routes/events.js';
import './routes/images.js';
import './routes/execs.js';
import './routes/console.js';
import './routes/stats.js';
import './routes/files.js';
import './routes/rounds.js';
import './routes/network.js';
import './routes/snapshots.js';
import './routes/security.js';
import './routes/trajectories.js';
import './routes/run.js';
import { DSEC_VERSION } from '../version.js';

function schemaOf(s: z.ZodType, io: 'input' | 'output'): Record<string, unknown> {
  const j = z.toJSONSchema(s, { io, unrepresentable: 'any' }) as Record<string, unknown>;
  delete j.$schema;
  return j;
}

/** Builds the OpenAPI document (a plain JSON object, stable key order). */
export function buildOpenApi(): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {};
  const routes = [...ROUTE_DOCS].sort((a, b) => a.url.localeCompare(b.url) || a.method.localeCompare(b.method));
  for (const r of routes) {
    const p = r.url.replace(/\/:([a-z_]+)/g, '/{$1}');
    const params: unknown[] = [];
    for (const m of r.url.matchAll(/:([a-z_]+)/g)) params.push({ name: m[1], in: 'path', required: true, schema: { type: 'string' } });
    if (r.query) {
      const qs = schemaOf(r.query, 'input') as { properties?: Record<string, unknown>; required?: string[] };
      for (const [name, schema] of Object.entries(qs.properties ?? {})) {
        params.push({ name, in: 'query', required: (qs.required ?? []).includes(name), schema });
      }
    }
    const responses: Record<string, unknown> = {
      [String(r.status)]: {
        description: r.summary,
        content: r.response ? { [r.ndjson ? 'application/x-ndjson' : 'application/json']: { schema: schemaOf(r.response, 'output') } } : undefined,
      },
    };
    for (const kind of [...r.errors, 'Internal']) {
      const status = String(ERROR_STATUS[kind as keyof typeof ERROR_STATUS]);
      const prev = responses[status] as { description: string } | undefined;
      responses[status] = {
        description: prev ? `${prev.description}, ${kind}` : kind,
        content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } },
      };
    }
    paths[p] ??= {};
    paths[p][r.method.toLowerCase()] = {
      summary: r.summary,
      ...(params.length ? { parameters: params } : {}),
      ...(r.body ? { requestBody: { required: true, content: { 'application/json': { schema: schemaOf(r.body, 'input') } } } } : {}),
      responses,
    };
  }
  return {
    openapi: '3.1.0',
    info: {
      title: 'dsecd API',
      version: DSEC_VERSION,
      description: 'HTTP+JSON on a Unix socket (default /run/dsec/dsecd.sock). snake_case fields; durations in ms; times in ms since the Unix epoch; sizes in bytes; CPU in cores. Unknown request fields are InvalidArgument.',
    },
    paths,
    components: { schemas: { Error: schemaOf(ErrorBody, 'output') } },
  };
}

/** The document as committed: 2-space JSON plus a trailing newline. */
export function renderOpenApi(): string {
  return JSON.stringify(buildOpenApi(), null, 2) + '\n';
}
