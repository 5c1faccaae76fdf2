/**
 * The E2B front (docs/E2B.md): E2B's control plane and envd served next to dsec's own
 * /v1 on one port, for the unmodified `e2b` SDKs. {@link mountE2b} is the one hook a
 * server calls: dsecd's TCP door (daemon/remote/listen.ts) mounts it over this host's
 * sandboxes; the fleet gateway mounts the same routes over an E2bHost (host.ts) that
 * forwards to the dsecd owning each sandbox. The server's door must set `req.principal`
 * from the API key (X-API-Key) and let routes marked `selfAuthenticated` (envd's, which
 * carry a per-sandbox access token instead) through to their own check.
 */
import type { FastifyInstance } from 'fastify';
import { registerControlRoutes } from './control.js';
import { registerEnvdRoutes } from './envd.js';
import type { E2bFront } from './front.js';

export { E2bFront } from './front.js';

/** Registers E2B's control-plane and envd routes on `app` (each in a scope of its own). */
export function mountE2b(app: FastifyInstance, front: E2bFront): void {
  app.register(async (scope) => registerControlRoutes(scope, front));
  app.register(async (scope) => registerEnvdRoutes(scope, front));
}
