/**
 * Helpers of the networking tests (test/integration/network.test.ts,
 * test/attacks/network.test.ts): the static network probe, servers inside the instance
 * netns, and reading events.
 *
 * Where traffic goes: only to addresses of 198.51.100.0/24 (TEST-NET-2) that a test adds
 * to the loopback device of the dsecd instance's own network namespace, where servers
 * started with {@link NetnsServer} listen. Sandboxes reach them through the instance
 * bridge; the test's fake DNS for dsecd itself listens on the host's 127.0.0.1. Nothing
 * leaves the host, and the host's namespace is never changed.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { REPO, netnsOf, type TestDaemon } from './harness.js';
import type { Event } from '../../sdk/index.js';

/** Addresses the tests put in the instance netns. */
export const NET = {
  dns: '198.51.100.53',
  pypi: '198.51.100.80',
  other: '198.51.100.81',
  udp: '198.51.100.82',
} as const;

/** Compiles test/fixtures/net-probe.c statically once per process. */
let probe: Buffer | null = null;
export async function netProbe(): Promise<Buffer> {
  if (probe) return probe;
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'dsec-netprobe-'));
  try {
    await execa('gcc', ['-static', '-O1', '-o', path.join(tmp, 'p'), path.join(REPO, 'test/fixtures/net-probe.c')]);
    probe = readFileSync(path.join(tmp, 'p'));
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  return probe;
}

/**
 * Runs shell `script` in a sandbox with the probe at /tmp/p; returns stdout lines.
 * Probe lines are `ok ...` or an errno name (EPERM: refused by the egress programs).
 */
export async function probeIn(d: TestDaemon, id: string, script: string): Promise<string[]> {
  const r = await d.client.exec(id, { argv: ['sh', '-c', `cat > /tmp/p && chmod +x /tmp/p && { ${script}; }`], stdin: await netProbe() });
  return r.stdout.toString().trim().split('\n').map((l) => l.trim());
}

/** Adds the test addresses to the instance netns's loopback (once; needs the netns, i.e. one allow/open sandbox created). */
export async function addTestAddresses(d: TestDaemon): Promise<void> {
  for (const a of Object.values(NET)) await execa('ip', ['-n', netnsOf(d), 'addr', 'replace', `${a}/32`, 'dev', 'lo']);
}

/** A server from test/fixtures/netns-servers.mjs running inside the instance netns; it ends when its stdin closes. */
export class NetnsServer {
  readonly lines: string[] = [];
  private constructor(private readonly proc: ChildProcess) {}

  /** Starts `mode host port extra` inside the netns of `d` and waits for `ready`. */
  static async start(d: TestDaemon, mode: 'dns' | 'tcp' | 'udp', host: string, port: number, extra?: string): Promise<NetnsServer> {
    const args = [`--net=/run/netns/${netnsOf(d)}`, '--', process.execPath, path.join(REPO, 'test/fixtures/netns-servers.mjs'), mode, host, String(port), ...(extra !== undefined ? [extra] : [])];
    const proc = spawn('nsenter', args, { stdio: ['pipe', 'pipe', 'inherit'] });
    const s = new NetnsServer(proc);
    let buf = '';
    await new Promise<void>((resolve, reject) => {
      proc.once('exit', (c) => reject(new Error(`netns server ${mode} ${host}:${port} exited (${c})`)));
      proc.stdout!.on('data', (b: Buffer) => {
        buf += b.toString();
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          const l = buf.slice(0, i);
          buf = buf.slice(i + 1);
          if (l === 'ready') resolve();
          else s.lines.push(l);
        }
      });
    });
    return s;
  }

  /** Stops the server and waits for it to exit. */
  async stop(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = new Promise((r) => this.proc.once('exit', r));
    this.proc.stdin!.end();
    await exited;
  }
}

/** Every recorded event of a sandbox (of the given type prefix). */
export async function eventsOf(d: TestDaemon, id: string, prefix = 'network.'): Promise<Event[]> {
  const out: Event[] = [];
  for await (const e of d.client.events()) if (e.sandbox_id === id && e.type.startsWith(prefix)) out.push(e);
  return out;
}

/** Names of the host's network interfaces and its ip_forward, which sandbox networking must never change. */
export async function hostNetworkState(): Promise<{ links: string[]; ipForward: string; routes: string }> {
  const links = (JSON.parse(String((await execa('ip', ['-j', 'link', 'show'])).stdout)) as { ifname: string }[]).map((l) => l.ifname).sort();
  return { links, ipForward: readFileSync('/proc/sys/net/ipv4/ip_forward', 'utf8').trim(), routes: String((await execa('ip', ['route', 'show'])).stdout) };
}
