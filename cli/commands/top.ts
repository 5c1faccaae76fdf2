/**
 * `dsec top [--once] [--sort cpu|mem|age|id] [--filter F] [--interval DUR]`: resource
 * use of every sandbox, live.
 *
 * On a terminal: the Ink view of cli/ui/top.tsx on the alternate screen, refreshed every
 * interval (1 s), until `q` or Ctrl-C (exit 0) or SIGTERM (exit 143); the screen is as it
 * was before when it ends. Row actions (cli/ui/top-keys.ts): `s`/Enter runs `sh` in the
 * selected sandbox under a PTY (as `dsec exec -it ID -- sh`; exiting it comes back),
 * `l` follows its log (q, Esc or ^C comes back), `p` pauses or resumes it, `d` destroys
 * it after a `y`. Otherwise (stdout not a terminal, or
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
import { DsecApiError, type StatsResponse } from '../../sdk/index.js';
import { renderPauseLine } from '../ui/jobs.js';
import { TOP_SORTS, hostFromStats, renderTopHeader, renderTopRows, renderTopTable, topRowJson, type TopHost, type TopSort } from '../ui/top-rows.js';
import type { Ctx } from '../util/context.js';
import { EXIT, UserError, apiErrorMessage } from '../util/errors.js';
import { signalNumber } from '../util/exec.js';
import { writeJson } from '../util/output.js';
import { flag, parseDuration } from '../util/parse.js';
import { enterRawMode } from '../util/terminal.js';
import { execInteractive } from './exec.js';
import { cleanLogLine } from './logs.js';

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

/**
 * Runs `load` (an import) with CI and CONTINUOUS_INTEGRATION removed from process.env,
 * then puts them back as they were; children started later see them unchanged.
 */
async function withoutCiEnv<T>(load: () => Promise<T>): Promise<T> {
  const saved = { CI: process.env.CI, CONTINUOUS_INTEGRATION: process.env.CONTINUOUS_INTEGRATION };
  delete process.env.CI;
  delete process.env.CONTINUOUS_INTEGRATION;
  try {
    return await load();
  } finally {
    for (const [k, v] of Object.entries(saved)) if (v !== undefined) process.env[k] = v;
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
    .description('show resource use of every sandbox, live (keys: ↑↓ select, s shell, l log, p pause/resume, d destroy, c m a i sort, / filter, q quit)')
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
          // Ink holds every frame until exit when CI or CONTINUOUS_INTEGRATION is set in the
          // environment (its is-in-ci check, read once at import); a live view on a terminal
          // must draw whatever the environment says, so both are hidden from that import.
          const { renderTop } = await withoutCiEnv(() => import('../ui/top.js'));
          await renderTop({
            stdout: ctx.io.stdout as NodeJS.WriteStream,
            stdin: ctx.io.stdin as unknown as NodeJS.ReadStream,
            sample: () => client.stats(),
            host: sampleHost,
            intervalMs: opts.interval,
            sort: opts.sort,
            filter: opts.filter ?? '',
            keys: ctx.io.stdin.isTTY === true,
            color: ctx.color,
            stop,
            act: (op, id) => rowAction(ctx, op, id),
            suspend: (kind, id) => (kind === 'shell' ? shell(ctx, id) : followLog(ctx, id, stop)),
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

/** `top`'s pause, resume and destroy of a sandbox; resolves with the line the view shows. @throws Error with the API error said as the CLI says it. */
async function rowAction(ctx: Ctx, op: 'pause' | 'resume' | 'destroy', id: string): Promise<string> {
  const client = ctx.client();
  try {
    if (op === 'pause') return renderPauseLine(id, (await client.pauseSandbox(id)).reclaim);
    if (op === 'resume') return `${(await client.resumeSandbox(id)).id} resumed`;
    return `${(await client.deleteSandbox(id, { force: true })).id} destroyed`;
  } catch (e) {
    if (e instanceof DsecApiError) throw new Error(`${op} ${id.slice(0, 12)}: ${apiErrorMessage(e, op === 'destroy' ? 'rm' : op)} (${e.code})`);
    throw e;
  }
}

/** `top`'s shell: `sh` in sandbox `id` under a PTY, with our terminal; resolves with how it ended. */
async function shell(ctx: Ctx, id: string): Promise<string> {
  ctx.err(`dsec: sh in sandbox ${id}; exit it to return to top\n`);
  const code = await execInteractive(ctx, id, ['sh']);
  return `shell in ${id.slice(0, 12)} ended (exit ${code})`;
}

/**
 * `top`'s log view: the sandbox's log, followed, on the normal screen, until `q`, Esc or
 * ^C (our terminal in raw mode, so ^C is a key here, not a signal), `stop` (a SIGTERM) or
 * the end of the log (the sandbox was destroyed). Resolves with how it ended.
 */
async function followLog(ctx: Ctx, id: string, stop: Promise<void>): Promise<string> {
  const { stdin, stdout } = ctx.io;
  const abort = new AbortController();
  void stop.then(() => abort.abort());
  stdout.write(`dsec: log of sandbox ${id}, followed; q, Esc or ^C returns to top\n`);
  const restore = enterRawMode(stdin, { keepOutput: true });
  const onData = (c: string | Uint8Array) => {
    if (/[q\x1b\x03]/.test(typeof c === 'string' ? c : Buffer.from(c).toString('latin1'))) abort.abort();
  };
  stdin.on?.('data', onData);
  stdin.resume?.();
  try {
    for await (const line of ctx.client().logs(id, { follow: true, signal: abort.signal })) stdout.write(cleanLogLine(line) + '\n');
  } catch (e) {
    if (!abort.signal.aborted) throw e;
  } finally {
    stdin.off?.('data', onData);
    stdin.pause?.();
    restore();
  }
  return abort.signal.aborted ? `left the log of ${id.slice(0, 12)}` : `the log of ${id.slice(0, 12)} ended (the sandbox is gone)`;
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
