/**
 * dsec-gateway configuration: defaults, the optional TOML file (`--config`, default
 * /etc/dsec/gateway.toml when it exists), and flags, in increasing precedence.
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { parseListen, resolveQuotas, TenantQuotaFile } from '../daemon/config.js';
import { TENANT_RE } from '../daemon/model/tenant.js';
import type { FleetQuotaConfig } from './quotas.js';
import { invalidArgument } from '../daemon/errors.js';
import { readTomlFile } from '../daemon/toml-file.js';
import { DEFAULT_PREFIX, parseEndpoints } from '../daemon/fleet/layout.js';
import type { DoorLimits } from '../daemon/remote/door.js';
import { DEFAULT_BURST_THRESHOLD, DEFAULT_K } from './placement.js';

/** Default config file; optional. */
export const DEFAULT_GATEWAY_CONFIG = '/etc/dsec/gateway.toml';

const FileConfig = z.object({
  listen: z.string().optional(),
  tls_cert: z.string().optional(),
  tls_key: z.string().optional(),
  tls_ca: z.string().optional(),
  client_ca: z.string().optional(),
  name: z.string().optional(),
  audit: z.string().optional(),
  log_level: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).optional(),
  etcd: z.object({
    endpoints: z.array(z.string()).min(1).optional(),
    cert: z.string().optional(),
    key: z.string().optional(),
    ca: z.string().optional(),
    prefix: z.string().regex(/^\/[A-Za-z0-9._/-]*$/).optional(),
  }).strict().optional(),
  placement: z.object({ k: z.number().int().min(1).max(64).optional(), job: z.enum(['spread', 'pack']).optional(), burst_threshold: z.number().min(0).max(1).optional() }).strict().optional(),
  quotas: TenantQuotaFile.extend({ tenants: z.record(z.string().regex(TENANT_RE), TenantQuotaFile).optional() }).strict().optional(),
  limits: z.object({
    creates_per_minute: z.number().int().min(1).optional(),
    auth_failures_per_minute: z.number().int().min(1).optional(),
    max_connections: z.number().int().min(1).optional(),
  }).strict().optional(),
}).strict();

/** The resolved configuration of a gateway. */
export interface GatewayConfig {
  /** `ADDR:PORT` the API is served on over TLS 1.3 (`--listen`; default 0.0.0.0:8443). */
  listen: string;
  /** The gateway's certificate (role gateway, `dsec fleet cert --role gateway`) and key, PEM files: served to clients and presented to hosts. */
  tlsCert: string;
  tlsKey: string;
  /** The fleet CA (PEM file): hosts' certificates must chain to it. */
  tlsCa: string;
  /** With a client CA (PEM file), every client must also present a certificate it signed, of role client; default none (tokens alone). */
  clientCa: string | null;
  /** The gateway's name (in cordon records and logs); default its certificate's CN. */
  name: string | null;
  /** Audit log file (JSON lines of every mutating call), or null for none. */
  audit: string | null;
  logLevel: string;
  etcd: { endpoints: string[]; cert: string; key: string; ca: string; prefix: string };
  /** `burstThreshold`: primary utilisation (0..1) above which `pool=burst` hosts take creates that allow them; default 0.8. */
  placement: { k: number; job: 'spread' | 'pack'; burstThreshold: number };
  /**
   * Fleet-wide tenant quotas (`[quotas]`, `[quotas.tenants.NAME]`: sandboxes, cpus in
   * cores, memory_bytes; dsecd's shape), held in etcd by every gateway (gateway/quotas.ts);
   * default none.
   */
  quotas: FleetQuotaConfig;
  /**
   * Limits of the door (daemon/remote/door.ts DoorLimits). Defaults as dsecd's door
   * (`[remote]`), except creates per token: 600,000 a minute (10,000/s), twice the paper's
   * whole-cluster peak of 5,000 creations/s, since one controller's token may drive the
   * whole fleet through one gateway.
   */
  limits: DoorLimits;
}

/** Flags of `dsec-gateway`. */
export interface GatewaySources {
  config?: string;
  listen?: string;
  tlsCert?: string;
  tlsKey?: string;
  tlsCa?: string;
  clientCa?: string;
  name?: string;
  audit?: string;
  etcd?: string;
  etcdCert?: string;
  etcdKey?: string;
  etcdCa?: string;
  etcdPrefix?: string;
  placementK?: number;
  jobPlacement?: string;
  burstThreshold?: number;
}

/**
 * Resolves the configuration.
 * @throws DsecError InvalidArgument for a malformed file, a missing certificate, key, CA or etcd endpoint.
 */
export function loadGatewayConfig(src: GatewaySources, env: NodeJS.ProcessEnv = process.env): GatewayConfig {
  const file = src.config ?? DEFAULT_GATEWAY_CONFIG;
  const fc: z.infer<typeof FileConfig> = readTomlFile(file, FileConfig, Boolean(src.config));
  const abs = (f: string | undefined | null) => (f ? path.resolve(f) : null);
  const tlsCert = abs(src.tlsCert ?? fc.tls_cert), tlsKey = abs(src.tlsKey ?? fc.tls_key), tlsCa = abs(src.tlsCa ?? fc.tls_ca);
  if (!tlsCert || !tlsKey || !tlsCa) {
    throw invalidArgument('a gateway needs --tls-cert and --tls-key (its certificate of role gateway: dsec fleet cert --role gateway) and --tls-ca (the fleet CA)');
  }
  const endpoints = src.etcd ?? fc.etcd?.endpoints;
  if (!endpoints) throw invalidArgument('a gateway needs --etcd URL[,URL...]: the fleet\'s etcd');
  const listen = src.listen ?? fc.listen ?? '0.0.0.0:8443';
  parseListen(listen, '--listen');
  const job = src.jobPlacement ?? fc.placement?.job ?? 'spread';
  if (job !== 'spread' && job !== 'pack') throw invalidArgument(`--job-placement ${JSON.stringify(job)}: spread or pack`);
  return {
    listen, tlsCert, tlsKey, tlsCa,
    clientCa: abs(src.clientCa ?? fc.client_ca),
    name: src.name ?? fc.name ?? null,
    audit: abs(src.audit ?? fc.audit),
    logLevel: env.DSEC_LOG_LEVEL ?? fc.log_level ?? 'info',
    etcd: {
      endpoints: parseEndpoints(endpoints),
      cert: abs(src.etcdCert ?? fc.etcd?.cert) ?? tlsCert,
      key: abs(src.etcdKey ?? fc.etcd?.key) ?? tlsKey,
      ca: abs(src.etcdCa ?? fc.etcd?.ca) ?? tlsCa,
      prefix: src.etcdPrefix ?? fc.etcd?.prefix ?? DEFAULT_PREFIX,
    },
    placement: { k: src.placementK ?? fc.placement?.k ?? DEFAULT_K, job, burstThreshold: src.burstThreshold ?? fc.placement?.burst_threshold ?? DEFAULT_BURST_THRESHOLD },
    quotas: resolveQuotas(fc.quotas),
    limits: {
      createsPerMinute: fc.limits?.creates_per_minute ?? 600_000,
      authFailuresPerMinute: fc.limits?.auth_failures_per_minute ?? 30,
      maxConnections: fc.limits?.max_connections ?? 10_000,
      headersTimeoutMs: 10_000,
      requestTimeoutMs: 3_600_000,
      keepAliveTimeoutMs: 5_000,
      handshakeTimeoutMs: 10_000,
    },
  };
}
