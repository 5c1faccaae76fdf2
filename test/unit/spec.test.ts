import { describe, expect, it } from 'vitest';
import { AGENT_FLAG_WORKER, AGENT_PATH, buildSpec, DEFAULT_CAPS, WORKER_AGENT_CAPS } from '../../daemon/drivers/container/spec.js';
import { BATCH_CPU_SHARES } from '../../daemon/drivers/cgroup-limits.js';

const input = {
  id: 'abcd', rootfs: '/r/rootfs', agentBinary: '/opt/dsec-agent', uidBase: 2 ** 31, uidCount: 65536,
  cgroupsPath: 'dsec-x/abcd', cpus: 0.5, memoryBytes: 256 << 20, pids: 64,
};

describe('OCI spec', () => {
  const spec = buildSpec(input) as any;
  it('runs the agent as init with the listening socket on fd 3', () => {
    expect(spec.process.args).toEqual([AGENT_PATH, '--listen-fd', '3']);
    const m = spec.mounts.find((x: any) => x.destination === AGENT_PATH);
    expect(m).toMatchObject({ type: 'bind', source: '/opt/dsec-agent' });
    expect(m.options).toContain('ro');
  });
  it('maps container root to the sandbox uid range in a user namespace', () => {
    expect(spec.linux.uidMappings).toEqual([{ containerID: 0, hostID: 2 ** 31, size: 65536 }]);
    expect(spec.linux.gidMappings).toEqual([{ containerID: 0, hostID: 2 ** 31, size: 65536 }]);
    const ns = spec.linux.namespaces.map((n: any) => n.type);
    for (const t of ['pid', 'mount', 'ipc', 'uts', 'network', 'user']) expect(ns).toContain(t);
  });
  it('applies limits: quota = cores x 100 ms period, bytes, pids', () => {
    expect(spec.linux.resources.cpu).toEqual({ quota: 50_000, period: 100_000 });
    expect(spec.linux.resources.memory.limit).toBe(256 << 20);
    expect(spec.linux.resources.pids.limit).toBe(64);
    expect(spec.linux.cgroupsPath).toBe('dsec-x/abcd');
  });
  it('never grants CAP_SYS_PTRACE or CAP_SYS_ADMIN, and sets no_new_privileges', () => {
    expect(DEFAULT_CAPS).not.toContain('CAP_SYS_PTRACE');
    expect(DEFAULT_CAPS).not.toContain('CAP_SYS_ADMIN');
    expect(spec.process.capabilities.bounding).toEqual([...DEFAULT_CAPS]);
    expect(spec.process.noNewPrivileges).toBe(true);
  });
  it('is deterministic', () => {
    expect(JSON.stringify(buildSpec(input))).toBe(JSON.stringify(buildSpec(input)));
  });
});

describe('OCI spec: priority classes', () => {
  const latency = buildSpec(input) as any;
  it('latency (the default, or explicit) is the unchanged spec: no agent flags, default shares, no rlimits, no unified', () => {
    expect(JSON.stringify(buildSpec({ ...input, priority: 'latency' }))).toBe(JSON.stringify(latency));
    expect(JSON.stringify(buildSpec({ ...input, priority: 'latency', cgroupVersion: 2 }))).toBe(JSON.stringify(latency));
    expect(latency.process.args).toEqual([AGENT_PATH, '--listen-fd', '3']);
    expect(latency.process.rlimits).toBeUndefined();
    expect(latency.linux.resources.cpu).not.toHaveProperty('shares');
    expect(latency.linux.resources).not.toHaveProperty('unified');
  });
  it('batch: the agent gets --sched-idle, the cgroup the minimum cpu.shares (2), RLIMIT_NICE 0', () => {
    const b = buildSpec({ ...input, priority: 'batch' }) as any;
    expect(b.process.args).toEqual([AGENT_PATH, '--listen-fd', '3', '--sched-idle']);
    expect(BATCH_CPU_SHARES).toBe(2);
    expect(b.linux.resources.cpu).toEqual({ quota: 50_000, period: 100_000, shares: 2 });
    expect(b.process.rlimits).toEqual([{ type: 'RLIMIT_NICE', hard: 0, soft: 0 }]);
    // Everything else is the latency spec.
    const strip = (s: any) => ({ ...s, process: { ...s.process, args: undefined, rlimits: undefined }, linux: { ...s.linux, resources: { ...s.linux.resources, cpu: undefined } } });
    expect(strip(b)).toEqual(strip(latency));
  });
  it('batch on cgroup v1 (the default) never sets unified; on v2 it sets cpu.idle 1', () => {
    expect((buildSpec({ ...input, priority: 'batch' }) as any).linux.resources).not.toHaveProperty('unified');
    expect((buildSpec({ ...input, priority: 'batch', cgroupVersion: 1 }) as any).linux.resources).not.toHaveProperty('unified');
    const v2 = buildSpec({ ...input, priority: 'batch', cgroupVersion: 2 }) as any;
    expect(v2.linux.resources.unified).toEqual({ 'cpu.idle': '1' });
    expect(v2.linux.resources.cpu.shares).toBe(2);
  });
  it('core scheduling adds --core-sched for either class, only when the caller asks', () => {
    expect((buildSpec({ ...input, coreScheduling: true }) as any).process.args).toEqual([AGENT_PATH, '--listen-fd', '3', '--core-sched']);
    expect((buildSpec({ ...input, priority: 'batch', coreScheduling: true }) as any).process.args)
      .toEqual([AGENT_PATH, '--listen-fd', '3', '--sched-idle', '--core-sched']);
    expect((buildSpec({ ...input, coreScheduling: false }) as any).process.args).toEqual([AGENT_PATH, '--listen-fd', '3']);
  });
});

describe('OCI spec: fncall workers', () => {
  const plain = buildSpec(input) as any;
  const w = buildSpec({ ...input, worker: true }) as any;
  it('worker: false (or absent) is the unchanged spec', () => {
    expect(JSON.stringify(buildSpec({ ...input, worker: false }))).toBe(JSON.stringify(plain));
    expect(plain.root.readonly).toBe(false);
    expect(plain.process.args).not.toContain(AGENT_FLAG_WORKER);
  });
  it('adds exactly CAP_SYS_ADMIN for the agent, which --worker drops from the bounding set of its execs', () => {
    expect(WORKER_AGENT_CAPS).toEqual(['CAP_SYS_ADMIN']);
    const caps = [...DEFAULT_CAPS, 'CAP_SYS_ADMIN'];
    expect(w.process.capabilities).toEqual({ bounding: caps, effective: caps, permitted: caps });
    expect(w.process.capabilities.bounding).not.toContain('CAP_SYS_PTRACE');
    expect(w.process.args).toEqual([AGENT_PATH, '--listen-fd', '3', AGENT_FLAG_WORKER]);
    expect(w.process.noNewPrivileges).toBe(true);
    expect(w.process.capabilities).not.toHaveProperty('ambient');
    expect(w.process.capabilities).not.toHaveProperty('inheritable');
  });
  it('mounts the image read-only; everything else is the ordinary spec (but seccomp: test/unit/seccomp.test.ts)', () => {
    expect(w.root).toEqual({ path: '/r/rootfs', readonly: true });
    const strip = (s: any) => ({ ...s, root: undefined, process: { ...s.process, args: undefined, capabilities: undefined }, linux: { ...s.linux, seccomp: undefined } });
    expect(strip(w)).toEqual(strip(plain));
  });
  it('combines with the priority flags', () => {
    expect((buildSpec({ ...input, worker: true, priority: 'batch', coreScheduling: true }) as any).process.args)
      .toEqual([AGENT_PATH, '--listen-fd', '3', '--sched-idle', '--core-sched', AGENT_FLAG_WORKER]);
  });
});

describe('OCI spec: allow/open network', () => {
  const spec = buildSpec({ ...input, network: { resolvConf: '/r/resolv.conf' } }) as any;
  it('drops CAP_NET_RAW (raw and packet sockets would bypass the egress hooks)', () => {
    for (const set of ['bounding', 'effective', 'permitted']) {
      expect(spec.process.capabilities[set]).not.toContain('CAP_NET_RAW');
      expect(spec.process.capabilities[set]).toContain('CAP_NET_BIND_SERVICE');
    }
    expect(DEFAULT_CAPS).toContain('CAP_NET_RAW'); // mode none keeps Docker's set (no route out anyway)
  });
  it('bind-mounts the generated resolv.conf read-only', () => {
    const m = spec.mounts.find((x: any) => x.destination === '/etc/resolv.conf');
    expect(m).toMatchObject({ type: 'bind', source: '/r/resolv.conf' });
    expect(m.options).toContain('ro');
  });
  it('keeps runc\'s own network namespace (dsecd plugs a veth into it after start)', () => {
    expect(spec.linux.namespaces).toContainEqual({ type: 'network' });
  });
  it('mode none: no resolv.conf mount', () => {
    expect((buildSpec(input) as any).mounts.some((x: any) => x.destination === '/etc/resolv.conf')).toBe(false);
  });
});
