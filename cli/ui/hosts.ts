/**
 * The `dsec hosts` table: NAME, POOL, STATE (up, down, plus cordoned or draining),
 * SANDBOXES, CPU (busy % of cores), MEM (available of total), BACKENDS, LABELS (other
 * than pool).
 */
import type { FleetHost } from '../../sdk/index.js';
import { formatBytes, makeTable, tableText, type TableStyle } from '../util/output.js';

/** The state column of a host: `up`, `down`, with `,cordoned` or `,draining`. */
export function hostState(h: Pick<FleetHost, 'state' | 'cordoned' | 'draining'>): string {
  return `${h.state}${h.draining ? ',draining' : h.cordoned ? ',cordoned' : ''}`;
}

/** Renders hosts as a table (one row each, in the order given). */
export function renderHostTable(hosts: FleetHost[], style: TableStyle): string {
  const t = makeTable(['NAME', 'POOL', 'STATE', 'SANDBOXES', 'CPU', 'MEM', 'BACKENDS', 'LABELS'], style);
  for (const h of hosts) {
    const labels = Object.entries(h.labels).filter(([k]) => k !== 'pool').map(([k, v]) => `${k}=${v}`).join(',') || '-';
    t.push([
      h.name, h.pool, hostState(h), String(h.sandboxes),
      h.state === 'up' ? `${Math.round(h.cpu.busy * 100)}% of ${h.cpu.cores}` : '-',
      h.state === 'up' ? `${formatBytes(h.memory.available_bytes)}/${formatBytes(h.memory.total_bytes)}` : '-',
      h.backends.join(',') || '-', labels,
    ]);
  }
  return tableText(t);
}
