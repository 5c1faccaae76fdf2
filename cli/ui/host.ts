/**
 * Text rendering of `dsec host info`. Pure: data in, string out.
 */
import type { HostInfo } from '../../sdk/index.js';
import { formatBytes, makeTable, tableText } from '../util/output.js';

/** Options of {@link renderHostInfo}. */
export interface RenderHostOptions {
  /** Bold table headers; set only for a terminal. */
  color?: boolean;
}

/**
 * Host facts as aligned `key  value` lines, then a backend table (AVAILABLE, REASON)
 * and a defence table (ENFORCED, DETAIL). Unavailable capabilities are shown with the
 * daemon's reason, never hidden.
 */
export function renderHostInfo(h: HostInfo, opts: RenderHostOptions = {}): string {
  const color = opts.color ?? false;
  const counts = Object.entries(h.sandboxes)
    .map(([state, n]) => `${state}=${n}`)
    .join(' ');
  const parents = Object.entries(h.cgroup.parents)
    .map(([ctl, p]) => `${ctl}=${p}`)
    .join(', ');
  const facts: [string, string][] = [
    ['version', h.version],
    ['instance', h.instance],
    ['root', h.root],
    ['socket', h.socket],
    ['kernel', h.kernel],
    ['cores', String(h.cores)],
    ['memory', formatBytes(h.memory_bytes)],
    ['cgroup', `v${h.cgroup.version}` + (parents ? ` (${parents})` : '')],
    ['runtime', `${h.runtime.name} ${h.runtime.version} (${h.runtime.path})`],
    ['uid pool', `base ${h.uid_pool.base}, size ${h.uid_pool.size}, ${h.uid_pool.range_size} per sandbox, ${h.uid_pool.in_use} in use, ${h.uid_pool.free} free`],
    ['sandboxes', counts || 'none'],
  ];
  if (h.storage) {
    const st = h.storage;
    const size = st.size_bytes === null ? '' : `, ${formatBytes(st.used_bytes ?? 0)} used of ${formatBytes(st.size_bytes)}`;
    facts.push(['storage', `${st.kind} (quota ${st.quota}) at ${st.location}${st.device ? ` (device ${st.device})` : ''}${size}, ${st.layers} writable layers`]);
    if (st.pool) {
      const p = st.pool;
      const ratio = st.size_bytes ? ` (${+(p.quota_sum_bytes / st.size_bytes).toFixed(2)}x the store)` : '';
      facts.push(['disk pool', `${formatBytes(p.available_bytes)} free; quotas sum to ${formatBytes(p.quota_sum_bytes)}${ratio}, admission allows ${formatBytes(p.quota_cap_bytes)} (disk_overcommit ${p.disk_overcommit}); `
        + `reserve ${formatBytes(p.reserve_bytes)}${p.capped ? `; store nearly full: ${p.capped} sandbox(es) limited to their share of the free space` : ''}${p.guarded ? `, ${p.guarded} of them held after writing all of it` : ''}`]);
    }
  }
  if (h.memory_reclaim) {
    const r = h.memory_reclaim;
    facts.push(['reclaim', `${r.mode} via ${r.method}: ${r.idle_sandboxes} idle sandbox(es) (idle after ${r.idle_after_s} s, CPU at most ${r.idle_cpu_permil}‰ of a core), ${formatBytes(r.reclaimed_bytes)} reclaimed since start; ${r.reason}`]);
    facts.push(['damon', `${r.damon.owned ? 'owned by dsecd' : 'not owned'}: ${r.damon.reason}`]);
  }
  const width = Math.max(...facts.map(([k]) => k.length));
  let out = facts.map(([k, v]) => `${k.padEnd(width)}  ${v}`).join('\n') + '\n';

  const backends = makeTable(['BACKEND', 'AVAILABLE', 'REASON'], { color });
  for (const [name, b] of Object.entries(h.backends)) backends.push([name, b.available ? 'yes' : 'no', b.reason ?? '-']);
  out += '\n' + tableText(backends);
  if (h.fncall_pools?.length) {
    const pools = makeTable(['FNCALL POOL', 'WORKERS', 'IDLE', 'BUSY', 'QUEUED', 'CALLS', 'REPLACED'], { color });
    for (const p of h.fncall_pools) pools.push([p.image, String(p.workers), String(p.idle), String(p.busy), String(p.queued), String(p.calls), String(p.replaced)]);
    out += '\n' + tableText(pools);
  }
  if (h.warm_pools?.length) {
    const pools = makeTable(['WARM POOL', 'NETWORK', 'SIZE', 'READY', 'FILLING', 'CLAIMED', 'MISSES', 'FILL ERRORS'], { color });
    for (const p of h.warm_pools) pools.push([p.image, p.network, String(p.size), String(p.ready), String(p.filling), String(p.claimed), String(p.misses), String(p.fill_errors)]);
    out += '\n' + tableText(pools);
  }
  if (h.features && Object.keys(h.features).length) {
    const features = makeTable(['FEATURE', 'AVAILABLE', 'REASON'], { color });
    for (const [name, f] of Object.entries(h.features)) features.push([name, f.available ? 'yes' : 'no', f.reason ?? '-']);
    out += '\n' + tableText(features);
  }

  const defences = makeTable(['DEFENCE', 'ENFORCED', 'DETAIL'], { color });
  for (const [name, d] of Object.entries(h.defences)) defences.push([name, d.enforced ? 'yes' : 'no', d.detail || '-']);
  out += '\n' + tableText(defences);
  return out;
}
