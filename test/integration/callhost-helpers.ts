/**
 * Helpers of the tests of isolated execs and call hosts (agent-isolated.test.ts,
 * callhost-attacks.test.ts, callhost-attacks2.test.ts): a static C helper compiled here
 * and copied into an ordinary sandbox, the rig of three fncall workers the attack files
 * compare, one call with its STARTED pid and output, and what the host sees of a worker
 * (its call hosts, the processes calls left behind).
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { AgentClient, FileWriteFlag, type AgentExecRequest, type AgentExecResult } from '../../daemon/agent/client.js';
import { buildAgent } from '../fixtures/agent.js';
import { startWorkerBeside, type WorkerContainer } from '../fixtures/worker.js';
import { TestDaemon } from './harness.js';

/** PATH of every call the tests make. */
export const ENV = ['PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin'];

/** `sh -c script`. */
export function sh(script: string): string[] {
  return ['sh', '-c', script];
}

/** key=value lines as a map. */
export function kv(s: string): Record<string, string> {
  return Object.fromEntries(s.trim().split('\n').filter((l) => l.includes('=')).map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
}

/** stdout of an exec that exited 0. @throws Error naming the outcome otherwise. */
export function ok(r: AgentExecResult): string {
  if (r.kind !== 'exit') throw new Error(`exec failed: ${r.message}`);
  if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode} signal ${r.signal}: ${r.stdout.toString()} ${r.stderr.toString()}`);
  return r.stdout.toString();
}

/**
 * Compiles the C program `source` (gcc -O2 -static, plus `flags`) and writes it, mode
 * 0755, to `dest` inside a sandbox through its agent `client` (a worker's image is
 * read-only; the ordinary sandbox beside it shares its rootfs).
 * @throws Error when gcc fails or the write is refused.
 */
export async function installStaticHelper(client: AgentClient, dest: string, source: string, flags: string[] = []): Promise<void> {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'dsec-helper-'));
  try {
    fs.writeFileSync(path.join(tmp, 'helper.c'), source);
    execFileSync('gcc', ['-O2', '-static', ...flags, '-o', path.join(tmp, 'helper'), path.join(tmp, 'helper.c')]);
    await client.writeFile(dest, fs.readFileSync(path.join(tmp, 'helper')), { mode: 0o755, flags: FileWriteFlag.CREATE | FileWriteFlag.PARENTS });
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

/**
 * Whether host pid `p` is a call host of the worker agent whose host pid is `agentPid`:
 * its child, and pid 1 of a pid namespace of its own (the last NSpid field). False once gone.
 */
export function isCallHost(agentPid: number, p: number): boolean {
  try {
    const st = fs.readFileSync(`/proc/${p}/status`, 'utf8');
    return Number(/^PPid:\s+(\d+)$/m.exec(st)?.[1]) === agentPid && /^NSpid:.*\s1$/m.test(st);
  } catch {
    return false;
  }
}

/** Processes in worker `wk`'s cgroup other than its agent and its call hosts, as "pid stat..." (those gone meanwhile left out). */
export async function strays(wk: WorkerContainer): Promise<string[]> {
  const ps = (await wk.cgroups.pids(wk.id)).filter((p) => p !== wk.pid && !isCallHost(wk.pid, p));
  return ps.map((p) => {
    try {
      return `${p} ${fs.readFileSync(`/proc/${p}/stat`, 'utf8').trim().slice(0, 80)}`;
    } catch {
      return `${p} gone`;
    }
  }).filter((s) => !s.endsWith(' gone'));
}

/** The ISOLATE options of a call (sizes in bytes). */
export type Iso = { tmpBytes?: number; shmBytes?: number; scratch?: { path: string; bytes: number }[] };

/**
 * One exec on `cl`: isolated with `isolate`, plain with null. Resolves with the pid
 * STARTED named (the call host's or the namespace init's; -1 if none), the outcome and
 * the output. @throws DsecError when the agent refuses the request (ERROR frame).
 */
export async function call(cl: AgentClient, argv: string[], isolate: Iso | null = {}, extra: Partial<AgentExecRequest> = {}) {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  const h = cl.startExec({ argv, env: ENV, ...extra, ...(isolate ? { isolate } : {}) }, { onStdout: (b) => out.push(b), onStderr: (b) => err.push(b) });
  const pid = await h.pid.catch(() => -1);
  const r = await h.done;
  return { pid, r, out: Buffer.concat(out).toString(), err: Buffer.concat(err).toString() };
}

/** Kills the host that serves `cl`'s next call (the top of its idle stack) with its call; resolves with that host's pid. */
export async function killNextHost(cl: AgentClient): Promise<number> {
  const h = cl.startExec({ argv: ['sleep', '100'], env: ENV, isolate: {} });
  const pid = await h.pid;
  h.signal(9);
  await h.done;
  return pid;
}

/**
 * The attack files' rig: a dsecd on `slot` with an ordinary busybox sandbox (into which
 * `helper` is compiled, with -pthread) and three fncall workers beside it on its rootfs:
 * `c` (call hosts and Landlock, what dsecd runs), `co` (`--no-callhost`: a namespace init
 * per call, for comparison) and `cn` (call hosts without `--landlock`).
 */
export interface CallhostRig {
  d: TestDaemon;
  ordinary: AgentClient;
  w: WorkerContainer;
  c: AgentClient;
  wo: WorkerContainer;
  co: AgentClient;
  wn: WorkerContainer;
  cn: AgentClient;
  /** Closes the connections, stops the workers and cleans the daemon up. */
  close(): Promise<void>;
}

/**
 * Starts a {@link CallhostRig}; `tag` names its workers. What started before a failure is
 * stopped again. @throws Error when any part fails to start.
 */
export async function startCallhostRig(slot: number, tag: string, helper: { path: string; source: string }): Promise<CallhostRig> {
  buildAgent();
  const d = await TestDaemon.start({ slot });
  const clients: AgentClient[] = [];
  const workers: WorkerContainer[] = [];
  const close = async () => {
    for (const cl of clients) cl.close();
    for (const x of workers) await x.stop();
    await d.cleanup();
  };
  const worker = async (name: string, mutateSpec?: (s: Record<string, any>) => void) => {
    const x = await startWorkerBeside(d.root, sb, `wk-${tag}${name}-${process.pid}`, mutateSpec ? { mutateSpec } : {});
    workers.push(x);
    const cl = await AgentClient.connect(x.socketPath);
    clients.push(cl);
    return [x, cl] as const;
  };
  let sb = '';
  try {
    sb = (await d.client.createSandbox({ image: 'busybox', filesystem: { writable_paths: [path.dirname(helper.path)] } })).id;
    const ordinary = await AgentClient.connect(path.join(d.root, 'sandboxes', sb, 'agent.sock'));
    clients.push(ordinary);
    await installStaticHelper(ordinary, helper.path, helper.source, ['-pthread']);
    const [w, c] = await worker('');
    const [wo, co] = await worker('o', (s) => { s.process.args.push('--no-callhost'); });
    const [wn, cn] = await worker('n', (s) => { s.process.args = (s.process.args as string[]).filter((a) => a !== '--landlock'); });
    return { d, ordinary, w, c, wo, co, wn, cn, close };
  } catch (e) {
    await close();
    throw e;
  }
}
