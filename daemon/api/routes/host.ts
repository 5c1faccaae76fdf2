/** GET /v1/version, GET /v1/host. */
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { HostInfo, VersionInfo } from '../schema.js';
import { route } from './table.js';
import type { Metrics } from '../../metrics.js';

/** Supplies the host info document (built by the daemon, which knows every subsystem). */
export interface HostInfoProvider {
  /** GET /v1/version: dsec's, the API's and the agent protocol's versions. */
  version(): z.infer<typeof VersionInfo>;
  /** GET /v1/host: the host info document, read now (daemon/startup/host-info.ts). */
  hostInfo(): Promise<z.infer<typeof HostInfo>>;
}

const metricsRoute = route({ method: 'GET', url: '/metrics', summary: 'Prometheus metrics (text exposition format).', status: 200, response: null, errors: [] });
const versionRoute = route({ method: 'GET', url: '/v1/version', summary: 'Daemon and API version.', status: 200, response: VersionInfo, errors: [] });
const hostRoute = route({ method: 'GET', url: '/v1/host', summary: 'Host capacity, runtime, cgroups, uid pool and which defences are enforced.', status: 200, response: HostInfo, errors: [] });

/** What the host routes use. */
export interface HostRouteDeps {
  host: HostInfoProvider;
  metrics: Pick<Metrics, 'render'>;
}

/** Registers the host routes. */
export function registerHostRoutes(app: FastifyInstance, deps: HostRouteDeps): void {
  app.get(versionRoute.url, async () => deps.host.version());
  app.get(metricsRoute.url, async (_req, reply) => {
    const { contentType, body } = await deps.metrics.render();
    return reply.type(contentType).send(body);
  });
  app.get(hostRoute.url, async () => deps.host.hostInfo());
}
