/**
 * The E2B front (docs/E2B.md): E2B's control plane and envd served next to dsec's own
 * /v1 on one port, for the unmodified `e2b` SDKs. {@link mountE2b} is the one hook a
 server calls: dsecd's TCP door mounts it over this host's sandboxes (the composition
 * root, daemon/main.ts); a fleet gateway routes E2B's API to the hosts that serve it
 * (gateway/e2b.ts). The server's door must set `req.principal`
 * from the API key (X-API-Key) and let routes marked `selfAuthenticated` (envd's, which
 * carry a per-sandbox access token instead) through to their own check.
 */
import type { FastifyInstance } from 'fastify';
import path from 'node:path';
import type { Logger } from 'pino';
import type { DaemonConfig } from '../../config.js';
import type { LayerStore } from '../../image/layer-store.js';
import { ensureE2bBaseImage } from '../../image/e2b-base.js';
import { registerControlRoutes } from './control.js';
import { registerEnvdRoutes } from './envd.js';
import { E2bFront } from './front.js';
import { localHost, type LocalHostDeps } from './host.js';
import { TemplateStore } from './templates.js';
import { EnvdTokens } from './tokens.js';

export { E2bFront };

/** Registers E2B's control-plane and envd routes on `app` (each in a scope of its own). */
export function mountE2b(app: FastifyInstance, front: E2bFront): void {
  app.register(async (scope) => registerControlRoutes(scope, front));
  app.register(async (scope) => registerEnvdRoutes(scope, front));
}

/**
 * Opens this dsecd's E2B front over its lifecycle services: the envd token key
 * (`<root>/e2b/envd.key`, made on first start) and the template aliases
 * (`<root>/e2b/templates.json`). With `serving` (the TCP door is configured) it also
 * builds the default `base` template's image; a missing bash-static is logged, not fatal
 * (templates of other images still work).
 */
export async function openE2bFront(config: { root: string; e2b: DaemonConfig['e2b'] }, deps: LocalHostDeps & { images: LayerStore }, serving: boolean, log: Logger): Promise<E2bFront> {
  const front = new E2bFront(
    localHost(deps),
    EnvdTokens.fromFile(path.join(config.root, 'e2b', 'envd.key')),
    new TemplateStore(path.join(config.root, 'e2b', 'templates.json')),
    { defaultTimeoutS: config.e2b.defaultTimeoutS, internet: config.e2b.internet },
    log.child({ component: 'e2b' }),
  );
  if (serving) await ensureE2bBaseImage(deps.images).catch((e) => log.warn({ err: e }, `E2B base template not available: ${(e as Error).message}`));
  return front;
}
