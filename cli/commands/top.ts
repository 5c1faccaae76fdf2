/**
 * `dsec top [--once] [--sort cpu|mem|age|id] [--filter F] [--interval DUR]`: resource
 * use of every sandbox, live.
 *
 * On a terminal: the Ink view of cli/ui/top.tsx, refreshed every interval (1 s), until
 * `q` or Ctrl-C (exit 0) or SIGTERM (exit 143). Otherwise (stdout not a terminal, or
 * `--once`, or `--json`): two samples one interval apart (CPU% needs a delta), then ONE
 * plain table (under the host line when stdout is a terminal), or
 * `{time, host, sandboxes: [...]}` with --json. When that fallback was
 * not asked for, stderr says so first: `(stdout is not a terminal: printing one snapshot)`.
 *
 * The host header comes from systeminformation (this host's memory and CPU load), falling
 * back to the host block of GET /v1/stats.
 */
import os from 'node:os';
import { Option, type Command } from 'commander';
import type { StatsResponse } from '../../sdk/index.js';
import { TOP_SORTS, hostFromStats, renderTopHeader, renderTopRows, renderTopTable, topRowJson, type TopHost, type TopSort } from '../ui/top-rows.js';
import type { Ctx } from '../util/context.js';
import { EXIT, UserError } from '../util/errors.js';
import { signalNumber } from '../util/exec.js';
import { writeJson } from '../util/output.js';
import { flag, parseDuration } from '../util/parse.js';

/** The note on stderr when stdout is not a terminal and no snapshot was asked for. */
export const SNAPSHOT_NOTE = '(stdout is not a terminal: printing one snapshot)';

/** Parses `--sort`: one of {@link TOP_SORTS}. */
function parseSort(text: string): TopSort {
  if (!(TOP_SORTS as readonly string[]).includes(text)) throw new UserError(`unknown sort ${JSON.stringify(text)}`, `sort by ${TOP_SORTS.join(', ')}`);
  return text as TopSort;
}

/** Parses `--interval`: 100 ms to 1 h. */
function parseInterval(text: string): number {
  const ms = parseDuration(text, '--interval');
  if (ms < 100 || ms > 3_600_000) throw new UserError(`--interval ${JSON.stringify(text)} is out of range`, 'write 100ms to 1h, e.g. --interval 2s');
  return ms;
}

/** This host's header from systeminformation; the sample's host block when that fails. */
export async function sampleHost(stats: StatsResponse): Promise<TopHost> {
  try {
    // Loaded here, not at the top: every other verb starts faster without it.
    const { default: si } = await import('systeminformation');
    const [mem, load] = await Promise.all([si.mem(), si.currentLoad()]);
    if (!(mem.total > 0)) throw new Error('no memory figures');
    return {
      cores: load.cpus?.length || stats.host.cores,
      cpuPercent: Number.isFinite(load.currentLoad) ? load.currentLoad : null,
      memoryUsedBytes: Math.max(0, mem.total - mem.available),
      memoryTotalBytes: mem.total,
      loadAvg: os.loadavg(),
    };
  } catch {
    return hostFromStats(stats);
  }
}

/** Options of `top`. */
interface TopOptions {
  once?: boolean;
  sort: TopSort;
  filter?: string;
  interval: number;
}

/** Adds `top` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('top')
    .description('show resource use of every sandbox, live (keys: c m a i sort, / filter, q quit)')
    .option('--once', 'print one table (two samples one interval apart) and exit')
    .option('--sort <key>', `sort by ${TOP_SORTS.join(', ')}`, flag('--sort', parseSort), 'cpu' as TopSort)
    .option('--filter <f>', 'only sandboxes matching k=v (a label, or state/image/id) or containing the text')
    .addOption(new Option('--interval <dur>', 'time between samples').argParser(flag('--interval', parseInterval)).default(1000, '1s'))
    .action(async (opts: TopOptions) => {
      const client = ctx.client();
      const interactive = !opts.once && !ctx.json && ctx.io.stdout.isTTY === true;
      let interrupted: NodeJS.Signals | undefined;
      let onStop: () => void = () => {};
      const stop = new Promise<void>((resolve) => {
        onStop = resolve;
      });
      const unregister = ctx.io.onInterrupt((sig) => {
        interrupted ??= sig;
        onStop();
      });
      try {
        if (interactive) {
          // Ink and React load only here (~0.3 s and ~40 MB that no other verb should pay).
          const { renderTop } = await import('../ui/top.js');
          await renderTop({
            stdout: ctx.io.stdout as NodeJS.WriteStream,
            stdin: ctx.io.stdin as unknown as NodeJS.ReadStream,
            sample: () => client.stats(),
            host: sampleHost,
            intervalMs: opts.interval,
            sort: opts.sort,
            filter: opts.filter ?? '',
            keys: ctx.io.stdin.isTTY === true,
            stop,
          });
        } else {
          if (!opts.once && !ctx.json) ctx.err(SNAPSHOT_NOTE + '\n');
          await snapshot(ctx, opts, stop);
        }
      } finally {
        unregister();
      }
      if (interrupted) ctx.exitCode = EXIT.signalBase + (signalNumber(interrupted) ?? 2);
    });
}

/** Two samples `interval` apart, then one table (or JSON); an interrupt cuts the wait short and prints nothing. */
async function snapshot(ctx: Ctx, opts: TopOptions, stop: Promise<void>): Promise<void> {
  const client = ctx.client();
  const first = await client.stats();
  let timer: NodeJS.Timeout | undefined;
  const waited = await Promise.race([
    new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(true), opts.interval);
    }),
    stop.then(() => false),
  ]);
  clearTimeout(timer);
  if (!waited) return;
  const second = await client.stats();
  const rows = renderTopRows(first, second, opts.sort, opts.filter ?? '');
  const host = await sampleHost(second);
  if (ctx.json) {
    writeJson(ctx.io.stdout, { time: second.time, host: { cores: host.cores, cpu_percent: host.cpuPercent, memory_used_bytes: host.memoryUsedBytes, memory_bytes: host.memoryTotalBytes, load_avg: host.loadAvg }, sandboxes: rows.map(topRowJson) });
    return;
  }
  // The host line only for a person (--once on a terminal): a pipe gets just the table.
  if (ctx.io.stdout.isTTY) ctx.out(renderTopHeader(host, second.sandboxes.length, rows.length) + '\n');
  ctx.out(renderTopTable(rows, { color: ctx.color }));
}
