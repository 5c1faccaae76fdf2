// readTomlFile: the one reader of dsecd's and dsec-gateway's TOML config files.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { readTomlFile } from '../../daemon/toml-file.js';
import { loadGatewayConfig } from '../../gateway/config.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'dsec-toml-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const file = (name: string, text: string) => {
  const f = path.join(dir, name);
  writeFileSync(f, text);
  return f;
};
const Schema = z.object({ listen: z.string().optional(), limits: z.object({ n: z.number().int().min(1) }).strict().optional() }).strict();

describe('readTomlFile', () => {
  it('parses a file against its schema; a missing default file is empty, a missing named one an error', () => {
    expect(readTomlFile(file('ok.toml', 'listen = "127.0.0.1:1"\n[limits]\nn = 3\n'), Schema, true)).toEqual({ listen: '127.0.0.1:1', limits: { n: 3 } });
    expect(readTomlFile(path.join(dir, 'absent.toml'), Schema, false)).toEqual({});
    expect(() => readTomlFile(path.join(dir, 'absent.toml'), Schema, true)).toThrow(/config file .*absent\.toml does not exist/);
  });

  it('names the file and every schema issue by its path; TOML that does not parse names the file', () => {
    const bad = file('bad.toml', 'listen = 5\n[limits]\nn = 0\nx = 1\n');
    let msg = '';
    try {
      readTomlFile(bad, Schema, true);
    } catch (e) {
      msg = (e as Error).message;
      expect((e as { kind?: string }).kind).toBe('InvalidArgument');
    }
    expect(msg).toMatch(/^config .*bad\.toml: /);
    expect(msg).toContain('listen: ');
    expect(msg).toContain('limits.n: ');
    expect(msg).toContain('limits: ');
    expect(() => readTomlFile(file('syntax.toml', 'listen = = "x"\n'), Schema, true)).toThrow(/^config .*syntax\.toml: /);
  });

  it('dsec-gateway reads its config through it: an unknown key is refused with the file named', () => {
    expect(() => loadGatewayConfig({ config: file('gw.toml', 'no_such_key = 1\n') }, {})).toThrow(/^config .*gw\.toml: .*no_such_key/);
  });

  it("dsec-gateway's [quotas] has dsecd's shape: a default, per-tenant overrides that inherit it, bad tenant names refused", () => {
    const tls = { tlsCert: '/c', tlsKey: '/k', tlsCa: '/a', etcd: 'https://127.0.0.1:2379' };
    const cfg = loadGatewayConfig({ ...tls, config: file('gwq.toml', '[quotas]\ncpus = 8\n[quotas.tenants.demo]\nsandboxes = 10\n') }, {});
    expect(cfg.quotas).toEqual({ default: { sandboxes: null, cpus: 8, memoryBytes: null }, tenants: { demo: { sandboxes: 10, cpus: 8, memoryBytes: null } } });
    expect(loadGatewayConfig({ ...tls, config: file('gwn.toml', '') }, {}).quotas).toEqual({ default: { sandboxes: null, cpus: null, memoryBytes: null }, tenants: {} });
    expect(() => loadGatewayConfig({ ...tls, config: file('gwb.toml', '[quotas.tenants."Bad Name"]\nsandboxes = 1\n') }, {})).toThrow(/quotas\.tenants/);
  });
});
