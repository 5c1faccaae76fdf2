/**
 * Generates the OpenAPI 3.1 document from the route descriptors and zod schemas, so
 * docs/api/openapi.json is derived, never hand-written. test/unit/openapi.test.ts fails
 * when the committed file differs from what this produces (`npm run openapi` fixes it).
 *
 * Every zod schema that daemon/api/schema.ts or a route module exports is a named
 * component (`#/components/schemas/<export name>`, a trailing `Schema` dropped) wherever
 * a route reaches it, and is referenced with `$ref`, so clients generated from the
 * document get one type per wire shape (the SDK's sdk/types.gen.ts is generated from it
 * with openapi-typescript). Schemas a route declares inline stay inline in its operation.
 */
import { z } from 'zod';
import { ERROR_STATUS } from '../errors.js';
import * as wire from './schema.js';
import { ROUTE_DOCS, type RouteDoc } from './routes/table.js';
import * as hostRoutes from './routes/host.js';
import * as sandboxRoutes from './routes/sandboxes.js';
import * as batchCreateRoutes from './routes/sandboxes-batch.js';
import * as eventRoutes from './routes/events.js';
import * as imageRoutes from './routes/images.js';
import * as execRoutes from './routes/execs.js';
import * as execChannelRoutes from './routes/exec-channel.js';
import * as consoleRoutes from './routes/console.js';
import * as statsRoutes from './routes/stats.js';
import * as fileRoutes from './routes/files.js';
import * as roundRoutes from './routes/rounds.js';
import * as snapshotRoutes from './routes/snapshots.js';
import * as securityRoutes from './routes/security.js';
import * as trajectoryRoutes from './routes/trajectories.js';
import * as runRoutes from './routes/run.js';
import * as networkRoutes from './routes/network.js';
import * as tokenRoutes from './routes/tokens.js';
import * as templateRoutes from './routes/templates.js';
import * as layerBlobRoutes from './routes/layer-blobs.js';
import { DSEC_VERSION } from '../version.js';

/** The modules whose exported schemas become named components (importing them also fills ROUTE_DOCS). */
const SCHEMA_MODULES: Record<string, unknown>[] = [
  wire, hostRoutes, sandboxRoutes, batchCreateRoutes, eventRoutes, imageRoutes, execRoutes, execChannelRoutes, consoleRoutes, statsRoutes,
  fileRoutes, roundRoutes, snapshotRoutes, securityRoutes, trajectoryRoutes, runRoutes, networkRoutes, tokenRoutes, templateRoutes, layerBlobRoutes,
];

/** Where a named component lives in the document. */
const componentRef = (id: string) => `#/components/schemas/${id}`;

/**
 * Component name of every exported schema: its export name without a trailing `Schema`
 * (`IoMaxSchema` → `IoMax`). A schema exported under several names keeps the first.
 * Throws when two different schemas would share a name.
 */
function namedSchemas(): Map<z.ZodType, string> {
  const names = new Map<z.ZodType, string>();
  const byName = new Map<string, z.ZodType>();
  for (const mod of SCHEMA_MODULES) {
    for (const [exportName, value] of Object.entries(mod)) {
      if (!(value instanceof z.ZodType) || names.has(value)) continue;
      const id = exportName.replace(/(.)Schema$/, '$1');
      const other = byName.get(id);
      if (other !== undefined && other !== value) throw new Error(`two API schemas are both named ${id}; rename one of them`);
      names.set(value, id);
      byName.set(id, value);
    }
  }
  return names;
}

/** The JSON Schema of each registered schema, by id, with `$ref`s to the named ones. */
function convert(named: Map<z.ZodType, string>, extra: Map<z.ZodType, string>, io: 'input' | 'output'): Record<string, Record<string, unknown>> {
  const registry = z.registry<{ id: string }>();
  for (const [s, id] of named) registry.add(s, { id });
  for (const [s, id] of extra) if (!named.has(s)) registry.add(s, { id });
  const { schemas } = z.toJSONSchema(registry, { io, unrepresentable: 'any', uri: componentRef }) as { schemas: Record<string, Record<string, unknown>> };
  if (schemas.__shared) throw new Error('an API schema is recursive; the OpenAPI generator does not support that');
  for (const s of Object.values(schemas)) {
    delete s.$schema;
    delete s.$id;
  }
  return schemas;
}

/** Ids of the components a JSON Schema refers to directly. */
function refsIn(schema: unknown): string[] {
  const ids: string[] = [];
  JSON.stringify(schema, (key, value: unknown) => {
    if (key === '$ref' && typeof value === 'string' && value.startsWith(componentRef(''))) ids.push(value.slice(componentRef('').length));
    return value;
  });
  return ids;
}

/** Ids of the schemas `roots` reach through `$ref`s, roots included. */
function reachable(schemas: Record<string, unknown>, roots: Iterable<string>): Set<string> {
  const seen = new Set<string>();
  const todo = [...roots];
  while (todo.length > 0) {
    const id = todo.pop()!;
    if (seen.has(id) || schemas[id] === undefined) continue;
    seen.add(id);
    todo.push(...refsIn(schemas[id]));
  }
  return seen;
}

/** Builds the OpenAPI document (a plain JSON object, stable key order). */
export function buildOpenApi(): Record<string, unknown> {
  const named = namedSchemas();
  const routes = [...ROUTE_DOCS].sort((a, b) => a.url.localeCompare(b.url) || a.method.localeCompare(b.method));
  // Route schemas that are not exported get a private id, only to be converted in the
  // same pass as the named ones (so their references become $refs); they stay inline.
  const idOf = (r: RouteDoc, part: 'body' | 'query' | 'response', s: z.ZodType) => named.get(s) ?? `${r.method} ${r.url} ${part}`;
  const inputs = new Map<z.ZodType, string>();
  const outputs = new Map<z.ZodType, string>([[wire.ErrorBody, named.get(wire.ErrorBody)!]]);
  for (const r of routes) {
    if (r.body) inputs.set(r.body, idOf(r, 'body', r.body));
    if (r.query) inputs.set(r.query, idOf(r, 'query', r.query));
    if (r.response) outputs.set(r.response, idOf(r, 'response', r.response));
  }
  const input = convert(named, inputs, 'input');
  const output = convert(named, outputs, 'output');
  const inline = (schemas: Record<string, Record<string, unknown>>, s: z.ZodType, id: string) => (named.has(s) ? { $ref: componentRef(id) } : schemas[id]);

  const paths: Record<string, Record<string, unknown>> = {};
  const inputRoots: string[] = [];
  for (const r of routes) {
    const p = r.url.replace(/\/:([a-z_]+)/g, '/{$1}');
    const params: unknown[] = [];
    for (const m of r.url.matchAll(/:([a-z_]+)/g)) params.push({ name: m[1], in: 'path', required: true, schema: { type: 'string' } });
    if (r.query) {
      // Query parameters are listed one by one; only what their schemas refer to is a component.
      const qs = input[inputs.get(r.query)!] as { properties?: Record<string, Record<string, unknown>>; required?: string[] };
      for (const [name, schema] of Object.entries(qs.properties ?? {})) {
        params.push({ name, in: 'query', required: (qs.required ?? []).includes(name), schema });
        inputRoots.push(...refsIn(schema));
      }
    }
    if (r.body) inputRoots.push(inputs.get(r.body)!);
    const responses: Record<string, unknown> = {
      [String(r.status)]: {
        description: r.summary,
        content: r.response ? { [r.ndjson ? 'application/x-ndjson' : 'application/json']: { schema: inline(output, r.response, outputs.get(r.response)!) } } : undefined,
      },
    };
    for (const kind of [...r.errors, 'Internal']) {
      const status = String(ERROR_STATUS[kind as keyof typeof ERROR_STATUS]);
      const prev = responses[status] as { description: string } | undefined;
      responses[status] = {
        description: prev ? `${prev.description}, ${kind}` : kind,
        content: { 'application/json': { schema: { $ref: componentRef(named.get(wire.ErrorBody)!) } } },
      };
    }
    paths[p] ??= {};
    paths[p][r.method.toLowerCase()] = {
      summary: r.summary,
      ...(params.length ? { parameters: params } : {}),
      ...(r.body ? { requestBody: { required: true, content: { 'application/json': { schema: inline(input, r.body, inputs.get(r.body)!) } } } } : {}),
      responses,
    };
  }

  // A component is the input form of its schema where requests reach it and the output
  // form where responses do; a schema both reach must read the same both ways (no
  // defaults, transforms or coercions, which zod renders differently per direction).
  const fromInputs = reachable(input, inputRoots);
  const fromOutputs = reachable(output, outputs.values());
  const components: Record<string, unknown> = {};
  const names = new Set(named.values());
  for (const id of [...new Set([...fromInputs, ...fromOutputs])].filter((id) => names.has(id)).sort()) {
    if (fromInputs.has(id) && fromOutputs.has(id) && JSON.stringify(input[id]) !== JSON.stringify(output[id])) {
      throw new Error(`API schema ${id} is used in requests and responses but differs between them (a default, transform or coercion); split it in two`);
    }
    components[id] = fromOutputs.has(id) ? output[id] : input[id];
  }
  return {
    openapi: '3.1.0',
    info: {
      title: 'dsecd API',
      version: DSEC_VERSION,
      description: 'HTTP+JSON on a Unix socket (default /run/dsec/dsecd.sock). snake_case fields; durations in ms; times in ms since the Unix epoch; sizes in bytes; CPU in cores. Unknown request fields are InvalidArgument.',
    },
    paths,
    components: { schemas: components },
  };
}

/** The document as committed: 2-space JSON plus a trailing newline. */
export function renderOpenApi(): string {
  return JSON.stringify(buildOpenApi(), null, 2) + '\n';
}
