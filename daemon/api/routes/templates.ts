/**
 * E2B template aliases (daemon/api/e2b/templates.ts): which dsec image and backend an
 * E2B `templateID` creates. List (any reader), set and remove (admin only: an alias
 * decides what every tenant's `Sandbox.create(NAME)` runs; daemon/remote/policy.ts).
 * `dsec image alias` is the CLI.
 */
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { parseWith } from '../server.js';
import { Backend } from '../schema.js';
import { notFound, unimplemented } from '../../errors.js';
import { Template } from '../e2b/templates.js';
import { route } from './table.js';
import type { ApiDeps } from '../server.js';

/** PUT /v1/templates/{name} request. */
export const SetTemplateRequest = z
  .object({
    image: z.string().min(1).max(255).describe('Image the template creates sandboxes from; it must be in the store.'),
    backend: Backend.default('container').describe('Backend of its sandboxes; default container.'),
  })
  .strict();

const listRoute = route({ method: 'GET', url: '/v1/templates', summary: 'E2B templates: aliases name -> image and backend, and the built-in base.', status: 200, response: z.object({ templates: z.array(Template) }), errors: ['Unimplemented'] });
const setRoute = route({ method: 'PUT', url: '/v1/templates/:name', summary: 'Set an E2B template alias (admin).', body: SetTemplateRequest, status: 200, response: Template, errors: ['InvalidArgument', 'NotFound', 'Unimplemented'] });
const deleteRoute = route({ method: 'DELETE', url: '/v1/templates/:name', summary: 'Remove an E2B template alias (admin); removing base brings back the built-in one.', status: 200, response: Template, errors: ['NotFound', 'Unimplemented'] });

/** Registers the template routes. */
export function registerTemplateRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const store = () => {
    if (!deps.e2b) throw unimplemented('the E2B front is off ([e2b] enabled = false)');
    return deps.e2b.templates;
  };
  app.get(listRoute.url, async () => ({ templates: store().list() }));
  app.put<{ Params: { name: string } }>(setRoute.url, async (req) => {
    const s = store();
    const body = parseWith(SetTemplateRequest, req.body, 'template request');
    if (!(await deps.e2b!.host.imageExists(body.image))) throw notFound(`image ${body.image} not found`);
    return s.set(req.params.name, body.image, body.backend);
  });
  app.delete<{ Params: { name: string } }>(deleteRoute.url, async (req) => store().remove(req.params.name));
}
