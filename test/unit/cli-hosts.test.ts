/**
 * `dsec hosts` and `dsec host cordon|drain` against a stand-in gateway: the table (state
 * with cordoned/draining, CPU and memory of up hosts only), --json, the stale-view
 * warning, and the user error a dsecd (not a gateway) gets.
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { FleetHost } from '../../sdk/index.js';
import { fail, json, runCli, startFakeDsecd, type FakeDsecd } from '../fixtures/fake-dsecd.js';

function fakeHost(over: Partial<FleetHost> = {}): FleetHost {
  return {
    name: 'h1', id: '0123456789abcdef', state: 'up', since: 0, cordoned: false, draining: false, pool: 'default', labels: { zone: 'a' },
    advertise: 'https://10.88.0.11:8443', tag: '012345', version: '0.1.0', backends: ['container', 'fncall'], sandboxes: 4, by_state: { running: 4 },
    cpu: { cores: 2, busy: 0.25, load1: 0.5 }, memory: { total_bytes: 24 * 2 ** 30, available_bytes: 20 * 2 ** 30 },
    admitted: { count: 4, cpus: 4, memory_bytes: 2 ** 31 }, admission: { max_sandboxes: 16384, cpus: 2000, memory_bytes: 2 ** 40 }, reported_at: 0, ...over,
  };
}

describe('dsec hosts', () => {
  let fake: FakeDsecd;
  beforeEach(async () => { fake = await startFakeDsecd(); });
  afterEach(async () => { await fake.close(); });

  it('prints one row per host; down hosts show no load; cordon and drain show in STATE', async () => {
    fake.routes['GET /v1/hosts'] = (_req, res) => json(res, 200, {
      hosts: [fakeHost(), fakeHost({ name: 'h2', state: 'down', cordoned: true, labels: { pool: 'burst' }, pool: 'burst' }), fakeHost({ name: 'h3', cordoned: true, draining: true })],
      view: { gateway: 'gw1', fresh: true, stale_since: null },
    });
    const r = await runCli(['hosts'], { socket: fake.socketPath });
    expect(r.code).toBe(0);
    const lines = r.out.trim().split('\n');
    expect(lines[0]).toMatch(/^NAME\s+POOL\s+STATE\s+SANDBOXES\s+CPU\s+MEM\s+BACKENDS\s+LABELS$/);
    expect(lines[1]).toMatch(/^h1\s+default\s+up\s+4\s+25% of 2\s+20GiB\/24GiB\s+container,fncall\s+zone=a$/);
    expect(lines[2]).toMatch(/^h2\s+burst\s+down,cordoned\s+4\s+-\s+-\s+container,fncall\s+-$/);
    expect(lines[3]).toMatch(/^h3\s+default\s+up,draining\s/);
    expect(r.err).toBe('');
    const j = await runCli(['--json', 'hosts'], { socket: fake.socketPath });
    expect(JSON.parse(j.out).hosts).toHaveLength(3);
  });

  it('warns when the gateway\'s view is stale', async () => {
    fake.routes['GET /v1/hosts'] = (_req, res) => json(res, 200, { hosts: [fakeHost()], view: { gateway: 'gw1', fresh: false, stale_since: Date.UTC(2026, 0, 1) } });
    const r = await runCli(['hosts'], { socket: fake.socketPath });
    expect(r.code).toBe(0);
    expect(r.err).toBe('dsec: warning: gateway gw1 cannot reach etcd since 2026-01-01T00:00:00.000Z: this is the last known state\n');
  });

  it('tells a dsecd from a gateway', async () => {
    fake.routes['GET /v1/hosts'] = fail(404, 'NotFound', 'no route GET /v1/hosts');
    const r = await runCli(['hosts'], { socket: fake.socketPath });
    expect(r.code).not.toBe(0);
    expect(r.err).toMatch(/not a gateway/);
    expect(r.err).toMatch(/dsec-gateway/);
  });

  it('cordons and drains a host, listing what is left', async () => {
    fake.routes['POST /v1/hosts/:name/cordon'] = (req, res) => json(res, 200, fakeHost({ name: req.params.name, cordoned: true }));
    fake.routes['POST /v1/hosts/:name/drain'] = (req, res) => json(res, 200, { host: fakeHost({ name: req.params.name, cordoned: true, draining: true }), left: [{ id: 'aaaaaaaaaaaaaaaa', state: 'running', labels: { job: 'a' } }] });
    const c = await runCli(['host', 'cordon', 'h2'], { socket: fake.socketPath });
    expect(c.out).toBe('h2: up,cordoned\n');
    const d = await runCli(['host', 'drain', 'h2'], { socket: fake.socketPath });
    expect(d.out).toBe('h2: up,draining; 1 sandbox(es) left\naaaaaaaaaaaaaaaa  running  job=a\n');
  });
});
