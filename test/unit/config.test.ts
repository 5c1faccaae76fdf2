import { describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { instanceNameFor, loadConfig } from '../../daemon/config.js';
import { Failpoints, FAILPOINTS } from '../../daemon/sandbox/failpoints.js';

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
