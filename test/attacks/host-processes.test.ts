/**
 * Code inside a sandbox cannot see or reach host processes through /proc: the sandbox
 * has its own pid namespace (PID 1 is its agent), so dsecd, the host's init, other
 * sandboxes' processes and their /proc entries do not exist for it, and the host's mount
 * table is not its mount table.
 *
 * The host-side half of each check shows what the attacker is looking for does exist
 * (dsecd's pid, a neighbour's process), so the in-sandbox assertions can fail.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import { IS_ROOT, TestDaemon } from '../integration/harness.js';

describe.skipIf(!IS_ROOT)('attack: reach host processes through /proc', () => {
  let d: TestDaemon;
  let id: string;
  let neighbour: string;

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 41 });
    id = (await d.client.createSandbox({ image: 'busybox' })).id;
    neighbour = (await d.client.createSandbox({ image: 'busybox' })).id;
  }, 120_000);
  afterAll(async () => {
    await d?.cleanup();
  });

  const sh = async (sb: string, script: string) => (await d.client.exec(sb, { argv: ['sh', '-c', script] })).stdout.toString();

  it('sees only its own processes: no dsecd, no host init, no neighbour', async () => {
    // The neighbour runs a marked process; on the host it is visible.
    await d.client.startExec(neighbour, { argv: ['sleep', '4242'] });
    let hostSees = false;
    for (let i = 0; i < 50 && !hostSees; i++) {
      hostSees = (await import('node:fs')).readdirSync('/proc').some((p) => /^\d+$/.test(p) && (() => {
        try {
          return readFileSync(`/proc/${p}/cmdline`, 'utf8') === 'sleep\u00004242\u0000';
        } catch {
          return false;
        }
      })());
      if (!hostSees) await new Promise((r) => setTimeout(r, 50));
    }
    expect(hostSees).toBe(true);
    expect(readFileSync(`/proc/${d.pid}/cmdline`, 'utf8')).toContain('dsecd');

    const ps = await sh(id, 'for p in /proc/[0-9]*; do printf "%s " "${p#/proc/}"; tr "\\0" " " < $p/cmdline; echo; done');
    expect(ps).not.toMatch(/sleep 4242|dsecd|node|systemd|runc/);
    expect(ps).toMatch(/^1 \/dev\/\.dsec-agent /m);
    // dsecd's host pid means nothing inside (or is one of the sandbox's own processes).
    const probe = await sh(id, `cat /proc/${d.pid}/cmdline 2>/dev/null | tr "\\0" " "; echo; cat /proc/1/cmdline | tr "\\0" " "`);
    expect(probe).not.toMatch(/dsecd|node/);
  });

  it('cannot signal or read host processes by pid, and sees a mount table of its own', async () => {
    const out = await sh(id, `kill -0 ${d.pid} 2>&1 && echo KILLED; ls /proc/${d.pid}/root 2>&1 | head -1; echo; awk '{print $5}' /proc/self/mountinfo`);
    expect(out).not.toContain('KILLED');
    // Every mount point is one of the sandbox's own (root, its writable top-level binds,
    // /proc, /dev, /sys and the masks over them, the agent binary): none of the host's
    // mount points, none under dsecd's state dir.
    const points = out.split('\n\n')[1].trim().split('\n');
    const top = (await sh(id, 'ls -1 /')).trim().split('\n').map((e) => `/${e}`);
    for (const p of points) expect(p === '/' || top.some((t) => p === t || p.startsWith(`${t}/`)), p).toBe(true);
    expect(points.some((p) => p.startsWith(d.root) || p.startsWith('/tmp/dsec-') || p === '/work')).toBe(false);
    const host = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')[4]).filter(Boolean);
    expect(host.some((p) => p.startsWith(d.root))).toBe(true);
  });

  it('a grader run as another uid keeps its environment and fds from root of the sandbox; one of the same uid does not', async () => {
    // The doc's advice (SECURITY.md "Not covered"): same-uid processes can read each
    // other through /proc; a different uid cannot, since root here has no CAP_SYS_PTRACE.
    const find = `for p in /proc/[0-9]*; do if grep -q sleep $p/cmdline 2>/dev/null; then `;
    const grader = await d.client.createSandbox({ image: 'busybox' });
    await d.client.startExec(grader.id, { argv: ['sh', '-c', 'echo THE-ANSWER > /tmp/a; exec 7</tmp/a; rm /tmp/a; exec sleep 4343'], env: { GRADER_TOKEN: 's3cr3t' }, user: '1000:1000' });
    await d.client.startExec(grader.id, { argv: ['sh', '-c', 'echo SAME-UID > /tmp/b; exec 7</tmp/b; rm /tmp/b; exec sleep 4344'], env: { GRADER_TOKEN: 'same-uid' } });
    let ps = '';
    for (let i = 0; i < 100 && !(ps.includes('4343') && ps.includes('4344')); i++) ps = await sh(grader.id, 'cat /proc/[0-9]*/cmdline 2>/dev/null | tr "\\0" " "');
    const r = await sh(grader.id, `${find} tr '\\0' '\\n' < $p/environ 2>&1 | grep -E 'GRADER|denied'; cat $p/fd/7 2>&1; fi; done`);
    // The same-uid process is readable (the residual risk the doc names) ...
    expect(r).toContain('GRADER_TOKEN=same-uid');
    expect(r).toContain('SAME-UID');
    // ... the other uid's is not.
    expect(r).not.toContain('s3cr3t');
    expect(r).not.toContain('THE-ANSWER');
    expect(r).toMatch(/Permission denied/);
    await d.client.deleteSandbox(grader.id, { force: true });
  });
});
