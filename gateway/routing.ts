/**
 * Routing a request to the host that holds its object, and passing the request and the
 * answer through with backpressure.
 *
 * A sandbox or snapshot id names its host: the ids a fleet host makes begin with its tag
 * (daemon/fleet/layout.ts hostTag), which the host table maps to the host, so the hot path
 * reads no etcd and asks no other host. The rest is looked up and remembered
 * ({@link Router.lookup}): ids made before a host joined the fleet (only hosts that report
 * such ids are asked), a tag two hosts share, snapshot names, trajectories.
 *
 * A sandbox whose host is down reads `unreachable` (GET of one sandbox answers it, with
 * the last row the gateway saw when it has one); other calls on it answer Unavailable
 * naming the host.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { IncomingMessage } from 'node:http';
import type { Readable } from 'node:stream';
import { DsecError, invalidArgument, notFound, unavailable } from '../daemon/errors.js';
import { tagOfId } from '../daemon/fleet/layout.js';
import { addressOf, identityOf, type GatewayContext } from './context.js';
import type { HostEntry } from './table.js';
import { passHeaders, type CallIdentity } from './upstream.js';

/** Largest body the gateway reads itself (creates, bulk): 32 MiB, dsecd's own limit (daemon/api/server.ts BODY_LIMIT_BYTES). */
export const READ_LIMIT_BYTES = 32 * 1024 * 1024;

/** Entries of the id -> host cache: 1 Mi (a few tens of MiB), well above the fleet's live sandboxes whose ids need a lookup. */
const CACHE_MAX = 1 << 20;

/** The state a sandbox reads when its host is down. */
export const UNREACHABLE = 'unreachable';

/** Reads a request body (the gateway passes bodies through unparsed) into memory. @throws DsecError InvalidArgument past the limit. */
export async function readBody(req: FastifyRequest, limit = READ_LIMIT_BYTES): Promise<Buffer> {
  const body = req.body as Readable | undefined;
  if (!body || typeof (body as Readable).on !== 'function') return Buffer.alloc(0);
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const c of body) {
    n += (c as Buffer).length;
    if (n > limit) throw invalidArgument(`request body larger than ${limit} bytes`);
    chunks.push(c as Buffer);
  }
  return Buffer.concat(chunks);
}

/** Parses a JSON request body; `{}` for an empty one. @throws DsecError InvalidArgument for malformed JSON or a non-object. */
export async function readJson(req: FastifyRequest): Promise<Record<string, unknown>> {
  const text = (await readBody(req)).toString('utf8').trim();
  if (!text) return {};
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    throw invalidArgument(`malformed JSON body: ${(e as Error).message}`);
  }
  if (!v || typeof v !== 'object' || Array.isArray(v)) throw invalidArgument('the request body must be a JSON object');
  return v as Record<string, unknown>;
}

/** The error a host answered, as a DsecError (its kind and message kept). */
export function hostError(host: string, status: number, body: unknown): DsecError {
  const e = (body as { error?: { code?: string; message?: string; reason?: string } } | null)?.error;
  const kind = e?.code && e.code in KINDS ? (e.code as DsecError['kind']) : status >= 500 ? 'Unavailable' : 'InvalidArgument';
  return new DsecError(kind, e?.message ?? `host ${host} answered ${status}`, { reason: e?.reason });
}
const KINDS: Record<string, true> = {
  InvalidArgument: true, Unauthenticated: true, PermissionDenied: true, NotFound: true, AlreadyExists: true, Conflict: true, FailedPrecondition: true,
  ResourceExhausted: true, Internal: true, Unimplemented: true, Unavailable: true, DeadlineExceeded: true,
};

/** Routing state of one gateway: the id cache and the last rows seen per host. */
export class Router {
  /** id (sandbox or snapshot) -> host name, for ids whose tag does not say (see the module comment). */
  private readonly cache = new Map<string, string>();
  /** Last row seen of each sandbox, by host, for `unreachable` answers while the host is down. */
  readonly lastRows = new Map<string, Map<string, Record<string, unknown>>>();

  constructor(private readonly ctx: GatewayContext) {}

  /** Remembers that `id` lives on `host`. */
  remember(id: string, host: string): void {
    if (this.cache.size >= CACHE_MAX) this.cache.delete(this.cache.keys().next().value as string);
    this.cache.set(id, host);
  }

  /** Forgets `id` (destroyed). */
  forget(id: string, host?: string): void {
    this.cache.delete(id);
    if (host) this.lastRows.get(host)?.delete(id);
  }

  /** Keeps `row` (a sandbox as an API answer) as the last seen of its host. */
  keepRow(host: string, row: Record<string, unknown>): void {
    if (typeof row.id !== 'string') return;
    let m = this.lastRows.get(host);
    if (!m) this.lastRows.set(host, (m = new Map()));
    m.set(row.id, row);
  }

  /** Replaces the last rows of `host` by a full list of its sandboxes. */
  replaceRows(host: string, rows: Array<Record<string, unknown>>): void {
    this.lastRows.set(host, new Map(rows.filter((r) => typeof r.id === 'string').map((r) => [r.id as string, r])));
  }

  /**
   * The host of a sandbox or snapshot id: by its tag, else from the cache, else asked of
   * the candidate hosts (`probe` is the path to GET there, answering 200 where it lives).
   * @throws DsecError NotFound when no host has it.
   */
  async hostOf(id: string, probe: string, identity: CallIdentity): Promise<HostEntry> {
    const t = this.ctx.table;
    const tag = tagOfId(id);
    const byTag = tag ? t.namesForTag(tag) : [];
    if (byTag.length === 1) {
      const h = t.hosts.get(byTag[0]);
      if (h) return h;
    }
    const cached = this.cache.get(id);
    if (cached && t.hosts.has(cached)) return t.hosts.get(cached)!;
    // Ask: the hosts sharing the tag, and the up hosts that hold ids made before they joined the fleet.
    const candidates = [...new Set([...byTag, ...t.list().filter((h) => h.state === 'up' && (h.live?.untagged ?? 0) > 0).map((h) => h.name)])]
      .map((n) => t.hosts.get(n)!).filter((h) => h && h.state === 'up');
    const found = await this.probe(candidates, probe, identity);
    if (found) {
      this.remember(id, found.name);
      return found;
    }
    throw notFound(`${probe.startsWith('/v1/snapshots') ? 'snapshot' : 'sandbox'} ${id} not found`);
  }

  /**
   * The host of an object found only by asking (a snapshot name, a trajectory id): every
   * up host is asked (GET `probe`), the answer remembered.
   * @throws DsecError NotFound when none has it.
   */
  async hostByLookup(key: string, probe: string, identity: CallIdentity, what: string): Promise<HostEntry> {
    const cached = this.cache.get(key);
    if (cached && this.ctx.table.hosts.get(cached)?.state === 'up') return this.ctx.table.hosts.get(cached)!;
    const found = await this.probe(this.ctx.table.list().filter((h) => h.state === 'up'), probe, identity);
    if (!found) throw notFound(`${what} not found`);
    this.remember(key, found.name);
    return found;
  }

  /** The first of `hosts` that answers 200 to GET `path`, asked all at once; null when none does. */
  private async probe(hosts: HostEntry[], path: string, identity: CallIdentity): Promise<HostEntry | null> {
    if (!hosts.length) return null;
    return new Promise((resolve) => {
      let left = hosts.length;
      let done = false;
      for (const h of hosts) {
        this.ctx.upstreams.json(addressOf(h), { method: 'GET', path, identity }).then((r) => {
          if (!done && r.status === 200) {
            done = true;
            resolve(h);
          }
        }, () => {}).finally(() => {
          if (--left === 0 && !done) resolve(null);
        });
      }
    });
  }
}

/** Why a down host's object cannot be reached, for messages. */
export function downMessage(h: HostEntry, what: string): string {
  return `${what} is ${UNREACHABLE}: its host ${h.name} is down (its lease lapsed ${new Date(h.since).toISOString()}); it is routable again when the host is back`;
}

/**
 * Passes the request to `h` as is (method, path, query, headers less hop-by-hop and
 * credentials, the body streamed) and the host's answer back as is, streamed: a slow
 * reader slows the host's stream (backpressure), a client that goes away ends the call.
 * `onAnswer` runs with the host's status before the answer is passed on.
 * @throws DsecError Unavailable when `h` is down or unreachable.
 */
export async function forward(ctx: GatewayContext, h: HostEntry, req: FastifyRequest, reply: FastifyReply, what: string, path = req.url, onAnswer?: (status: number) => Promise<void>): Promise<FastifyReply> {
  if (h.state !== 'up') throw unavailable(downMessage(h, what));
  const res = await ctx.upstreams.request(addressOf(h), {
    method: req.method, path, headers: { ...passHeaders(req.headers), 'x-forwarded-for': req.socket.remoteAddress ?? '' },
    body: req.body as Readable | undefined, identity: identityOf(req),
  });
  await onAnswer?.(res.statusCode ?? 0);
  return sendUpstream(reply, res);
}

/** Sends a host's answer (status, headers, streamed body) as this request's answer. */
export function sendUpstream(reply: FastifyReply, res: IncomingMessage): FastifyReply {
  reply.code(res.statusCode ?? 502);
  for (const [k, v] of Object.entries(passHeaders(res.headers))) reply.header(k, v);
  // An aborted client destroys `res` (fastify pipes it), which ends the call to the host.
  return reply.send(res);
}
