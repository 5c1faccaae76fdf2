/**
 * bench/fleet: the fleet's costs, each against its baseline in the same run. Prints one
 * JSON object (and writes bench/results-fleet.json):
 *
 * - `paths`: create -> first exec and exec round trip of `true`, interleaved per sample,
 *   through the gateway (client -TLS-> gateway -mTLS-> host), straight to the host's TLS
 *   door (the same TLS leg the gateway uses, so the difference is the gateway's hop), and
 *   on the host's Unix socket. Run from inside the gateway's network namespace, so no
 *   forwarder sits on any path.
 * - `host_down`: from kill -9 of one dsecd to the gateway's `host.down` event and to
 *   `GET /v1/hosts` showing it down (the lease TTL is 5 s).
 * - `placement`: 160 simulated hosts registered in a real etcd, mirrored by one gateway's
 *   host table (gateway/table.ts); p50/p99 of one decision (filter, sample K, score, as
 *   a create makes it) and decisions per second of one gateway, with the in-flight
 *   accounting of every placement.
 *
 * The fleet is scripts/fleet-demo.sh's (etcd with TLS, three hosts and a gateway, each in
 * a network namespace of its own).
 *
 * - `burst` (with `--burst N`, instead of `paths` and `host_down`): N creates, each then
 *   its first exec, `--concurrency` at a time, through the gateway against straight to the
 *   three hosts in turn, same run: ready/s and p50/p99 create -> first exec.
 *
 * Usage: node dist/bench/fleet.js [--creates 20] [--execs 300] [--decisions 20000] [--no-fleet] [--no-placement]
 *        node dist/bench/fleet.js --burst 1000 [--concurrency 32] --no-placement
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { execa } from 'execa';
import pino from 'pino';
import { DsecClient } from '../sdk/client.js';
import { lineReader } from '../test/fixtures/ndjson.js';
import { repoRoot } from '../daemon/startup/host.js';
import { openEtcd } from '../daemon/fleet/etcd.js';
import { FleetKeys, hostTag, type HostInfoRecord, type HostLiveRecord } from '../daemon/fleet/layout.js';
import { HostTable } from '../gateway/table.js';
import { choose, DEFAULT_WEIGHTS, isNoHost, type PlacementRequest } from '../gateway/placement.js';
import { percentile } from './lib.js';

const round = (x: number) => Math.round(x * 1000) / 1000;
const stats = (xs: number[]) => ({ p50: round(percentile(xs, 50)), p99: round(percentile(xs, 99)), n: xs.length });

/** A JSON call over an https agent; resolves with status and body. */
function call(agent: https.Agent, base: string, method: string, p: string, headers: Record<string, string>, body?: unknown): Promise<{ status: number; json: any }> {
  const u = new URL(base);
  const text = body === undefined ? undefined : JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = https.request({ agent, host: u.hostname, port: Number(u.port), method, path: p, headers: { ...headers, ...(text ? { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) } : {}) } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const t = Buffer.concat(chunks).toString();
        resolve({ status: res.statusCode ?? 0, json: t ? JSON.parse(t) : null });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(text);
  });
}

/** The measurements of the three paths, run inside the gateway's namespace (`--inner DIR`). */
async function inner(dir: string, creates: number, execs: number): Promise<unknown> {
  const ca = readFileSync(path.join(dir, 'ca', 'ca.crt'), 'utf8');
  const token = readFileSync(path.join(dir, 'user.token'), 'utf8').trim();
  const gwAgent = new https.Agent({ keepAlive: true, ca });
  const hostAgent = new https.Agent({ keepAlive: true, ca, cert: readFileSync(path.join(dir, 'certs', 'gw1.crt')), key: readFileSync(path.join(dir, 'certs', 'gw1.key')) });
  const unix = new DsecClient({ socketPath: path.join(dir, 'h1', 'dsecd.sock'), timeoutMs: 120_000 });
  type Path = { name: string; call: (m: string, p: string, b?: unknown) => Promise<{ status: number; json: any }> };
  const paths: Path[] = [
    { name: 'gateway', call: (m, p, b) => call(gwAgent, 'https://10.88.0.2:8443', m, p, { authorization: `Bearer ${token}` }, b) },
    { name: 'host_tls', call: (m, p, b) => call(hostAgent, 'https://10.88.0.11:8443', m, p, { 'x-dsec-tenant': 'demo', 'x-dsec-role': 'user' }, b) },
    {
      name: 'host_unix',
      call: async (m, p, b) => ({ status: 200, json: await (unix as unknown as { request(m: string, p: string, b?: unknown, o?: unknown): Promise<unknown> }).request(m, p, b, { timeoutMs: 0 }) }),
    },
  ];
  const createMs: Record<string, number[]> = { gateway: [], host_tls: [], host_unix: [] };
  const execMs: Record<string, number[]> = { gateway: [], host_tls: [], host_unix: [] };
  for (let i = 0; i < creates; i++) {
    for (const p of paths) {
      const t0 = performance.now();
      const c = await p.call('POST', '/v1/sandboxes', { image: 'busybox', labels: { bench: 'fleet' } });
      if (c.status >= 300) throw new Error(`${p.name} create: ${JSON.stringify(c.json)}`);
      const e = await p.call('POST', `/v1/sandboxes/${c.json.id}/exec`, { argv: ['true'] });
      if (e.json.exit_code !== 0) throw new Error(`${p.name} exec: ${JSON.stringify(e.json)}`);
      createMs[p.name].push(performance.now() - t0);
      await p.call('DELETE', `/v1/sandboxes/${c.json.id}?force=true`);
    }
  }
  // Tenant demo's sandbox, so every path may exec in it (the socket is an admin: it sees every tenant's).
  const made = await paths[1].call('POST', '/v1/sandboxes', { image: 'busybox', labels: { bench: 'fleet' } });
  if (made.status >= 300) throw new Error(`host_tls create: ${JSON.stringify(made.json)}`);
  const sb = made.json as { id: string };
  for (const p of paths) for (let i = 0; i < 20; i++) await p.call('POST', `/v1/sandboxes/${sb.id}/exec`, { argv: ['true'] });
  for (let i = 0; i < execs; i++) {
    for (const p of paths) {
      const t0 = performance.now();
      await p.call('POST', `/v1/sandboxes/${sb.id}/exec`, { argv: ['true'] });
      execMs[p.name].push(performance.now() - t0);
    }
  }
  await unix.deleteSandbox(sb.id, { force: true });
  const out: Record<string, unknown> = {};
  for (const n of Object.keys(createMs)) out[n] = { create_to_first_exec_ms: stats(createMs[n]), exec_ms: stats(execMs[n]) };
  const g = percentile(execMs.gateway, 50), t = percentile(execMs.host_tls, 50);
  out.gateway_adds_to_exec_p50_ms = round(g - t);
  out.gateway_adds_to_create_p50_ms = round(percentile(createMs.gateway, 50) - percentile(createMs.host_tls, 50));
  return out;
}

/**
 * A burst of `n` creates, `concurrency` at a time, each followed by its first exec
 * (`true`), through the gateway and then straight to the three hosts' TLS doors in turn
 * (no placement: create i goes to host i mod 3), in the same run; every sandbox is
 * destroyed between the two. Each create carries an Idempotency-Key, as the SDK sends.
 */
async function burst(dir: string, n: number, concurrency: number): Promise<unknown> {
  const ca = readFileSync(path.join(dir, 'ca', 'ca.crt'), 'utf8');
  const token = readFileSync(path.join(dir, 'user.token'), 'utf8').trim();
  const gwAgent = new https.Agent({ keepAlive: true, ca, maxSockets: concurrency });
  const hostAgent = new https.Agent({ keepAlive: true, ca, cert: readFileSync(path.join(dir, 'certs', 'gw1.crt')), key: readFileSync(path.join(dir, 'certs', 'gw1.key')), maxSockets: concurrency });
  const hosts = ['https://10.88.0.11:8443', 'https://10.88.0.12:8443', 'https://10.88.0.13:8443'];
  const direct = { 'x-dsec-tenant': 'demo', 'x-dsec-role': 'user' };
  // A connection reset under load (a keep-alive socket closed as it was reused) is retried
  // once: the create with its idempotency key (the same sandbox), the exec and destroy as they are.
  const again = async <T>(f: () => Promise<T>): Promise<T> => {
    try {
      return await f();
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ECONNRESET') throw e;
      return f();
    }
  };
  const run = async (name: string, target: (i: number) => { agent: https.Agent; base: string; headers: Record<string, string> }) => {
    const ms: number[] = [];
    const made: Array<{ i: number; id: string }> = [];
    let failed = 0;
    let next = 0;
    const t0 = performance.now();
    await Promise.all(Array.from({ length: concurrency }, async () => {
      while (next < n) {
        const i = next++;
        const t = target(i);
        const s = performance.now();
        const c = await again(() => call(t.agent, t.base, 'POST', '/v1/sandboxes', { ...t.headers, 'idempotency-key': `bench-${name}-${i}-${t0}` }, { image: 'busybox', labels: { bench: `burst-${name}` } }));
        if (c.status !== 201) {
          failed++;
          continue;
        }
        const e = await again(() => call(t.agent, t.base, 'POST', `/v1/sandboxes/${c.json.id}/exec`, t.headers, { argv: ['true'] }));
        if (e.json?.exit_code !== 0) {
          failed++;
          continue;
        }
        ms.push(performance.now() - s);
        made.push({ i, id: c.json.id });
      }
    }));
    const wall = (performance.now() - t0) / 1000;
    let k = 0;
    await Promise.all(Array.from({ length: concurrency }, async () => {
      while (k < made.length) {
        const m = made[k++];
        const t = target(m.i);
        await again(() => call(t.agent, t.base, 'DELETE', `/v1/sandboxes/${m.id}?force=true`, t.headers));
      }
    }));
    return { ready: ms.length, failed, wall_s: round(wall), ready_per_s: round(ms.length / wall), create_to_first_exec_ms: stats(ms) };
  };
  const gateway = await run('gateway', () => ({ agent: gwAgent, base: 'https://10.88.0.2:8443', headers: { authorization: `Bearer ${token}` } }));
  const straight = await run('direct', (i) => ({ agent: hostAgent, base: hosts[i % 3], headers: direct }));
  return { n, concurrency, hosts: 3, gateway, direct: straight };
}

/** kill -9 of h3: time to the gateway's event and to `GET /v1/hosts` saying down (through the demo's forwarder). */
async function hostDown(dir: string, host: string, caFile: string, token: string): Promise<unknown> {
  const u = new URL(host);
  const ca = readFileSync(caFile, 'utf8');
  const agent = new https.Agent({ keepAlive: true, ca });
  const events = await new Promise<import('node:http').IncomingMessage>((resolve, reject) => {
    https.get({ host: u.hostname, port: Number(u.port), path: '/v1/events?follow=true', ca, headers: { authorization: `Bearer ${token}` }, agent: false }, resolve).on('error', reject);
  });
  const pid = Number(readFileSync(path.join(dir, 'h3.pid'), 'utf8'));
  const t0 = performance.now();
  process.kill(pid, 'SIGKILL');
  let eventMs = 0;
  const ev = lineReader(events).until((o) => o.type === 'host.down' && o.host === 'h3').then(() => { eventMs = performance.now() - t0; });
  let listMs = 0;
  for (;;) {
    const r = await call(agent, host, 'GET', '/v1/hosts', { authorization: `Bearer ${token}` });
    if (r.json.hosts.find((h: { name: string }) => h.name === 'h3')?.state === 'down') {
      listMs = performance.now() - t0;
      break;
    }
    await new Promise((res) => setTimeout(res, 50));
  }
  await ev;
  events.destroy();
  return { lease_ttl_s: 5, kill_to_event_ms: Math.round(eventMs), kill_to_hosts_down_ms: Math.round(listMs), poll_ms: 50 };
}

/** A throwaway plain etcd on loopback for the placement part. */
async function plainEtcd(dir: string): Promise<{ url: string; proc: ChildProcess }> {
  const free = () => new Promise<number>((r) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => r(p));
    });
  });
  const [cp, pp] = [await free(), await free()];
  const url = `http://127.0.0.1:${cp}`;
  const proc = spawn('etcd', ['--name', 'b', '--data-dir', path.join(dir, 'data'), '--listen-client-urls', url, '--advertise-client-urls', url,
    '--listen-peer-urls', `http://127.0.0.1:${pp}`, '--initial-advertise-peer-urls', `http://127.0.0.1:${pp}`, '--initial-cluster', `b=http://127.0.0.1:${pp}`,
    '--logger', 'zap', '--log-outputs', 'stderr', '--log-level', 'error'], { stdio: 'ignore' });
  for (let i = 0; i < 300; i++) {
    const ok = await new Promise<boolean>((r) => {
      const c = net.connect(cp, '127.0.0.1', () => { c.destroy(); r(true); });
      c.on('error', () => r(false));
    });
    if (ok) return { url, proc };
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('etcd did not start');
}

/** 160 simulated hosts in etcd, one gateway's table over them, decisions timed. */
async function placement(decisions: number): Promise<unknown> {
  const dir = mkdtempSync('/tmp/dsec-bench-placement-');
  const { url, proc } = await plainEtcd(dir);
  const etcd = openEtcd({ endpoints: [url] });
  const keys = new FleetKeys('/bench');
  try {
    const lease = etcd.lease(60);
    const leaseId = await lease.grant();
    for (let i = 0; i < 160; i++) {
      const name = `sim${String(i).padStart(3, '0')}`;
      const id = (0x1000000000000000n + BigInt(i)).toString(16);
      const info: HostInfoRecord = {
        id, name, tag: hostTag(id), advertise: `https://10.0.${i >> 8}.${i & 255}:8443`, labels: { zone: `z${i % 4}` }, backends: ['container', 'fncall'],
        capacity: { cores: 192, memory_bytes: 1.5 * 2 ** 40, disk_bytes: 2 ** 42 }, admission: { max_sandboxes: 4096, cpus: 192 * 50, memory_bytes: 1.5 * 2 ** 40 * 10, disk_bytes: null },
        defaults: { cpus: 1, memory_bytes: 2 ** 29 }, version: 'bench', started_at: Date.now(),
      };
      const live: HostLiveRecord = {
        id, seq: 0, at: Date.now(), sandboxes: { running: 1000 + (i * 7) % 1000 }, admitted: { count: 1000 + (i * 7) % 1000, cpus: 1500, memory_bytes: 2 ** 40, disk_bytes: 0 },
        cpu: { load1: 40, busy: (i % 10) / 10 }, memory_available_bytes: 2 ** 39, warm_pools: [{ image: 'busybox:latest', network: 'none', ready: i % 3, size: 4 }], jobs: { [`j${i % 20}`]: 10 }, untagged: 0,
      };
      await etcd.put(keys.hostId(name)).value(id);
      await etcd.put(keys.hostInfo(name)).value(JSON.stringify(info));
      await etcd.put(keys.hostLive(name)).value(JSON.stringify(live)).lease(leaseId);
      await etcd.put(keys.hostImages(name)).value(JSON.stringify({ id, images: [{ ref: 'busybox:latest', digest: null }, ...(i % 2 ? [{ ref: 'py:3.11', digest: null }] : [])] })).lease(leaseId);
    }
    const table = new HostTable(etcd, keys, pino({ level: 'silent' }));
    await table.start();
    const up = table.list().filter((h) => h.state === 'up').length;
    const policy = { k: 3, job: 'spread' as const, weights: DEFAULT_WEIGHTS, random: Math.random };
    const req = (i: number): PlacementRequest => ({ backend: 'container', image: i % 2 ? 'py:3.11' : 'busybox:latest', network: 'none', cpus: 1, memoryBytes: 2 ** 29, job: `j${i % 50}`, refused: new Set() });
    // One decision as a create makes it: the table's view of every host, then choose.
    const one: number[] = [];
    for (let i = 0; i < decisions; i++) {
      const t0 = performance.now();
      const h = choose(table.placementHosts(), req(i), policy);
      one.push((performance.now() - t0) * 1000);
      if (isNoHost(h)) throw new Error('no host');
    }
    // Throughput: decisions with their reservations (reserve, then settle as created), for 3 s.
    let n = 0;
    const t0 = performance.now();
    while (performance.now() - t0 < 3000) {
      const r = req(n);
      const h = choose(table.placementHosts(), r, policy);
      if (isNoHost(h)) throw new Error('no host');
      const res = { count: 1, cpus: 1, memoryBytes: 2 ** 29, job: r.job };
      table.reserve(h.name, res);
      table.settle(h.name, res, true);
      n++;
    }
    const perS = n / ((performance.now() - t0) / 1000);
    await table.close();
    await lease.revoke();
    return { hosts: 160, up, k: 3, decision_us: stats(one), placements_per_s: Math.round(perS), target_per_s: 5000 };
  } finally {
    etcd.close();
    proc.kill('SIGTERM');
    await new Promise((r) => proc.once('exit', r));
    rmSync(dir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const program = new Command('bench-fleet')
    .option('--creates <n>', 'create -> first exec samples per path', (v) => Number(v), 20)
    .option('--execs <n>', 'exec round trips per path', (v) => Number(v), 300)
    .option('--decisions <n>', 'timed placement decisions', (v) => Number(v), 20000)
    .option('--no-fleet', 'skip the parts that need a fleet')
    .option('--no-placement', 'skip the placement part')
    .option('--burst <n>', 'instead of the paths: a burst of N creates (each then its first exec) through the gateway and straight to the hosts', (v) => Number(v), 0)
    .option('--concurrency <n>', 'creates in flight in the burst', (v) => Number(v), 32)
    .option('--inner <dir>', '(internal) run the path measurements of the fleet in DIR')
    .parse(process.argv);
  const o = program.opts<{ creates: number; execs: number; decisions: number; fleet: boolean; placement: boolean; inner?: string; burst: number; concurrency: number }>();
  if (o.inner) {
    process.stdout.write(JSON.stringify(o.burst ? await burst(o.inner, o.burst, o.concurrency) : await inner(o.inner, o.creates, o.execs)));
    return;
  }
  const repo = repoRoot();
  const result: Record<string, unknown> = { time: new Date().toISOString() };
  if (o.fleet) {
    const dir = mkdtempSync('/tmp/dsec-bench-fleet-');
    rmSync(dir, { recursive: true });
    try {
      const up = await execa('bash', [path.join(repo, 'scripts/fleet-demo.sh'), 'up', dir], { reject: false });
      if (up.exitCode !== 0) throw new Error(`fleet-demo.sh up: ${up.stderr}`);
      const env = Object.fromEntries(String(up.stdout).replace(/^export /, '').trim().split(' ').map((kv) => kv.split('=')));
      const ns = readFileSync(path.join(dir, 'netns-prefix'), 'utf8').trim();
      // Wait until the gateway sees every host up.
      for (;;) {
        const r = await call(new https.Agent({ ca: readFileSync(env.DSEC_CA, 'utf8') }), env.DSEC_HOST, 'GET', '/v1/hosts', { authorization: `Bearer ${env.DSEC_TOKEN}` });
        if (r.json.hosts.length === 3 && r.json.hosts.every((h: { state: string }) => h.state === 'up')) break;
        await new Promise((r2) => setTimeout(r2, 200));
      }
      const run = await execa('nsenter', [`--net=/run/netns/${ns}-gw1`, process.execPath, path.join(repo, 'dist/bench/fleet.js'), '--inner', dir, '--creates', String(o.creates), '--execs', String(o.execs),
        '--burst', String(o.burst), '--concurrency', String(o.concurrency)], { reject: false });
      if (run.exitCode !== 0) throw new Error(`${o.burst ? 'burst' : 'paths'}: ${run.stderr}`);
      if (o.burst) result.burst = JSON.parse(String(run.stdout));
      else {
        result.paths = JSON.parse(String(run.stdout));
        result.host_down = await hostDown(dir, env.DSEC_HOST, env.DSEC_CA, readFileSync(path.join(dir, 'admin.token'), 'utf8').trim());
      }
    } finally {
      await execa('bash', [path.join(repo, 'scripts/fleet-demo.sh'), 'down', dir], { reject: false });
    }
  }
  if (o.placement) result.placement = await placement(o.decisions);
  const text = JSON.stringify(result, null, 2);
  process.stdout.write(`${text}\n`);
  writeFileSync(path.join(repo, o.burst ? 'bench/results-fleet-burst.json' : 'bench/results-fleet.json'), `${text}\n`);
}

await main();
