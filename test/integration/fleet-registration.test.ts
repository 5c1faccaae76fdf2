/**
 * dsecd --etcd against a real etcd (Debian's etcd 3.4, on loopback): the host claims its
 * name for its persistent id by transaction, writes info and live records (live under a
 * lease), tags the ids of what it creates, refuses a second dsecd that claims its name
 * from another id, keeps serving while etcd is gone and registers again when it is back,
 * and leaves the fleet at once on a clean stop.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Etcd3 } from 'etcd3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, TestDaemon, out, REPO } from './harness.js';
import { freePort, startEtcd, type TestEtcd } from '../fixtures/etcd.js';
import { issueCert, loadFleetCa, makeFleetCa } from '../../pki/certs.js';
import { FleetKeys, HostInfoRecord, HostLiveRecord, hostTag, parseRecord } from '../../daemon/fleet/layout.js';
import { execa } from 'execa';

const run = IS_ROOT ? describe : describe.skip;

/** Polls `f` until it returns a value other than undefined (the test's own timeout bounds it). */
async function until<T>(f: () => Promise<T | undefined>, pauseMs = 100): Promise<T> {
  for (;;) {
    const v = await f().catch(() => undefined);
    if (v !== undefined) return v;
    await new Promise((r) => setTimeout(r, pauseMs));
  }
}

/** Waits until dsecd's host info says its registration holds (the API answers before the first attempt ends). */
async function registered(d: TestDaemon): Promise<void> {
  await until(async () => ((await d.client.hostInfo() as unknown as { fleet: { state: string } }).fleet.state === 'registered' ? true : undefined), 100);
}

run('fleet registration (real etcd)', () => {
  let dir: string;
  let etcd: TestEtcd;
  let client: Etcd3;
  let d: TestDaemon;
  const keys = new FleetKeys(`/t${process.pid}`);
  let port = 0;
  /** A fleet host's flags: its TLS door (its fleet certificate, the fleet CA) and etcd. */
  const fleetArgs = () => ['--listen', `127.0.0.1:${port}`, '--tls-cert', path.join(dir, 'r1.crt'), '--tls-key', path.join(dir, 'r1.key'), '--tls-ca', path.join(dir, 'ca', 'ca.crt'),
    '--etcd', etcd.url, '--etcd-prefix', keys.prefix, '--advertise', 'https://127.0.0.1:9', '--host-name', 'r1', '--host-label', 'pool=main', '--host-label', 'zone=a'];

  beforeAll(async () => {
    dir = mkdtempSync('/tmp/dsec-fleet-reg-');
    await makeFleetCa(path.join(dir, 'ca'));
    const leaf = await issueCert(loadFleetCa(path.join(dir, 'ca')), { name: 'r1', role: 'host', ips: ['127.0.0.1'], usage: ['server', 'client'], days: 1 });
    writeFileSync(path.join(dir, 'r1.crt'), leaf.cert);
    writeFileSync(path.join(dir, 'r1.key'), leaf.key, { mode: 0o600 });
    port = await freePort();
    etcd = await startEtcd({ dir: path.join(dir, 'etcd') });
    client = new Etcd3({ hosts: etcd.url });
    d = await TestDaemon.start({ slot: 0, args: fleetArgs() });
    await registered(d);
  }, 120_000);

  afterAll(async () => {
    client?.close();
    await d?.cleanup();
    await etcd?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('claims its name for its persistent id and writes info and live (under a lease)', async () => {
    const ident = JSON.parse(readFileSync(path.join(d.root, 'fleet', 'host.json'), 'utf8')) as { id: string };
    expect(await client.get(keys.hostId('r1')).string()).toBe(ident.id);
    const info = parseRecord(HostInfoRecord, await client.get(keys.hostInfo('r1')).string());
    expect(info).toMatchObject({ id: ident.id, name: 'r1', tag: hostTag(ident.id), advertise: 'https://127.0.0.1:9', labels: { pool: 'main', zone: 'a' } });
    expect(info!.backends).toContain('container');
    expect(info!.capacity.cores).toBeGreaterThan(0);
    const liveKv = await client.get(keys.hostLive('r1')).exec();
    expect(liveKv.kvs).toHaveLength(1);
    expect(Number(liveKv.kvs[0].lease)).not.toBe(0);
    expect(parseRecord(HostLiveRecord, liveKv.kvs[0].value)).not.toBeNull();
    const host = await d.client.hostInfo() as unknown as { fleet: { state: string; host_id: string; tag: string } };
    expect(host.fleet).toMatchObject({ state: 'registered', host_id: ident.id, tag: hostTag(ident.id) });
  });

  it('begins the ids of its sandboxes with its tag and reports them in live', async () => {
    const ident = JSON.parse(readFileSync(path.join(d.root, 'fleet', 'host.json'), 'utf8')) as { id: string };
    const sb = await d.client.createSandbox({ image: 'busybox', labels: { job: 'reg-job' } });
    try {
      expect(sb.id).toMatch(/^[0-9a-f]{16}$/);
      expect(sb.id.slice(0, 6)).toBe(hostTag(ident.id));
      const live = await until(async () => {
        const l = parseRecord(HostLiveRecord, await client.get(keys.hostLive('r1')).string());
        // A record written while the create was still running counts the sandbox as
        // creating: wait for one that has it running.
        return l && l.admitted.count >= 1 && l.jobs['reg-job'] === 1 && (l.sandboxes.running ?? 0) >= 1 ? l : undefined;
      });
      expect(live.sandboxes.running).toBeGreaterThanOrEqual(1);
      expect(live.jobs['reg-job']).toBe(1);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('refuses a second dsecd that claims the name from another id, and leaves the claim alone', async () => {
    const before = await client.get(keys.hostId('r1')).string();
    const root = mkdtempSync('/tmp/dsec-fleet-reg2-');
    try {
      const r = await execa(path.join(REPO, 'bin/dsecd'), ['--root', root, '--socket', path.join(root, 's.sock'), ...fleetArgs()], { reject: false, env: { DSEC_LOG_LEVEL: 'silent' }, timeout: 120_000 });
      expect(r.exitCode).toBe(1);
      expect(r.stderr).toMatch(/host name r1 is registered in the fleet by host id [0-9a-f]{16}, not by this host/);
      expect(await client.get(keys.hostId('r1')).string()).toBe(before);
    } finally {
      // The refused dsecd made state under its root (cgroups, store): purge it as any test daemon.
      await execa(path.join(REPO, 'bin/dsecd'), ['--root', root, '--socket', path.join(root, 's.sock'), '--purge'], { reject: false, env: { DSEC_LOG_LEVEL: 'silent' } });
      rmSync(root, { recursive: true, force: true });
    }
  }, 240_000);

  it('keeps serving without etcd, and registers again when etcd is back', async () => {
    await etcd.kill9();
    // The lease lapses on the host's side once keep-alives fail for its TTL.
    await until(async () => {
      const f = (await d.client.hostInfo() as unknown as { fleet: { state: string } }).fleet;
      return f.state === 'lost' ? f : undefined;
    }, 250);
    const sb = await d.client.createSandbox({ image: 'busybox' });
    const r = await d.client.exec(sb.id, { argv: ['echo', 'no etcd needed'] });
    expect(out(r)).toBe('no etcd needed\n');
    await etcd.restart();
    await until(async () => {
      const f = (await d.client.hostInfo() as unknown as { fleet: { state: string } }).fleet;
      return f.state === 'registered' ? f : undefined;
    }, 250);
    const live = parseRecord(HostLiveRecord, await client.get(keys.hostLive('r1')).string());
    expect(live?.admitted.count).toBeGreaterThanOrEqual(1);
    await d.client.deleteSandbox(sb.id, { force: true });
  }, 120_000);

  it('stops on SIGTERM while etcd is unreachable (no watch or retry keeps it alive)', async () => {
    await etcd.kill9();
    await d.stop();
    expect(d.proc!.exitCode).toBe(0);
    await etcd.restart();
    await d.launch();
    await registered(d);
  }, 120_000);

  it('a clean stop revokes the lease at once; the name claim and info stay', async () => {
    await d.stop();
    expect((await client.get(keys.hostLive('r1')).exec()).kvs).toHaveLength(0);
    expect(await client.get(keys.hostId('r1')).string()).not.toBeNull();
    expect(await client.get(keys.hostInfo('r1')).string()).not.toBeNull();
    await d.launch();
    await registered(d);
    expect((await client.get(keys.hostLive('r1')).exec()).kvs).toHaveLength(1);
  }, 120_000);
});
