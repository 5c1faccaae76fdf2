/**
 * Exec activity per sandbox, in memory: how many execs of it run now and when the last
 * one started or ended. The exec service (exec.ts) records every exec to completion and
 * every exec session; the host's reclaim reads it to tell an idle sandbox
 * (host/memory/idle.ts). Nothing is stored: after a restart every sandbox starts with no
 * exec known.
 */

/** What {@link ExecActivity.view} answers for one sandbox. */
export interface ExecActivityView {
  /** Execs running now. */
  running: number;
  /** Last exec start or end, ms since the epoch; null: none since dsecd started. */
  lastMs: number | null;
}

/** See the module comment. */
export class ExecActivity {
  private readonly m = new Map<string, { running: number; lastMs: number }>();

  constructor(private readonly now: () => number = Date.now) {}

  /** An exec of sandbox `id` starts. Pair with exactly one {@link end}. */
  begin(id: string): void {
    const e = this.m.get(id);
    if (e) {
      e.running += 1;
      e.lastMs = this.now();
    } else this.m.set(id, { running: 1, lastMs: this.now() });
  }

  /** An exec of sandbox `id` ended (or failed to start). */
  end(id: string): void {
    const e = this.m.get(id);
    if (!e) return;
    e.running = Math.max(0, e.running - 1);
    e.lastMs = this.now();
  }

  /** Sandbox `id`'s activity. */
  view(id: string): ExecActivityView {
    const e = this.m.get(id);
    return e ? { running: e.running, lastMs: e.lastMs } : { running: 0, lastMs: null };
  }

  /** Forgets sandboxes not in `live` (those destroyed), keeping ones with execs running. */
  retain(live: ReadonlySet<string>): void {
    for (const [id, e] of this.m) if (!live.has(id) && e.running === 0) this.m.delete(id);
  }
}
