/**
 * The gateway's calls to hosts: HTTPS with mutual TLS, the gateway presenting its own
 * fleet certificate (role gateway) and accepting only a host certificate (role host)
 * whose name is the host's, one keep-alive agent per host. Requests name the caller's
 * tenant and role in headers ({@link IDENTITY_HEADERS}) that hosts accept only from a
 * gateway certificate (daemon/remote/door.ts).
 *
 * Failures before a host answered (refused connection, TLS, a connect that takes longer
 * than {@link CONNECT_TIMEOUT_MS}) become DsecError Unavailable naming the host; an
 * answer, whatever its status, is the host's and is passed on.
 */
import https from 'node:https';
import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import type { Duplex, Readable } from 'node:stream';
import tls, { type PeerCertificate } from 'node:tls';
import type { Logger } from 'pino';
import { DsecError, unavailable } from '../daemon/errors.js';
import { roleOfSan } from '../pki/certs.js';
import { ACK_HEADER, IDEMPOTENCY_HEADER } from '../daemon/sandbox/create-records.js';

/** Headers a gateway sets on every call to a host: who the caller is (hosts trust them only from a gateway certificate). */
export const IDENTITY_HEADERS = {
  tenant: 'x-dsec-tenant',
  role: 'x-dsec-role',
  tokenId: 'x-dsec-token-id',
} as const;

/** A connection to a host that is not up within 3 s is given up: a live host on a fleet network answers in milliseconds. */
export const CONNECT_TIMEOUT_MS = 3000;

/**
 * Free keep-alive sockets are closed by the gateway after 30 s at most, and sooner when
 * the host's answer carries `Keep-Alive: timeout=N` (node's agent then closes at N-1 s,
 * but only when an agent timeout is set at all): a host closes an idle connection after
 * its `keep_alive_timeout_s` (5 s by default), and a request sent on a socket the host is
 * closing fails with ECONNRESET ("socket hang up") before the host saw it.
 */
export const FREE_SOCKET_TIMEOUT_MS = 30_000;

/**
 * Methods whose request is sent again, once, on a fresh connection when the pooled
 * connection it went out on turns out closed before any answer; a request with an
 * `Idempotency-Key` is too (the host answers a repeat with the first outcome). Others
 * (an exec's POST) are not: the host may have started them.
 */
const REPLAYABLE = new Set(['GET', 'HEAD', 'PUT', 'DELETE', 'OPTIONS']);

/** Hop-by-hop headers (RFC 9110 section 7.6.1) and the caller's credentials, never passed between client and host. */
const DROP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'host',
  'authorization', 'x-api-key', ACK_HEADER, IDENTITY_HEADERS.tenant, IDENTITY_HEADERS.role, IDENTITY_HEADERS.tokenId]);

/** Headers of `h` that may be passed on (see DROP). */
export function passHeaders(h: IncomingHttpHeaders): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(h)) if (v !== undefined && !DROP.has(k)) out[k] = v;
  return out;
}

/** The gateway's TLS material for calling hosts: PEM texts. */
export interface UpstreamTls {
  /** The fleet CA, which signed the hosts' certificates. */
  ca: string;
  /** The gateway's certificate (role gateway) and key. */
  cert: string;
  key: string;
}

/** Where a host is reached: its name (the CN its certificate must carry) and `https://ADDR:PORT`. */
export interface HostAddress {
  name: string;
  advertise: string;
}

/** Who the call is for: the caller as the gateway authenticated it. */
export interface CallIdentity {
  tenant: string;
  role: string;
  tokenId: string | null;
}

/** One call to a host. */
export interface UpstreamRequest {
  method: string;
  /** Path and query, e.g. `/v1/sandboxes/ab..?force=true`. */
  path: string;
  headers?: Record<string, string | string[]>;
  /** Body: bytes, or a stream piped with backpressure. */
  body?: Buffer | string | Readable;
  identity: CallIdentity;
}

/** Calls to hosts; see the module comment. */
export class Upstreams {
  private readonly agents = new Map<string, { advertise: string; agent: https.Agent }>();

  constructor(private readonly tls: UpstreamTls, private readonly log: Logger) {}

  /** The agent of host `h` (made again when its address changed). */
  private agent(h: HostAddress): https.Agent {
    const cur = this.agents.get(h.name);
    if (cur && cur.advertise === h.advertise) return cur.agent;
    cur?.agent.destroy();
    const agent = new https.Agent({
      keepAlive: true,
      timeout: FREE_SOCKET_TIMEOUT_MS,
      // Enough parallel calls for a burst's creates and execs to one host; queued past that.
      maxSockets: 256,
      maxFreeSockets: 64,
      ca: this.tls.ca,
      cert: this.tls.cert,
      key: this.tls.key,
      minVersion: 'TLSv1.3',
      // The peer must be the host the table names: a host certificate (role host) whose name is the host's.
      checkServerIdentity: (servername: string, cert: PeerCertificate) => {
        const err = tls.checkServerIdentity(servername, cert);
        if (err) return err;
        const role = roleOfSan(cert.subjectaltname);
        const cn = Array.isArray(cert.subject?.CN) ? cert.subject.CN[0] : cert.subject?.CN;
        if (role !== 'host') return new Error(`the certificate at ${h.advertise} names role ${role ?? '(none)'}, not host`);
        if (cn !== h.name) return new Error(`the certificate at ${h.advertise} is ${cn}'s, not host ${h.name}'s`);
        return undefined;
      },
    });
    this.agents.set(h.name, { advertise: h.advertise, agent });
    return agent;
  }

  /** Options of node's https.request for a call to `h`. */
  private options(h: HostAddress, r: Omit<UpstreamRequest, 'body'>): https.RequestOptions {
    const u = new URL(h.advertise);
    const headers: Record<string, string | string[]> = { ...(r.headers ?? {}) };
    headers[IDENTITY_HEADERS.tenant] = r.identity.tenant;
    headers[IDENTITY_HEADERS.role] = r.identity.role;
    if (r.identity.tokenId) headers[IDENTITY_HEADERS.tokenId] = r.identity.tokenId;
    return {
      agent: this.agent(h), protocol: 'https:', hostname: u.hostname.replace(/^\[|\]$/g, ''), port: Number(u.port), method: r.method, path: r.path, headers,
      servername: /^[0-9.]+$|:/.test(u.hostname) ? undefined : u.hostname,
    };
  }

  /** Options for a call to `h` on a connection of its own, outside the pool, with the pool's TLS checks. */
  private direct(h: HostAddress, r: Omit<UpstreamRequest, 'body'>): https.RequestOptions {
    const opts: https.RequestOptions = { ...this.options(h, r), agent: false, ca: this.tls.ca, cert: this.tls.cert, key: this.tls.key, minVersion: 'TLSv1.3' };
    opts.checkServerIdentity = (this.agent(h).options as https.AgentOptions).checkServerIdentity;
    return opts;
  }

  /**
   * Sends a request and resolves with the host's response (its body unread: the caller
   * streams or reads it).
   * @throws DsecError Unavailable when the host could not be reached (before any answer).
   */
  request(h: HostAddress, r: UpstreamRequest): Promise<IncomingMessage> {
    const replayable = !isStream(r.body) && (REPLAYABLE.has(r.method.toUpperCase()) || r.headers?.[IDEMPOTENCY_HEADER] !== undefined);
    return this.send(h, r, replayable, false);
  }

  /**
   * One attempt of {@link request}: on a pooled connection, or on one of its own when
   * `fresh`; `replay` allows one more, fresh, attempt (see {@link REPLAYABLE}).
   */
  private send(h: HostAddress, r: UpstreamRequest, replay: boolean, fresh: boolean): Promise<IncomingMessage> {
    return new Promise((resolve, reject) => {
      let answered = false;
      const req = https.request(fresh ? this.direct(h, r) : this.options(h, r), (res) => {
        answered = true;
        clearTimeout(timer);
        resolve(res);
      });
      const timer = setTimeout(() => req.destroy(new Error(`no connection within ${CONNECT_TIMEOUT_MS} ms`)), CONNECT_TIMEOUT_MS);
      req.on('socket', (s) => {
        // A reused keep-alive socket is connected already.
        if (!(s as { connecting?: boolean }).connecting) clearTimeout(timer);
        else s.once('secureConnect', () => clearTimeout(timer));
      });
      req.on('error', (e: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        if (answered) return;
        if (replay && req.reusedSocket && (e.code === 'ECONNRESET' || e.code === 'EPIPE')) {
          this.log.debug({ host: h.name, path: r.path, err: e.message }, 'pooled connection closed by the host; sending again');
          // On a connection of its own: the pool's other idle sockets may be closing too.
          resolve(this.send(h, r, false, true));
          return;
        }
        reject(this.unreachable(h, e));
      });
      const body = r.body;
      if (!isStream(body)) req.end(body);
      else {
        body.on('error', (e) => req.destroy(e));
        body.pipe(req);
      }
    });
  }

  /**
   * A request whose answer is JSON: status and parsed body (null when the body is not JSON).
   * @throws DsecError Unavailable when the host could not be reached or the answer broke off.
   */
  async json<T = unknown>(h: HostAddress, r: UpstreamRequest): Promise<{ status: number; body: T | null; headers: IncomingHttpHeaders }> {
    const res = await this.request(h, r);
    const chunks: Buffer[] = [];
    try {
      for await (const c of res) chunks.push(c as Buffer);
    } catch (e) {
      throw this.unreachable(h, e as Error);
    }
    const text = Buffer.concat(chunks).toString('utf8');
    let body: T | null = null;
    try {
      body = text ? JSON.parse(text) as T : null;
    } catch { /* not JSON */ }
    return { status: res.statusCode ?? 0, body, headers: res.headers };
  }

  /**
   * Opens a WebSocket (or any HTTP upgrade) to `h`: resolves with the host's `101`
   * response, its socket and the bytes that came after the head. A host that answers
   * without upgrading resolves with that response and no socket.
   * @throws DsecError Unavailable when the host could not be reached.
   */
  upgrade(h: HostAddress, r: Omit<UpstreamRequest, 'body'>): Promise<{ res: IncomingMessage; socket: Duplex | null; head: Buffer }> {
    return new Promise((resolve, reject) => {
      let answered = false;
      // A fresh connection: an upgraded socket is never returned to the keep-alive pool.
      const req = https.request(this.direct(h, r));
      const timer = setTimeout(() => req.destroy(new Error(`no connection within ${CONNECT_TIMEOUT_MS} ms`)), CONNECT_TIMEOUT_MS);
      req.once('socket', (s) => s.once('secureConnect', () => clearTimeout(timer)));
      req.on('upgrade', (res, socket, head) => {
        answered = true;
        clearTimeout(timer);
        resolve({ res, socket, head });
      });
      req.on('response', (res) => {
        answered = true;
        clearTimeout(timer);
        resolve({ res, socket: null, head: Buffer.alloc(0) });
      });
      req.on('error', (e) => {
        clearTimeout(timer);
        if (!answered) reject(this.unreachable(h, e));
      });
      req.end();
    });
  }

  private unreachable(h: HostAddress, e: Error): DsecError {
    if (e instanceof DsecError) return e;
    this.log.debug({ host: h.name, err: e.message }, 'host unreachable');
    return unavailable(`host ${h.name} (${h.advertise}) is unreachable: ${e.message}`, e);
  }

  /** Closes every agent's idle connections. */
  close(): void {
    for (const { agent } of this.agents.values()) agent.destroy();
    this.agents.clear();
  }
}

/** Whether a request body is a stream (which cannot be sent twice). */
function isStream(body: UpstreamRequest['body']): body is Readable {
  return body !== undefined && typeof body !== 'string' && !Buffer.isBuffer(body);
}
