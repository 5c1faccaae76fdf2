import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, TestDaemon } from './harness.js';

describe.skipIf(!IS_ROOT)('microvm smoke', () => {
  let d: TestDaemon;
  beforeAll(async () => { d = await TestDaemon.start({ slot: 90 }); });
  afterAll(async () => { await d?.cleanup(); });
  it('boots', async () => {
    const t0 = Date.now();
    const sb = await d.client.createSandbox({ image: 'busybox', backend: 'microvm' });
    console.log('create ms', Date.now() - t0, sb);
    const r = await d.client.exec(sb.id, { argv: ['uname', '-r'] });
    console.log(r.stdout.toString(), r.stderr.toString());
    console.log(JSON.stringify((await d.client.hostInfo()).features), JSON.stringify((await d.client.hostInfo()).backends));
    console.log(await d.client.sandboxStats(sb.id));
    await d.client.deleteSandbox(sb.id, { force: true });
    console.log(await d.traces());
  });
});
