/**
 * Route descriptors: method, path, schemas and docs of every API route, declared next
 * to their handlers and read by the OpenAPI generator (daemon/api/openapi.ts), so the
 * published spec cannot list a route the server does not serve or miss one it does.
 */
import type { z } from 'zod';

/** One route as the OpenAPI document describes it. */
export interface RouteDoc {
  method: 'GET' | 'POST' | 'DELETE' | 'PUT';
  /** fastify-style path, e.g. `/v1/sandboxes/:id`. */
  url: string;
  summary: string;
  /** Request body schema, if any. */
  body?: z.ZodType;
  /** Query string schema, if any. */
  query?: z.ZodType;
  /** Success status and body schema (`ndjson` for streamed responses). */
  status: number;
  response: z.ZodType | null;
  ndjson?: boolean;
  /** Error kinds this route can answer with, beyond Internal. */
  errors: string[];
}

/** Every route, filled in by the route modules at import time. */
export const ROUTE_DOCS: RouteDoc[] = [];

/** Declares a route's documentation and returns it (for use when registering). */
export function route(doc: RouteDoc): RouteDoc {
  ROUTE_DOCS.push(doc);
  return doc;
}
