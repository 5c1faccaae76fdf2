/**
 * Text rendering of events (used by `dsec events`). Pure: data in, string out.
 */
import type { Event } from '../../sdk/index.js';

/**
 * One event as `TIME TYPE SANDBOX STATE [MESSAGE]` (ISO 8601 UTC time; `-` for a missing
 * field; the message, e.g. which calls a seccomp.denied event counted, after the state
 * when there is one), no newline.
 */
export function renderEventLine(e: Event): string {
  const base = `${new Date(e.time).toISOString()} ${e.type} ${e.sandbox_id ?? '-'} ${e.state ?? '-'}`;
  return e.message ? `${base} ${e.message.replace(/\s*\n\s*/g, ' ')}` : base;
}
