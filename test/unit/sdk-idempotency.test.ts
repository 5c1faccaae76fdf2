/**
 * The SDK's creates carry an Idempotency-Key (sdk/transport.ts keyedCreate): a fresh one
 * per logical create, the same one on its retries after a lost answer (the connection
 * dropped, or a 503), none reused across creates; a caller's own key is sent as given.
 */
import { describe, expect, it } from 'vitest';
import { sdkFixtures, fakeSandbox, json } from '../fixtures/fake-dsecd.js';

const { fake: fakeDsecd, client } = sdkFixtures();

describe('SDK creates and their idempotency keys', () => {
  it('retries a create whose answer was lost with the same key; the next create has another', async () => {
    let n = 0;
    const f = await fakeDsecd((_req, res) => {
      n++;
      if (n === 1) {
        // The answer is lost: the connection drops before any response.
        res.socket?.destroy();
        return;
      }
      if (n === 2) return json(res, 503, { error: { code: 'Unavailable', message: 'gateway restarting' } });
      return json(res, 201, fakeSandbox());
    });
    const c = client(f);
    expect((await c.createSandbox({ image: 'busybox' })).id).toBe(fakeSandbox().id);
    await c.createSandbox({ image: 'busybox' });
    const keys = f.seen.map((s) => s.headers['idempotency-key']);
    expect(keys).toHaveLength(4);
    expect(keys[0]).toMatch(/^[0-9a-f-]{36}$/);
    expect(keys[1]).toBe(keys[0]);
    expect(keys[2]).toBe(keys[0]);
    expect(keys[3]).not.toBe(keys[0]);
  });

  it('sends the caller\'s key on create, restore and fork, and does not retry an error answer', async () => {
    const f = await fakeDsecd((req, res) => {
      if (req.url?.endsWith('/fork')) return json(res, 429, { error: { code: 'ResourceExhausted', message: 'full' } });
      return json(res, 201, fakeSandbox());
    });
    const c = client(f);
    await c.createSandbox({}, { idempotencyKey: 'k-create' });
    await c.restore('snap', {}, { idempotencyKey: 'k-restore' });
    await expect(c.fork('snap', { count: 2 }, { idempotencyKey: 'k-fork' })).rejects.toMatchObject({ code: 'ResourceExhausted' });
    expect(f.seen.map((s) => s.headers['idempotency-key'])).toEqual(['k-create', 'k-restore', 'k-fork']);
    expect(f.seen.map((s) => s.headers['x-dsec-burst'])).toEqual([undefined, undefined, undefined]);
    await c.createSandbox({}, { allowBurst: true });
    expect(f.seen[3].headers['x-dsec-burst']).toBe('allow');
  });
});
