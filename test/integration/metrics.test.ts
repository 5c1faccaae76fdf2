/** Prometheus metrics on the API socket and on a configured TCP address. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import http from 'node:http';
import { IS_ROOT, TestDaemon } from './harness.js';
import { freePort } from '../fixtures/ports.js';


describe.skipIf(!IS_ROOT)('metrics', () => {
  let d: TestDaemon;
  let port: number;
  beforeAll(async () => {
    port = await freePort();
    d = await TestDaemon.start({ slot: 17, config: `[metrics]\naddress = "127.0.0.1:${port}"\n` });
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('counts sandboxes by state, create and exec latency, and errors by kind', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    await d.client.exec(sb.id, { argv: ['true'] });
    await d.client.getSandbox('0000000000000000').catch(() => {});
    const text = await new Promise<string>((resolve, reject) => {
      http.get({ socketPath: d.socket, path: '/metrics' }, (res) => {
        let b = '';
        res.on('data', (c) => (b += c));
        res.on('end', () => resolve(b));
      }).on('error', reject);
    });
    expect(text).toMatch(/^dsec_sandboxes\{state="running"\} 1$/m);
    expect(text).toMatch(/^dsec_sandbox_create_seconds_count\{backend="container"\} 1$/m);
    expect(text).toMatch(/^dsec_exec_seconds_count 1$/m);
    expect(text).toMatch(/^dsec_api_errors_total\{code="NotFound"\} 1$/m);
    expect(text).toMatch(/^dsec_process_resident_memory_bytes \d+/m);
    const tcp = await fetch(`http://127.0.0.1:${port}/metrics`);
    expect(tcp.status).toBe(200);
    expect(await tcp.text()).toMatch(/^dsec_sandboxes\{state="running"\} 1$/m);
    // The TCP address serves metrics only, never the API.
    expect((await fetch(`http://127.0.0.1:${port}/v1/sandboxes`)).status).toBe(404);
    await d.client.deleteSandbox(sb.id, { force: true });
  });
});
