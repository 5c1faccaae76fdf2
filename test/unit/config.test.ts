import { describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { instanceNameFor, loadConfig } from '../../daemon/config.js';
import { Failpoints, FAILPOINTS } from '../../daemon/sandbox/failpoints.js';
import { Admission } from '../../daemon/sandbox/admission.js';

describe('config', () => {
  it('defaults, and flags beat env beat file', () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'dsec-cfg-'));
    try {
      const f = path.join(dir, 'c.toml');
      writeFileSync(f, 'root = "/from/file"\nsocket = "/file.sock"\n[defaults]\ncpus = 2\n');
      const c = loadConfig({ config: f, env: { DSEC_ROOT: '/from/env' } });
      expect(c.root).toBe('/from/env');
      expect(c.socket).toBe('/file.sock');
      expect(c.defaults.cpus).toBe(2);
      expect(loadConfig({ config: f, root: '/flag', env: { DSEC_ROOT: '/from/env' } }).root).toBe('/flag');
      const d = loadConfig({ env: {}, config: undefined });
      expect(d.uidPool).toEqual({ base: 2 ** 31, size: 2 ** 30, rangeSize: 65536 });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
  it('disk pool and I/O keys: defaults, values, and bad values refused', () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'dsec-cfg-'));
    try {
      const d = loadConfig({ env: {}, config: undefined });
      expect(d.admission.diskOvercommit).toBe(100);
      expect(d.storage.reserveBytes).toBeNull();
      expect(d.defaults.io).toEqual({ weight: 100, readBps: null, writeBps: null, readIops: null, writeIops: null });
      const f = path.join(dir, 'c.toml');
      writeFileSync(f, '[admission]\ndisk_overcommit = 1.5\n[storage]\nreserve_bytes = 0\n[defaults]\nio_weight = 50\n[defaults.io_max]\nwrite_bps = 1048576\nread_iops = 200\n');
      const c = loadConfig({ config: f, env: {} });
      expect(c.admission.diskOvercommit).toBe(1.5);
      expect(c.storage.reserveBytes).toBe(0);
      expect(c.defaults.io).toEqual({ weight: 50, readBps: null, writeBps: 1048576, readIops: 200, writeIops: null });
      for (const bad of ['[admission]\ndisk_overcommit = 0\n', '[defaults]\nio_weight = 0\n', '[defaults]\nio_weight = 10001\n',
        '[defaults.io_max]\nwrite_bps = 100\n', '[defaults.io_max]\n', '[defaults.io_max]\nwbps = 1\n']) {
        writeFileSync(f, bad);
        expect(() => loadConfig({ config: f, env: {} }), bad).toThrow();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
  it('[quotas]: none by default, a default for every tenant and per-tenant values over it; admission refuses past them naming the quota', () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'dsec-cfg-'));
    try {
      expect(loadConfig({ env: {}, config: undefined }).quotas).toEqual({ default: { sandboxes: null, cpus: null, memoryBytes: null }, tenants: {} });
      const f = path.join(dir, 'c.toml');
      writeFileSync(f, '[quotas]\nsandboxes = 3\ncpus = 4\n[quotas.tenants.team-a]\nsandboxes = 10\ncpus = 100\nmemory_bytes = 1000\n');
      const c = loadConfig({ config: f, env: {} });
      expect(c.quotas).toEqual({ default: { sandboxes: 3, cpus: 4, memoryBytes: null }, tenants: { 'team-a': { sandboxes: 10, cpus: 100, memoryBytes: 1000 } } });
      writeFileSync(f, '[quotas]\ncpus = 4\n[quotas.tenants.team-b]\nsandboxes = 10\n');
      expect(loadConfig({ config: f, env: {} }).quotas.tenants['team-b']).toEqual({ sandboxes: 10, cpus: 4, memoryBytes: null });
      for (const bad of ['[quotas]\nsandboxes = -1\n', '[quotas]\nsandbox = 1\n', '[quotas.tenants."Team A"]\nsandboxes = 1\n']) {
        writeFileSync(f, bad);
        expect(() => loadConfig({ config: f, env: {} }), bad).toThrow();
      }
      // Tenant team-a holds 9 sandboxes of 1 core and 100 bytes each; team-b 3; system any number.
      const use: Record<string, { count: number; memoryBytes: number; cpus: number; diskBytes: number }> = {
        'team-a': { count: 9, memoryBytes: 900, cpus: 9, diskBytes: 0 }, 'team-b': { count: 3, memoryBytes: 300, cpus: 3, diskBytes: 0 },
      };
      const adm = new Admission({
        config: c, storage: { capacityBytes: () => null, location: 'x' } as never,
        repo: { admissionTotals: (t?: string) => (t ? use[t] ?? { count: 0, memoryBytes: 0, cpus: 0, diskBytes: 0 } : { count: 12, memoryBytes: 1200, cpus: 12, diskBytes: 0 }) },
      });
      const res = { cpus: 1, memoryBytes: 100, pids: 10, diskBytes: null, io: null } as never;
      adm.admitTenant(res, 1, 'team-a'); // the 10th
      expect(() => adm.admitTenant(res, 2, 'team-a')).toThrow(expect.objectContaining({
        kind: 'ResourceExhausted', message: expect.stringContaining('tenant team-a is at its quota of 10 sandboxes (quotas.tenants.team-a.sandboxes): it has 9, and 2 new sandboxes would make 11'),
      }));
      expect(() => adm.admitTenant({ ...(res as object), memoryBytes: 101 } as never, 1, 'team-a')).toThrow(/over its quota of 1000 \(quotas.tenants.team-a.memory_bytes; in use: 900 bytes\)/);
      expect(() => adm.admitTenant(res, 1, 'team-b')).toThrow(/tenant team-b is at its quota of 3 sandboxes \(quotas.sandboxes\)/);
      expect(() => adm.admitTenant({ ...(res as object), cpus: 2 } as never, 1, 'team-c')).not.toThrow();
      expect(() => adm.admitTenant({ ...(res as object), cpus: 5 } as never, 1, 'team-c')).toThrow(/CPU limits would total 5 cores, over its quota of 4 \(quotas.cpus/);
      adm.admitTenant(res, 1000, 'system'); // no quota
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
  it('rejects unknown keys and a missing explicit file', () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'dsec-cfg-'));
    try {
      const f = path.join(dir, 'c.toml');
      writeFileSync(f, 'rooot = "/x"\n');
      expect(() => loadConfig({ config: f, env: {} })).toThrow(/rooot|Unrecognized/i);
      expect(() => loadConfig({ config: path.join(dir, 'nope.toml'), env: {} })).toThrow(/does not exist/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
  it('refuses network.ttl_min_s above ttl_max_s (given or default)', () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'dsec-cfg-'));
    try {
      const f = path.join(dir, 'c.toml');
      writeFileSync(f, '[network]\nttl_min_s = 600\nttl_max_s = 60\n');
      expect(() => loadConfig({ config: f, env: {} })).toThrow(/network\.ttl_min_s \(600\) must not exceed network\.ttl_max_s \(60\)/);
      writeFileSync(f, '[network]\nttl_min_s = 7200\n');
      expect(() => loadConfig({ config: f, env: {} })).toThrow(/ttl_max_s \(3600, the default\)/);
      writeFileSync(f, '[network]\nttl_min_s = 60\nttl_max_s = 60\n');
      expect(loadConfig({ config: f, env: {} }).network).toMatchObject({ ttlMinS: 60, ttlMaxS: 60 });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('derives distinct instance names from roots', () => {
    expect(instanceNameFor('/var/lib/dsec')).toBe('default');
    const a = instanceNameFor('/tmp/a/dsec');
    const b = instanceNameFor('/tmp/b/dsec');
    expect(a).not.toBe(b);
    expect(a).toMatch(/^[a-z0-9][a-z0-9_.-]{0,62}$/);
  });
});

describe('failpoints', () => {
  it('parse names and counts, reject unknown ones', () => {
    expect(new Failpoints(undefined).armed).toBeNull();
    expect(new Failpoints('create.after-rootfs:3').armed).toBe('create.after-rootfs');
    expect(() => new Failpoints('create.nope')).toThrow(/unknown failpoint/);
    expect(() => new Failpoints('create.after-rootfs:0')).toThrow(/bad hit count/);
    expect(FAILPOINTS.length).toBeGreaterThan(10);
  });
});
