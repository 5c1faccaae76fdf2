/**
 * The host and its policies: dsecd's version and host information, a sandbox's network
 * and the network policies, and the seccomp profile in force.
 */
import type { HostInfo, NetworkInput, NetworkPolicy, PolicyReloadResult, SandboxNetwork, SeccompProfileInfo, VersionInfo } from './types.js';
import { sandboxPath } from './paths.js';
import type { TransportClass } from './transport.js';

/** Mixes the host, network and security calls into a {@link Transport} class (composed into DsecClient by sdk/client.ts). */
export function withHostCalls<B extends TransportClass>(Base: B) {
  return class HostCalls extends Base {
    /** GET /v1/version: the daemon's version. Rejects with `Unavailable` when dsecd is not reachable. */
    version(): Promise<VersionInfo> {
      return this.request<VersionInfo>('GET', '/v1/version');
    }

    /** GET /v1/host: host capabilities, runtime, cgroup layout, uid pool and sandbox counts. */
    hostInfo(): Promise<HostInfo> {
      return this.request<HostInfo>('GET', '/v1/host');
    }

    /** GET /v1/sandboxes/{id}/network: mode, effective rules, address, resolved hosts, egress denials. Errors: `NotFound`. */
    getNetwork(id: string): Promise<SandboxNetwork> {
      return this.request<SandboxNetwork>('GET', sandboxPath(id) + '/network');
    }

    /**
     * PUT /v1/sandboxes/{id}/network: changes a sandbox's network; a running sandbox gets
     * it at once. Errors: `InvalidArgument` (bad rules, unknown policy), `NotFound`,
     * `FailedPrecondition` (between none and allow/open, or networking unavailable).
     */
    setNetwork(id: string, network: NetworkInput): Promise<SandboxNetwork> {
      return this.request<SandboxNetwork>('PUT', sandboxPath(id) + '/network', network);
    }

    /** GET /v1/network/policies: the loaded network policies. */
    async listNetworkPolicies(): Promise<NetworkPolicy[]> {
      return (await this.request<{ policies: NetworkPolicy[] }>('GET', '/v1/network/policies')).policies;
    }

    /**
     * POST /v1/network/policies/reload: reloads the policy files, all or nothing.
     * Errors: `InvalidArgument` naming each malformed file and field (the loaded policies stay in force).
     */
    reloadNetworkPolicies(): Promise<PolicyReloadResult> {
      return this.request<PolicyReloadResult>('POST', '/v1/network/policies/reload');
    }

    /** GET /v1/security/seccomp: the seccomp profile in force. */
    seccompProfile(): Promise<SeccompProfileInfo> {
      return this.request<SeccompProfileInfo>('GET', '/v1/security/seccomp');
    }

    /**
     * POST /v1/security/seccomp/reload: loads the seccomp profile file again (new creates
     * and starts get it). Errors: `InvalidArgument` naming the file and field (the profile
     * in force stays).
     */
    reloadSeccompProfile(): Promise<SeccompProfileInfo> {
      return this.request<SeccompProfileInfo>('POST', '/v1/security/seccomp/reload');
    }
  };
}
