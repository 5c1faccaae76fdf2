/**
 * Line framing of streamed response bodies: NDJSON (events, trajectory exports, long
 * operations' progress) and plain text (sandbox logs). Lines split across reads, even
 * inside a UTF-8 character, are reassembled; nothing beyond the current line is held.
 */
import type http from 'node:http';
import { StringDecoder } from 'node:string_decoder';

/** Media type of streamed responses (events, long operations). */
export const NDJSON_TYPE = 'application/x-ndjson';

/**
 * The lines of a text response body, in order, without their `\n` (blank lines kept). A
 * line split across reads (even inside a UTF-8 character) is reassembled; a final line
 * without a newline counts. Errors of the underlying stream propagate.
 */
export async function* textLines(res: http.IncomingMessage): AsyncGenerator<string, void, undefined> {
  const decoder = new StringDecoder('utf8');
  let pending = '';
  for await (const chunk of res as AsyncIterable<Buffer>) {
    pending += decoder.write(chunk);
    if (!pending.includes('\n')) continue;
    const lines = pending.split('\n');
    pending = lines.pop()!;
    for (const line of lines) yield line;
  }
  pending += decoder.end();
  if (pending !== '') yield pending;
}

/**
 * The non-blank lines of an NDJSON response body, in order. A line split across reads
 * (even inside a UTF-8 character) is reassembled; a final line without a newline counts.
 * Errors of the underlying stream (a dropped connection) propagate.
 */
export async function* ndjsonLines(res: http.IncomingMessage): AsyncGenerator<string, void, undefined> {
  const decoder = new StringDecoder('utf8');
  let pending = '';
  for await (const chunk of res as AsyncIterable<Buffer>) {
    pending += decoder.write(chunk);
    if (!pending.includes('\n')) continue;
    const lines = pending.split('\n');
    pending = lines.pop()!;
    for (const line of lines) if (line.trim() !== '') yield line;
  }
  pending += decoder.end();
  if (pending.trim() !== '') yield pending;
}

/** `s` cut to 80 characters for an error message. */
export function clip(s: string): string {
  return s.length > 80 ? s.slice(0, 80) + '…' : s;
}
