/**
 * Text rendering of exec sessions (used by `dsec execs`). Pure: data in, string out.
 */
import type { ExecInfo } from '../../sdk/index.js';
import { formatAge, makeTable, tableText } from '../util/output.js';

/** Column headers of {@link renderExecTable}, in order. */
export const EXEC_COLUMNS = ['EXEC_ID', 'STATE', 'PID', 'EXIT', 'AGE', 'COMMAND'] as const;

/** Characters of an exec id shown in the table (as `docker ps` shows 12 of a container id). */
export const SHORT_EXEC_ID = 12;

/** Longest COMMAND shown unless `noTrunc`. */
const COMMAND_WIDTH = 60;

/** Options of {@link renderExecTable}. */
export interface RenderExecOptions {
  /** "Now" in ms since the epoch, for the AGE column; default `Date.now()`. */
  now?: number;
  /** Bold header; set only for a terminal. */
  color?: boolean;
  /** Full exec ids and commands. */
  noTrunc?: boolean;
}

/** A word as a POSIX shell would need it written: bare when safe, else single-quoted. */
export function shellQuote(word: string): string {
  if (word !== '' && /^[A-Za-z0-9_@%+=:,./-]+$/.test(word)) return word;
  return `'${word.replace(/'/g, `'\\''`)}'`;
}

/** The EXIT column: the exit code, else the signal (`SIGKILL`), `timeout`, or `-` while running. */
export function exitColumn(e: Pick<ExecInfo, 'state' | 'exit_code' | 'signal' | 'timed_out'>): string {
  if (e.state === 'running') return '-';
  if (e.timed_out) return 'timeout';
  if (e.exit_code !== null) return String(e.exit_code);
  return e.signal ?? '?';
}

/**
 * The `dsec execs` table: EXEC_ID (12 characters unless `noTrunc`), STATE, PID (inside
 * the sandbox), EXIT, AGE (since start) and COMMAND (shell-quoted, cut at 60 characters
 * unless `noTrunc`), newest first, header first even when empty.
 */
export function renderExecTable(execs: ExecInfo[], opts: RenderExecOptions = {}): string {
  const now = opts.now ?? Date.now();
  const t = makeTable([...EXEC_COLUMNS], { color: opts.color ?? false });
  for (const e of [...execs].sort((a, b) => b.started_at - a.started_at || a.exec_id.localeCompare(b.exec_id))) {
    let cmd = e.argv.map(shellQuote).join(' ');
    if (!opts.noTrunc && [...cmd].length > COMMAND_WIDTH) cmd = [...cmd].slice(0, COMMAND_WIDTH - 1).join('') + '…';
    t.push([
      opts.noTrunc ? e.exec_id : e.exec_id.slice(0, SHORT_EXEC_ID),
      e.state,
      e.pid === null ? '-' : String(e.pid),
      exitColumn(e),
      formatAge(now - e.started_at),
      cmd,
    ]);
  }
  return tableText(t);
}
