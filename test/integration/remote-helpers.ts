/**
 * Helpers of the TCP door's tests: raw HTTPS requests to a test dsecd's door (so a test
 * sees the wire: status, headers, body), token creation through its Unix socket, and its
 * audit log.
 */
import https from 'node:https';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { TestDaemon } from './harness.js';

/** An answer of the door. */
export interface DoorAnswer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** Options of {@link doorRequest}. */
export interface DoorRequest {
  method?: string;
  path: string;
  /** Sent as `Authorization: Bearer`. */
  token?: string;
  /** Extra headers. */
  headers?: Record<string, string>;
  /** JSON body. */
  json?: unknown;
  /** Raw body. */
  raw?: Buffer | string;
  /** Client certificate and key, PEM. */
  cert?: string;
  key?: string;
  /** CA to trust (default the daemon's own ca.crt). */
  ca?: string;
  /** Source address (127.0.0.0/8), to be another client for per-address limits. */
  localAddress?: string;
}

/** One HTTPS request to `d`'s TCP door; resolves with the answer (rejects only when no answer came). */
export function doorRequest(d: TestDaemon, r: DoorRequest): Promise<DoorAnswer> {
  const body = r.json !== undefined ? JSON.stringify(r.json) : r.raw;
  const headers: Record<string, string> = { ...(r.json !== undefined ? { 'content-type': 'application/json' } : {}), ...(r.headers ?? {}) };
  if (r.token !== undefined) headers.authorization = `Bearer ${r.token}`;
  return new Promise((resolve, reject) => {
    const req = https.request({
      host: '127.0.0.1', port: d.remotePort!, path: r.path, method: r.method ?? 'GET', headers,
      ca: r.ca ?? readFileSync(d.caFile, 'utf8'), cert: r.cert, key: r.key, localAddress: r.localAddress, agent: false,
    }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: text }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** Creates a token through `d`'s Unix socket; resolves with its text and id. */
export async function makeToken(d: TestDaemon, tenant: string, role: 'admin' | 'user' | 'reader' | 'metrics', ttlS?: number): Promise<{ token: string; id: string }> {
  const r = await (d.client as unknown as { request<T>(m: string, p: string, b?: unknown): Promise<T> }).request<{ token: string; id: string }>('POST', '/v1/tokens', { tenant, role, ...(ttlS ? { ttl_s: ttlS } : {}) });
  return { token: r.token, id: r.id };
}

/**
 * The lines of `d`'s audit log (`<root>/audit.log`) written so far, parsed. The log is
 * written asynchronously, so a last line still being written is left out; callers poll.
 */
export function auditLines(d: TestDaemon): Array<Record<string, unknown>> {
  const text = readFileSync(path.join(d.root, 'audit.log'), 'utf8');
  return text.slice(0, text.lastIndexOf('\n') + 1).split('\n').filter(Boolean).map((x) => JSON.parse(x) as Record<string, unknown>);
}
