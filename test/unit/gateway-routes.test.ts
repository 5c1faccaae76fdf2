/**
 * Every route of dsecd's API has a class in the gateway (gateway/server.ts classify), read
 * from the route table itself: a route added to dsecd fails here until the gateway
 * knows how to answer it (route it, place it, fan it out, or refuse it on purpose).
 */
import { describe, expect, it } from 'vitest';
import '../../daemon/api/server.js';
import { ROUTE_DOCS } from '../../daemon/api/routes/table.js';
import { classify } from '../../gateway/server.js';
import type { GatewayContext } from '../../gateway/context.js';
import { imageSomewhere } from '../../gateway/create.js';
import { imageSetOf } from '../../gateway/table.js';

/** Routes the gateway refuses on purpose, and why. */
const REFUSED: Record<string, string> = {
  'DELETE /v1/sandboxes': 'dsecd answers it 405 (destroy one id, or bulk by selector)',
  'GET /v1/layers/:digest/blob': 'a gateway relays blobs between hosts itself when it copies an image (gateway/image-copy.ts)',
  'PUT /v1/layers/:digest/blob': 'a gateway relays blobs between hosts itself when it copies an image (gateway/image-copy.ts)',
  'POST /v1/sandboxes:ack': 'a gateway sends it to hosts itself, after it delivered a create answer (gateway/idempotency.ts)',
  'GET /v1/run/channel': 'a channel would pin one host for all its calls; the gateway places each POST /v1/run and /v1/run:batch call itself',
};

describe('gateway route classes', () => {
  it('classifies every route of the table', () => {
    const unclassified = ROUTE_DOCS.map((r) => `${r.method} ${r.url}`).filter((k) => classify(k.split(' ')[0], k.split(' ')[1]) === 'none' && !(k in REFUSED));
    expect(unclassified).toEqual([]);
  });
  it('routes sandbox and snapshot paths by id, places creates, fans out lists and bulk', () => {
    expect(classify('POST', '/v1/sandboxes/:id/exec')).toBe('sandbox');
    expect(classify('GET', '/v1/sandboxes/:id/execs/:exec_id/attach')).toBe('sandbox');
    expect(classify('POST', '/v1/snapshots/:ref/fork')).toBe('snapshot');
    expect(classify('POST', '/v1/sandboxes')).toBe('create');
    expect(classify('POST', '/v1/run')).toBe('create');
    expect(classify('GET', '/v1/sandboxes')).toBe('list');
    expect(classify('POST', '/v1/sandboxes/bulk')).toBe('bulk');
    expect(classify('GET', '/v1/events')).toBe('events');
    expect(classify('POST', '/v1/images/import')).toBe('pinned');
  });
});

describe("the gateway's image check (image names per tenant)", () => {
  /** A gateway context with one up host reporting `images` (the fields imageSomewhere reads). */
  const ctxWith = (images: { ref: string; digest: string | null; tenant?: string }[]) => {
    const record = { id: '0'.repeat(16), images };
    const e = { state: 'up', images: record, imageSet: imageSetOf(record) };
    return { table: { hosts: new Map([['h1', e]]) } } as unknown as GatewayContext;
  };

  it("finds a system image for every tenant and a tenant's own image for that tenant only", () => {
    const ctx = ctxWith([{ ref: 'busybox:latest', digest: null }, { ref: 'app:v1', digest: null, tenant: 'team-a' }]);
    expect(() => imageSomewhere(ctx, 'busybox:latest', 'team-b')).not.toThrow();
    expect(() => imageSomewhere(ctx, 'app:v1', 'team-a')).not.toThrow();
    expect(() => imageSomewhere(ctx, 'app:v1', 'team-b')).toThrow(/image app:v1 is on none of the fleet's 1 up hosts/);
    expect(() => imageSomewhere(ctx, 'app:v1', 'system')).toThrow(/image app:v1 is on none/);
  });
});
