/**
 * The agent as PID 1 of a new pid namespace (`unshare --fork --pid --mount-proc`), the way
 * it runs in every container sandbox: it must reap orphans it never spawned and must
 * not stop on signals sent from inside the sandbox. Needs root.
 */
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { AgentClient, type AgentExecResult } from '../../daemon/agent/client.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const AGENT = path.join(ROOT, 'native/agent/dsec-agent');
const BB = '/bin/busybox';
const ENV = ['PATH=/usr/bin:/bin:/usr/sbin:/sbin'];
const isRoot = process.getuid?.() === 0;

interface Pid1Agent {
  unshare: ChildProcess;
  dir: string;
  socketPath: string;
  logPath: string;
  exited: Promise<void>;
}

let current: Pid1Agent | null = null;
let client: AgentClient | null = null;

/** Same fd hand-over as the unit tests: Node binds, the agent inherits fd 3, Node lets go. */
async function startPid1Agent(): Promise<Pid1Agent> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dsec-agent-pid1-'));
  const bindPath = path.join(dir, 'bind.sock');
  const socketPath = path.join(dir, 'agent.sock');
  const logPath = path.join(dir, 'agent.log');
  const server = net.createServer();
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(bindPath, resolve);
  });
  fs.linkSync(bindPath, socketPath);
  const fd = (server as unknown as { _handle: { fd: number } })._handle.fd;
  const log = fs.openSync(logPath, 'a');
  // --kill-child: if unshare dies, the kernel SIGKILLs the agent, which tears down the
  // whole pid namespace.
  const unshare = spawn('unshare', ['--fork', '--pid', '--mount-proc', '--kill-child', AGENT, '--listen-fd', '3'], {
    stdio: ['ignore', log, log, fd],
  });
  fs.closeSync(log);
  await new Promise<void>((resolve) => server.close(() => resolve()));
  const exited = new Promise<void>((resolve) => unshare.once('exit', () => resolve()));
  current = { unshare, dir, socketPath, logPath, exited };
  return current;
}

/** Host pid of the agent: the only child of the unshare process. */
function agentHostPid(a: Pid1Agent): number | null {
  try {
    const kids = fs.readFileSync(`/proc/${a.unshare.pid}/task/${a.unshare.pid}/children`, 'utf8').trim();
    return kids ? Number(kids.split(/\s+/)[0]) : null;
  } catch {
    return null;
  }
}

async function waitFor(what: string, cond: () => boolean | Promise<boolean>, limitMs = 20_000): Promise<void> {
  const end = Date.now() + limitMs;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
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

beforeAll(() => {
  execFileSync('make', ['-s', '-C', path.join(ROOT, 'native/agent')], { stdio: 'inherit' });
});

afterEach(async () => {
  client?.close();
  client = null;
  const a = current;
  current = null;
  if (!a) return;
  const pid = agentHostPid(a);
  if (pid) {
    try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
  }
  if (a.unshare.exitCode === null && a.unshare.signalCode === null) {
    const t = setTimeout(() => { try { process.kill(a.unshare.pid!, 'SIGKILL'); } catch { /* gone */ } }, 10_000);
    await a.exited;
    clearTimeout(t);
  }
  fs.rmSync(a.dir, { recursive: true, force: true });
});

describe.skipIf(!isRoot)('dsec-agent as PID 1 of a pid namespace', () => {
  it('runs as pid 1 and reaps orphaned zombies it did not spawn', async () => {
    const a = await startPid1Agent();
    client = await AgentClient.connect(a.socketPath, { timeoutMs: 10_000 });
    const c = client;
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
    client = await AgentClient.connect(a.socketPath, { timeoutMs: 10_000 });
    const c = client;
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
