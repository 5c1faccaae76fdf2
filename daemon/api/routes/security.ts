/**
 * The seccomp profile in force (a data file, docs/SECURITY.md "seccomp"):
 *   GET  /v1/security/seccomp           which file, its sha256, how many syscalls it denies
 *   POST /v1/security/seccomp/reload    validate and load the file again (as SIGHUP does);
 *                                       a malformed file is refused and the profile in force stays
 * New creates and starts get the profile in force; running sandboxes keep the filter the
 * kernel already installed.
 */
import type { FastifyInstance } from 'fastify';
import { SeccompProfileInfo } from '../schema.js';
import type { ApiDeps } from '../server.js';
import { route } from './table.js';

const getRoute = route({
  method: 'GET', url: '/v1/security/seccomp', summary: 'The seccomp profile in force: its data file, sha256 and number of denied syscalls.',
  status: 200, response: SeccompProfileInfo, errors: [],
});
const reloadRoute = route({
  method: 'POST', url: '/v1/security/seccomp/reload', summary: 'Validate and load the seccomp profile file again; a malformed file is refused (InvalidArgument, naming the file and field) and the profile in force stays.',
  status: 200, response: SeccompProfileInfo, errors: ['InvalidArgument'],
});

/** Registers the security profile routes. */
export function registerSecurityRoutes(app: FastifyInstance, deps: ApiDeps): void {
  app.get(getRoute.url, async () => deps.security.seccompInfo());
  app.post(reloadRoute.url, async () => deps.security.reloadSeccomp());
}
