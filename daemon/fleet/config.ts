/**
 * The fleet settings of a dsecd host (`[fleet]`, `--etcd` and friends): what
 * daemon/fleet/registration.ts registers, resolved from flags over the config file, and
 * what joining a fleet changes of the host's TCP door. Resolved by daemon/config.ts
 * loadConfig.
 */
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { invalidArgument } from '../errors.js';
import { parseListen, type RemoteConfig } from '../remote/config.js';
import { DEFAULT_LEASE_TTL_S, DEFAULT_PREFIX, DEFAULT_REFRESH_MS, HOST_LABEL_RE, HOST_NAME_RE, parseEndpoints } from './layout.js';

/**
 * `[fleet]` and the fleet flags: dsecd registers its host in etcd (daemon/fleet/registration.ts).
 * - `etcd`: client URLs (`--etcd URL[,URL...]`).
 * - `cert`/`key`/`ca`: PEM files of the etcd client certificate (its CN is the host's etcd
 *   user, so it is the host name), its key, and the CA of etcd's server certificate
 *   (`--etcd-cert`, `--etcd-key`, `--etcd-ca`); default none (plain or server-only TLS).
 * - `prefix`: key prefix of the fleet (`--etcd-prefix`, default `/dsec`).
 * - `advertise`: `https://ADDR:PORT` at which gateways reach this host (`--advertise`); required.
 * - `hostName`: `--host-name`, default the machine's host name (lowercased; a DNS label).
 * - `labels`: `--host-label k=v` (repeatable) and `[fleet.labels]`, e.g. pool=burst, zone=a.
 * - `leaseTtlS`: the registration lease's TTL (default 5 s); `refreshMs`: load is
 *   rewritten at least this often (`refresh_s`, default 2 s).
 */
export interface FleetConfig {
  etcd: string[];
  cert: string | null;
  key: string | null;
  ca: string | null;
  prefix: string;
  advertise: string | null;
  hostName: string;
  labels: Record<string, string>;
  leaseTtlS: number;
  refreshMs: number;
}

/** The fleet flags (undefined: not given). */
export interface FleetSources {
  /** `--etcd URL[,URL...]`. */
  etcd?: string;
  etcdCert?: string;
  etcdKey?: string;
  etcdCa?: string;
  etcdPrefix?: string;
  /** `--advertise https://ADDR:PORT`. */
  advertise?: string;
  hostName?: string;
  /** `--host-label k=v`, each. */
  hostLabels?: string[];
}

/** `[fleet]` of the config file, as parsed. */
export interface FleetFileConfig {
  etcd?: string[];
  etcd_cert?: string;
  etcd_key?: string;
  etcd_ca?: string;
  prefix?: string;
  advertise?: string;
  host_name?: string;
  labels?: Record<string, string>;
  lease_ttl_s?: number;
  refresh_s?: number;
}

/**
 * What a fleet changes of a host's TCP door and fills in of the fleet settings: the door
 * must run with the host's fleet certificate and the fleet CA, and accepts only gateway
 * certificates (gateways authenticate callers; docs/SECURITY.md "Fleet identity"); the
 * advertised address defaults to a specific `--listen` address; etcd's client
 * certificate defaults to the host's own (its CN is the host's etcd user).
 * @throws DsecError InvalidArgument naming what is missing.
 */
export function fleetHost(fleet: FleetConfig, remote: RemoteConfig): [FleetConfig, RemoteConfig] {
  if (!remote.listen || !remote.tlsCert || !remote.tlsKey || !remote.tlsCa) {
    throw invalidArgument('a fleet host (--etcd) serves gateways over mutual TLS: give --listen ADDR:PORT, --tls-cert and --tls-key (its certificate of role host, `dsec fleet cert --role host`) and --tls-ca (the fleet CA)');
  }
  let advertise = fleet.advertise;
  if (advertise === null) {
    const { host, port } = parseListen(remote.listen, '--listen');
    if (host === '0.0.0.0' || host === '::') throw invalidArgument(`--listen ${remote.listen} names no address gateways could reach: give --advertise https://ADDR:${port}`);
    advertise = `https://${net.isIPv6(host) ? `[${host}]` : host}:${port}`;
  }
  return [
    { ...fleet, advertise, cert: fleet.cert ?? remote.tlsCert, key: fleet.key ?? remote.tlsKey, ca: fleet.ca ?? remote.tlsCa },
    { ...remote, peerRoles: ['gateway'] },
  ];
}

/**
 * The fleet settings from flags over `[fleet]`; null when no etcd endpoint is given.
 * @throws DsecError InvalidArgument for a malformed URL, host name or label.
 */
export function resolveFleet(src: FleetSources, fc: FleetFileConfig | undefined): FleetConfig | null {
  const endpoints = src.etcd ?? fc?.etcd;
  if (!endpoints || (Array.isArray(endpoints) && !endpoints.length)) return null;
  const hostName = src.hostName ?? fc?.host_name ?? os.hostname().toLowerCase().split('.')[0];
  if (!HOST_NAME_RE.test(hostName)) throw invalidArgument(`host name ${JSON.stringify(hostName)} is not a DNS label (1-63 of [a-z0-9-]); pass --host-name`);
  const labels: Record<string, string> = { ...(fc?.labels ?? {}) };
  for (const l of src.hostLabels ?? []) {
    const i = l.indexOf('=');
    const k = l.slice(0, i), v = l.slice(i + 1);
    if (i < 1 || !HOST_LABEL_RE.test(k) || !HOST_LABEL_RE.test(v)) throw invalidArgument(`--host-label ${JSON.stringify(l)}: expected k=v, each 1-63 of [A-Za-z0-9._/-]`);
    labels[k] = v;
  }
  const advertise = src.advertise ?? fc?.advertise ?? null;
  if (advertise !== null) {
    let u: URL | null = null;
    try {
      u = new URL(advertise);
    } catch { /* refused below */ }
    if (!u || u.protocol !== 'https:' || !u.port) throw invalidArgument(`--advertise ${JSON.stringify(advertise)}: expected https://ADDR:PORT, the address gateways reach this host's TLS listener at`);
  }
  const abs = (f: string | undefined) => (f ? path.resolve(f) : null);
  return {
    etcd: parseEndpoints(endpoints),
    cert: abs(src.etcdCert ?? fc?.etcd_cert),
    key: abs(src.etcdKey ?? fc?.etcd_key),
    ca: abs(src.etcdCa ?? fc?.etcd_ca),
    prefix: src.etcdPrefix ?? fc?.prefix ?? DEFAULT_PREFIX,
    advertise,
    hostName,
    labels,
    leaseTtlS: fc?.lease_ttl_s ?? DEFAULT_LEASE_TTL_S,
    refreshMs: fc?.refresh_s !== undefined ? Math.round(fc.refresh_s * 1000) : DEFAULT_REFRESH_MS,
  };
}
