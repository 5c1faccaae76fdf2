/**
 * The TCP door's settings (`[remote]`, `--listen`, `--tls-*`) and the address helpers
 * the config and the door share. Resolved by daemon/config.ts loadConfig.
 */
import { invalidArgument } from '../errors.js';
import type { CertRole } from '../../pki/roles.js';

/**
 * `[remote]`, the TCP door (daemon/remote/door.ts, docs/SECURITY.md "The TCP door"):
 * HTTPS with TLS 1.3 only and a token on every request.
 */
export interface RemoteConfig {
  /** `ADDR:PORT` to listen on (`--listen`, `listen`; `[::]:8443` for every IPv6 and IPv4 address), or null: no TCP door. */
  listen: string | null;
  /** Server certificate chain and key, PEM files (`--tls-cert`/`--tls-key`); null: dsecd's own CA and certificate under `<root>/tls` (pki/certs.ts ensureServerCert). */
  tlsCert: string | null;
  tlsKey: string | null;
  /** Client CA, PEM file (`--tls-ca`): when set, every client must present a certificate it signed (mutual TLS), of a role in `peerRoles`. */
  tlsCa: string | null;
  /** Roles a client certificate may name (`peer_roles`, `--tls-peer-roles`; default client and gateway: a host's certificate is refused). */
  peerRoles: CertRole[];
  /** Extra names dsecd's own server certificate covers besides its host name and addresses (`san`: DNS names or IP addresses). */
  san: string[];
  /** Sandbox creates (create, restore, fork) one token may start per minute (`creates_per_minute`; default 6,000: 100/s sustained, far above one RL controller's burst on one host, a brake on a runaway loop). */
  createsPerMinute: number;
  /** Failed authentications one source address may make per minute before it gets 429 for the rest of that minute (`auth_failures_per_minute`; default 30). */
  authFailuresPerMinute: number;
  /** Most TCP connections at once (`max_connections`; default 10,000: an attach each for thousands of sandboxes, below the default fd limit of dsecd's unit). */
  maxConnections: number;
  /** Time for a request's headers, ms (`headers_timeout_s`; default 10 s: a slowloris client holding connections with partial headers is cut). */
  headersTimeoutMs: number;
  /** Time to receive a whole request, ms (`request_timeout_s`; default 3,600 s: an upload of a large file over a slow link; 0 for none). */
  requestTimeoutMs: number;
  /** Idle keep-alive connections close after this, ms (`keep_alive_timeout_s`; default 5 s, node's). */
  keepAliveTimeoutMs: number;
  /** A TLS handshake must finish within this, ms (`handshake_timeout_s`; default 10 s). */
  handshakeTimeoutMs: number;
}

/** Whether `host` (of a host:port) is a loopback address or `localhost`. */
export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '');
  return h === 'localhost' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h) || h === '::1';
}

/**
 * Splits `ADDR:PORT` (`[v6]:PORT` for IPv6).
 * @throws DsecError InvalidArgument naming `what` for anything else.
 */
export function parseListen(addr: string, what: string): { host: string; port: number } {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\[\]]+)):(\d{1,5})$/.exec(addr);
  const port = m ? Number(m[3]) : NaN;
  if (!m || port > 65535) throw invalidArgument(`${what} ${JSON.stringify(addr)}: want ADDR:PORT, e.g. 0.0.0.0:8443 or [::]:8443`);
  return { host: m[1] ?? m[2], port };
}

