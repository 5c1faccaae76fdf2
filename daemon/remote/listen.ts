/**
 * Starting the TCP door (`dsecd --listen`): its TLS material, the API app with the TCP
 * door's hooks (daemon/remote/door.ts), listening.
 */
import type { FastifyInstance } from 'fastify';
import net from 'node:net';
import path from 'node:path';
import type { Logger } from 'pino';
import { parseListen, type RemoteConfig } from '../config.js';
import { failedPrecondition } from '../errors.js';
import type { AuditLog } from './audit.js';
import { tcpDoor, type ApiDoor, type TokenConnections } from './door.js';
import type { Metrics } from '../metrics.js';
import type { TokenService } from './tokens.js';
import { PkiError, ensureServerCert, hostNames, readPem as readPemFile } from '../../pki/certs.js';
import { DsecError } from '../errors.js';

/** readPem with its refusal as a DsecError of the same kind (dsecd prints it as one line). */
function readPem(file: string, label: 'CERTIFICATE' | 'PRIVATE KEY', what: string): string {
  try {
    return readPemFile(file, label, what);
  } catch (e) {
    throw e instanceof PkiError ? new DsecError(e.kind, e.message) : e;
  }
}

/** A listening TCP door. */
export interface RemoteDoor {
  app: FastifyInstance;
  /** Where it listens: `{ host, port }` (the port the kernel chose for port 0). */
  address: { host: string; port: number };
  /** The CA certificate file clients trust: `<root>/tls/ca.crt`, or null with `--tls-cert` (the operator's CA). */
  caFile: string | null;
  /** Connections per token (revocation closes them). */
  connections: TokenConnections;
}

/**
 * The server certificate and key: the operator's (`--tls-cert`/`--tls-key`), or dsecd's
 * own under `<root>/tls` covering its host name, its addresses, the listen address and
 * `[remote] san` (issued on first start, again when a name is missing or it nears expiry).
 */
export async function serverTls(remote: RemoteConfig, root: string, log: Logger): Promise<{ cert: string; key: string; caFile: string | null }> {
  if (remote.tlsCert && remote.tlsKey) {
    return { cert: readPem(remote.tlsCert, 'CERTIFICATE', '--tls-cert'), key: readPem(remote.tlsKey, 'PRIVATE KEY', '--tls-key'), caFile: null };
  }
  const names = hostNames();
  const { host } = parseListen(remote.listen!, '--listen');
  const extra = [...remote.san, ...(host !== '0.0.0.0' && host !== '::' ? [host] : [])];
  for (const n of extra) {
    if (net.isIP(n)) names.ips.push(n);
    else names.dns.push(n);
  }
  const r = await ensureServerCert(path.join(root, 'tls'), { dns: [...new Set(names.dns)], ips: [...new Set(names.ips)] });
  if (r.issued) log.info({ ca: r.caFile, dns: names.dns, ips: names.ips }, 'issued a server certificate for the TCP door; clients trust the CA certificate');
  return { cert: r.cert, key: r.key, caFile: r.caFile };
}

/**
 * Builds and starts the TCP door. `buildApi` makes the API app for a door (daemon/api/server.ts
 * buildApi, passed in by the composition root so this module stays below daemon/api/).
 * With `gatewayIdentity` (a fleet host) a gateway certificate's requests carry their
 * caller in headers (daemon/remote/door.ts).
 * @throws DsecError InvalidArgument for unreadable TLS files, FailedPrecondition when the address is taken.
 */
export async function startRemoteDoor(remote: RemoteConfig, root: string, deps: { tokens: TokenService; metrics: Metrics }, buildApi: (door: ApiDoor) => FastifyInstance, audit: AuditLog | null, log: Logger,
  opts: { gatewayIdentity?: boolean } = {}): Promise<RemoteDoor> {
  const tls = await serverTls(remote, root, log);
  const clientCa = remote.tlsCa ? readPem(remote.tlsCa, 'CERTIFICATE', '--tls-ca') : null;
  const door = tcpDoor({
    tokens: deps.tokens,
    tls: { cert: tls.cert, key: tls.key, clientCa, peerRoles: remote.peerRoles },
    limits: remote,
    metrics: deps.metrics,
    log: log.child({ component: 'door' }),
    audit,
    gatewayIdentity: opts.gatewayIdentity,
  });
  const app = buildApi(door);
  const { host, port } = parseListen(remote.listen!, '--listen');
  try {
    await app.listen({ host, port });
  } catch (e) {
    await app.close().catch(() => {});
    throw failedPrecondition(`cannot listen on ${remote.listen}: ${(e as Error).message}`, e);
  }
  const a = app.server.address() as net.AddressInfo;
  log.info({ address: `${a.address}:${a.port}`, ca: tls.caFile, mtls: clientCa !== null, peer_roles: clientCa ? remote.peerRoles : undefined }, 'serving the API over TLS');
  return { app, address: { host: a.address, port: a.port }, caFile: tls.caFile, connections: door.connections };
}
