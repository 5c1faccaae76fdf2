/**
 * Prometheus metrics of one dsecd (prom-client), served as GET /metrics on the API
 * socket and, when `[metrics] address` is set, on a TCP address that serves nothing else.
 *
 * Series:
 * - `dsec_sandboxes{state}`: sandboxes by state (read from the store at scrape time);
 * - `dsec_sandbox_create_seconds`: create latency, request to acknowledged running;
 * - `dsec_exec_seconds`: round trip of the run-to-completion exec API;
 * - `dsec_api_errors_total{code}`: API errors by kind;
 * - `dsec_exec_sessions{state}`: exec sessions held (running / exited, kept for re-attach);
 * - `dsec_warm_pool_shells{image,network,state}`: warm-pool shells ready / filling, and
 *   `dsec_warm_pool_claims_total` / `dsec_warm_pool_misses_total{image,network}` (read at scrape time);
 * - `dsec_file_transfer_buffered_bytes`: bytes of file transfers (GET/PUT .../files) held
 *   in dsecd's buffers now, and `dsec_file_transfer_buffered_bytes_peak`, the most one
 *   transfer has held at once since dsecd started (bounded by design:
 *   daemon/api/transfer.ts);
 * - `dsec_auth_failures_total{reason}`: requests on the TCP door refused before a role was
 *   known: `missing`, `malformed`, `unknown`, `revoked`, `expired` token (one 401 answer
 *   for all of them: the reason is only here and in dsecd's log), `rate_limited` (the
 *   source address failed too often), `client_cert` (a client certificate of a role
 *   the port does not accept);
 * - `dsec_auth_denied_total{role}`: authenticated requests refused because the token's
 *   role may not make them (403);
 * - the default process metrics (RSS, CPU, event loop lag, ...), prefixed `dsec_`.
 */
import http from 'node:http';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { invalidArgument } from './errors.js';

/** Latency buckets in seconds: 1 ms .. 10 s, dense where the targets are (2 ms exec, 30 ms create). */
const BUCKETS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10];

/** The metric objects; one per daemon. */
export class Metrics {
  readonly registry = new Registry();
  readonly createSeconds = new Histogram({ name: 'dsec_sandbox_create_seconds', help: 'Sandbox create latency, request to acknowledged running.', labelNames: ['backend'], buckets: BUCKETS, registers: [this.registry] });
  readonly execSeconds = new Histogram({ name: 'dsec_exec_seconds', help: 'Round trip of POST /v1/sandboxes/{id}/exec.', buckets: BUCKETS, registers: [this.registry] });
  readonly errors = new Counter({ name: 'dsec_api_errors_total', help: 'API errors by kind.', labelNames: ['code'], registers: [this.registry] });
  readonly authFailures = new Counter({ name: 'dsec_auth_failures_total', help: 'Requests on the TCP door refused before a role was known, by reason.', labelNames: ['reason'], registers: [this.registry] });
  readonly authDenied = new Counter({ name: 'dsec_auth_denied_total', help: 'Authenticated requests on the TCP door refused because the role may not make them.', labelNames: ['role'], registers: [this.registry] });
  /**
   * @param sandboxesByState called at scrape time: count of sandboxes per state.
   * @param execSessions called at scrape time: exec sessions per state.
   * @param warmPools called at scrape time: the warm pools' counters (daemon/sandbox/warm-pool.ts WarmPoolStats).
   * @param transfers what file transfers hold in dsecd's buffers now and at most, bytes
   *   (daemon/api/transfer.ts TransferMeter, which the files routes account into).
   */
  constructor(sandboxesByState: () => Record<string, number>, execSessions: () => Record<string, number>,
    warmPools: () => Array<{ image: string; network: string; ready: number; filling: number; claimed: number; misses: number }> = () => [],
    transfers: { readonly bufferedBytes: number; readonly peakBytes: number } = { bufferedBytes: 0, peakBytes: 0 }) {
    const states = ['creating', 'running', 'paused', 'stopped', 'failed'];
    new Gauge({
      name: 'dsec_sandboxes', help: 'Sandboxes by state.', labelNames: ['state'], registers: [this.registry],
      collect() {
        const c = sandboxesByState();
        for (const s of states) this.set({ state: s }, c[s] ?? 0);
      },
    });
    new Gauge({
      name: 'dsec_exec_sessions', help: 'Exec sessions held, by state.', labelNames: ['state'], registers: [this.registry],
      collect() {
        const c = execSessions();
        for (const s of ['running', 'exited']) this.set({ state: s }, c[s] ?? 0);
      },
    });
    new Gauge({
      name: 'dsec_warm_pool_shells', help: 'Warm-pool shells by pool and state (ready, filling).', labelNames: ['image', 'network', 'state'], registers: [this.registry],
      collect() {
        for (const p of warmPools()) {
          this.set({ image: p.image, network: p.network, state: 'ready' }, p.ready);
          this.set({ image: p.image, network: p.network, state: 'filling' }, p.filling);
        }
      },
    });
    // Counters kept by the pools; exposed as gauges read at scrape time (monotonic while dsecd runs).
    new Gauge({
      name: 'dsec_warm_pool_claims_total', help: 'Creates answered from a warm pool since dsecd started.', labelNames: ['image', 'network'], registers: [this.registry],
      collect() {
        for (const p of warmPools()) this.set({ image: p.image, network: p.network }, p.claimed);
      },
    });
    new Gauge({
      name: 'dsec_warm_pool_misses_total', help: 'Creates of a pooled image and network mode that found no ready shell since dsecd started.', labelNames: ['image', 'network'], registers: [this.registry],
      collect() {
        for (const p of warmPools()) this.set({ image: p.image, network: p.network }, p.misses);
      },
    });
    new Gauge({
      name: 'dsec_file_transfer_buffered_bytes', help: 'Bytes of file transfers held in dsecd\'s buffers now.', registers: [this.registry],
      collect() {
        this.set(transfers.bufferedBytes);
      },
    });
    new Gauge({
      name: 'dsec_file_transfer_buffered_bytes_peak', help: 'The most bytes one file transfer has held in dsecd\'s buffers at once since dsecd started.', registers: [this.registry],
      collect() {
        this.set(transfers.peakBytes);
      },
    });
    collectDefaultMetrics({ register: this.registry, prefix: 'dsec_' });
  }

  /** The exposition text and its content type. */
  async render(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }

  /**
   * Serves GET /metrics (only) on `address` (`host:port`, e.g. `127.0.0.1:9464`).
   * @throws DsecError InvalidArgument for a malformed address.
   */
  async listen(address: string): Promise<http.Server> {
    const m = /^(.*):(\d+)$/.exec(address);
    if (!m) throw invalidArgument(`metrics address ${address}: want host:port`);
    const server = http.createServer((req, res) => {
      if (req.method !== 'GET' || req.url?.split('?')[0] !== '/metrics') {
        res.writeHead(404, { 'content-type': 'text/plain' }).end('only GET /metrics is served here\n');
        return;
      }
      this.render().then(({ contentType, body }) => res.writeHead(200, { 'content-type': contentType }).end(body), () => res.writeHead(500).end());
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(Number(m[2]), m[1].replace(/^\[|\]$/g, ''), () => resolve());
    });
    return server;
  }
}
