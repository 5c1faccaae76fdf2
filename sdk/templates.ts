/**
 * E2B template aliases (docs/E2B.md): which dsec image and backend an E2B `templateID`
 * creates. Listing is open to any reader; setting and removing are admin operations.
 */
import type { Backend, E2bTemplate } from './types.js';
import type { TransportClass } from './transport.js';

/** Mixes the template calls into a {@link Transport} class (composed into DsecClient by sdk/client.ts). */
export function withTemplateCalls<B extends TransportClass>(Base: B) {
  return class TemplateCalls extends Base {
    /**
     * GET /v1/templates: the E2B template aliases (name -> image and backend) and the
     * built-in `base` when no alias replaces it. Errors: `Unimplemented` when the
     * daemon's E2B front is off.
     */
    async listTemplates(): Promise<E2bTemplate[]> {
      return (await this.request<{ templates: E2bTemplate[] }>('GET', '/v1/templates')).templates;
    }

    /**
     * PUT /v1/templates/{name}: makes `name` an E2B template for `image` on `backend`
     * (default container), replacing an alias of that name (admin only). Errors:
     * `InvalidArgument` (malformed name), `NotFound` (no such image), `PermissionDenied`.
     */
    setTemplate(name: string, image: string, backend?: Backend): Promise<E2bTemplate> {
      return this.request<E2bTemplate>('PUT', `/v1/templates/${encodeURIComponent(name)}`, { image, ...(backend ? { backend } : {}) });
    }

    /** DELETE /v1/templates/{name}: removes an alias (admin only); resolves with what it was. Errors: `NotFound`, `PermissionDenied`. */
    removeTemplate(name: string): Promise<E2bTemplate> {
      return this.request<E2bTemplate>('DELETE', `/v1/templates/${encodeURIComponent(name)}`);
    }
  };
}
