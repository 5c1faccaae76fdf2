/**
 * Code inside a sandbox cannot reach the agent's endpoint: it is no path in the
 * sandbox's mount namespace, not in its network namespace's socket table, and the
 * agent's fds cannot be opened through /proc or ptrace.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, TestDaemon } from '../integration/harness.js';

describe.skipIf(!IS_ROOT)('attack: reach the agent endpoint from inside', () => {
  let d: TestDaemon;
  let id: string;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 4 });
    id = (await d.client.createSandbox({ image: 'busybox' })).id;
  });
  afterAll(async () => {
    await d?.cleanup();
  });
  const sh = async (script: string) => {
    const r = await d.client.exec(id, { argv: ['sh', '-c', script] });
    return { code: r.exit_code, out: r.stdout.toString(), err: r.stderr.toString() };
  };

  it('finds no unix socket file anywhere in the sandbox', async () => {
    const r = await sh('find / -xdev -type s 2>/dev/null; find /dev /run /tmp -type s 2>/dev/null; echo done');
    expect(r.out.trim()).toBe('done');
  });

  it('cannot open, read or connect through /proc/1/fd of the agent', async () => {
    const r = await sh('for f in /proc/1/fd/*; do cat $f </dev/null >/dev/null 2>&1 && echo OPENED $f; readlink $f && echo LINK $f; done; echo done');
    expect(r.out).not.toMatch(/OPENED|LINK/);
    const nc = await sh('for f in /proc/1/fd/*; do echo x | nc -U $f 2>&1 && echo CONNECTED; done; ls /proc/1/root/ 2>&1 | head -1; echo done');
    expect(nc.out).not.toContain('CONNECTED');
    expect(nc.out).toMatch(/Permission denied|done/);
  });

  it('cannot ptrace the agent (no CAP_SYS_PTRACE; agent not dumpable)', async () => {
    const caps = await sh('grep CapEff /proc/self/status');
    const eff = BigInt('0x' + caps.out.split(':')[1].trim());
    expect(eff & (1n << 19n)).toBe(0n); // CAP_SYS_PTRACE is bit 19
    const st = await sh('cat /proc/1/environ >/dev/null 2>&1 && echo READ; cat /proc/1/mem >/dev/null 2>&1 && echo MEM; echo done');
    expect(st.out).not.toMatch(/READ|MEM/);
  });

  it('sees no agent socket in its network namespace and cannot find the host path', async () => {
    const r = await sh('cat /proc/net/unix');
    expect(r.out).not.toContain('agent.sock');
    const p = await sh(`ls ${d.root} 2>&1; echo x | nc -U ${d.root}/sandboxes/${id}/agent.sock 2>&1; echo rc=$?`);
    expect(p.out).toMatch(/No such file or directory/);
  });

  it('cannot start execs: spawned processes inherit no agent fd', async () => {
    const r = await sh('ls -l /proc/self/fd/ | grep -c socket; true');
    expect(r.out.trim()).toBe('0');
  });
});
