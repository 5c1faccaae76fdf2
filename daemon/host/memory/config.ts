/**
 * `[memory]` of dsecd.toml and `dsecd --reclaim`: proactive reclaim of idle container
 * sandboxes by the host (issue 23; the controller is host/memory/host-reclaim.ts). Schema,
 * defaults and the two presets, all pure.
 *
 * Modes (`reclaim`, the flag wins over the file):
 *   - `off` (default): dsecd reclaims nothing proactively (a pause still reclaims the
 *     sandbox it freezes). Off by default because on a host without swap the fallback can
 *     only drop page cache, which the next exec of that sandbox reads back from disk: an
 *     operator chooses that trade.
 *   - `idle`: a container sandbox idle for `idle_after_s` (default 120 s, DAMON_RECLAIM's
 *     own default minimum age) is reclaimed once per idle period; with DAMON, regions of
 *     it unaccessed for 120 s are paged out at most 1% of a core and 64 MiB/s.
 *   - `aggressive`: idle after 15 s (an RL rollout waiting for its trainer's step is idle
 *     for tens of seconds), reclaimed again every 60 s while it stays idle, memory.reclaim
 *     asks for the whole usage; DAMON pages out regions unaccessed for 10 s with 5% of a
 *     core and 256 MiB/s.
 * Every key below overrides its preset value.
 *
 * Idle (host/memory/idle.ts): no exec of the sandbox running, none started or ended for
 * `idle_after_s`, and its cgroup's CPU time growing by no more than `idle_cpu_permil` of one
 * core over each sweep interval for as long; or paused.
 */
import { z } from 'zod';
import type { DamonReclaimParams } from './damon.js';

/** The reclaim modes (`--reclaim`, `[memory] reclaim`). */
export const RECLAIM_MODES = ['off', 'idle', 'aggressive'] as const;
/** One of {@link RECLAIM_MODES}. */
export type ReclaimMode = (typeof RECLAIM_MODES)[number];

/** `[memory]` of dsecd.toml (see {@link HostReclaimConfig} for each key). */
export const MemorySchema = z.object({
  reclaim: z.enum(RECLAIM_MODES).optional(),
  idle_after_s: z.number().positive().max(86_400).optional(),
  idle_cpu_permil: z.number().min(0).max(1000).optional(),
  repeat_s: z.number().min(0).max(86_400).optional(),
  sweep_s: z.number().min(0.1).max(600).optional(),
  fraction: z.number().positive().max(1).optional(),
  damon: z.boolean().optional(),
  damon_sysfs: z.string().regex(/^\//, 'damon_sysfs is an absolute path').optional(),
  damon_min_age_s: z.number().positive().max(86_400).optional(),
  damon_cpu_ms_per_s: z.number().int().min(0).max(1000).optional(),
  damon_bytes_per_s: z.number().int().min(0).optional(),
}).strict();

/** The resolved `[memory]` settings. */
export interface HostReclaimConfig {
  /** See the module comment. */
  mode: ReclaimMode;
  /** A sandbox idle at least this long is reclaimed, ms (`idle_after_s`; idle 120 s, aggressive 15 s). */
  idleAfterMs: number;
  /**
   * CPU at or below which a sandbox counts as idle, per mille of one core averaged over a
   * sweep (`idle_cpu_permil`; default {@link DEFAULT_IDLE_CPU_PERMIL}). Measured on this
   * host: an idle busybox sandbox (the agent as init, nothing running) used 0 ns of CPU in
   * 20 s; a shell loop waking 10 times a second (`while :; do sleep 0.1; done`) used 10 per
   * mille, so it counts as busy.
   */
  idleCpuPermil: number;
  /** While a sandbox stays idle it is reclaimed again after this long, ms (`repeat_s`; idle 0: once per idle period; aggressive 60 s). */
  repeatMs: number;
  /**
   * How often idle is judged and reclaim runs, ms (`sweep_s`; default 5 s). Each sweep
   * reads one cgroup's stats per container sandbox (about 8 small files): 1,000 sandboxes
   * make ~1,600 reads per second at 5 s.
   */
  sweepMs: number;
  /** cgroup v2: the share of a sandbox's usage asked of memory.reclaim per round, (0, 1] (`fraction`; idle 0.5, aggressive 1). */
  fraction: number;
  /** Use DAMON where dsecd may own a kdamond (`damon`; default true); false: memory cgroups only. */
  damon: boolean;
  /** The DAMON sysfs directory (`damon_sysfs`; default /sys/kernel/mm/damon; tests point it at a sysfs-shaped tree). */
  damonSysfs: string;
  /** What dsecd's kdamond applies (`damon_min_age_s`, `damon_cpu_ms_per_s`, `damon_bytes_per_s`); intervals 100 ms / 2 s as the guest's. */
  damonParams: DamonReclaimParams;
}

/** The presets (see the module comment); `off` resolves as `idle` so that a mode change is the only difference. */
const PRESETS: Record<'idle' | 'aggressive', { idleAfterS: number; repeatS: number; fraction: number; minAgeS: number; cpuMsPerS: number; bytesPerS: number }> = {
  idle: { idleAfterS: 120, repeatS: 0, fraction: 0.5, minAgeS: 120, cpuMsPerS: 10, bytesPerS: 64 * 2 ** 20 },
  aggressive: { idleAfterS: 15, repeatS: 60, fraction: 1, minAgeS: 10, cpuMsPerS: 50, bytesPerS: 256 * 2 ** 20 },
};

/** Default CPU threshold of idle: 5 per mille (0.5% of one core; see HostReclaimConfig.idleCpuPermil for the measurements). */
export const DEFAULT_IDLE_CPU_PERMIL = 5;
/** Default sweep interval: 5 s. */
export const DEFAULT_SWEEP_S = 5;
/** DAMON's sampling and aggregation intervals for the host's kdamond, µs (as the guest's: 100 ms, 2 s). */
const DAMON_SAMPLE_US = 100_000;
const DAMON_AGGR_US = 2_000_000;

/**
 * `[memory]` with the flag and the preset applied.
 * @param raw the file's `[memory]` table (validated by {@link MemorySchema}).
 * @param flag `--reclaim`, which wins over `raw.reclaim`.
 * @throws RangeError for a flag that is not one of {@link RECLAIM_MODES} (loadConfig turns it into InvalidArgument).
 */
export function resolveHostReclaim(raw: z.infer<typeof MemorySchema> | undefined, flag?: string): HostReclaimConfig {
  if (flag !== undefined && !(RECLAIM_MODES as readonly string[]).includes(flag)) {
    throw new RangeError(`--reclaim ${JSON.stringify(flag)}: one of ${RECLAIM_MODES.join(', ')}`);
  }
  const r = raw ?? {};
  const mode = (flag as ReclaimMode | undefined) ?? r.reclaim ?? 'off';
  const p = PRESETS[mode === 'aggressive' ? 'aggressive' : 'idle'];
  return {
    mode,
    idleAfterMs: Math.round((r.idle_after_s ?? p.idleAfterS) * 1000),
    idleCpuPermil: r.idle_cpu_permil ?? DEFAULT_IDLE_CPU_PERMIL,
    repeatMs: Math.round((r.repeat_s ?? p.repeatS) * 1000),
    sweepMs: Math.round((r.sweep_s ?? DEFAULT_SWEEP_S) * 1000),
    fraction: r.fraction ?? p.fraction,
    damon: r.damon ?? true,
    damonSysfs: r.damon_sysfs ?? '/sys/kernel/mm/damon',
    damonParams: {
      minAgeMs: Math.round((r.damon_min_age_s ?? p.minAgeS) * 1000),
      sampleUs: DAMON_SAMPLE_US,
      aggrUs: DAMON_AGGR_US,
      cpuMsPerS: r.damon_cpu_ms_per_s ?? p.cpuMsPerS,
      bytesPerS: r.damon_bytes_per_s ?? p.bytesPerS,
    },
  };
}
