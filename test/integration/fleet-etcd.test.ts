/**
 * The registration's name claim against a real etcd: two hosts that claim one name at
 * the same moment from two ids end with exactly one registered and the other refused
 * (an etcd transaction, never a merge); and a large change of load is written at once.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import path from 'node:path';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openEtcd } from '../../daemon/fleet/etcd.js';
import { FleetKeys, HostLiveRecord, hostTag, parseRecord } from '../../daemon/fleet/layout.js';
import { largeChange, Registration, type FleetHostSource } from '../../daemon/fleet/registration.js';
import { startEtcd, type TestEtcd } from '../fixtures/etcd.js';
import type { Etcd3 } from 'etcd3';

const log = pino({ level: 'silent' });

function source(count: () => number): FleetHostSource {
  return {
    info: () => ({ backends: ['container'], capacity: { cores: 2, memory_bytes: 2 ** 34, disk_bytes: null }, admission: { max_sandboxes: 100, cpus: 200, memory_bytes: 2 ** 40, disk_bytes: null }, defaults: { cpus: 1, memory_bytes: 2 ** 29 }, version: 'test' }),
    load: () => ({ sandboxes: { running: count() }, admitted: { count: count(), cpus: count(), memory_bytes: 0, disk_bytes: 0 }, warm_pools: [], jobs: {}, untagged: 0 }),
    images: async () => [],
  };
}

function reg(etcd: Etcd3, keys: FleetKeys, id: string, n: () => number = () => 0): Registration {
  return new Registration({ etcd, keys, identity: { id, tag: hostTag(id), createdAt: 0 }, name: 'same', advertise: 'https://127.0.0.1:1', labels: {}, source: source(n), log });
}

describe('fleet registration against etcd', () => {
  let dir: string;
  let etcd: TestEtcd;
  let client: Etcd3;
  beforeAll(async () => {
    dir = mkdtempSync('/tmp/dsec-fleet-etcd-');
    etcd = await startEtcd({ dir: path.join(dir, 'etcd') });
    client = openEtcd({ endpoints: [etcd.url] });
  }, 60_000);
  afterAll(async () => {
    client?.close();
    await etcd?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('two claims of one name at once: one registered, one refused', async () => {
    const keys = new FleetKeys('/race');
    const a = reg(client, keys, 'aaaaaaaaaaaaaaaa'), b = reg(client, keys, 'bbbbbbbbbbbbbbbb');
    await Promise.all([a.start(), b.start()]);
    const states = [a.status().state, b.status().state].sort();
    expect(states).toEqual(['refused', 'registered']);
    const winner = a.status().state === 'registered' ? 'aaaaaaaaaaaaaaaa' : 'bbbbbbbbbbbbbbbb';
    expect(await client.get(keys.hostId('same')).string()).toBe(winner);
    const loser = a.status().state === 'refused' ? a : b;
    expect(loser.status().reason).toMatch(new RegExp(`registered in the fleet by host id ${winner}`));
    await Promise.all([a.stop(), b.stop()]);
  }, 60_000);

  it('writes live at once when the load moves a lot, not only at the refresh', async () => {
    const keys = new FleetKeys('/burst');
    let n = 0;
    const r = new Registration({ etcd: client, keys, identity: { id: 'cccccccccccccccc', tag: hostTag('cccccccccccccccc'), createdAt: 0 }, name: 'h', advertise: 'https://127.0.0.1:1', labels: {},
      source: source(() => n), log, refreshMs: 3_600_000, checkMs: 50 });
    await r.start();
    n = 40;
    for (;;) {
      const l = parseRecord(HostLiveRecord, await client.get(keys.hostLive('h')).string());
      if (l?.admitted.count === 40) break;
      await new Promise((res) => setTimeout(res, 50));
    }
    await r.stop();
    expect(largeChange({ admitted: { count: 40, cpus: 0, memory_bytes: 0, disk_bytes: 0 }, warm_pools: [] }, { admitted: { count: 42, cpus: 0, memory_bytes: 0, disk_bytes: 0 }, warm_pools: [] })).toBe(false);
    expect(largeChange({ admitted: { count: 40, cpus: 0, memory_bytes: 0, disk_bytes: 0 }, warm_pools: [] }, { admitted: { count: 44, cpus: 0, memory_bytes: 0, disk_bytes: 0 }, warm_pools: [] })).toBe(true);
  }, 60_000);
});
