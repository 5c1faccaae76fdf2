/** Shared pieces of the benchmarks: percentiles and a throwaway dsecd. */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import { DsecClient } from '../sdk/client.js';
import { repoRoot } from '../daemon/startup/host.js';
import { builderTomlForSlot, leaseSlot, releaseSlot, uidPoolForSlot } from '../test/fixtures/slots.js';

/** Percentile (nearest-rank) of `xs` in the same unit; `p` in [0, 100]. NaN for no samples. */
export function percentile(xs: number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

/** A dsecd started by {@link tempDaemon}. */
export interface TempDaemon {
  client: DsecClient;
  /** Its state directory. */
  root: string;
  /** Host pid of the dsecd process. */
  pid: number | undefined;
  /**
   * SIGTERMs it, purges what is left (sandboxes, layer mounts, cgroup parents), removes the
   * root and releases its slot. A purge that fails is reported on stderr and its root is
   * kept, to purge again by hand.
   */
  stop(): Promise<void>;
}

/**
 * Uid pool of the benchmark dsecds that hold many sandboxes: 2^27 ids from 2^29, in
 * ranges of {@link BENCH_RANGE} (8,192 sandboxes), below every slot's pool and builder
 * range (test/fixtures/slots.ts) and the default pool. Pass both to {@link tempDaemon}.
 */
export const BENCH_POOL = { base: 2 ** 29, size: 2 ** 27 };
/** Ids per sandbox in {@link BENCH_POOL}: 16,384. */
export const BENCH_RANGE = 16_384;

/**
 * Starts a throwaway dsecd on a new root under /tmp (`prefix` names it), with id ranges of
 * its own: it leases a slot (test/fixtures/slots.ts, as the integration tests' daemons do)
 * and takes that slot's builder range, and its uid pool unless `pool` names one (the
 * benchmarks that hold thousands of sandboxes pass a bigger pool, below every slot's and
 * the default's). So it runs beside the host's own dsecd (which holds the default pool
 * and builder range) and beside tests. `extraToml` is appended to its config (e.g. an
 * `[fncall]` table; a `[builder]` table there replaces the slot's builder range).
 * `opts.rangeSize` sets `[uid_pool] range_size` (ids per sandbox; default dsecd's
 * 65,536); `opts.env` is added to dsecd's environment; `opts.nodeArgs` runs bin/dsecd as
 * `node <nodeArgs> bin/dsecd` (e.g. `--cpu-prof`, which NODE_OPTIONS refuses).
 * @throws Error when dsecd does not answer within 60 s or exits first (its root is removed and its slot released).
 */
export async function tempDaemon(prefix: string, pool: { base: number; size: number } | null, extraToml = '', opts: { rangeSize?: number; env?: Record<string, string>; nodeArgs?: string[] } = {}): Promise<TempDaemon> {
  const slot = leaseSlot();
  const root = mkdtempSync(`/tmp/${prefix}`);
  const cfg = path.join(root, 'dsecd.toml');
  const p = pool ?? uidPoolForSlot(slot);
  const rs = opts.rangeSize ? `range_size = ${opts.rangeSize}\n` : '';
  const builder = /^\[builder\]/m.test(extraToml) ? '' : builderTomlForSlot(slot);
  writeFileSync(cfg, `[uid_pool]\nbase = ${p.base}\nsize = ${p.size}\n${rs}${builder}${extraToml}`);
  const socket = path.join(root, 'dsecd.sock');
  const dsecd = path.join(repoRoot(), 'bin/dsecd');
  const args = ['--root', root, '--socket', socket, '--config', cfg];
  // bin/dsecd's own shebang flag and environment are repeated when node is named explicitly.
  const proc = spawn(opts.nodeArgs ? process.execPath : dsecd, opts.nodeArgs ? [...opts.nodeArgs, '--max-semi-space-size=2', dsecd, ...args] : args, {
    stdio: ['ignore', 'ignore', 'inherit'], env: { ...process.env, UV_THREADPOOL_SIZE: '16', DSEC_LOG_LEVEL: 'warn', ...(opts.env ?? {}) },
  });
  const exited = new Promise((r) => proc.once('exit', r));
  const client = new DsecClient({ socketPath: socket, timeoutMs: 120_000 });
  /** SIGTERMs dsecd, purges what is left (sandboxes, layer mounts, cgroup parents), removes the root, releases the slot. */
  const stop = async () => {
    client.close();
    if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
    await exited;
    // --purge destroys what is left (after a failed run), unmounts layers and removes cgroup parents.
    const purged = await execa(dsecd, ['--root', root, '--socket', socket, '--config', cfg, '--purge'], { reject: false });
    if (purged.exitCode !== 0) {
      // Its root stays, so `dsecd --root <root> --purge` can be run again by hand.
      // The slot stays leased while this process lives: its uid ranges may still be in use.
      process.stderr.write(`bench: dsecd --purge of ${root} failed (exit ${purged.exitCode}); left in place:\n${purged.stderr}\n`);
      return;
    }
    rmSync(root, { recursive: true, force: true });
    releaseSlot(slot);
  };
  const deadline = Date.now() + 60_000;
  for (;;) {
    try {
      await client.version();
      break;
    } catch (e) {
      if (Date.now() > deadline || proc.exitCode !== null) {
        await stop();
        throw new Error(`dsecd did not start: ${(e as Error).message}`);
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  return { client, root, pid: proc.pid, stop };
}
