/**
 * The benchmarks' throwaway dsecds (bench/lib.ts tempDaemon) run beside the host's own
 * dsecd: `npm run bench` right after the README's install, which leaves a dsecd on the
 * default uid pool and builder range running, must not be refused for overlapping ranges.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, TestDaemon } from './harness.js';
import { DEFAULT_BUILDER_RANGE } from '../../daemon/host/builder.js';
import { leaseSlot, releaseSlot, uidPoolForSlot } from '../fixtures/slots.js';
import { tempDaemon, type TempDaemon } from '../../bench/lib.js';

describe.skipIf(!IS_ROOT)('benchmark daemons beside an installed dsecd', () => {
  /** A dsecd on a private root holding the default builder range, as an installed one does; null when a live instance holds it already. */
  let installed: TestDaemon | null = null;
  let slot = -1;
  let bench: TempDaemon | null = null;

  beforeAll(async () => {
    try {
      installed = await TestDaemon.start({ slot: 41, config: `[builder]\nbase = ${DEFAULT_BUILDER_RANGE.base}\nsize = ${DEFAULT_BUILDER_RANGE.size}\n` });
    } catch (e) {
      // The host's own dsecd (or another on the defaults) holds the range: that is the case under test.
      if (!/builder range \[\d+, \d+\) overlaps instance \S+ builder range/.test((e as Error).message)) throw e;
    }
    slot = leaseSlot();
  });
  afterAll(async () => {
    await bench?.stop();
    await installed?.cleanup();
    if (slot >= 0) releaseSlot(slot);
  });

  it('starts with a builder range of its own while another instance holds the default one', async () => {
    // A pool of its own, as every benchmark gives (bench/all.ts passes a bigger one).
    bench = await tempDaemon('dsec-bench-ranges-', uidPoolForSlot(slot));
    const info = await bench.client.hostInfo();
    expect(info.uid_pool.base).toBe(uidPoolForSlot(slot).base);
    const sb = await bench.client.createSandbox({ image: 'busybox' });
    const r = await bench.client.exec(sb.id, { argv: ['true'] });
    expect(r.exit_code).toBe(0);
    await bench.client.deleteSandbox(sb.id, { force: true });
  });
});
