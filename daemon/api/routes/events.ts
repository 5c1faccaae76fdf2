/** GET /v1/events: lifecycle events as NDJSON, optionally followed. */
import type { FastifyInstance } from 'fastify';
import { Event, EventsQuery } from '../schema.js';
import { parseWith } from '../parse.js';
import { scopeOf } from '../scope.js';
import { visible } from '../../model/tenant.js';
import { invalidArgument } from '../../errors.js';
import { route } from './table.js';
import type { SandboxRepo } from '../../db/sandboxes.js';
import { parseSelector } from '../../model/selector.js';

const eventsRoute = route({
  method: 'GET', url: '/v1/events', summary: "Lifecycle events of the caller's tenant (every tenant's for an admin), one JSON object per line; follow=true keeps the stream open.",
  query: EventsQuery, status: 200, response: Event, ndjson: true, errors: ['InvalidArgument'],
});

/** Registers the events route. Followed streams end when the server closes. */
/** What the event routes use: the recorded events and their listeners. */
export interface EventRouteDeps {
  repo: Pick<SandboxRepo, 'events' | 'onEvent'>;
}

/** Registers GET /v1/events. */
export function registerEventRoutes(app: FastifyInstance, deps: EventRouteDeps): void {
  const followers = new Set<{ end(): void }>();
  app.addHook('preClose', async () => {
    for (const f of followers) f.end();
  });
  app.get(eventsRoute.url, async (req, reply) => {
    const q = parseWith(EventsQuery, req.query, 'query');
    let match: (l: Record<string, string>) => boolean;
    try {
      match = parseSelector(q.selector);
    } catch (e) {
      throw invalidArgument((e as Error).message);
    }
    // Only the caller's tenant's events (every tenant's for an admin), then the selector.
    const scope = scopeOf(req);
    const ok = (e: Event) => visible(scope, e.tenant ?? 'system') && (!q.selector || (e.labels !== undefined && match(e.labels)));
    const follow = q.follow === 'true' || q.follow === '1';
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' });
    for (const e of deps.repo.events(q.since ?? 0)) if (ok(e)) res.write(JSON.stringify(e) + '\n');
    if (!follow) {
      res.end();
      return;
    }
    const off = deps.repo.onEvent((e) => {
      if (ok(e)) res.write(JSON.stringify(e) + '\n');
    });
    followers.add(res);
    // A comment-free keepalive: an empty line every 15 s lets clients notice a dead daemon.
    const ka = setInterval(() => res.write('\n'), 15_000);
    req.raw.on('close', () => {
      off();
      clearInterval(ka);
      followers.delete(res);
    });
  });
}
