/**
 * CgroupManager.create and procsFiles (the cgroups dsecd makes itself, for the microvm
 * tier's VMM) on v2, against a temp tree shaped like cgroupfs (this host's real
 * hierarchies are v1; test/integration/microvm.test.ts covers v1 for real). mkdir in a
 * plain directory grows no interface files, so the test writes the ones the kernel would
 * have before create runs a second time (idempotence) and reads what create wrote.
 */
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { detectCgroups } from '../../daemon/host/cgroups/index.js';

const OWN = '/system.slice/dsecd.service';
let root: string;

beforeEach(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), 'dsec-cgc-'));
  await writeFile(path.join(root, 'cgroup.controllers'), 'cpu memory pids\n');
  await mkdir(path.join(root, OWN, 'dsec-unit'), { recursive: true });
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

describe('cgroup v2 create', () => {
  it('makes the sandbox cgroup with CPU quota, weight from shares, memory and pids limits, cpu.idle when the kernel has it', async () => {
    const m = await detectCgroups({ instance: 'unit', mountRoot: root, procSelfCgroup: `0::${OWN}\n`, mountinfo: '' });
    expect(m.version).toBe(2);
    const dir = path.join(root, OWN, 'dsec-unit', 'vm1');
    const limits = { cpuQuotaUs: 150_000, cpuPeriodUs: 100_000, cpuShares: 2, memoryBytes: 805_306_368, pids: 256, idle: true };
    await m.create('vm1', limits);
    const f = (n: string) => readFile(path.join(dir, n), 'utf8');
    expect(await f('cpu.max')).toBe('150000 100000');
    expect(await f('cpu.weight')).toBe('1');
    expect(await f('memory.max')).toBe('805306368');
    expect(await f('pids.max')).toBe('256');
    // No cpu.idle file (an older kernel): not written.
    await expect(f('cpu.idle')).rejects.toThrow();
    await writeFile(path.join(dir, 'cpu.idle'), '0');
    await m.create('vm1', { ...limits, cpuQuotaUs: null, cpuShares: null });
    expect(await f('cpu.max')).toBe('max 100000');
    expect(await f('cpu.idle')).toBe('1');
    expect(m.procsFiles('vm1')).toEqual([path.join(dir, 'cgroup.procs')]);
    expect(await m.list()).toEqual(['vm1']);
    await expect(m.create('../x', limits)).rejects.toMatchObject({ kind: 'InvalidArgument' });
  });
});
