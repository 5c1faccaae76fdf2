/**
 * Fan-out: one request sent to every host and the answers merged. Every merged answer
 * carries `hosts`, one entry per host of the table: `ok` (it answered), `down` (its lease
 * lapsed: not asked) or `error` (it failed mid-way, with the error), so a host that
 * fails is reported, never hidden.
 *
 * - lists (`GET /v1/sandboxes`, snapshots, images, ...): the array of each answer,
 *   concatenated, every element naming its `host`; a down host's sandboxes are the last
 *   rows the gateway saw, reading `unreachable`;
 * - bulk (`POST /v1/sandboxes/bulk`): every host's per-sandbox results, concatenated;
 * - apply (leases, image changes, reloads): every up host does it; the answer is the
 *   first host's body plus `hosts`;
 * - events: every host's stream merged line by line, each line naming its host, plus the
 *   gateway's own `host.up` / `host.down` lines; backpressure from the client pauses
 *   every host's stream;
 * - stats and metrics: merged (see {@link mergeStats}, {@link mergeMetrics}).
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { IncomingMessage } from 'node:http';
import { addressOf, identityOf, type GatewayContext } from './context.js';
import { hostError, readBody, UNREACHABLE, type Router } from './routing.js';
import type { HostEntry } from './table.js';
import { passHeaders } from './upstream.js';

/** One host's part in a fan-out answer. */
export interface HostOutcome {
  name: string;
  outcome: 'ok' | 'down' | 'error';
  error?: { code: string; message: string };
}

/** The answer of every up host to one JSON request, and each host's outcome (down hosts not asked). */
export async function askAll(ctx: GatewayContext, req: FastifyRequest, opts: { method?: string; path?: string; body?: Buffer } = {}): Promise<{ answers: Array<{ host: HostEntry; body: Record<string, unknown> }>; hosts: HostOutcome[] }> {
  const hosts = ctx.table.list().filter((h) => h.info);
  const identity = identityOf(req);
  const outcomes: HostOutcome[] = [];
  const answers: Array<{ host: HostEntry; body: Record<string, unknown> }> = [];
  await Promise.all(hosts.map(async (h) => {
    if (h.state !== 'up') {
      outcomes.push({ name: h.name, outcome: 'down', error: { code: 'Unavailable', message: `host ${h.name} is down (its lease lapsed ${new Date(h.since).toISOString()})` } });
      return;
    }
    try {
      const body = opts.body;
      const r = await ctx.upstreams.json<Record<string, unknown>>(addressOf(h), {
        method: opts.method ?? req.method, path: opts.path ?? req.url, identity,
        headers: body ? { 'content-type': 'application/json', 'content-length': String(body.length) } : {}, body,
      });
      if (r.status >= 400) {
        const e = hostError(h.name, r.status, r.body);
        outcomes.push({ name: h.name, outcome: 'error', error: { code: e.kind, message: e.message } });
        return;
      }
      answers.push({ host: h, body: r.body ?? {} });
      outcomes.push({ name: h.name, outcome: 'ok' });
    } catch (e) {
      outcomes.push({ name: h.name, outcome: 'error', error: { code: (e as { kind?: string }).kind ?? 'Unavailable', message: (e as Error).message } });
    }
  }));
  outcomes.sort((a, b) => a.name.localeCompare(b.name));
  answers.sort((a, b) => a.host.name.localeCompare(b.host.name));
  return { answers, hosts: outcomes };
}

/** The one array field of a list answer (`{ sandboxes: [...] }`), or null. */
function arrayField(body: Record<string, unknown>): string | null {
  const k = Object.keys(body).filter((x) => Array.isArray(body[x]));
  return k.length === 1 ? k[0] : null;
}

/**
 * A merged list: the array of every host's answer concatenated, each element naming its
 * host. For `GET /v1/sandboxes` the down hosts' last rows are added as `unreachable`
 * (filtered by the request's `selector` and `state` as a host would), and the rows seen
 * become the last rows of their hosts.
 */
export async function mergedList(ctx: GatewayContext, router: Router, req: FastifyRequest): Promise<Record<string, unknown>> {
  const { answers, hosts } = await askAll(ctx, req);
  let field: string | null = null;
  const items: Array<Record<string, unknown>> = [];
  for (const a of answers) {
    const f = arrayField(a.body);
    if (!f) continue;
    field ??= f;
    const rows = (a.body[f] as Array<Record<string, unknown>>).map((x) => ({ ...x, host: a.host.name }));
    items.push(...rows);
  }
  const url = req.url.split('?')[0];
  if (url === '/v1/sandboxes') {
    field = 'sandboxes';
    const q = new URLSearchParams(req.url.split('?')[1] ?? '');
    const unfiltered = !q.get('selector') && !q.get('state');
    for (const a of answers) {
      const rows = (a.body.sandboxes as Array<Record<string, unknown>> | undefined) ?? [];
      if (unfiltered) router.replaceRows(a.host.name, rows);
      else for (const r of rows) router.keepRow(a.host.name, r);
      for (const r of rows) if (typeof r.id === 'string') router.remember(r.id, a.host.name);
    }
    const sel = parseSelector(q.get('selector'));
    const state = q.get('state');
    for (const o of hosts) {
      if (o.outcome !== 'down' || (state && state !== UNREACHABLE)) continue;
      for (const row of router.lastRows.get(o.name)?.values() ?? []) {
        if (sel((row.labels ?? {}) as Record<string, string>)) items.push({ ...row, state: UNREACHABLE, host: o.name });
      }
    }
    items.sort((a, b) => Number(a.created_at ?? 0) - Number(b.created_at ?? 0) || String(a.id).localeCompare(String(b.id)));
  }
  return { [field ?? 'items']: items, hosts };
}

/** A `k=v,k2=v2` selector as a predicate on labels (every pair must match); everything for none. */
function parseSelector(sel: string | null): (l: Record<string, string>) => boolean {
  if (!sel) return () => true;
  const pairs = sel.split(',').map((p) => p.split('='));
  return (l) => pairs.every(([k, v]) => l[k] === v);
}

/** `POST /v1/sandboxes/bulk` on every host: the results concatenated (each naming its host), and each host's outcome. */
export async function bulk(ctx: GatewayContext, router: Router, req: FastifyRequest): Promise<Record<string, unknown>> {
  const body = await readBody(req);
  const { answers, hosts } = await askAll(ctx, req, { body });
  const results: Array<Record<string, unknown>> = [];
  const freed: string[] = [];
  for (const a of answers) {
    for (const r of (a.body.results as Array<Record<string, unknown>> | undefined) ?? []) {
      results.push({ ...r, host: a.host.name });
      if (r.ok && r.state === 'destroyed' && typeof r.id === 'string') {
        router.forget(r.id, a.host.name);
        freed.push(r.id);
      }
    }
  }
  // Their shares of the caller's fleet-wide quota (gateway/quotas.ts).
  for (const id of freed) await ctx.quotas.destroyed(req.principal.tenant, id);
  return { results, hosts };
}

/** A request every up host carries out: the first host's answer, plus every host's outcome. @throws the first error when no host succeeded. */
export async function applyAll(ctx: GatewayContext, req: FastifyRequest): Promise<Record<string, unknown>> {
  const body = await readBody(req);
  const { answers, hosts } = await askAll(ctx, req, { body: body.length ? body : undefined });
  if (!answers.length) {
    const e = hosts.find((h) => h.outcome === 'error')?.error ?? hosts[0]?.error ?? { code: 'Unavailable', message: 'no host is up' };
    const { DsecError } = await import('../daemon/errors.js');
    throw new DsecError(e.code as never, e.message);
  }
  return { ...answers[0].body, hosts };
}

/**
 * `GET /v1/stats` of the fleet: every host's sandboxes (naming their host), the host
 * section summed (cores, memory bytes and load averages added), and each host's outcome
 * with, for a host that answered, its sandbox count and its own host section (`dsec top`
 * drills into one host with it).
 */
export async function mergeStats(ctx: GatewayContext, req: FastifyRequest): Promise<Record<string, unknown>> {
  const { answers, hosts } = await askAll(ctx, req);
  const host = { cores: 0, memory_bytes: 0, memory_available_bytes: 0, load_avg: [0, 0, 0] as number[] };
  const sandboxes: Array<Record<string, unknown>> = [];
  for (const a of answers) {
    const h = a.body.host as { cores: number; memory_bytes: number; memory_available_bytes: number; load_avg: number[] } | undefined;
    if (h) {
      host.cores += h.cores;
      host.memory_bytes += h.memory_bytes;
      host.memory_available_bytes += h.memory_available_bytes;
      host.load_avg = host.load_avg.map((v, i) => v + (h.load_avg[i] ?? 0));
    }
    for (const s of (a.body.sandboxes as Array<Record<string, unknown>> | undefined) ?? []) sandboxes.push({ ...s, host: a.host.name });
  }
  const own = new Map(answers.map((a) => [a.host.name, a.body]));
  const detailed = hosts.map((o) => {
    const body = own.get(o.name);
    return body ? { ...o, sandboxes: ((body.sandboxes as unknown[] | undefined) ?? []).length, host: body.host } : { ...o, sandboxes: 0 };
  });
  return { time: Date.now(), host, sandboxes, hosts: detailed };
}

/** The gateway's own metrics, then every up host's with a `host` label on each sample (HELP/TYPE lines once). */
export async function mergeMetrics(ctx: GatewayContext, req: FastifyRequest): Promise<string> {
  let text = await ctx.metrics.registry.metrics();
  const seen = new Set<string>();
  await Promise.all(ctx.table.list().filter((h) => h.state === 'up').map(async (h) => {
    try {
      const res = await ctx.upstreams.request(addressOf(h), { method: 'GET', path: '/metrics', identity: identityOf(req) });
      const chunks: Buffer[] = [];
      for await (const c of res) chunks.push(c as Buffer);
      if (res.statusCode !== 200) return;
      const out: string[] = [];
      for (const line of Buffer.concat(chunks).toString('utf8').split('\n')) {
        if (!line) continue;
        if (line.startsWith('#')) {
          if (!seen.has(line)) out.push(line);
          seen.add(line);
          continue;
        }
        const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? (.*)$/.exec(line);
        if (!m) continue;
        const labels = m[3] ? `${m[3]},host="${h.name}"` : `host="${h.name}"`;
        out.push(`${m[1]}{${labels}} ${m[4]}`);
      }
      text += `${out.join('\n')}\n`;
    } catch { /* a host that fails is missing from this scrape; dsec_gateway_hosts says it is down */ }
  }));
  return text;
}

/**
 * `GET /v1/events` of the fleet: every up host's NDJSON stream (the request's query
 * passed on), each line naming its host, merged as lines arrive; with `follow`, the
 * gateway's `host.down`/`host.up` lines join, and a host that comes back is followed
 * again. Backpressure: while the client's socket is full, every host's stream is paused.
 */
export function mergedEvents(ctx: GatewayContext, req: FastifyRequest, reply: FastifyReply): FastifyReply {
  const q = new URLSearchParams(req.url.split('?')[1] ?? '');
  const follow = q.get('follow') === 'true' || q.get('follow') === '1';
  const identity = identityOf(req);
  reply.hijack();
  const out = reply.raw;
  out.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' });
  const streams = new Map<string, IncomingMessage>();
  let closed = false;
  let pending = 0;
  const write = (line: string) => {
    if (closed) return;
    if (!out.write(`${line}\n`)) {
      for (const s of streams.values()) s.pause();
      out.once('drain', () => {
        for (const s of streams.values()) s.resume();
      });
    }
  };
  const open = (h: HostEntry, path: string) => {
    pending += 1;
    ctx.upstreams.request(addressOf(h), { method: 'GET', path, headers: passHeaders(req.headers), identity }).then((res) => {
      if (closed) {
        res.destroy();
        return;
      }
      if (res.statusCode !== 200) {
        write(JSON.stringify({ time: Date.now(), type: 'host.error', sandbox_id: null, host: h.name, message: `host ${h.name} answered ${res.statusCode}` }));
        res.resume();
        return;
      }
      streams.set(h.name, res);
      let buf = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => {
        buf += c;
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          if (!line.trim()) continue;
          try {
            write(JSON.stringify({ ...JSON.parse(line), host: h.name }));
          } catch { /* a malformed line of a host is dropped */ }
        }
      });
      res.on('close', () => {
        if (streams.get(h.name) === res) streams.delete(h.name);
        finish();
      });
    }, (e: Error) => {
      write(JSON.stringify({ time: Date.now(), type: 'host.error', sandbox_id: null, host: h.name, message: e.message }));
    }).finally(() => {
      pending -= 1;
      finish();
    });
  };
  const finish = () => {
    if (!follow && pending === 0 && streams.size === 0 && !closed) {
      closed = true;
      out.end();
    }
  };
  for (const h of ctx.table.list()) if (h.state === 'up') open(h, req.url);
  if (!follow) {
    finish();
    return reply;
  }
  const onDown = (name: string) => {
    const h = ctx.table.hosts.get(name);
    write(JSON.stringify({ time: Date.now(), type: 'host.down', sandbox_id: null, host: name, message: `host ${name} is down: its lease lapsed` }));
    streams.get(name)?.destroy();
    void h;
  };
  const onUp = (name: string) => {
    const h = ctx.table.hosts.get(name);
    write(JSON.stringify({ time: Date.now(), type: 'host.up', sandbox_id: null, host: name, message: `host ${name} is up` }));
    if (h && !streams.has(name)) {
      q.set('since', String(Date.now()));
      open(h, `/v1/events?${q.toString()}`);
    }
  };
  ctx.table.on('down', onDown);
  ctx.table.on('up', onUp);
  const ka = setInterval(() => write(''), 15_000);
  out.on('close', () => {
    closed = true;
    clearInterval(ka);
    ctx.table.off('down', onDown);
    ctx.table.off('up', onUp);
    for (const s of streams.values()) s.destroy();
  });
  return reply;
}
