/**
 * Detection of CRIU process checkpoints: `criu check` must pass on the host before
 * dsecd offers memory+process snapshots. The probe runs once per dsecd process (it
 * reads kernel features; they do not change while the host runs).
 */
import { execa } from 'execa';

/** Outcome of the probe. */
export interface CriuProbe {
  /** True when `criu check` passed. */
  available: boolean;
  /** Why not (criu's own error lines), or the criu version when available. */
  reason: string;
}

let cached: Promise<CriuProbe> | null = null;

/** `criu check` gets 30 s: it only inspects kernel features, which takes well under a second where it works. */
const PROBE_TIMEOUT_MS = 30_000;

/** Runs `criu check` (once; later calls share the result). Never throws. */
export function probeCriu(bin = 'criu'): Promise<CriuProbe> {
  cached ??= (async (): Promise<CriuProbe> => {
    const r = await execa(bin, ['check'], { reject: false, timeout: PROBE_TIMEOUT_MS, all: true });
    if ((r as { code?: string }).code === 'ENOENT' || /ENOENT/.test(String(r.message ?? '')) && r.exitCode === undefined) {
      return { available: false, reason: 'criu is not installed (Debian: apt install criu)' };
    }
    if (r.timedOut) return { available: false, reason: `criu check did not finish within ${PROBE_TIMEOUT_MS / 1000} s` };
    const out = String(r.all ?? '').trim().split('\n').filter((l) => l.trim()).slice(-4).join('; ');
    if (r.exitCode !== 0) return { available: false, reason: `criu check failed on this kernel: ${out || `exit ${r.exitCode}`}` };
    return { available: true, reason: out || 'criu check passed' };
  })();
  return cached;
}
