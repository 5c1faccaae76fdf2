/**
 * API tokens of dsecd's TCP door (docs/SECURITY.md "The TCP door"): create, list, revoke
 * (admin only: the Unix socket or an admin token), and who the caller is.
 */
import type { CreatedToken, CreateTokenInput, TokenInfo, Whoami } from './types.js';
import type { TransportClass } from './transport.js';

/** Mixes the token calls into a {@link Transport} class (composed into DsecClient by sdk/client.ts). */
export function withTokenCalls<B extends TransportClass>(Base: B) {
  return class TokenCalls extends Base {
    /**
     * POST /v1/tokens: makes a token for `tenant` with `role` (`ttl_s` seconds of life,
     * none: never expires). The answer's `token` is the text, shown this once.
     * Errors: `InvalidArgument`, `PermissionDenied` (not an admin).
     */
    createToken(input: CreateTokenInput): Promise<CreatedToken> {
      return this.request<CreatedToken>('POST', '/v1/tokens', input);
    }

    /** GET /v1/tokens: every token, never its text. Errors: `PermissionDenied`. */
    async listTokens(): Promise<TokenInfo[]> {
      return (await this.request<{ tokens: TokenInfo[] }>('GET', '/v1/tokens')).tokens;
    }

    /**
     * DELETE /v1/tokens/{id}: revokes a token: refused from now on, and the connections it
     * opened (attach, logs, events) are closed. Errors: `NotFound`, `PermissionDenied`.
     */
    revokeToken(id: string): Promise<TokenInfo> {
      return this.request<TokenInfo>('DELETE', `/v1/tokens/${encodeURIComponent(id)}`);
    }

    /** GET /v1/whoami: the caller as dsecd sees it (door, token, tenant, role, client certificate). */
    whoami(): Promise<Whoami> {
      return this.request<Whoami>('GET', '/v1/whoami');
    }
  };
}
