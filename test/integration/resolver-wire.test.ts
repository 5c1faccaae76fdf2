/**
 * The sandbox resolver process (daemon/net/resolver-child.ts) on the real kernel, in a
 * network namespace of this test: what reaches the upstream for an allowed name is a
 * query rebuilt from the question alone (new id, lowercased name, RD only, no EDNS, no
 * extra records, no trailing bytes), and the client gets the answer under its own id
 * and question, over UDP and TCP. The test plays dsecd on the child's IPC channel
 * (every question forwarded) and runs a fake upstream that prints every query's bytes.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import readline from 'node:readline';
import { execa } from 'execa';
import { IS_ROOT, REPO } from './harness.js';
import { buildQuery, parseAnswer, QTYPE } from '../../daemon/net/dnswire.js';
import type { ChildToParent } from '../../daemon/net/resolver-ipc.js';

const NS = `dsec-t-reswire-${process.pid}`;
const FIXTURE = path.join(REPO, 'test/fixtures/netns-servers.mjs');

/** Fake upstream on 127.0.0.2:53 (UDP and TCP): prints `q <hex>` per query and answers A 192.0.2.9. */
const UPSTREAM = `
import dgram from 'node:dgram'; import net from 'node:net';
import { answer } from ${JSON.stringify(FIXTURE)};
const rec = (m) => process.stdout.write('q ' + m.toString('hex') + '\\n');
const u = dgram.createSocket('udp4');
u.on('message', (m, r) => { rec(m); u.send(answer(m, ['192.0.2.9']), r.port, r.address); });
const t = net.createServer((c) => { let b = Buffer.alloc(0); c.on('data', (d) => { b = Buffer.concat([b, d]);
  if (b.length >= 2 && b.length >= 2 + b.readUInt16BE(0)) { const m = b.subarray(2, 2 + b.readUInt16BE(0)); rec(m); const a = answer(m, ['192.0.2.9']);
    const l = Buffer.alloc(2); l.writeUInt16BE(a.length); c.end(Buffer.concat([l, a])); } }); });
u.bind(53, '127.0.0.2', () => t.listen(53, '127.0.0.2', () => process.stdout.write('ready\\n')));
`;

/** Sends one query (hex argv[1]) to 127.0.0.1:53 over UDP or TCP (argv[2]) and prints the reply's hex. */
const CLIENT = `
import dgram from 'node:dgram'; import net from 'node:net';
const q = Buffer.from(process.argv[1], 'hex');
if (process.argv[2] === 'udp') { const s = dgram.createSocket('udp4'); s.on('message', (m) => { console.log(m.toString('hex')); s.close(); }); s.send(q, 53, '127.0.0.1'); }
else { const c = net.connect(53, '127.0.0.1', () => { const l = Buffer.alloc(2); l.writeUInt16BE(q.length); c.write(Buffer.concat([l, q])); });
  let b = Buffer.alloc(0); c.on('data', (d) => { b = Buffer.concat([b, d]); if (b.length >= 2 + b.readUInt16BE(0)) { console.log(b.subarray(2, 2 + b.readUInt16BE(0)).toString('hex')); c.destroy(); } }); }
`;

describe.skipIf(!IS_ROOT)('sandbox resolver: what an allowed query carries upstream', () => {
  let upstream: ChildProcess;
  let child: ChildProcess;
  const upLines: string[] = [];
  const asked: string[] = [];

  beforeAll(async () => {
    await execa('ip', ['netns', 'add', NS]);
    await execa('ip', ['-n', NS, 'link', 'set', 'lo', 'up']);
    upstream = spawn('ip', ['netns', 'exec', NS, process.execPath, '--input-type=module', '-e', UPSTREAM], { stdio: ['pipe', 'pipe', 'inherit'] });
    const rl = readline.createInterface({ input: upstream.stdout! });
    await new Promise<void>((resolve) => rl.on('line', (l) => { if (l === 'ready') resolve(); else upLines.push(l); }));
    child = spawn('nsenter', [`--net=/run/netns/${NS}`, '--', process.execPath, path.join(REPO, 'dist/daemon/net/resolver-child.js'), '127.0.0.1', JSON.stringify(['127.0.0.2:53'])], {
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    await new Promise<void>((resolve, reject) => child.on('message', (m: ChildToParent) => {
      if (m.t === 'ready') resolve();
      if (m.t === 'error') reject(new Error(m.message));
      if (m.t === 'query') { asked.push(m.name); child.send({ t: 'verdict', n: m.n, action: 'forward', report: false }); }
    }));
  });

  afterAll(async () => {
    child?.kill('SIGKILL');
    upstream?.kill('SIGKILL');
    await execa('ip', ['netns', 'del', NS], { reject: false });
  });

  /** Sends `q` through the resolver; returns the client's reply and the bytes the upstream got. */
  async function ask(q: Buffer, proto: 'udp' | 'tcp'): Promise<{ reply: Buffer; upstreamGot: Buffer }> {
    const before = upLines.length;
    const r = await execa('ip', ['netns', 'exec', NS, process.execPath, '--input-type=module', '-e', CLIENT, q.toString('hex'), proto]);
    const got = upLines.slice(before);
    expect(got).toHaveLength(1);
    return { reply: Buffer.from(r.stdout.trim(), 'hex'), upstreamGot: Buffer.from(got[0].slice(2), 'hex') };
  }

  it.each(['udp', 'tcp'] as const)('over %s: only the lowercased question goes upstream under a new id; the client gets its id and question back', async (proto) => {
    // The client's query hides data in its id, the case of its name, its flags (AD, CD),
    // an EDNS option and trailing bytes.
    const base = buildQuery('PyPI.ORG', QTYPE.A, 0xabcd);
    const q = Buffer.concat([base, Buffer.from([0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 8, 0, 10, 0, 4, 0xde, 0xad, 0xbe, 0xef]), Buffer.from('trailing-secret')]);
    q.writeUInt16BE(0x0130, 2);
    q.writeUInt16BE(1, 10);
    const { reply, upstreamGot } = await ask(q, proto);
    // Upstream: the question alone (bytes after the id equal a fresh query's), no id reuse.
    expect(upstreamGot.subarray(2).toString('hex')).toBe(buildQuery('pypi.org', QTYPE.A, 0).subarray(2).toString('hex'));
    expect(upstreamGot.includes(Buffer.from('trailing-secret'))).toBe(false);
    expect(asked.at(-1)).toBe('pypi.org');
    // Client: its id, its question bytes (its case), the upstream's address.
    expect(reply.readUInt16BE(0)).toBe(0xabcd);
    expect(reply.subarray(12, base.length).equals(base.subarray(12))).toBe(true);
    expect(parseAnswer(reply).addresses.map((a) => a.address)).toEqual(['192.0.2.9']);
  });

  it('queries under one client id go upstream under ids the client did not choose', async () => {
    const ids = new Set<number>();
    for (let i = 0; i < 4; i++) ids.add((await ask(buildQuery('pypi.org', QTYPE.A, 0x4242), 'udp')).upstreamGot.readUInt16BE(0));
    // 4 random 16-bit ids: all equal to 0x4242 has probability 2^-64.
    expect([...ids]).not.toEqual([0x4242]);
  });
});
