/**
 * The gateway's calls to hosts (gateway/upstream.ts) over a pooled connection the host
 * closes: a host that drops a keep-alive connection just as the gateway sends on it
 * (its idle timeout racing the gateway's next call) must not turn a replayable call into
 * Unavailable, and must never make a non-replayable one run twice.
 */
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCa, issueCert } from '../../pki/certs.js';
import { FREE_SOCKET_TIMEOUT_MS, Upstreams } from '../../gateway/upstream.js';

const identity = { tenant: 'system', role: 'admin', tokenId: null };

describe('gateway upstream calls on a pooled connection the host closed', () => {
  let server: https.Server;
  let ups: Upstreams;
  let host: { name: string; advertise: string };
  /** Requests the host received, by method and path, in order. */
  const seen: string[] = [];
  /** Connections the host saw. */
  let connections = 0;

  beforeAll(async () => {
    const ca = await createCa('test fleet CA');
    const hostCert = await issueCert(ca, { name: 'h1', role: 'host', ips: ['127.0.0.1'], usage: ['server', 'client'], days: 1 });
    const gwCert = await issueCert(ca, { name: 'gw1', role: 'gateway', usage: ['client'], days: 1 });
    server = https.createServer({ ...hostCert, ca: ca.cert, requestCert: true, rejectUnauthorized: true, minVersion: 'TLSv1.3', keepAliveTimeout: 20_000 }, (req, res) => {
      seen.push(`${req.method} ${req.url}`);
      // The second request on a connection finds it closing: the host drops it unanswered,
      // as a host whose keep-alive timer fired as the request arrived does.
      const n = ((req.socket as unknown as { served?: number }).served ?? 0) + 1;
      (req.socket as unknown as { served?: number }).served = n;
      if (n >= 2) {
        req.socket.destroy();
        return;
      }
      req.resume();
      req.on('end', () => res.end(JSON.stringify({ ok: true, n: seen.length })));
    });
    server.on('secureConnection', () => connections++);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    host = { name: 'h1', advertise: `https://127.0.0.1:${(server.address() as AddressInfo).port}` };
    ups = new Upstreams({ ca: ca.cert, cert: gwCert.cert, key: gwCert.key }, pino({ level: 'silent' }));
  });

  afterAll(async () => {
    ups.close();
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });

  it('sends a GET again on a connection of its own, once', async () => {
    seen.length = 0;
    connections = 0;
    const a = await ups.json(host, { method: 'GET', path: '/v1/sandboxes/a', identity });
    expect(a.status).toBe(200);
    const b = await ups.json(host, { method: 'GET', path: '/v1/sandboxes/b', identity });
    expect(b.status).toBe(200);
    // b went out on a's pooled connection, was dropped there, and was answered on a new one.
    expect(seen).toEqual(['GET /v1/sandboxes/a', 'GET /v1/sandboxes/b', 'GET /v1/sandboxes/b']);
    expect(connections).toBe(2);
  });

  it('sends a keyed POST again (the host answers a repeated key with its first outcome)', async () => {
    seen.length = 0;
    ups.close();
    await ups.json(host, { method: 'GET', path: '/warm', identity });
    const r = await ups.json(host, { method: 'POST', path: '/v1/sandboxes', headers: { 'idempotency-key': 'k1', 'content-type': 'application/json' }, body: '{}', identity });
    expect(r.status).toBe(200);
    expect(seen).toEqual(['GET /warm', 'POST /v1/sandboxes', 'POST /v1/sandboxes']);
  });

  it('does not send an unkeyed POST twice: the caller gets Unavailable naming the host', async () => {
    seen.length = 0;
    ups.close();
    await ups.json(host, { method: 'GET', path: '/warm', identity });
    const err = await ups.json(host, { method: 'POST', path: '/v1/sandboxes/a/exec', body: '{}', identity }).then(() => null, (e: Error) => e);
    expect(err).toBeInstanceOf(Error);
    expect((err as { kind?: string }).kind).toBe('Unavailable');
    expect(err!.message).toMatch(/^host h1 \(https:\/\/127\.0\.0\.1:\d+\) is unreachable: /);
    expect(seen).toEqual(['GET /warm', 'POST /v1/sandboxes/a/exec']);
  });

  it('closes an idle pooled connection a second before the host would (its Keep-Alive hint)', async () => {
    ups.close();
    await ups.json(host, { method: 'GET', path: '/warm', identity });
    // The host announced `Keep-Alive: timeout=20`; node's agent honours it only when an agent timeout is set.
    const agent = (ups as unknown as { agents: Map<string, { agent: https.Agent }> }).agents.get('h1')!.agent;
    const free = Object.values(agent.freeSockets).flat();
    expect(free).toHaveLength(1);
    expect(free[0]!.timeout).toBe(19_000);
    expect(FREE_SOCKET_TIMEOUT_MS).toBeGreaterThan(19_000);
  });
});
