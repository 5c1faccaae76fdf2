/**
 * Sandbox networks and network policies:
 *   GET  /v1/sandboxes/{id}/network      the settled network, address, resolved hosts, denial counters
 *   PUT  /v1/sandboxes/{id}/network      change it (takes effect at once on a running sandbox)
 *   GET  /v1/network/policies            the loaded policy files
 *   POST /v1/network/policies/reload     reload them (all or nothing; as SIGHUP does)
 */
import type { FastifyInstance } from 'fastify';
import { NetworkPolicyList, NetworkSpec, PolicyReloadResult, SandboxNetwork } from '../schema.js';
import { parseWith } from '../parse.js';
import type { SandboxNetworking } from '../../net/network.js';
import type { PolicySet } from '../../security/egress-policy.js';
import type { SandboxLifecycle } from '../../sandbox/lifecycle.js';
import type { PolicyReloadResult as PolicyReloadResultBody } from '../schema.js';
import { unimplemented } from '../../errors.js';
import { route } from './table.js';

const getRoute = route({
  method: 'GET', url: '/v1/sandboxes/:id/network', summary: "A sandbox's network: mode, effective rules, address, resolved hosts and egress denials.",
  status: 200, response: SandboxNetwork, errors: ['NotFound'],
});
const putRoute = route({
  method: 'PUT', url: '/v1/sandboxes/:id/network', summary: 'Change the network of a sandbox (allow <-> open, rules, policy); a running sandbox gets it at once. none <-> allow/open is refused.',
  body: NetworkSpec, status: 200, response: SandboxNetwork, errors: ['InvalidArgument', 'NotFound', 'FailedPrecondition'],
});
const policiesRoute = route({ method: 'GET', url: '/v1/network/policies', summary: 'The loaded network policies (shipped examples and the operator\'s policy_dir).', status: 200, response: NetworkPolicyList, errors: [] });
const reloadRoute = route({
  method: 'POST', url: '/v1/network/policies/reload', summary: 'Reload the network policy files, all or nothing: a malformed file is refused with the problem and the loaded policies stay in force.',
  status: 200, response: PolicyReloadResult, errors: ['InvalidArgument'],
});

/** Sandbox networking and its policies, as the API serves them. */
export interface NetworkApi {
  networking: SandboxNetworking;
  policies: PolicySet;
  /** Reloads the policy files and re-applies changed ones. @throws DsecError InvalidArgument (the previous set stays). */
  reload(): Promise<PolicyReloadResultBody>;
}

/** What the network routes use. */
export interface NetworkRouteDeps {
  lifecycle: Pick<SandboxLifecycle, 'get' | 'setNetwork'>;
  /** Absent: the routes answer Unimplemented. */
  network?: NetworkApi;
}

/** Registers the network routes (answered Unimplemented when the daemon has no networking). */
export function registerNetworkRoutes(app: FastifyInstance, deps: NetworkRouteDeps): void {
  const net = () => {
    if (!deps.network) throw unimplemented('this dsecd has no sandbox networking');
    return deps.network;
  };
  const view = (id: string) => {
    const sb = deps.lifecycle.get(id);
    return { id: sb.id, ...net().networking.view(sb) };
  };
  app.get<{ Params: { id: string } }>(getRoute.url, async (req) => view(req.params.id));
  app.put<{ Params: { id: string } }>(putRoute.url, async (req) => {
    const body = parseWith(NetworkSpec, req.body, 'network');
    net();
    await deps.lifecycle.setNetwork(req.params.id, body);
    return view(req.params.id);
  });
  app.get(policiesRoute.url, async () => ({
    policies: net().policies.all().map((p) => ({ name: p.name, file: p.file, description: p.description ?? null, mode: p.mode, allow: p.allow, deny: p.deny })),
  }));
  app.post(reloadRoute.url, async () => net().reload());
}
