/** Resource usage (GET /v1/stats, GET /v1/sandboxes/{id}/stats) and logs (GET /v1/sandboxes/{id}/logs). */
import type { FastifyInstance } from 'fastify';
import { open, stat } from 'node:fs/promises';
import os from 'node:os';
import type { z } from 'zod';
import { LogsQuery, SandboxStatsView, StatsResponse } from '../schema.js';
import { parseWith } from '../parse.js';
import { scopeOf } from '../scope.js';
import type { DiskUsage } from '../../storage/writable-layers.js';
import { route } from './table.js';
import type { SandboxRepo } from '../../db/sandboxes.js';
import type { SandboxNetworking } from '../../net/network.js';
import type { DiskQuotaWatch } from '../../sandbox/disk-quota.js';
import type { SandboxLifecycle } from '../../sandbox/lifecycle.js';
import type { SandboxRecord } from '../../model/sandbox.js';

const statsRoute = route({ method: 'GET', url: '/v1/stats', summary: "Resource usage of the caller's tenant's sandboxes (every tenant's for an admin) and of the host (for dsec top).", status: 200, response: StatsResponse, errors: [] });
const oneRoute = route({ method: 'GET', url: '/v1/sandboxes/:id/stats', summary: 'Resource usage of one sandbox.', status: 200, response: SandboxStatsView, errors: ['NotFound'] });
const logsRoute = route({
  method: 'GET', url: '/v1/sandboxes/:id/logs', summary: "The sandbox's lifecycle and exec history, then its agent log, as text lines; follow=true streams new lines.",
  query: LogsQuery, status: 200, response: null, errors: ['NotFound'],
});

/** How often a followed agent log is checked for new bytes: 250 ms. */
const LOG_POLL_MS = 250;

/** What the stats and logs routes use. */
export interface StatsRouteDeps {
  lifecycle: Pick<SandboxLifecycle, 'get' | 'list' | 'stats' | 'logPath'>;
  disks: Pick<DiskQuotaWatch, 'usage' | 'usageAll'>;
  /** Sandbox networking: egress denials of a sandbox. */
  network?: { networking: Pick<SandboxNetworking, 'denials'> };
  /** Recorded events (a sandbox's log starts with them) and whether the sandbox still exists. */
  repo: Pick<SandboxRepo, 'events' | 'onEvent' | 'find'>;
  /** The host's reclaim of idle container sandboxes: a sandbox's idle time and bytes reclaimed (HostReclaim.sandbox). */
  reclaim?: { sandbox(id: string): { idleSinceMs: number | null; reclaimedBytes: number } };
}

/** Registers the stats and logs routes. */
export function registerStatsRoutes(app: FastifyInstance, deps: StatsRouteDeps): void {
  /** One sandbox's stats; `disks` (the store's usage of all layers, read at once) serves the list, else one live read. */
  const view = async (sb: SandboxRecord, disks?: Map<string, DiskUsage>): Promise<z.infer<typeof SandboxStatsView>> => {
    // A failed read leaves the live counters null in the answer; the drivers log why.
    const st = await deps.lifecycle.stats(sb.id).catch(() => null);
    const disk = disks ? disks.get(sb.id) : deps.disks.usage(sb.id);
    return {
      id: sb.id, state: sb.state, image: sb.image, labels: sb.labels, created_at: sb.createdAt, cpus: sb.cpus,
      cpu_usage_ns: st?.cpuUsageNs ?? null, memory_bytes: st?.memoryBytes ?? null, memory_limit_bytes: st?.memoryLimitBytes ?? null,
      pids: st?.pids ?? null, oom_kills: st?.oomKills ?? null, pids_limit_hits: st?.pidsLimitHits ?? null, seccomp_denials: st?.seccompDenials ?? null,
      network_denied: deps.network?.networking.denials(sb) ?? null,
      disk_used_bytes: disk?.usedBytes ?? null, disk_limit_bytes: disk?.limitBytes ?? null,
      ...(deps.reclaim ? ((r) => ({ idle_since: r.idleSinceMs, reclaimed_bytes: r.reclaimedBytes }))(deps.reclaim.sandbox(sb.id)) : {}),
    };
  };
  app.get(statsRoute.url, async (req) => ({
    time: Date.now(),
    host: { cores: os.cpus().length, memory_bytes: os.totalmem(), memory_available_bytes: os.freemem(), load_avg: os.loadavg() },
    sandboxes: await (async () => {
      const disks = deps.disks.usageAll();
      return Promise.all(deps.lifecycle.list(undefined, undefined, scopeOf(req)).map((sb) => view(sb, disks)));
    })(),
  }));
  app.get<{ Params: { id: string } }>(oneRoute.url, async (req) => view(deps.lifecycle.get(req.params.id)));
  // Followed logs end when the API closes (dsecd's shutdown), before the store closes
  // under them: a follower polls the store for its sandbox's existence.
  const followers = new Set<() => void>();
  app.addHook('preClose', async () => {
    for (const stop of followers) stop();
  });
  app.get<{ Params: { id: string } }>(logsRoute.url, async (req, reply) => {
    const sb = deps.lifecycle.get(req.params.id);
    const q = parseWith(LogsQuery, req.query, 'query');
    const follow = q.follow === 'true' || q.follow === '1';
    const logFile = deps.lifecycle.logPath(sb.id);
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' });
    let closed = false;
    res.on('close', () => { closed = true; });
    let wake: (() => void) | null = null;
    const stop = () => {
      closed = true;
      wake?.();
    };
    if (follow) followers.add(stop);
    const line = (e: { time: number; type: string; message?: string; state?: string }) =>
      `${new Date(e.time).toISOString()} ${e.type}${e.state ? ` state=${e.state}` : ''}${e.message ? ` ${e.message}` : ''}\n`;
    for (const e of deps.repo.events()) if (e.sandbox_id === sb.id) res.write(line(e));
    const off = follow ? deps.repo.onEvent((e) => { if (e.sandbox_id === sb.id && !closed) res.write(line(e)); }) : () => {};
    // The agent log: written by the agent (PID 1) on the host side; read from our offset on.
    let pos = 0;
    const drain = async () => {
      if (!logFile) return;
      const st = await stat(logFile).catch(() => null);
      if (!st) return;
      if (st.size < pos) pos = 0; // truncated or replaced (restart of the sandbox)
      if (st.size === pos) return;
      const fh = await open(logFile, 'r');
      try {
        const buf = Buffer.alloc(Math.min(1 << 20, st.size - pos));
        const { bytesRead } = await fh.read(buf, 0, buf.length, pos);
        pos += bytesRead;
        if (!closed) res.write(buf.subarray(0, bytesRead));
      } finally {
        await fh.close();
      }
    };
    try {
      if (!follow) {
        for (let before = -1; before !== pos && !closed;) {
          before = pos;
          await drain();
        }
        return;
      }
      while (!closed) {
        await drain();
        await new Promise<void>((r) => {
          const t = setTimeout(r, LOG_POLL_MS);
          wake = () => {
            clearTimeout(t);
            r();
          };
        });
        wake = null;
        if (closed || !deps.repo.find(sb.id)) break; // shutting down, or destroyed: the stream ends
      }
    } finally {
      followers.delete(stop);
      off();
      res.end();
    }
  });
}
