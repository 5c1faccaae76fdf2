/**
 * The fleet calls of a gateway (dsec-gateway, docs/OPERATIONS.md "A fleet"): its hosts,
 * and cordon, uncordon, drain, forget. A dsecd answers them NotFound (no route).
 */
import type { TransportClass } from './transport.js';

/** A fleet host as a gateway lists it (GET /v1/hosts; gateway/hosts.ts HostView is the wire schema). */
export interface FleetHost {
  name: string;
  /** Persistent host id holding the name, or null. */
  id: string | null;
  /** `up` while its etcd lease is alive; `down` once it lapsed. */
  state: 'up' | 'down';
  /** When the gateway saw the state change, ms since the epoch. */
  since: number;
  cordoned: boolean;
  draining: boolean;
  /** Its `pool` label, or `default`. */
  pool: string;
  labels: Record<string, string>;
  advertise: string | null;
  /** 6 hex that begin the ids of its sandboxes. */
  tag: string | null;
  version: string | null;
  backends: string[];
  /** Sandboxes on it (all states), as it last reported. */
  sandboxes: number;
  by_state: Record<string, number>;
  /** Cores, busy fraction of all cores (0..1), 1-minute load average. */
  cpu: { cores: number; busy: number; load1: number };
  memory: { total_bytes: number; available_bytes: number };
  admitted: { count: number; cpus: number; memory_bytes: number };
  admission: { max_sandboxes: number; cpus: number; memory_bytes: number };
  /** When the host took its last load report, ms since the epoch (its clock). */
  reported_at: number | null;
}

/** GET /v1/hosts response: the hosts, and whether the gateway's view of etcd is current. */
export interface FleetHostList {
  hosts: FleetHost[];
  view: { gateway: string; fresh: boolean; stale_since: number | null };
}

/** POST /v1/hosts/{name}/drain response. */
export interface DrainResult {
  host: FleetHost;
  left: Array<{ id: string; state: string; labels: Record<string, string> }>;
}

/** Mixes the fleet calls into a {@link Transport} class (composed into DsecClient by sdk/client.ts). */
export function withFleetCalls<B extends TransportClass>(Base: B) {
  return class FleetCalls extends Base {
    /** GET /v1/hosts (a gateway): the fleet's hosts. Errors: `NotFound` from a dsecd (not a gateway). */
    listHosts(): Promise<FleetHostList> {
      return this.request<FleetHostList>('GET', '/v1/hosts');
    }

    /** POST /v1/hosts/{name}/cordon (a gateway; admin): no new placements on the host. Errors: `NotFound`, `PermissionDenied`. */
    cordonHost(name: string): Promise<FleetHost> {
      return this.request<FleetHost>('POST', `/v1/hosts/${encodeURIComponent(name)}/cordon`);
    }

    /** POST /v1/hosts/{name}/uncordon (a gateway; admin): the host takes placements again. Errors: `NotFound`, `PermissionDenied`. */
    uncordonHost(name: string): Promise<FleetHost> {
      return this.request<FleetHost>('POST', `/v1/hosts/${encodeURIComponent(name)}/uncordon`);
    }

    /**
     * POST /v1/hosts/{name}/drain (a gateway; admin): cordons the host and reports the
     * sandboxes left on it. Errors: `NotFound`, `PermissionDenied`, `FailedPrecondition` (it is down).
     */
    drainHost(name: string): Promise<DrainResult> {
      return this.request<DrainResult>('POST', `/v1/hosts/${encodeURIComponent(name)}/drain`);
    }

    /** DELETE /v1/hosts/{name} (a gateway; admin): removes a down host's registration and name claim. Errors: `NotFound`, `FailedPrecondition` (it is up). */
    forgetHost(name: string): Promise<FleetHost> {
      return this.request<FleetHost>('DELETE', `/v1/hosts/${encodeURIComponent(name)}`);
    }
  };
}
