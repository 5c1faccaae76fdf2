/**
 * Where a client reaches dsecd: its Unix socket (the local administrator's door), or its
 * TCP door over HTTPS (`https://HOST:PORT`, TLS 1.3, a token on every request; docs/SECURITY.md
 * "The TCP door"). The transport (sdk/transport.ts) asks an {@link Endpoint} for the
 * options of each request and WebSocket, so every call works the same on both.
 */
import { readFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';

/** How to reach dsecd over TCP. */
export interface RemoteOptions {
  /** `https://HOST:PORT` of dsecd's TCP door (or a gateway's). */
  url: string;
  /** API token (`e2b_...`), sent as `Authorization: Bearer`. */
  token?: string;
  /** CA certificate(s) to trust, PEM (dsecd's `<root>/tls/ca.crt`, or a fleet CA); default the system's. */
  ca?: string | Buffer;
  /** Client certificate and key, PEM, for a port that requires them (mutual TLS). */
  cert?: string | Buffer;
  key?: string | Buffer;
}

/** The connection-specific part of a request's options. */
export type ConnectOptions = Pick<https.RequestOptions, 'socketPath' | 'host' | 'port' | 'ca' | 'cert' | 'key' | 'servername' | 'minVersion'>;

/** One way to dsecd: a socket path, or an HTTPS endpoint. */
export class Endpoint {
  /** `dsecd socket PATH` or `dsecd at https://HOST:PORT`, for messages. */
  readonly where: string;
  private readonly remote: { host: string; port: number; token?: string; ca?: string | Buffer; cert?: string | Buffer; key?: string | Buffer } | null;

  /**
   * @param socketPath the Unix socket (used when `remote` is absent)
   * @param remote the TCP door; a bad URL throws TypeError naming it
   */
  constructor(readonly socketPath: string, remote?: RemoteOptions) {
    if (!remote) {
      this.remote = null;
      this.where = `dsecd socket ${socketPath}`;
      return;
    }
    const u = new URL(remote.url);
    if (u.protocol !== 'https:') throw new TypeError(`dsecd host ${remote.url}: want https://HOST:PORT (the TCP door speaks TLS only)`);
    if (u.pathname !== '/' && u.pathname !== '') throw new TypeError(`dsecd host ${remote.url}: no path after HOST:PORT`);
    this.remote = { host: u.hostname.replace(/^\[|\]$/g, ''), port: Number(u.port || 443), token: remote.token, ca: remote.ca, cert: remote.cert, key: remote.key };
    this.where = `dsecd at https://${u.host}`;
  }

  /** Whether this is the TCP door. */
  get isRemote(): boolean {
    return this.remote !== null;
  }

  /**
   * A keep-alive agent for pooled requests of this endpoint. Idle pooled sockets close a
   * second before dsecd's `Keep-Alive: timeout=N` says it would close them (node's agent
   * honours that hint only when an agent timeout is set, hence the 30 s cap), so a call
   * rarely goes out on a socket dsecd is closing; {@link Transport} resends idempotent
   * calls once when one does.
   */
  newAgent(): http.Agent {
    const opts = { keepAlive: true, timeout: 30_000 };
    return this.remote ? new https.Agent(opts) : new http.Agent(opts);
  }

  /** Options that direct a request here (TLS 1.3 only over TCP: dsecd refuses anything older). */
  connect(): ConnectOptions {
    if (!this.remote) return { socketPath: this.socketPath };
    const r = this.remote;
    return { host: r.host, port: r.port, ca: r.ca, cert: r.cert, key: r.key, minVersion: 'TLSv1.3' };
  }

  /** Headers every request carries here (the token). */
  authHeaders(): Record<string, string> {
    return this.remote?.token ? { authorization: `Bearer ${this.remote.token}` } : {};
  }

  /** Starts a request: https over TCP, http over the socket. */
  request(opts: http.RequestOptions): http.ClientRequest {
    const o = { ...opts, ...this.connect(), headers: { ...this.authHeaders(), ...(opts.headers as Record<string, string> | undefined) } };
    return this.remote ? https.request(o) : http.request(o);
  }

  /** The WebSocket URL of `path` and the options the `ws` client needs (TLS, token). */
  webSocket(path: string): { url: string; options: Record<string, unknown> } {
    if (!this.remote) return { url: `ws+unix://${this.socketPath}:${path}`, options: {} };
    const r = this.remote;
    const host = r.host.includes(':') ? `[${r.host}]` : r.host;
    return { url: `wss://${host}:${r.port}${path}`, options: { ca: r.ca, cert: r.cert, key: r.key, minVersion: 'TLSv1.3', headers: this.authHeaders() } };
  }
}

/**
 * The remote options from the environment: `DSEC_HOST` (`https://HOST:PORT`),
 * `DSEC_TOKEN`, `DSEC_CA` (a PEM file). Undefined when DSEC_HOST is unset.
 * @throws Error naming DSEC_CA when that file cannot be read.
 */
export function remoteFromEnv(env: Record<string, string | undefined> = process.env): RemoteOptions | undefined {
  if (!env.DSEC_HOST) return undefined;
  let ca: Buffer | undefined;
  if (env.DSEC_CA) {
    try {
      ca = readFileSync(env.DSEC_CA);
    } catch (e) {
      throw new Error(`DSEC_CA ${env.DSEC_CA}: ${(e as Error).message}`);
    }
  }
  return { url: env.DSEC_HOST, token: env.DSEC_TOKEN || undefined, ca };
}
