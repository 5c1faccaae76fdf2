/**
 * API tokens of the TCP door (daemon/remote/tokens.ts): create (the token text is in the
 * answer once), list, revoke. Admin only: the Unix socket, or an admin token
 * (daemon/remote/policy.ts ADMIN_ROUTES).
 */
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { parseWith } from '../parse.js';
import { TENANT_RE, TOKEN_ROLES } from '../../remote/tokens.js';
import { route } from './table.js';
import type { TokenService } from '../../remote/tokens.js';

/** POST /v1/tokens request. */
export const CreateTokenRequest = z
  .object({
    tenant: z.string().regex(TENANT_RE, 'tenant: 1-63 of a-z, 0-9, _ and -, starting with a letter or digit').describe('The tenant the token acts for.'),
    role: z.enum(TOKEN_ROLES).describe('admin: everything, every tenant; user: its tenant, no host-wide operation; reader: reads only; metrics: GET /metrics only.'),
    ttl_s: z.number().int().min(1).max(10 * 365 * 86400).nullable().optional().describe('Lifetime in seconds; absent or null: never expires.'),
    description: z.string().max(200).nullable().optional().describe('Free text shown by GET /v1/tokens.'),
  })
  .strict();

/** A token as listed: never its text or hash. Times are ms since the Unix epoch. */
export const TokenView = z.object({
  id: z.string().describe('16 hex: the first part of the token text after e2b_.'),
  tenant: z.string(),
  role: z.enum(TOKEN_ROLES),
  description: z.string().nullable(),
  created_at: z.number().int(),
  expires_at: z.number().int().nullable(),
  revoked_at: z.number().int().nullable(),
  state: z.enum(['active', 'expired', 'revoked']),
});

/** POST /v1/tokens response: the view plus the token text, shown this once. */
export const CreatedToken = TokenView.extend({ token: z.string().describe('e2b_ + 48 hex; only its hash is kept: it cannot be shown again.') });

/** GET /v1/whoami response: the caller as dsecd sees it (daemon/remote/door.ts Principal). */
export const Whoami = z.object({
  door: z.enum(['unix', 'tcp']),
  token_id: z.string().nullable().describe('The token that authenticated the request; null on the Unix socket.'),
  tenant: z.string(),
  role: z.enum(TOKEN_ROLES),
  peer: z.object({ name: z.string(), role: z.string().nullable(), fingerprint256: z.string() }).nullable().describe('The verified client certificate (mutual TLS), else null.'),
});

const whoamiRoute = route({ method: 'GET', url: '/v1/whoami', summary: 'The caller as dsecd sees it: door, token, tenant, role, client certificate.', status: 200, response: Whoami, errors: [] });
const createRoute = route({ method: 'POST', url: '/v1/tokens', summary: 'Create an API token for the TCP door (admin only); the answer holds the token text, shown once.', body: CreateTokenRequest, status: 201, response: CreatedToken, errors: ['InvalidArgument', 'PermissionDenied'] });
const listRoute = route({ method: 'GET', url: '/v1/tokens', summary: 'Every API token, without its text (admin only).', status: 200, response: z.object({ tokens: z.array(TokenView) }), errors: ['PermissionDenied'] });
const revokeRoute = route({ method: 'DELETE', url: '/v1/tokens/:id', summary: 'Revoke a token (admin only): refused from now on, and the connections it opened (attach, logs -f, events) are closed.', status: 200, response: TokenView, errors: ['NotFound', 'PermissionDenied'] });

/** Registers the token routes. */
/** What the token routes use: the token store of the TCP door (admin only, daemon/remote/policy.ts). */
export interface TokenRouteDeps {
  tokens: TokenService;
}

export function registerTokenRoutes(app: FastifyInstance, deps: TokenRouteDeps): void {
  app.get(whoamiRoute.url, async (req) => {
    const p = req.principal;
    return { door: p.door, token_id: p.tokenId, tenant: p.tenant, role: p.role, peer: p.peer };
  });
  app.post(createRoute.url, async (req, reply) => {
    const body = parseWith(CreateTokenRequest, req.body, 'token request');
    const { token, view } = await deps.tokens.create({ tenant: body.tenant, role: body.role, ttlMs: body.ttl_s ? body.ttl_s * 1000 : null, description: body.description ?? null });
    return reply.code(201).send({ ...view, token });
  });
  app.get(listRoute.url, async () => ({ tokens: await deps.tokens.list() }));
  app.delete<{ Params: { id: string } }>(revokeRoute.url, async (req) => deps.tokens.revoke(req.params.id));
}
