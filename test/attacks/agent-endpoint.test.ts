/**
 * Code inside a sandbox cannot reach the agent's endpoint: it is no path in the
 * sandbox's mount namespace, not in its network namespace's socket table, and the
 * agent's fds cannot be opened through /proc or ptrace.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { IS_ROOT, REPO, TestDaemon } from '../integration/harness.js';

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

  it('cannot take the listening socket with ptrace or pidfd_getfd, even with seccomp allowing both', async () => {
    const tmp = mkdtempSync(path.join(os.tmpdir(), 'dsec-attach-'));
    try {
      const bin = path.join(tmp, 'attach-probe');
      await execa('gcc', ['-static', '-O1', '-o', bin, path.join(REPO, 'test/attacks/attach-probe.c')]);
      // The probe can succeed: on the host, against a child of the same uid, both work.
      const child = execa('sleep', ['30']);
      try {
        expect((await execa(bin, [String(child.pid), '0'])).stdout).toBe('ptrace ok\npidfd_getfd ok');
      } finally {
        child.kill('SIGKILL');
        await child.catch(() => {});
      }
      const probe = readFileSync(bin);
      const run = async (sb: string) => (await d.client.exec(sb, { argv: ['sh', '-c', 'cat > /tmp/p && chmod +x /tmp/p && /tmp/p 1 3'], stdin: probe })).stdout.toString();
      // Default profile: seccomp refuses both calls.
      expect(await run(id)).toBe('ptrace EPERM\npidfd_getfd EPERM\n');
      // With seccomp lifted for both, the agent is still out of reach: it is not dumpable
      // and no sandbox process has CAP_SYS_PTRACE, so the kernel's ptrace access check fails.
      const open = (await d.client.createSandbox({ image: 'busybox', seccomp: { allow: ['ptrace', 'pidfd_getfd'] } })).id;
      try {
        expect(await run(open)).toBe('ptrace EPERM\npidfd_getfd EPERM\n');
        expect((await d.client.exec(open, { argv: ['echo', 'agent-alive'] })).stdout.toString()).toBe('agent-alive\n');
      } finally {
        await d.client.deleteSandbox(open, { force: true });
      }
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
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
