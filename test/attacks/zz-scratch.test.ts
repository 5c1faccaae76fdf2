import { afterAll, beforeAll, it } from 'vitest';
import { TestDaemon, postJson } from '../integration/harness.js';
let d: TestDaemon;
beforeAll(async () => { d = await TestDaemon.start({ slot: 30, config: '[fncall]\nmax_workers = 1\nmin_idle = 1\npids = 64\n' }); });
afterAll(async () => { await d?.cleanup(); });
it('explore', async () => {
  for (let i = 0; i < 3; i++) {
    const r: any = await postJson(d, '/v1/run', { backend: 'fncall', argv: ['sh', '-c', 'b() { b | b & }; b; sleep 1; echo survived'], timeout_ms: 3000 });
    console.log(JSON.stringify({ ...r, stdout: Buffer.from(r.stdout_b64, 'base64').toString(), stderr: Buffer.from(r.stderr_b64, 'base64').toString().slice(0, 300) }));
  }
  const r: any = await postJson(d, '/v1/run', { backend: 'fncall', argv: ['sh', '-c', 'echo x > /proc/self/comm; echo $?; echo y > /tmp/a && cat /tmp/a; touch /etc/x; stty -F /dev/null'] });
  console.log(Buffer.from(r.stdout_b64, 'base64').toString(), Buffer.from(r.stderr_b64, 'base64').toString());
});
