/**
 * WebSockets through the gateway (exec attach, the exec channel, the vm console): the client's upgrade is
 * authenticated as any request (token, role: an attach writes), its sandbox routed to
 * its host, the upgrade sent on to the host over mutual TLS, and once the host switched
 * protocols the two sockets are piped to each other byte for byte. The gateway does not
 * parse frames: PTY output, stdin, resizes and signals pass as the host and client send
 * them, with TCP's backpressure on both legs, and either side closing closes the other.
 */
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { DsecError, permissionDenied, unauthenticated } from '../daemon/errors.js';
import { peerIdentity, type CertRole } from '../pki/certs.js';
import { allows } from '../daemon/remote/policy.js';
import { UNAUTHENTICATED_MESSAGE, type TokenConnections } from '../daemon/remote/door.js';
import { addressOf, type GatewayContext } from './context.js';
import { downMessage, type Router } from './routing.js';
import { IDENTITY_HEADERS } from './upstream.js';

/** Paths that upgrade: an exec's attach, a sandbox's exec channel and a vm's console. */
const WS_PATHS = [
  /^\/v1\/sandboxes\/([^/?]+)\/execs\/[^/?]+\/attach(?:\?|$)/,
  /^\/v1\/sandboxes\/([^/?]+)\/exec\/channel(?:\?|$)/,
  /^\/v1\/sandboxes\/([^/?]+)\/console(?:\?|$)/,
];

/** Writes an HTTP error answer on a socket that asked to upgrade, and closes it. */
function refuse(socket: Duplex, e: unknown): void {
  const err = e instanceof DsecError ? e : new DsecError('Internal', (e as Error)?.message ?? String(e));
  const body = JSON.stringify({ error: { code: err.kind, message: err.message } });
  const reason = { 400: 'Bad Request', 401: 'Unauthorized', 403: 'Forbidden', 404: 'Not Found', 429: 'Too Many Requests', 503: 'Service Unavailable' }[err.status] ?? 'Error';
  if (socket.writable) {
    socket.end(`HTTP/1.1 ${err.status} ${reason}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
  } else socket.destroy();
}

/** The token of an upgrade request (`Authorization: Bearer` or `X-API-Key`, as the door reads it). */
function tokenOf(req: IncomingMessage): string | undefined {
  const auth = req.headers.authorization;
  const key = req.headers['x-api-key'];
  if (auth !== undefined) {
    const m = /^Bearer +(\S+)\s*$/i.exec(auth);
    return m ? m[1] : '';
  }
  return Array.isArray(key) ? '' : key?.trim();
}

/** Options of {@link handleUpgrade}. */
export interface UpgradeOptions {
  ctx: GatewayContext;
  router: Router;
  connections: TokenConnections;
  /** Roles a client certificate may name when the gateway requires client certificates; null: none required. */
  clientRoles: CertRole[] | null;
}

/** Handles one `upgrade` event of the gateway's server; never throws (errors answer the client). */
export async function handleUpgrade(o: UpgradeOptions, req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
  const { ctx, router } = o;
  socket.on('error', () => socket.destroy());
  try {
    const url = req.url ?? '/';
    const m = WS_PATHS.map((r) => r.exec(url)).find(Boolean);
    if (!m && /^\/v1\/run\/channel(?:\?|$)/.test(url)) {
      throw new DsecError('NotFound', 'the gateway does not carry the run channel (one connection would pin one host): send the calls with POST /v1/run or /v1/run:batch, which the gateway places, or open the channel on a host');
    }
    if (!m) throw new DsecError('NotFound', `no WebSocket route ${url.split('?')[0]}`);
    if (o.clientRoles) {
      const peer = peerIdentity((socket as TLSSocket).getPeerCertificate?.());
      if (!peer || !peer.role || !o.clientRoles.includes(peer.role)) throw permissionDenied('client certificate not accepted on this port');
    }
    const r = await ctx.tokens.check(tokenOf(req));
    if (!r.ok) {
      ctx.metrics.authFailures.inc({ reason: r.why });
      throw unauthenticated(UNAUTHENTICATED_MESSAGE);
    }
    if (!allows(r.rec.role, 'write')) {
      ctx.metrics.authDenied.inc({ role: r.rec.role });
      throw permissionDenied(`a ${r.rec.role} token may not attach`);
    }
    o.connections.track(r.rec.id, r.rec.expires_at, socket as import('node:net').Socket);
    const identity = { tenant: r.rec.tenant, role: r.rec.role, tokenId: r.rec.id };
    const id = decodeURIComponent(m[1]);
    const host = await router.hostOf(id, `/v1/sandboxes/${encodeURIComponent(id)}`, identity);
    if (host.state !== 'up') throw new DsecError('Unavailable', downMessage(host, `sandbox ${id}`));
    const headers: Record<string, string | string[]> = {};
    for (const [k, v] of Object.entries(req.headers)) {
      if (v === undefined || k === 'host' || k === 'authorization' || k === 'x-api-key' || (Object.values(IDENTITY_HEADERS) as string[]).includes(k)) continue;
      headers[k] = v;
    }
    const up = await ctx.upstreams.upgrade(addressOf(host), { method: 'GET', path: url, headers, identity });
    if (!up.socket) {
      // The host answered without upgrading (an error): pass its answer on.
      const chunks: Buffer[] = [];
      for await (const c of up.res) chunks.push(c as Buffer);
      const body = Buffer.concat(chunks);
      socket.end(`HTTP/1.1 ${up.res.statusCode} ${up.res.statusMessage ?? ''}\r\ncontent-type: ${up.res.headers['content-type'] ?? 'application/json'}\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body.toString('latin1')}`, 'latin1');
      return;
    }
    const upstream = up.socket;
    let raw = 'HTTP/1.1 101 Switching Protocols\r\n';
    for (let i = 0; i < up.res.rawHeaders.length; i += 2) raw += `${up.res.rawHeaders[i]}: ${up.res.rawHeaders[i + 1]}\r\n`;
    socket.write(`${raw}\r\n`);
    if (up.head.length) socket.write(up.head);
    if (head.length) upstream.write(head);
    upstream.on('error', () => socket.destroy());
    socket.on('close', () => upstream.destroy());
    upstream.on('close', () => socket.destroy());
    upstream.pipe(socket);
    socket.pipe(upstream);
  } catch (e) {
    refuse(socket, e);
  }
}
