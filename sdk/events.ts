/**
 * What happens and what it costs: the event stream (NDJSON), a sandbox's log lines, and
 * resource usage of the sandboxes and the host.
 */
import type http from 'node:http';
import { DsecApiError, errMessage, errorFromResponse } from './errors.js';
import { clip, ndjsonLines, textLines } from './ndjson.js';
import type { Event, SandboxStats, StatsResponse } from './types.js';
import { query, sandboxPath } from './paths.js';
import { readBody, type TransportClass } from './transport.js';

/** Query of {@link DsecClient.events}. */
export interface EventsQuery {
  /** Only events of sandboxes whose labels match this selector (`k=v`, `k!=v`, `k` terms, comma-separated; see {@link ListSandboxesQuery.selector}). */
  selector?: string;
  /** Keep the stream open and yield new events as they happen (until aborted). */
  follow?: boolean;
  /** Only events at or after this time, ms since the Unix epoch. */
  since?: number;
  /** Ends the stream: iteration then finishes normally, without an error. */
  signal?: AbortSignal;
}

/** Options of {@link DsecClient.logs}. */
export interface LogsOptions {
  /** Keep the stream open and yield new lines until `signal` aborts or the sandbox is destroyed. */
  follow?: boolean;
  /** Ends the stream: iteration then finishes normally, without an error. */
  signal?: AbortSignal;
}

/** Mixes events, logs and stats into a {@link Transport} class (composed into DsecClient by sdk/client.ts). */
export function withEventCalls<B extends TransportClass>(Base: B) {
  return class EventCalls extends Base {
    /**
     * GET /v1/events: sandbox lifecycle events, oldest first, as an async iterable. Without
     * `follow` it ends after the recorded events; with it, it stays open until `signal`
     * aborts (iteration then ends normally) or the consumer stops iterating (`break`), which
     * closes the connection. Lines are NDJSON; a line split across reads is reassembled.
     * Errors: as for any call when opening; a malformed line is `Internal`; a dropped
     * connection is `Unavailable`.
     */
    async *events(q: EventsQuery = {}): AsyncGenerator<Event, void, undefined> {
      const path =
        '/v1/events' +
        query({ selector: q.selector, follow: q.follow ? 'true' : undefined, since: q.since === undefined ? undefined : String(q.since) });
      const signal = q.signal;
      if (signal?.aborted) return;
      let res: http.IncomingMessage;
      try {
        res = await this.open('GET', path, undefined, signal, 0, 0, true);
      } catch (e) {
        if (signal?.aborted) return;
        throw e;
      }
      if (res.statusCode! >= 400) {
        throw errorFromResponse(res.statusCode!, await readBody(res));
      }
      try {
        for await (const line of ndjsonLines(res)) yield parseEventLine(line);
      } catch (e) {
        if (signal?.aborted) return;
        if (e instanceof DsecApiError) throw e;
        throw new DsecApiError('Unavailable', `event stream from ${this.where} broke: ${errMessage(e)}`, 0, { cause: e });
      } finally {
        res.destroy();
      }
    }

    /**
     * GET /v1/sandboxes/{id}/logs: the sandbox's lifecycle and exec history, then its agent
     * log, as text lines (without their newline). Without `follow` it ends after what is
     * recorded; with it, it stays open until `signal` aborts (iteration then ends normally),
     * the consumer stops iterating, or the sandbox is destroyed. Errors: `NotFound` when
     * opening; a dropped connection is `Unavailable`.
     */
    async *logs(id: string, opts: LogsOptions = {}): AsyncGenerator<string, void, undefined> {
      const signal = opts.signal;
      if (signal?.aborted) return;
      let res: http.IncomingMessage;
      try {
        res = await this.openStream('GET', sandboxPath(id) + '/logs' + query({ follow: opts.follow ? 'true' : undefined }), signal);
      } catch (e) {
        if (signal?.aborted) return;
        throw e;
      }
      try {
        for await (const line of textLines(res)) yield line;
      } catch (e) {
        if (signal?.aborted) return;
        if (e instanceof DsecApiError) throw e;
        throw new DsecApiError('Unavailable', `log stream from ${this.where} broke: ${errMessage(e)}`, 0, { cause: e });
      } finally {
        res.destroy();
      }
    }

    /** GET /v1/stats: resource usage of every sandbox and the host's totals (cores, memory, load). */
    stats(): Promise<StatsResponse> {
      return this.request<StatsResponse>('GET', '/v1/stats');
    }

    /** GET /v1/sandboxes/{id}/stats: resource usage of one sandbox. Errors: `NotFound`. */
    sandboxStats(id: string): Promise<SandboxStats> {
      return this.request<SandboxStats>('GET', sandboxPath(id) + '/stats');
    }
  };
}

/** Parses one NDJSON line of the event stream. */
function parseEventLine(line: string): Event {
  try {
    return JSON.parse(line) as Event;
  } catch (e) {
    throw new DsecApiError('Internal', `dsecd sent a malformed event line: ${JSON.stringify(clip(line))}`, 200, { cause: e });
  }
}
