/**
 * Slot leases of throwaway dsecds (test/fixtures/slots.ts): a slot whose uid pool or
 * builder range a live registered dsecd still holds is never handed out, even when the
 * process that leased it is gone (a dsecd that outlived its test made a whole CI run's
 * daemons refuse to start: "uid pool ... overlaps instance ...").
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

const registry = mkdtempSync(path.join(os.tmpdir(), 'dsec-slots-registry-'));
// The registry dir is read when daemon/host/instances.ts loads: set it before the import.
process.env.DSEC_REGISTRY_DIR = registry;
const slots = await import('../fixtures/slots.js');

afterAll(() => rmSync(registry, { recursive: true, force: true }));

describe('leaseSlot', () => {
  it('skips every slot whose uid pool or builder range a live registered instance holds', () => {
    // This process stands in for a dsecd left running: it holds the first free slot's pool
    // and the next slot's builder range.
    const first = slots.leaseSlot();
    slots.releaseSlot(first);
    writeFileSync(path.join(registry, 'a.json'), JSON.stringify({ pid: process.pid, uid_pool: slots.uidPoolForSlot(first) }));
    writeFileSync(path.join(registry, 'b.json'), JSON.stringify({ pid: process.pid, builder: slots.builderRangeForSlot(first + 1) }));
    // A dead instance's entry holds nothing.
    writeFileSync(path.join(registry, 'c.json'), JSON.stringify({ pid: 2 ** 22 + 1, uid_pool: slots.uidPoolForSlot(first + 2) }));
    const s = slots.leaseSlot();
    try {
      expect(s).not.toBe(first);
      expect(s).not.toBe(first + 1);
    } finally {
      slots.releaseSlot(s);
    }
  });
});
