/**
 * PTY execs, detached execs and file operations of the agent running as PID 1 of new pid
 * and mount namespaces with a devpts of its own (`newinstance,ptmxmode=0666`), the way
 * container sandboxes mount /dev/pts. Needs root.
 */
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { AgentClient } from '../../daemon/agent/client.js';
import {
  AGENT, BB, UnsharedAgents, agentHostPid, buildAgent, waitFor, type UnsharedAgent,
} from '../fixtures/agent.js';

const ENV = ['PATH=/usr/bin:/bin:/usr/sbin:/sbin'];
const isRoot = process.getuid?.() === 0;

const unshared = new UnsharedAgents();

/**
 * The agent as PID 1 of new pid + mount namespaces, after mounting a new devpts instance
 * on /dev/pts (private propagation: the host's /dev/pts is untouched). With
 * ptmx = 'null', /dev/ptmx is bind-mounted over by /dev/null, so the agent has to use
 * /dev/pts/ptmx.
 */
async function startNsAgent(ptmx: 'default' | 'null'): Promise<UnsharedAgent> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dsec-agent-ns-'));
  fs.chmodSync(dir, 0o755);
  const script = [
    'set -e',
    'mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts /dev/pts',
    'if [ "$1" = null ]; then mount --bind /dev/null /dev/ptmx; fi',
    'exec "$0" --listen-fd 3',
  ].join('\n');
  return unshared.start(dir, ['--fork', '--pid', '--mount-proc', '--propagation', 'private', '--kill-child',
    '/bin/sh', '-c', script, AGENT, ptmx]);
}

async function connectNs(a: UnsharedAgent): Promise<AgentClient> {
  // The socket exists at once, but the agent accepts only after the mounts.
  let last: unknown;
  for (let i = 0; i < 200; i++) {
    try {
      return unshared.track(await AgentClient.connect(a.socketPath, { timeoutMs: 10_000 }));
    } catch (e) {
      last = e;
      await new Promise((r) => setTimeout(r, 25));
    }
  }
  throw last;
}

async function tty(c: AgentClient, script: string): Promise<string> {
  let out = '';
  const h = c.startExec({ argv: [BB, 'sh', '-c', script], env: ENV, tty: { rows: 30, cols: 90 } }, {
    onStdout: (b) => { out += b.toString(); },
  });
  expect(await h.done).toMatchObject({ kind: 'exit', exitCode: 0 });
  return out;
}

beforeAll(() => buildAgent());

afterEach(() => unshared.cleanup());

describe.skipIf(!isRoot)('dsec-agent as PID 1 with its own devpts', () => {
  it('allocates terminals from the sandbox devpts through /dev/ptmx', async () => {
    const a = await startNsAgent('default');
    const c = await connectNs(a);
    expect(c.info.pid).toBe(1);
    const out = await tty(c, `${BB} tty; ${BB} stty size; ls /dev/pts`);
    const lines = out.split('\r\n');
    expect(lines[0]).toBe('/dev/pts/0'); // a fresh instance numbers from 0
    expect(lines[1]).toBe('30 90');
  });

  it('falls back to /dev/pts/ptmx when /dev/ptmx is unusable', async () => {
    const a = await startNsAgent('null');
    const c = await connectNs(a);
    const check = await c.exec({ argv: [BB, 'sh', '-c', 'stat -c %t:%T /dev/ptmx'], env: ENV, maxOutputBytes: 100 });
    expect(check.stdout.toString().trim()).toBe('1:3'); // /dev/null: not a ptmx
    const out = await tty(c, `${BB} tty; ${BB} stty size`);
    expect(out).toBe('/dev/pts/0\r\n30 90\r\n');
    const hostPid = agentHostPid(a);
    expect(hostPid).toBeGreaterThan(1);
    // Ctrl-C still works through the terminal.
    const h = c.startExec({ argv: [BB, 'sleep', '30'], env: ENV, tty: { rows: 5, cols: 5 } });
    await h.pid;
    h.writeStdin(Buffer.from('\x03'));
    expect(await h.done).toMatchObject({ kind: 'exit', signal: 2 });
  });

  it('keeps a detached exec across a disconnect and reaps it as PID 1', async () => {
    const a = await startNsAgent('default');
    let c = await connectNs(a);
    const file = path.join(a.dir, 'detached');
    const h = c.startExec({ argv: [BB, 'sh', '-c', `sleep 0.5; echo ok > ${file}`], env: ENV, detached: true });
    const pid = await h.pid;
    c.close();
    await waitFor('the detached exec to finish', () => fs.existsSync(file));
    c = await connectNs(a);
    await waitFor('no zombie left', async () => {
      const r = await c.exec({ argv: [BB, 'sh', '-c', `cat /proc/${pid}/stat 2>/dev/null || echo gone`], env: ENV, maxOutputBytes: 1000 });
      return r.stdout.toString().trim() === 'gone';
    });
    expect(fs.readFileSync(a.logPath, 'utf8')).toMatch(new RegExp(`pid=${pid} \\(detached, connection gone\\) reaped`));
  });

  it('performs file operations as a given user and stays root itself', async () => {
    const a = await startNsAgent('default');
    const c = await connectNs(a);
    const d = path.join(a.dir, 'shared');
    fs.mkdirSync(d);
    fs.chmodSync(d, 0o777);
    await c.writeFile(path.join(d, 'n.txt'), Readable.from(['hello ', 'nobody']), { user: 'nobody' });
    expect(fs.statSync(path.join(d, 'n.txt')).uid).toBe(65534);
    const parts: Buffer[] = [];
    const r = c.readFile(path.join(d, 'n.txt'), { user: 'nobody' });
    for await (const b of r.stream) parts.push(b as Buffer);
    await r.done;
    expect(Buffer.concat(parts).toString()).toBe('hello nobody');
    await expect(c.writeFile(path.join(a.dir, 'denied'), Buffer.from('x'), { user: 'nobody' }))
      .rejects.toMatchObject({ kind: 'FailedPrecondition' });
    // /proc inside is the sandbox's: its magic links are refused as well.
    await expect(c.stat('/proc/1/root/etc/passwd')).rejects.toMatchObject({ kind: 'InvalidArgument' });
    expect((await c.list('/dev/pts')).map((e) => e.name)).toContain('ptmx');
    const hostPid = agentHostPid(a);
    const status = fs.readFileSync(`/proc/${hostPid}/status`, 'utf8');
    expect(/^Uid:\s+(.*)$/m.exec(status)?.[1].split(/\s+/)).toEqual(['0', '0', '0', '0']);
  });
});
