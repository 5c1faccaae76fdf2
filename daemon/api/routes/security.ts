/**
 * The seccomp profile in force (a data file, docs/SECURITY.md "seccomp"):
 *   GET  /v1/security/seccomp           which file, its sha256, how many syscalls it denies
 *   POST /v1/security/seccomp/reload    validate and load the file again (as SIGHUP does);
 *                                       a malformed file is refused and the profile in force stays
 * New creates and starts get the profile in force; running sandboxes keep the filter the
 * kernel already installed.
 */
import type { FastifyInstance } from 'fastify';
import { SeccompProfileInfo, type SeccompProfileInfo as SeccompProfileInfoBody } from '../schema.js';
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
/** The seccomp profile in force and its reload. */
export interface SecurityApi {
  /** @returns the file, sha256 and denied-syscall count of the profile in force. */
  seccompInfo(): SeccompProfileInfoBody;
  /** Loads the configured profile file again. @throws DsecError InvalidArgument naming the file and field (the profile in force stays). */
  reloadSeccomp(): SeccompProfileInfoBody;
}

/** What the security routes use. */
export interface SecurityRouteDeps {
  security: SecurityApi;
}

/** Registers the seccomp profile routes. */
export function registerSecurityRoutes(app: FastifyInstance, deps: SecurityRouteDeps): void {
  app.get(getRoute.url, async () => deps.security.seccompInfo());
  app.post(reloadRoute.url, async () => deps.security.reloadSeccomp());
}
