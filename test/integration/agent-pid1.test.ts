/**
 * The agent as PID 1 of a new pid namespace (`unshare --fork --pid --mount-proc`), the way
 * it runs in every container sandbox: it must reap orphans it never spawned and must
 * not stop on signals sent from inside the sandbox. Needs root.
 */
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { AgentClient, type AgentExecResult } from '../../daemon/agent/client.js';
import {
  AGENT, BB, UnsharedAgents, agentHostPid, buildAgent, waitFor, type UnsharedAgent,
} from '../fixtures/agent.js';

const ENV = ['PATH=/usr/bin:/bin:/usr/sbin:/sbin'];
const isRoot = process.getuid?.() === 0;

const unshared = new UnsharedAgents();

/** Same fd hand-over as the unit tests (test/fixtures/agent.ts), under unshare. */
async function startPid1Agent(): Promise<UnsharedAgent> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dsec-agent-pid1-'));
  return unshared.start(dir, ['--fork', '--pid', '--mount-proc', '--kill-child', AGENT, '--listen-fd', '3']);
}

function out(r: AgentExecResult): string {
  if (r.kind !== 'exit') throw new Error(`exec failed: ${r.message}`);
  return r.stdout.toString();
}

/** "pid state ppid" of every process in the namespace, read with shell builtins only. */
async function processTable(c: AgentClient): Promise<{ pid: number; state: string; ppid: number }[]> {
  const r = await c.exec({
    argv: [BB, 'sh', '-c', 'for f in /proc/[0-9]*/stat; do read -r l < "$f" 2>/dev/null && echo "$l"; done'],
    env: ENV, maxOutputBytes: 1 << 20,
  });
  return out(r).trim().split('\n').filter(Boolean).map((l) => {
    const rest = l.slice(l.lastIndexOf(')') + 2).split(' ');
    return { pid: Number(l.split(' ')[0]), state: rest[0], ppid: Number(rest[1]) };
  });
}

beforeAll(() => buildAgent());

afterEach(() => unshared.cleanup());

describe.skipIf(!isRoot)('dsec-agent as PID 1 of a pid namespace', () => {
  it('runs as pid 1 and reaps orphaned zombies it did not spawn', async () => {
    const a = await startPid1Agent();
    const c = unshared.track(await AgentClient.connect(a.socketPath, { timeoutMs: 10_000 }));
    expect(c.info.pid).toBe(1);

    // The shell exits at once; its background children become orphans, are reparented
    // to PID 1 and turn into zombies when they exit, unless PID 1 reaps them.
    const r = await c.exec({
      argv: [BB, 'sh', '-c', 'sleep 0.2 & echo $!; for i in 1 2 3 4; do (sleep 0.1; exit $i) & done; exit 0'],
      env: ENV, maxOutputBytes: 1000,
    });
    const orphan = Number(out(r).trim());
    expect(orphan).toBeGreaterThan(1);
    const table = await processTable(c);
    const entry = table.find((p) => p.pid === orphan);
    if (entry) expect(entry.ppid).toBe(1); // still alive: reparented to the agent

    await waitFor('the orphans to exit and be reaped', async () => {
      const t = await processTable(c);
      return !t.some((p) => p.pid === orphan) && !t.some((p) => p.state === 'Z') &&
        t.every((p) => p.pid === 1 || p.ppid === 1); // only the agent and the scanning shell
    });
    const log = fs.readFileSync(a.logPath, 'utf8');
    expect(log).toContain(`reaped orphan pid=${orphan} `);
    expect(log).toMatch(/pid1=yes/);
  });

  it('is not stopped by signals sent from inside the sandbox', async () => {
    const a = await startPid1Agent();
    const c = unshared.track(await AgentClient.connect(a.socketPath, { timeoutMs: 10_000 }));
    const hostPid = agentHostPid(a);
    expect(hostPid).toBeGreaterThan(1);

    for (const sig of ['TERM', 'INT', 'HUP', 'KILL']) {
      const r = await c.exec({ argv: [BB, 'kill', `-${sig}`, '1'], env: ENV, maxOutputBytes: 1000 });
      expect(r).toMatchObject({ kind: 'exit', exitCode: 0 });
    }
    // Still serving the same connection, and new ones.
    expect(await c.ping()).toBeGreaterThanOrEqual(0);
    expect(out(await c.exec({ argv: [BB, 'echo', 'alive'], env: ENV, maxOutputBytes: 100 }))).toBe('alive\n');
    const c2 = await AgentClient.connect(a.socketPath, { timeoutMs: 10_000 });
    try {
      expect(c2.info.pid).toBe(1);
    } finally {
      c2.close();
    }
    expect(fs.existsSync(`/proc/${hostPid}`)).toBe(true);
    expect(a.unshare.exitCode).toBeNull();
  });
});
