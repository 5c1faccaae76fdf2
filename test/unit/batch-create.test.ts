/**
 * The pure parts of batched creates: the per-sandbox idempotency keys
 * (daemon/sandbox/create-records.ts itemKeys), the batch request's shape
 * (daemon/api/wire/batch.ts), and admission's reservations (daemon/sandbox/admission.ts
 * reserve), which count a create admitted but not yet in the store so that concurrent
 * creates cannot pass a limit together.
 */
import { describe, expect, it } from 'vitest';
import { CreateSandboxesRequest } from '../../daemon/api/schema.js';
import { Admission } from '../../daemon/sandbox/admission.js';
import { itemKeys } from '../../daemon/sandbox/create-records.js';

describe('itemKeys', () => {
  it('derives K/i from the header, takes body keys as given, and refuses both or a key too long to derive from', () => {
    expect(itemKeys('abc', undefined, 3)).toEqual(['abc/0', 'abc/1', 'abc/2']);
    expect(itemKeys(undefined, ['x', 'y'], 2)).toEqual(['x', 'y']);
    expect(itemKeys(undefined, undefined, 2)).toEqual([null, null]);
    expect(() => itemKeys('abc', ['x'], 1)).toThrow(/not both/);
    expect(() => itemKeys('a b', undefined, 1)).toThrow(/visible ASCII/);
    expect(itemKeys('k'.repeat(253), undefined, 10)[9]).toBe(`${'k'.repeat(253)}/9`);
    expect(() => itemKeys('k'.repeat(253), undefined, 11)).toThrow(/at most 255/);
  });
});

describe('CreateSandboxesRequest', () => {
  it('takes {count, spec} or {items}, 1 to 1,000, keys one per sandbox', () => {
    expect(CreateSandboxesRequest.safeParse({ count: 3 }).success).toBe(true);
    expect(CreateSandboxesRequest.safeParse({ count: 3, spec: { image: 'busybox' }, keys: ['a', 'b', 'c'] }).success).toBe(true);
    expect(CreateSandboxesRequest.safeParse({ items: [{}, { image: 'x' }] }).success).toBe(true);
    for (const bad of [{}, { count: 0 }, { count: 1001 }, { items: [] }, { count: 1, items: [{}] }, { items: [{}], spec: {} }, { count: 2, keys: ['a'] }, { count: 1, other: 1 }]) {
      expect(CreateSandboxesRequest.safeParse(bad).success, JSON.stringify(bad)).toBe(false);
    }
  });
});

describe('Admission.reserve', () => {
  it('counts admitted creates until released, for the host and the tenant', () => {
    const stored = { count: 0, memoryBytes: 0, cpus: 0, diskBytes: 0 };
    const adm = new Admission({
      config: { admission: { maxSandboxes: 2, memoryOvercommit: 1e9, cpuOvercommit: 1e9, diskOvercommit: 1e9 }, quotas: { default: null, tenants: { t: { sandboxes: 1, cpus: null, memoryBytes: null } } } } as never,
      storage: { capacityBytes: () => null, location: 'x' } as never,
      repo: { admissionTotals: () => stored },
    });
    const res = { cpus: 1, memoryBytes: 100, pids: 10, diskBytes: null, io: null } as never;
    const caps = { storeDisk: false };
    const a = adm.reserve(res, caps, 1, 'system');
    const b = adm.reserve(res, caps, 1, 'system');
    // Two admitted and not yet in the store: a third does not fit.
    expect(() => adm.reserve(res, caps, 1, 'system')).toThrow(/limit of 2 sandboxes/);
    a();
    a(); // idempotent
    const c = adm.reserve(res, caps, 1, 't');
    b();
    // Tenant t's pending one counts against its quota of 1.
    expect(() => adm.reserve(res, caps, 1, 't')).toThrow(/tenant t is at its quota of 1/);
    c();
    adm.reserve(res, caps, 1, 't')();
  });
});
