/**
 * E2B's control plane (the REST API the SDKs reach at `E2B_API_URL` with `X-API-KEY`),
 * over dsec sandboxes. The door (daemon/remote/door.ts) has already checked the key as a
 * dsec token and set `req.principal`; here every route sees and touches only the
 * sandboxes its tenant owns (admins: every sandbox), and answers any other id as not
 * found, so ids of other tenants are not revealed.
 *
 * Routes (both generations the SDKs use: 2.8 creates and connects without `/v2`):
 * - POST /sandboxes, POST /v2/sandboxes: create (201, with envdAccessToken);
 * - GET /sandboxes, GET /v2/sandboxes: list (metadata filter, state, limit, nextToken
 *   with the next page's token in `x-next-token`);
 * - GET /sandboxes/:id: info (with envdAccessToken); DELETE /sandboxes/:id: kill (204);
 * - POST /sandboxes/:id/timeout: set the timeout from now (204);
 * - POST /sandboxes/:id/pause (204; 409 when already paused), /resume (201);
 * - POST /sandboxes/:id/connect, /v2/sandboxes/:id/connect: resume if paused, extend the
 *   timeout (200 running, 201 resumed), with envdAccessToken;
 * - POST /sandboxes/:id/refreshes: extend the timeout (older SDKs' keepalive, 204).
 * Errors are E2B's `{code, message}` (wire.ts).
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { CreateSandboxRequest, type Sandbox } from '../wire/sandboxes.js';
import { LIMITS } from '../../model/resources.js';
import { parseWith } from '../parse.js';
import { DsecError, failedPrecondition, invalidArgument, notFound, unimplemented } from '../../errors.js';
import { E2B_BASE_IMAGE } from '../../image/e2b-base.js';
import { ENVD_VERSION, TEMPLATE_LABEL, TENANT_LABEL, ttlFor, type E2bFront } from './front.js';
import { sendE2bError } from './wire.js';

const timeoutS = z.number().int().min(0).max(LIMITS.maxTtlS).describe('Seconds from now.');

/** E2B's NewSandbox / NewSandboxV2 (unknown fields are ignored, as the E2B API does). */
const NewSandbox = z.object({
  templateID: z.string().min(1).max(255),
  timeout: timeoutS.optional(),
  metadata: z.record(z.string(), z.string()).nullish(),
  envVars: z.record(z.string(), z.string()).nullish(),
  autoPause: z.boolean().optional(),
  autoPauseMemory: z.boolean().optional(),
  secure: z.boolean().optional(),
  allow_internet_access: z.boolean().nullish(),
  network: z.record(z.string(), z.unknown()).nullish(),
  mcp: z.record(z.string(), z.unknown()).nullish(),
  volumeMounts: z.array(z.unknown()).nullish(),
  autoResume: z.unknown().optional(),
});

const TimeoutBody = z.object({ timeout: timeoutS.optional() });
const PauseBody = z.object({ memory: z.boolean().optional() });
const RefreshBody = z.object({ duration: timeoutS.optional() });

/** GET /v2/sandboxes query. */
const ListQuery = z.object({
  metadata: z.string().optional(),
  state: z.union([z.string(), z.array(z.string())]).optional(),
  limit: z.coerce.number().int().min(1).max(1000).optional(),
  nextToken: z.string().optional(),
  startedAfter: z.string().optional(),
  template: z.string().optional(),
  order: z.enum(['asc', 'desc']).optional(),
});

/** Page size of a list that names none: 100 (E2B's). */
const DEFAULT_PAGE = 100;

/** E2B's `Sandbox` answer (create, connect, resume): ids, envd version, the access token. */
function sandboxAnswer(front: E2bFront, sb: Sandbox) {
  const t = front.templateOf(sb);
  return {
    sandboxID: sb.id,
    templateID: t,
    alias: t,
    clientID: 'dsec',
    envdVersion: ENVD_VERSION,
    envdAccessToken: front.tokens.tokenOf(sb.id),
    domain: null,
    trafficAccessToken: null,
  };
}

/** End of the sandbox's life as E2B shows it: creation + TTL, or far away for none (a paused sandbox waits). */
function endAt(sb: Sandbox): string {
  return sb.ttl_s === null ? '9999-12-31T23:59:59.000Z' : new Date(sb.created_at + sb.ttl_s * 1000).toISOString();
}

/** E2B's `ListedSandbox`. */
function listed(front: E2bFront, sb: Sandbox) {
  const t = front.templateOf(sb);
  return {
    sandboxID: sb.id,
    templateID: t,
    alias: t,
    clientID: 'dsec',
    startedAt: new Date(sb.created_at).toISOString(),
    endAt: endAt(sb),
    state: front.stateOf(sb)!,
    cpuCount: sb.cpus,
    memoryMB: Math.round(sb.memory_bytes / 2 ** 20),
    diskSizeMB: sb.disk_bytes === null ? 0 : Math.round(sb.disk_bytes / 2 ** 20),
    envdVersion: ENVD_VERSION,
    metadata: front.metadataOf(sb),
    volumeMounts: [],
  };
}

/** Opaque page token: where the previous page ended (created_at, id). */
function pageToken(sb: Sandbox): string {
  return Buffer.from(JSON.stringify([sb.created_at, sb.id])).toString('base64url');
}

function parsePageToken(t: string): [number, string] {
  try {
    const v = JSON.parse(Buffer.from(t, 'base64url').toString('utf8')) as unknown;
    if (Array.isArray(v) && typeof v[0] === 'number' && typeof v[1] === 'string') return [v[0], v[1]];
  } catch { /* below */ }
  throw invalidArgument('nextToken is not a token this server gave');
}

/**
 * The metadata filter of a list: E2B sends `metadata=` + a URL-encoded query string whose
 * keys and values were URL-encoded once more (`k%3Dv%26k2%3Dv2` for {k: v, k2: v2}).
 */
export function parseMetadataFilter(q: string | undefined): Record<string, string> {
  if (!q) return {};
  const out: Record<string, string> = {};
  for (const [k, v] of new URLSearchParams(q)) {
    try {
      out[decodeURIComponent(k)] = decodeURIComponent(v);
    } catch {
      throw invalidArgument(`metadata filter ${JSON.stringify(q)} is not URL-encoded key=value pairs`);
    }
  }
  return out;
}

/** Registers the control-plane routes (see the module comment) on an app whose door sets `req.principal`. */
export function registerControlRoutes(app: FastifyInstance, front: E2bFront): void {
  const host = front.host;
  app.setErrorHandler((e, _req, reply) => sendE2bError(reply, e));

  type R = FastifyRequest<{ Params: { id: string } }>;
  /** The sandbox of the request, if its caller may see it; NotFound otherwise (also for another tenant's). */
  const owned = async (req: FastifyRequest): Promise<Sandbox> => {
    const id = (req as R).params.id;
    const sb = await host.get(id).catch((e: unknown) => {
      if (e instanceof DsecError && (e.kind === 'NotFound' || e.kind === 'InvalidArgument')) throw notFound(`sandbox ${id} not found`);
      throw e;
    });
    if (!front.visible(req.principal, sb) || front.stateOf(sb) === null) throw notFound(`sandbox ${id} not found`);
    return sb;
  };

  const create = async (req: FastifyRequest, reply: FastifyReply) => {
    const body = parseWith(NewSandbox, req.body, 'create request');
    if (body.autoPause) throw unimplemented('autoPause (pause instead of kill at the timeout) is not supported by dsec; pause explicitly with Sandbox.pause()');
    if (body.mcp && Object.keys(body.mcp).length) throw unimplemented('MCP gateways are not supported by dsec');
    if (body.volumeMounts?.length) throw unimplemented('volume mounts are not supported by dsec');
    if (body.network && Object.keys(body.network).length) throw unimplemented('per-sandbox egress rules through the E2B API are not supported; use a dsec network policy ([e2b] internet, docs/E2B.md)');
    const tpl = front.templates.resolve(body.templateID);
    if (!(await host.imageExists(tpl.image, req.principal.tenant))) {
      const hint = tpl.image === E2B_BASE_IMAGE ? ' (dsecd builds it at start when Debian\'s bash-static is installed)' : ' (a template ID is an alias an admin made with dsec image alias NAME IMAGE, or the name of an image your tenant sees: dsec image ls)';
      throw notFound(`template ${body.templateID} not found: no image ${tpl.image} in the store${hint}`);
    }
    // Metadata becomes labels under dsec's label rules (which also reserve `dsec.`).
    const metadata = parseWith(CreateSandboxRequest.shape.labels, body.metadata ?? undefined, 'metadata') ?? {};
    const env = parseWith(CreateSandboxRequest.shape.env, body.envVars ?? undefined, 'envVars') ?? {};
    if (Object.keys(metadata).length > LIMITS.maxLabels - 2) throw invalidArgument(`metadata: at most ${LIMITS.maxLabels - 2} keys`);
    const templateLabel = /^[A-Za-z0-9._/-]{0,63}$/.test(body.templateID) ? body.templateID : tpl.image.slice(0, 63);
    const mode = body.allow_internet_access === false ? 'none' : front.settings.internet;
    const end = host.timeCreate?.(tpl.backend);
    const sb = await host.create({
      image: tpl.image,
      backend: tpl.backend,
      labels: { ...metadata, [TEMPLATE_LABEL]: templateLabel, [TENANT_LABEL]: req.principal.tenant },
      env,
      ttlS: Math.max(1, body.timeout ?? front.settings.defaultTimeoutS),
      network: mode === 'none' ? undefined : { mode },
      tenant: req.principal.tenant,
    });
    end?.();
    return reply.code(201).send(sandboxAnswer(front, sb));
  };
  app.post('/sandboxes', create);
  app.post('/v2/sandboxes', create);

  const list = async (req: FastifyRequest, reply: FastifyReply) => {
    const q = parseWith(ListQuery, req.query, 'query');
    const meta = parseMetadataFilter(q.metadata);
    const states = new Set((Array.isArray(q.state) ? q.state.join(',') : q.state ?? 'running,paused').split(',').filter(Boolean));
    for (const s of states) if (s !== 'running' && s !== 'paused') throw invalidArgument(`state ${JSON.stringify(s)}: running or paused`);
    const after = q.startedAfter ? Date.parse(q.startedAfter) : null;
    if (after !== null && Number.isNaN(after)) throw invalidArgument('startedAfter is not an RFC 3339 time');
    const desc = (q.order ?? 'desc') === 'desc';
    let all = (await host.list()).filter((sb) => {
      const st = front.stateOf(sb);
      return st !== null && states.has(st) && front.visible(req.principal, sb)
        && Object.entries(meta).every(([k, v]) => sb.labels[k] === v)
        && (after === null || sb.created_at > after)
        && (!q.template || front.templateOf(sb) === q.template);
    });
    const cmp = (a: Sandbox, b: Sandbox) => (a.created_at - b.created_at) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
    all = all.sort((a, b) => (desc ? -cmp(a, b) : cmp(a, b)));
    if (q.nextToken) {
      const [t, id] = parsePageToken(q.nextToken);
      const mark = { created_at: t, id } as Sandbox;
      all = all.filter((sb) => (desc ? cmp(sb, mark) < 0 : cmp(sb, mark) > 0));
    }
    const limit = q.limit ?? DEFAULT_PAGE;
    const page = all.slice(0, limit);
    if (all.length > limit) reply.header('x-next-token', pageToken(page[page.length - 1]));
    return page.map((sb) => listed(front, sb));
  };
  app.get('/sandboxes', list);
  app.get('/v2/sandboxes', list);

  app.get('/sandboxes/:id', async (req) => {
    const sb = await owned(req);
    return {
      ...listed(front, sb),
      envdAccessToken: front.tokens.tokenOf(sb.id),
      domain: null,
      allowInternetAccess: (sb.network?.mode ?? 'none') !== 'none',
    };
  });

  app.delete('/sandboxes/:id', async (req, reply) => {
    const sb = await owned(req);
    await host.destroy(sb.id);
    front.forget(sb.id);
    return reply.code(204).send();
  });

  app.post('/sandboxes/:id/timeout', async (req, reply) => {
    const sb = await owned(req);
    const b = parseWith(TimeoutBody, req.body, 'timeout request');
    if (front.stateOf(sb) !== 'running') throw failedPrecondition(`sandbox ${sb.id} is paused; connect to it first`);
    await host.setTtl(sb.id, ttlFor(sb.created_at, b.timeout ?? front.settings.defaultTimeoutS));
    return reply.code(204).send();
  });

  app.post('/sandboxes/:id/refreshes', async (req, reply) => {
    const sb = await owned(req);
    const b = parseWith(RefreshBody, req.body, 'refresh request');
    if (front.stateOf(sb) === 'running') await extend(sb, b.duration ?? front.settings.defaultTimeoutS);
    return reply.code(204).send();
  });

  /** Sets the timeout to `timeoutS` from now unless the sandbox already lives longer (E2B's connect rule). */
  const extend = async (sb: Sandbox, timeoutS: number) => {
    const ttl = ttlFor(sb.created_at, timeoutS);
    if (sb.ttl_s === null || sb.ttl_s < ttl) await host.setTtl(sb.id, ttl);
  };

  app.post('/sandboxes/:id/pause', async (req, reply) => {
    const sb = await owned(req);
    const b = parseWith(PauseBody, req.body, 'pause request');
    if (front.stateOf(sb) === 'paused') {
      return sendE2bError(reply, failedPrecondition(`sandbox ${sb.id} is already paused`));
    }
    // memory: false is E2B's filesystem-only pause: dsec's stop (processes end, the writable layer stays).
    if (b.memory === false) await host.stop(sb.id);
    else await host.pause(sb.id);
    // A paused E2B sandbox waits to be resumed: no TTL until connect sets one again.
    await host.setTtl(sb.id, null);
    return reply.code(204).send();
  });

  /** Brings a paused (or stopped) sandbox back and sets its timeout; returns whether it had to. */
  const wake = async (sb: Sandbox, timeoutS: number): Promise<boolean> => {
    if (front.stateOf(sb) === 'running') {
      await extend(sb, timeoutS);
      return false;
    }
    if (sb.state === 'paused') await host.resume(sb.id);
    else await host.start(sb.id);
    await host.setTtl(sb.id, ttlFor(sb.created_at, timeoutS));
    return true;
  };

  const connect = async (req: FastifyRequest, reply: FastifyReply) => {
    const sb = await owned(req);
    const b = parseWith(TimeoutBody.extend({ memory: z.boolean().optional() }), req.body, 'connect request');
    const woke = await wake(sb, b.timeout ?? front.settings.defaultTimeoutS);
    return reply.code(woke ? 201 : 200).send(sandboxAnswer(front, await host.get(sb.id)));
  };
  app.post('/sandboxes/:id/connect', connect);
  app.post('/v2/sandboxes/:id/connect', connect);

  app.post('/sandboxes/:id/resume', async (req, reply) => {
    const sb = await owned(req);
    const b = parseWith(TimeoutBody.extend({ autoPause: z.boolean().optional(), memory: z.boolean().optional() }), req.body, 'resume request');
    if (front.stateOf(sb) === 'running') return sendE2bError(reply, failedPrecondition(`sandbox ${sb.id} is already running`));
    await wake(sb, b.timeout ?? front.settings.defaultTimeoutS);
    return reply.code(201).send(sandboxAnswer(front, await host.get(sb.id)));
  });
}
