/**
 * E2B template aliases (daemon/api/e2b/templates.ts): which dsec image and backend an
 * E2B `templateID` creates. List (any reader), set and remove (admin only: an alias
 * decides what every tenant's `Sandbox.create(NAME)` runs; daemon/remote/policy.ts).
 * `dsec image alias` is the CLI.
 */
import type { FastifyInstance } from 'fastify';
import { parseWith } from '../parse.js';
import { SetTemplateRequest, Template, TemplateList } from '../wire/templates.js';
import { notFound, unimplemented } from '../../errors.js';
import { route } from './table.js';
import type { E2bFront } from '../e2b/front.js';

/** What the template routes use. */
export interface TemplateRouteDeps {
  /** The E2B front (daemon/api/e2b); absent with `[e2b] enabled = false`: the routes answer Unimplemented. */
  e2b?: Pick<E2bFront, 'templates' | 'host'>;
}

const listRoute = route({ method: 'GET', url: '/v1/templates', summary: 'E2B templates: aliases name -> image and backend, and the built-in base.', status: 200, response: TemplateList, errors: ['Unimplemented'] });
const setRoute = route({ method: 'PUT', url: '/v1/templates/:name', summary: 'Set an E2B template alias (admin).', body: SetTemplateRequest, status: 200, response: Template, errors: ['InvalidArgument', 'NotFound', 'Unimplemented'] });
const deleteRoute = route({ method: 'DELETE', url: '/v1/templates/:name', summary: 'Remove an E2B template alias (admin); removing base brings back the built-in one.', status: 200, response: Template, errors: ['NotFound', 'Unimplemented'] });

/** Registers the template routes. */
export function registerTemplateRoutes(app: FastifyInstance, deps: TemplateRouteDeps): void {
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
