/**
 * Issue 9's acceptance: one one-shot run call (POST /v1/run), changing only `backend`,
 * across the four tiers fncall, container, microvm and vm, gives the same result shape and
 * output. Each non-fncall run creates a sandbox, runs the command and destroys it on the
 * server side; nothing is left after.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync } from 'node:fs';
import { GUEST_KERNEL, IS_ROOT, TestDaemon, postJson } from './harness.js';

const HAS_VMS = existsSync('/usr/bin/qemu-system-x86_64') && existsSync(GUEST_KERNEL) && existsSync('/usr/share/seabios/bios-256k.bin');

describe.skipIf(!IS_ROOT || !HAS_VMS)('POST /v1/run across the four tiers', () => {
  let d: TestDaemon;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 98, config: '[vm]\naccel = "tcg"\n' });
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('the same body, only backend changed: stdout "hi\\n", exit 3, the same result shape on fncall, container, microvm and vm', async () => {
    const results: Record<string, Record<string, unknown>> = {};
    for (const backend of ['fncall', 'container', 'microvm', 'vm'] as const) {
      const t0 = performance.now();
      const r = await postJson<Record<string, unknown>>(d, '/v1/run', { backend, image: 'busybox', argv: ['sh', '-c', 'echo hi; exit 3'], memory_bytes: 256 * 2 ** 20 });
      console.log(`run ${backend}: ${(performance.now() - t0).toFixed(0)} ms`);
      results[backend] = r;
      expect(Buffer.from(r.stdout_b64 as string, 'base64').toString(), backend).toBe('hi\n');
      expect(Buffer.from(r.stderr_b64 as string, 'base64').toString(), backend).toBe('');
      expect(r.exit_code, backend).toBe(3);
      expect(r.signal, backend).toBeNull();
      expect(r.timed_out, backend).toBe(false);
    }
    const shape = Object.keys(results.fncall).sort();
    for (const b of ['container', 'microvm', 'vm']) expect(Object.keys(results[b]).sort(), b).toEqual(shape);
    // One-shot sandboxes are gone; only the fncall pool's workers remain.
    const t = await d.traces();
    const rows = (await d.client.listSandboxes()).filter((s) => s.backend !== 'fncall');
    expect(rows).toEqual([]);
    expect(t.mounts.length).toBeLessThanOrEqual(t.rows.length);
  });
});
