/**
 * Text rendering of events (used by `dsec events`). Pure: data in, string out.
 */
import type { Event } from '../../sdk/index.js';

/** One event as `TIME TYPE SANDBOX STATE` (ISO 8601 UTC time; `-` for a missing field), no newline. */
export function renderEventLine(e: Event): string {
  return `${new Date(e.time).toISOString()} ${e.type} ${e.sandbox_id ?? '-'} ${e.state ?? '-'}`;
}
