import { describe, expect, it } from 'vitest';
import { detectCgroups } from '../../daemon/host/cgroups/index.js';
import {
  ownCgroupDir, parseFlatKeyed, parseLimit, parseMountinfo, parseProcCgroup, resolveLayout,
} from '../../daemon/host/cgroups/procfs.js';
import { isDsecError } from '../../daemon/errors.js';

// This development machine: hybrid, one hierarchy per controller, memory nested.
const HYBRID_CGROUP = `9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/e64ec0c76f2f1467b440b4ca58b4a7a7
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
`;
const HYBRID_MOUNTINFO = `22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`;

// A systemd v1 host (Debian 10 style): cpu,cpuacct co-mounted, dsecd in its service cgroup.
const COMOUNT_CGROUP = `12:cpu,cpuacct:/system.slice/dsecd.service
11:memory:/system.slice/dsecd.service
10:pids:/system.slice/dsecd.service
9:freezer:/
8:net_cls,net_prio:/
1:name=systemd:/system.slice/dsecd.service
0::/system.slice/dsecd.service
`;
const COMOUNT_MOUNTINFO = `25 18 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,cpu,cpuacct
31 25 0:28 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
32 25 0:29 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,pids
33 25 0:30 / /sys/fs/cgroup/freezer rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,freezer
`;

// Pure v2, dsecd in a nested service cgroup.
const V2_CGROUP = '0::/system.slice/dsec.slice/dsecd@a.service\n';
const V2_MOUNTINFO = `24 18 0:21 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`;

function expectKind(fn: () => unknown, kind: string) {
  try {
    fn();
  } catch (e) {
    expect(isDsecError(e), String(e)).toBe(true);
    expect((e as { kind: string }).kind).toBe(kind);
    return;
  }
  throw new Error(`expected a DsecError(${kind})`);
}

describe('parseProcCgroup', () => {
  it('reads v1 hierarchies, named hierarchies and the unified line', () => {
    const lines = parseProcCgroup(HYBRID_CGROUP);
    expect(lines).toHaveLength(10);
    expect(lines[0]).toEqual({ hierarchyId: 9, controllers: ['name=systemd'], path: '/' });
    expect(lines[5]).toEqual({ hierarchyId: 4, controllers: ['memory'], path: '/process_api/e64ec0c76f2f1467b440b4ca58b4a7a7' });
    expect(lines[9]).toEqual({ hierarchyId: 0, controllers: [], path: '/' });
  });
  it('splits co-mounted controllers and keeps colons in the path', () => {
    const lines = parseProcCgroup('12:cpu,cpuacct:/a:b/c\n0::/x:y\n');
    expect(lines[0].controllers).toEqual(['cpu', 'cpuacct']);
    expect(lines[0].path).toBe('/a:b/c');
    expect(lines[1].path).toBe('/x:y');
  });
  it('rejects malformed lines', () => {
    expectKind(() => parseProcCgroup('garbage\n'), 'Internal');
    expectKind(() => parseProcCgroup('x:memory:/\n'), 'Internal');
  });
});

describe('parseMountinfo', () => {
  it('parses fields around optional fields and the separator', () => {
    const m = parseMountinfo(COMOUNT_MOUNTINFO);
    expect(m).toHaveLength(7);
    expect(m[1]).toMatchObject({
      mountId: 26, parentId: 25, majorMinor: '0:23', root: '/', mountPoint: '/sys/fs/cgroup/unified',
      fsType: 'cgroup2', source: 'cgroup2', superOptions: ['rw', 'nsdelegate'],
    });
    expect(m[3].superOptions).toEqual(['rw', 'cpu', 'cpuacct']);
    expect(m[3].mountPoint).toBe('/sys/fs/cgroup/cpu,cpuacct');
  });
  it('decodes octal escapes in paths', () => {
    const [m] = parseMountinfo('50 1 0:40 /a\\040b /mnt/with\\040space\\134x rw - cgroup2 none rw\n');
    expect(m.root).toBe('/a b');
    expect(m.mountPoint).toBe('/mnt/with space\\x');
  });
  it('rejects a line without the separator', () => {
    expectKind(() => parseMountinfo('1 2 0:1 / /x rw a b c d\n'), 'Internal');
  });
});

describe('resolveLayout', () => {
  it('hybrid: every v1 hierarchy plus unified, own paths nested per hierarchy', () => {
    const l = resolveLayout(parseProcCgroup(HYBRID_CGROUP), parseMountinfo(HYBRID_MOUNTINFO), '/sys/fs/cgroup');
    expect(l.version).toBe(1);
    const byKey = Object.fromEntries(l.hierarchies.flatMap((h) => h.keys.map((k) => [k, h])));
    expect(Object.keys(byKey).sort()).toEqual(
      ['blkio', 'cpu', 'cpuacct', 'cpuset', 'devices', 'freezer', 'memory', 'pids', 'systemd', 'unified'],
    );
    expect(byKey.memory.ownDir).toBe('/sys/fs/cgroup/memory/process_api/e64ec0c76f2f1467b440b4ca58b4a7a7');
    expect(byKey.cpu.ownDir).toBe('/sys/fs/cgroup/cpu');
    expect(byKey.systemd.controllers).toEqual(['name=systemd']);
    expect(byKey.unified).toMatchObject({ version: 2, ownDir: '/sys/fs/cgroup/unified' });
  });
  it('co-mounted cpu,cpuacct is one hierarchy under two keys; unmounted hierarchies are skipped', () => {
    const l = resolveLayout(parseProcCgroup(COMOUNT_CGROUP), parseMountinfo(COMOUNT_MOUNTINFO), '/sys/fs/cgroup');
    const cpu = l.hierarchies.find((h) => h.keys.includes('cpu'))!;
    expect(cpu.keys).toEqual(['cpu', 'cpuacct']);
    expect(cpu.ownDir).toBe('/sys/fs/cgroup/cpu,cpuacct/system.slice/dsecd.service');
    expect(l.hierarchies.some((h) => h.keys.includes('net_cls'))).toBe(false);
    expect(l.hierarchies.find((h) => h.keys.includes('freezer'))!.ownDir).toBe('/sys/fs/cgroup/freezer');
  });
  it('pure v2 with a nested own path', () => {
    const l = resolveLayout(parseProcCgroup(V2_CGROUP), parseMountinfo(V2_MOUNTINFO), '/sys/fs/cgroup');
    expect(l.version).toBe(2);
    expect(l.hierarchies).toHaveLength(1);
    expect(l.hierarchies[0].ownDir).toBe('/sys/fs/cgroup/system.slice/dsec.slice/dsecd@a.service');
  });
  it('v2 whose mount shows only a subtree strips the mount root from the own path', () => {
    const mi = '24 18 0:21 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n';
    const l = resolveLayout(parseProcCgroup('0::/kubepods/pod1/ctr\n'), parseMountinfo(mi), '/sys/fs/cgroup');
    expect(l.hierarchies[0].ownDir).toBe('/sys/fs/cgroup/ctr');
  });
  it('refuses an own cgroup outside the mount or the namespace', () => {
    expectKind(() => ownCgroupDir('/sys/fs/cgroup', '/kubepods/pod1', '/other'), 'FailedPrecondition');
    expectKind(() => ownCgroupDir('/sys/fs/cgroup', '/', '/../..'), 'FailedPrecondition');
  });
  it('ignores cgroup mounts outside the mount root and fails when none is left', () => {
    expectKind(() => resolveLayout(parseProcCgroup(HYBRID_CGROUP), parseMountinfo(HYBRID_MOUNTINFO), '/elsewhere'), 'FailedPrecondition');
  });
  it('falls back to v2 for a test tree only when asked', () => {
    const l = resolveLayout(parseProcCgroup('0::/a\n'), [], '/tmp/fake', { fallbackV2: true });
    expect(l).toMatchObject({ version: 2, hierarchies: [{ ownDir: '/tmp/fake/a', keys: ['unified'] }] });
  });
});

describe('cgroupfs file parsing', () => {
  it('flat-keyed files and limits', () => {
    expect(parseFlatKeyed('oom_kill_disable 0\nunder_oom 0\noom_kill 3\n')).toEqual({ oom_kill_disable: 0, under_oom: 0, oom_kill: 3 });
    expect(parseLimit('max\n')).toBeNull();
    expect(parseLimit('9223372036854771712\n')).toBeNull();
    expect(parseLimit('33554432\n')).toBe(33554432);
  });
});

describe('detectCgroups (from sample text, no filesystem writes)', () => {
  it('hybrid v1: parents per hierarchy under the own cgroup', async () => {
    const m = await detectCgroups({ instance: 'prod-1', procSelfCgroup: HYBRID_CGROUP, mountinfo: HYBRID_MOUNTINFO });
    expect(m.version).toBe(1);
    expect(m.parents.memory).toBe('/sys/fs/cgroup/memory/process_api/e64ec0c76f2f1467b440b4ca58b4a7a7/dsec-prod-1');
    expect(m.parents.pids).toBe('/sys/fs/cgroup/pids/dsec-prod-1');
    expect(m.parents.systemd).toBe('/sys/fs/cgroup/systemd/dsec-prod-1');
    expect(m.parents.unified).toBe('/sys/fs/cgroup/unified/dsec-prod-1');
    expect(m.runtimePath('sb-1')).toBe('dsec-prod-1/sb-1');
    expect(m.sandboxPaths('sb-1').freezer).toBe('/sys/fs/cgroup/freezer/dsec-prod-1/sb-1');
  });
  it('co-mounted v1: cpu and cpuacct share a parent', async () => {
    const m = await detectCgroups({ instance: 'a', procSelfCgroup: COMOUNT_CGROUP, mountinfo: COMOUNT_MOUNTINFO });
    expect(m.parents.cpu).toBe('/sys/fs/cgroup/cpu,cpuacct/system.slice/dsecd.service/dsec-a');
    expect(m.parents.cpuacct).toBe(m.parents.cpu);
  });
  it('pure v2: one unified parent', async () => {
    const m = await detectCgroups({ instance: 'a', procSelfCgroup: V2_CGROUP, mountinfo: V2_MOUNTINFO });
    expect(m.version).toBe(2);
    expect(m.parents).toEqual({ unified: '/sys/fs/cgroup/system.slice/dsec.slice/dsecd@a.service/dsec-a' });
  });
  it('memcgPath: the sandbox\'s memory cgroup from the memory controller\'s mount (DAMON memcg filters)', async () => {
    const v1 = await detectCgroups({ instance: 'a', procSelfCgroup: COMOUNT_CGROUP, mountinfo: COMOUNT_MOUNTINFO });
    expect(v1.sandboxPaths('sb-1').memory).toBe('/sys/fs/cgroup/memory/system.slice/dsecd.service/dsec-a/sb-1');
    expect(v1.memcgPath('sb-1')).toBe('/system.slice/dsecd.service/dsec-a/sb-1');
    const v2 = await detectCgroups({ instance: 'a', procSelfCgroup: V2_CGROUP, mountinfo: V2_MOUNTINFO });
    expect(v2.memcgPath('sb-1')).toBe('/system.slice/dsec.slice/dsecd@a.service/dsec-a/sb-1');
    expectKind(() => v2.memcgPath('../x'), 'InvalidArgument');
    expectKind(() => v1.memcgPath('../x'), 'InvalidArgument');
  });
  it('v2 already inside the dsecd leaf keeps the parent next to the leaf', async () => {
    const m = await detectCgroups({ instance: 'a', procSelfCgroup: '0::/system.slice/dsecd.service/dsecd\n', mountinfo: V2_MOUNTINFO });
    expect(m.parents.unified).toBe('/sys/fs/cgroup/system.slice/dsecd.service/dsec-a');
  });
  it('rejects bad instance names and sandbox ids', async () => {
    for (const instance of ['', 'A', '-x', '../x', 'a/b', 'a'.repeat(64)]) {
      await expect(detectCgroups({ instance, procSelfCgroup: V2_CGROUP, mountinfo: V2_MOUNTINFO })).rejects.toMatchObject({ kind: 'InvalidArgument' });
    }
    const m = await detectCgroups({ instance: 'a.b_c-1', procSelfCgroup: HYBRID_CGROUP, mountinfo: HYBRID_MOUNTINFO });
    for (const id of ['', '..', 'a/b', 'A', '.x', 'a.b', 'x'.repeat(65)]) {
      expectKind(() => m.runtimePath(id), 'InvalidArgument');
      expectKind(() => m.sandboxPaths(id), 'InvalidArgument');
      await expect(m.exists(id)).rejects.toMatchObject({ kind: 'InvalidArgument' });
      await expect(m.remove(id)).rejects.toMatchObject({ kind: 'InvalidArgument' });
    }
    expect(m.runtimePath('x'.repeat(64))).toBe(`dsec-a.b_c-1/${'x'.repeat(64)}`);
  });
});
