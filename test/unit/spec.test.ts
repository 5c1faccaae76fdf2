import { describe, expect, it } from 'vitest';
import { AGENT_PATH, buildSpec, DEFAULT_CAPS } from '../../daemon/drivers/container/spec.js';

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
