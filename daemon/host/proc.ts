/** Reading /proc/PID/stat (process liveness that survives pid reuse), and signal names. */
import { readFileSync } from 'node:fs';
import { constants as osConstants } from 'node:os';

/**
 * starttime (field 22 of /proc/PID/stat: clock ticks after boot) of a live process, or
 * null when it does not exist or is a zombie. Paired with the pid it identifies one
 * process for the life of the host, even after the pid is reused.
 */
export function procStartTime(pid: number): number | null {
  let s: string;
  try {
    s = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return null;
  }
  // The command name (field 2) may contain spaces and parens: split after the last ')'.
  const rest = s.slice(s.lastIndexOf(')') + 2).split(' ');
  if (rest[0] === 'Z' || rest[0] === 'X') return null; // rest[0] is field 3, the state
  return Number(rest[19]);
}

const SIGNAL_NAMES: Record<number, string> = Object.fromEntries(
  Object.entries(osConstants.signals).map(([name, num]) => [num as number, name]),
);

/** Signal number -> name, e.g. 9 -> `SIGKILL`; `SIG<n>` for numbers Node does not name. */
export function signalName(n: number): string {
  return SIGNAL_NAMES[n] ?? `SIG${n}`;
}

/** True when /proc/meminfo reports any swap (SwapTotal > 0). */
export function hostHasSwap(): boolean {
  try {
    const m = /^SwapTotal:\s+(\d+)/m.exec(readFileSync('/proc/meminfo', 'utf8'));
    return !!m && Number(m[1]) > 0;
  } catch {
    return false;
  }
}
