/**
 * `node dist/bench/e2b.js` (also `npm run bench -- --only e2b`): the E2B front against
 * dsec's own API, same dsecd, same sandbox, same run, both through the TCP door (HTTPS,
 * TLS 1.3, a token):
 *   - run: the unmodified `e2b` SDK's `commands.run('true')` (a Connect server stream:
 *     start, output, end events; the SDKs run `/bin/bash -l -c true`), round trip p50/p99,
 *     against POST /v1/sandboxes/{id}/exec of `true`, and of `/bin/bash -l -c true` (the
 *     same work as E2B's: what is left is the protocol);
 *   - create: `Sandbox.create('base')` (the e2b-base image) against POST /v1/sandboxes
 *     of the same image, p50/p99 (each sandbox killed after it is timed).
 * The SDK runs as its own process (test/fixtures/e2b-client.mjs: NODE_EXTRA_CA_CERTS is
 * read at start) and times its own calls; the /v1 calls go over one kept-alive HTTPS
 * connection from this process.
 *
 * Usage: node dist/bench/e2b.js [--n 200] [--create-n 20] [--quick]
 * Prints JSON on stdout (and writes bench/results-e2b.json unless --quick).
 */
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import { readFileSync, writeFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { execa } from 'execa';
import { repoRoot } from '../daemon/startup/host.js';
import { percentile, tempDaemon, type TempDaemon } from './lib.js';
import { freePort } from '../test/fixtures/ports.js';

/** Uid pool of this bench's dsecd: 2^25 ids from 2^29 + 2^28 + 2^26, clear of the test slots and of the other benches' pools. */
const POOL = { base: 2 ** 29 + 2 ** 28 + 2 ** 26, size: 2 ** 25 };

const r2 = (x: number) => Math.round(x * 100) / 100;
const pct = (xs: number[]) => ({ p50: r2(percentile(xs, 50)), p99: r2(percentile(xs, 99)), n: xs.length });


/** dsec's own API over the TCP door: JSON requests with a token on one kept-alive connection. */
function doorClient(port: number, ca: string, token: string) {
  const agent = new https.Agent({ keepAlive: true, maxSockets: 1, ca });
  return (method: string, p: string, body?: unknown) => new Promise<{ status: number; json: any }>((resolve, reject) => {
    const data = body === undefined ? undefined : JSON.stringify(body);
    const req = https.request({ host: '127.0.0.1', port, path: p, method, agent, headers: { authorization: `Bearer ${token}`, ...(data ? { 'content-type': 'application/json' } : {}) } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, json: text ? JSON.parse(text) : null }));
    });
    req.on('error', reject);
    req.end(data);
  });
}

/** Runs a scenario of the E2B client program against the door; resolves with what it printed. */
async function sdk(url: string, ca: string, key: string, scenario: string, args: unknown): Promise<any> {
  const r = await execa(process.execPath, [path.join(repoRoot(), 'test/fixtures/e2b-client.mjs'), 'e2b', scenario, JSON.stringify(args)], {
    cwd: repoRoot(), env: { E2B_API_URL: url, E2B_SANDBOX_URL: url, E2B_API_KEY: key, NODE_EXTRA_CA_CERTS: ca },
  });
  const out = JSON.parse(String(r.stdout).trim().split('\n').pop()!);
  if (!out.ok) throw new Error(`e2b ${scenario}: ${out.error.name}: ${out.error.message}`);
  return out;
}

/** The measurement (see the module comment). */
export async function runE2b(o: { n: number; createN: number; warmup: number }): Promise<Record<string, unknown>> {
  const port = await freePort();
  const d: TempDaemon = await tempDaemon('dsec-bench-e2b-', POOL, `[remote]\nlisten = "127.0.0.1:${port}"\n`);
  try {
    // The TCP door listens after the socket answers.
    while (!(await new Promise<boolean>((resolve) => {
      const c = net.connect(port, '127.0.0.1', () => { c.destroy(); resolve(true); });
      c.once('error', () => resolve(false));
    }))) await new Promise((r) => setTimeout(r, 50));
    const ca = path.join(d.root, 'tls', 'ca.crt');
    const caPem = readFileSync(ca, 'utf8');
    const url = `https://127.0.0.1:${port}`;
    const tok = await (d.client as unknown as { request<T>(m: string, p: string, b?: unknown): Promise<T> }).request<{ token: string }>('POST', '/v1/tokens', { tenant: 'system', role: 'admin' });
    const v1 = doorClient(port, caPem, tok.token);
    const out: Record<string, unknown> = { n: o.n, create_n: o.createN };

    // One sandbox of the base template for both protocols (made through /v1, it has no E2B tenant: an admin token reaches it both ways).
    const sb = (await v1('POST', '/v1/sandboxes', { image: 'e2b-base', ttl_s: 3600 })).json as { id: string };
    const timeExec = async (argv: string[]) => {
      const ms: number[] = [];
      for (let i = 0; i < o.warmup + o.n; i++) {
        const t = performance.now();
        const r = await v1('POST', `/v1/sandboxes/${sb.id}/exec`, { argv });
        if (r.status !== 200 || r.json.exit_code !== 0) throw new Error(`exec ${argv.join(' ')}: ${r.status} ${JSON.stringify(r.json)}`);
        if (i >= o.warmup) ms.push(performance.now() - t);
      }
      return pct(ms);
    };
    out.v1_exec_true_ms = await timeExec(['true']);
    out.v1_exec_bash_true_ms = await timeExec(['/bin/bash', '-l', '-c', 'true']);
    out.e2b_run_true_ms = pct((await sdk(url, ca, tok.token, 'benchRun', { sandboxId: sb.id, n: o.n, warmup: o.warmup })).ms);
    await v1('DELETE', `/v1/sandboxes/${sb.id}?force=true`);

    const creates: number[] = [];
    for (let i = 0; i < o.createN + 1; i++) {
      const t = performance.now();
      const r = await v1('POST', '/v1/sandboxes', { image: 'e2b-base', ttl_s: 300 });
      const dt = performance.now() - t;
      if (r.status !== 201) throw new Error(`create: ${r.status} ${JSON.stringify(r.json)}`);
      if (i > 0) creates.push(dt);
      await v1('DELETE', `/v1/sandboxes/${r.json.id}?force=true`);
    }
    out.v1_create_ms = pct(creates);
    out.e2b_create_ms = pct((await sdk(url, ca, tok.token, 'benchCreate', { n: o.createN + 1 })).ms.slice(1));
    process.stderr.write(`e2b: ${JSON.stringify(out)}\n`);
    return out;
  } finally {
    await d.stop();
  }
}

async function main(): Promise<void> {
  const o = new Command('bench-e2b')
    .option('--n <n>', 'sequential runs of true per protocol', '200')
    .option('--create-n <n>', 'sequential creates per protocol', '20')
    .option('--quick', 'small counts, not written to bench/results-e2b.json', false)
    .parse(process.argv)
    .opts<{ n: string; createN: string; quick: boolean }>();
  const res = {
    bench: 'e2b', date: new Date().toISOString(),
    ...(await runE2b({ n: o.quick ? 20 : Number(o.n), createN: o.quick ? 3 : Number(o.createN), warmup: o.quick ? 3 : 20 })),
  };
  const text = JSON.stringify(res, null, 2);
  if (!o.quick) writeFileSync(path.join(repoRoot(), 'bench/results-e2b.json'), text + '\n');
  process.stdout.write(text + '\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((e) => {
    process.stderr.write(`bench failed: ${(e as Error).stack ?? e}\n`);
    process.exit(1);
  });
}
