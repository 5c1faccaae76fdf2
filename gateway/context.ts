/**
 * What every gateway route needs: the host table, the calls to hosts, the placement
 * policy, and helpers that turn a table entry into what placement and the upstream calls
 * take. Routes receive this object; none imports the server.
 */
import type { FastifyRequest } from 'fastify';
import type { Etcd3 } from 'etcd3';
import type { Logger } from 'pino';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { unavailable } from '../daemon/errors.js';
import type { FleetKeys } from '../daemon/fleet/layout.js';
import type { TokenService } from '../daemon/remote/tokens.js';
import type { KeyedCreates } from './idempotency.js';
import type { FleetQuotas } from './quotas.js';
import type { PlacementPolicy, PlacementRequest } from './placement.js';
import type { HostEntry, HostTable } from './table.js';
import type { CallIdentity, HostAddress, Upstreams } from './upstream.js';

/** Prometheus metrics of a gateway (GET /metrics: these, then each host's with a `host` label). */
export class GatewayMetrics {
  readonly registry = new Registry();
  readonly errors = new Counter({ name: 'dsec_gateway_api_errors_total', help: 'Gateway API errors by kind.', labelNames: ['code'], registers: [this.registry] });
  readonly authFailures = new Counter({ name: 'dsec_gateway_auth_failures_total', help: 'Requests refused before a role was known, by reason.', labelNames: ['reason'], registers: [this.registry] });
  readonly authDenied = new Counter({ name: 'dsec_gateway_auth_denied_total', help: 'Authenticated requests refused because the role may not make them.', labelNames: ['role'], registers: [this.registry] });
  readonly placementSeconds = new Histogram({
    name: 'dsec_gateway_placement_seconds', help: 'Time of one placement decision (filter, sample, score), seconds.',
    buckets: [0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005], registers: [this.registry],
  });
  readonly placements = new Counter({ name: 'dsec_gateway_placements_total', help: 'Creates placed, by outcome (created, refused: a host refused and the next was tried, none: no host fit).', labelNames: ['outcome'], registers: [this.registry] });

  constructor(table: HostTable) {
    collectDefaultMetrics({ register: this.registry, prefix: 'dsec_gateway_' });
    new Gauge({
      name: 'dsec_gateway_hosts', help: 'Hosts in the table by state (up, down, cordoned).', labelNames: ['state'], registers: [this.registry],
      collect() {
        const c = { up: 0, down: 0, cordoned: 0 };
        for (const h of table.hosts.values()) {
          c[h.state] += 1;
          if (h.cordon) c.cordoned += 1;
        }
        for (const [k, v] of Object.entries(c)) this.set({ state: k }, v);
      },
    });
    new Gauge({
      name: 'dsec_gateway_view_stale', help: '1 while the watch of etcd is down (the table is the last known state).', registers: [this.registry],
      collect() {
        this.set(table.fresh ? 0 : 1);
      },
    });
  }
}

/** Everything routes use. */
export interface GatewayContext {
  table: HostTable;
  upstreams: Upstreams;
  tokens: TokenService;
  policy: PlacementPolicy;
  metrics: GatewayMetrics;
  etcd: Etcd3;
  keys: FleetKeys;
  log: Logger;
  /** The gateway's name (its certificate's CN). */
  name: string;
  /** Idempotency records and delivery acknowledgements (gateway/idempotency.ts). */
  keyed: KeyedCreates;
  /** Fleet-wide tenant quotas held in etcd (gateway/quotas.ts). */
  quotas: FleetQuotas;
}

/** The caller of a request as hosts are told it. */
export function identityOf(req: FastifyRequest): CallIdentity {
  const p = req.principal;
  return { tenant: p.tenant, role: p.role, tokenId: p.tokenId };
}

/** Where to reach host `h`. @throws DsecError Unavailable when it never said (no info record). */
export function addressOf(h: HostEntry): HostAddress {
  if (!h.info) throw unavailable(`host ${h.name} has not registered its address`);
  return { name: h.name, advertise: h.info.advertise };
}

/** The limits a create asks for, with the defaults the fleet's hosts report when it names none. */
export function requestLimits(body: { cpus?: unknown; memory_bytes?: unknown }, table: HostTable): Pick<PlacementRequest, 'cpus' | 'memoryBytes'> {
  let d = { cpus: 1, memory_bytes: 512 * 1024 * 1024 };
  for (const h of table.hosts.values()) {
    if (h.info?.defaults) {
      d = h.info.defaults;
      break;
    }
  }
  return {
    cpus: typeof body.cpus === 'number' ? body.cpus : d.cpus,
    memoryBytes: typeof body.memory_bytes === 'number' ? body.memory_bytes : d.memory_bytes,
  };
}
