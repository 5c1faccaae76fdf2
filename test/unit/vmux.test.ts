/**
 * The agent stream multiplexer of the microvm tier, both ends: the host codec and session
 * (daemon/drivers/vmm/vmux.ts) and the guest side (native/agent/vmux.c), with the real
 * agent run on the host as `dsec-agent --vmux-fd 3` on a socketpair instead of a
 * virtio-serial port. Covers the handshake and version negotiation, streams carrying the
 * agent protocol, per-stream credits (a stalled reader blocks nobody else), large
 * transfers both ways, resynchronisation after stale and truncated frames (what a dsecd
 * restart leaves), guest operations, and the host going away.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import { AgentClient } from '../../daemon/agent/client.js';
import { FrameDecoder, FrameType, encodeExecRequest, encodeFrame, encodeU32 } from '../../daemon/agent/protocol.js';
import {
  GuestOp, MUX_BREAK_BYTES, MUX_MAX_PAYLOAD, MuxDecoder, MuxType, VmuxSession, decodeHelloAck, encodeHello, encodeMuxFrame, findFrame,
  type MuxFrame,
} from '../../daemon/drivers/vmm/vmux.js';
import { AGENT, buildAgent, waitFor } from '../fixtures/agent.js';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'dsec-vmux-test-'));
const ENV = ['PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin'];

describe('mux codec', () => {
  it('round-trips frames split at every byte', () => {
    const frames = [encodeMuxFrame(MuxType.DATA, 7, Buffer.from('hello')), encodeMuxFrame(MuxType.CREDIT, 0), encodeMuxFrame(MuxType.DATA, 0xffffffff, randomBytes(MUX_MAX_PAYLOAD))];
    const all = Buffer.concat(frames);
    const d = new MuxDecoder();
    const got: MuxFrame[] = [];
    for (let i = 0; i < all.length; i++) got.push(...d.push(all.subarray(i, i + 1)));
    expect(got.map((f) => [f.type, f.stream, f.payload.length])).toEqual([[MuxType.DATA, 7, 5], [MuxType.CREDIT, 0, 0], [MuxType.DATA, 0xffffffff, MUX_MAX_PAYLOAD]]);
    expect(d.skipped).toBe(0);
    expect(() => encodeMuxFrame(MuxType.DATA, 1, Buffer.alloc(MUX_MAX_PAYLOAD + 1))).toThrow();
  });

  it('skips garbage, corrupt frames and a truncated frame completed by the break, then finds the next frame', () => {
    const good = encodeMuxFrame(MuxType.DATA, 3, Buffer.from('after'));
    const corrupt = encodeMuxFrame(MuxType.DATA, 3, Buffer.from('flipped'));
    corrupt[corrupt.length - 1] ^= 1;
    // A header claiming 60,000 bytes of which only 10 arrived (the old dsecd died mid-write).
    const truncated = encodeMuxFrame(MuxType.DATA, 9, Buffer.alloc(60_000, 7)).subarray(0, 26);
    const d = new MuxDecoder();
    const got = d.push(Buffer.concat([Buffer.from('garbage\xd5\xd5X'), corrupt, truncated, Buffer.alloc(MUX_BREAK_BYTES), good]));
    expect(got.map((f) => f.payload.toString())).toEqual(['after']);
    expect(d.skipped).toBeGreaterThan(MUX_BREAK_BYTES);
    expect(d.pendingBytes).toBe(0);
  });

  it('findFrame finds a handshake frame behind a stale header that claims a long payload', () => {
    const nonce = randomBytes(8);
    const ack = Buffer.alloc(18);
    nonce.copy(ack, 6);
    const stale = encodeMuxFrame(MuxType.DATA, 1, Buffer.alloc(50_000)).subarray(0, 100);
    const buf = Buffer.concat([stale, encodeMuxFrame(MuxType.HELLO_ACK, 0, ack)]);
    expect(new MuxDecoder().push(buf)).toEqual([]); // sequential parsing waits for the stale payload
    const hit = findFrame(buf, (f) => f.type === MuxType.HELLO_ACK && decodeHelloAck(f.payload)!.nonce.equals(nonce));
    expect(hit?.end).toBe(buf.length);
  });
});

interface GuestAgent {
  child: ChildProcess;
  port: Duplex;
  log: () => string;
  exited: Promise<void>;
}

describe('mux end to end with the agent on a socketpair', () => {
  const agents: GuestAgent[] = [];
  const closers: Array<() => void> = [];
  beforeAll(() => buildAgent());
  afterEach(async () => {
    for (const c of closers.splice(0)) c();
    for (const a of agents.splice(0)) {
      a.child.kill('SIGTERM');
      await a.exited;
    }
  });
  afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

  /** The agent with its mux on fd 3, one end of a socketpair whose other end is `port`. */
  function startGuest(): GuestAgent {
    const logFile = path.join(tmp, `agent-${randomBytes(4).toString('hex')}.log`);
    const log = fs.openSync(logFile, 'a');
    const child = spawn(AGENT, ['--vmux-fd', '3'], { stdio: ['ignore', log, log, 'pipe'] });
    fs.closeSync(log);
    const a: GuestAgent = { child, port: child.stdio[3] as Duplex, log: () => fs.readFileSync(logFile, 'utf8'), exited: new Promise((r) => child.once('exit', () => r())) };
    agents.push(a);
    return a;
  }

  /** A Unix socket whose connections become streams of `s` (what dsecd's agent.sock is). */
  async function endpoint(s: VmuxSession): Promise<string> {
    const p = path.join(tmp, `ep-${randomBytes(4).toString('hex')}.sock`);
    const srv = net.createServer((c) => s.attach(c));
    await new Promise<void>((r) => srv.listen(p, r));
    closers.push(() => { srv.close(); s.close(); });
    return p;
  }

  /** Frames the guest sends on `port` until `until` matches one (raw, before a VmuxSession owns the port). */
  function rawFrames(port: Duplex) {
    const d = new MuxDecoder();
    const seen: MuxFrame[] = [];
    const waiters: Array<{ match: (f: MuxFrame) => boolean; resolve: (f: MuxFrame) => void }> = [];
    const onData = (b: Buffer) => {
      for (const f of d.push(b)) {
        seen.push(f);
        for (const w of [...waiters]) if (w.match(f)) { waiters.splice(waiters.indexOf(w), 1); w.resolve(f); }
      }
    };
    port.on('data', onData);
    return {
      next: (match: (f: MuxFrame) => boolean) => new Promise<MuxFrame>((resolve) => {
        const hit = seen.find(match);
        if (hit) resolve(hit);
        else waiters.push({ match, resolve });
      }),
      detach: () => port.off('data', onData),
    };
  }

  it('handshakes and carries independent agent connections', async () => {
    const g = startGuest();
    const s = await VmuxSession.start(g.port, { timeoutMs: 10_000, what: 'test guest' });
    expect(s.version).toBe(1);
    const p = await endpoint(s);
    const [a, b] = await Promise.all([AgentClient.connect(p), AgentClient.connect(p)]);
    closers.push(() => { a.close(); b.close(); });
    expect(a.info).toMatchObject({ agent: 'dsec-agent', protocol: 1 });
    const [ra, rb] = await Promise.all([
      a.exec({ argv: ['/bin/busybox', 'echo', 'one'], env: ENV, cwd: '/', user: '0', maxOutputBytes: 1024 }),
      b.exec({ argv: ['/bin/busybox', 'sh', '-c', 'cat'], env: ENV, cwd: '/', user: '0', stdin: Buffer.from('two'), maxOutputBytes: 1024 }),
    ]);
    expect([ra.stdout.toString(), rb.stdout.toString()]).toEqual(['one\n', 'two']);
    expect(s.streamCount).toBe(2);
    a.close();
    await waitFor('the guest to see the stream close', () => /conn=\d+ closed \(peer closed\)/.test(g.log()));
  });

  it('a stream whose reader stalls blocks no other stream, and loses nothing once read again', async () => {
    const g = startGuest();
    const s = await VmuxSession.start(g.port, { timeoutMs: 10_000, what: 'test guest' });
    const p = await endpoint(s);
    // A raw agent connection that asks for 16 MiB of output and then does not read.
    const raw = net.createConnection(p);
    closers.push(() => raw.destroy());
    await new Promise((r) => raw.once('connect', r));
    raw.write(encodeFrame(FrameType.HELLO, 0, encodeU32(1)));
    raw.write(encodeFrame(FrameType.EXEC, 1, encodeExecRequest({ argv: ['/bin/busybox', 'head', '-c', String(16 << 20), '/dev/zero'], env: ENV, cwd: '/', user: '0' })));
    raw.pause();
    const c = await AgentClient.connect(p);
    closers.push(() => c.close());
    // The stalled stream holds at most a window in each place; the other stream runs.
    for (let i = 0; i < 5; i++) {
      const r = await c.exec({ argv: ['/bin/busybox', 'echo', `still ${i}`], env: ENV, cwd: '/', user: '0', maxOutputBytes: 1024 });
      expect(r.stdout.toString()).toBe(`still ${i}\n`);
    }
    const dec = new FrameDecoder();
    let out = 0;
    const exit = new Promise<void>((resolve) => raw.on('data', (b: Buffer) => {
      for (const f of dec.push(b)) {
        if (f.type === FrameType.STDOUT) out += f.payload.length;
        if (f.type === FrameType.EXIT) resolve();
      }
    }));
    raw.resume();
    await exit;
    expect(out).toBe(16 << 20);
  });

  it('moves a 3 MiB file in and out intact (credits in both directions)', async () => {
    const g = startGuest();
    const s = await VmuxSession.start(g.port, { timeoutMs: 10_000, what: 'test guest' });
    const c = await AgentClient.connect(await endpoint(s));
    closers.push(() => c.close());
    const data = randomBytes(3 << 20);
    const f = path.join(tmp, `big-${randomBytes(4).toString('hex')}`);
    await c.writeFile(f, [data]);
    expect(fs.readFileSync(f).equals(data)).toBe(true);
    const r = await c.readFile(f);
    const parts: Buffer[] = [];
    for await (const chunk of r.stream) parts.push(chunk as Buffer);
    expect(Buffer.concat(parts).equals(data)).toBe(true);
  });

  it('negotiates the version: a host speaking only later versions gets version 0 and the guest range', async () => {
    const g = startGuest();
    const raw = rawFrames(g.port);
    const nonce = randomBytes(8);
    g.port.write(encodeMuxFrame(MuxType.HELLO, 0, encodeHello(nonce, 2, 3)));
    const ack = decodeHelloAck((await raw.next((f) => f.type === MuxType.HELLO_ACK)).payload)!;
    expect(ack).toMatchObject({ version: 0, guestMin: 1, guestMax: 1 });
    expect(ack.nonce.equals(nonce)).toBe(true);
    raw.detach();
    // A later HELLO in range opens a session on the same port.
    const s = await VmuxSession.start(g.port, { timeoutMs: 10_000, what: 'test guest' });
    closers.push(() => s.close());
    expect(s.version).toBe(1);
  });

  it('a new host session after stale and truncated frames drops the old streams and works (dsecd restarted)', async () => {
    const g = startGuest();
    const raw = rawFrames(g.port);
    // "Old dsecd": a session with one stream running an exec, then a frame cut short.
    const old = randomBytes(8);
    g.port.write(encodeMuxFrame(MuxType.HELLO, 0, encodeHello(old)));
    await raw.next((f) => f.type === MuxType.HELLO_ACK);
    g.port.write(encodeMuxFrame(MuxType.OPEN, 5));
    const hello = encodeFrame(FrameType.HELLO, 0, encodeU32(1));
    const exec = encodeFrame(FrameType.EXEC, 1, encodeExecRequest({ argv: ['/bin/busybox', 'sleep', '300'], env: ENV, cwd: '/', user: '0' }));
    g.port.write(encodeMuxFrame(MuxType.DATA, 5, Buffer.concat([hello, exec])));
    const started = await raw.next((f) => f.type === MuxType.DATA && f.stream === 5 && new FrameDecoder().push(f.payload).some((x) => x.type === FrameType.STARTED));
    const sleepPid = new FrameDecoder().push(started.payload).find((x) => x.type === FrameType.STARTED)!.payload.readUInt32BE(0);
    g.port.write(encodeMuxFrame(MuxType.DATA, 5, Buffer.alloc(40_000, 1)).subarray(0, 300));
    raw.detach();
    // "New dsecd": break + HELLO on the same byte stream (the guest never saw an end of file).
    const s = await VmuxSession.start(g.port, { timeoutMs: 10_000, what: 'test guest' });
    const c = await AgentClient.connect(await endpoint(s));
    closers.push(() => c.close());
    const r = await c.exec({ argv: ['/bin/busybox', 'echo', 'new session'], env: ENV, cwd: '/', user: '0', maxOutputBytes: 1024 });
    expect(r.stdout.toString()).toBe('new session\n');
    expect(g.log()).toMatch(/vmux: dropping 1 stream\(s\): a new host session began/);
    expect(g.log()).toMatch(/vmux: skipped \d+ byte\(s\) that were no valid frame/);
    // The old stream's exec was killed like a dropped connection's.
    await waitFor('the old exec to be killed', () => new RegExp(`pid=${sleepPid} killed: connection closed`).test(g.log()));
  });

  it('guest operations answer; those only the guest init may do are refused elsewhere', async () => {
    const g = startGuest();
    const s = await VmuxSession.start(g.port, { timeoutMs: 10_000, what: 'test guest' });
    closers.push(() => s.close());
    expect(await s.op(GuestOp.SYNC)).toBe(0);
    expect(await s.op(GuestOp.PROCS)).toBeGreaterThan(0);
    await expect(s.op(GuestOp.KILL_ALL, encodeU32(15))).rejects.toMatchObject({ kind: 'Internal', message: expect.stringMatching(/KILL_ALL failed with errno 1/) });
    await expect(s.op(GuestOp.SET_TIME, Buffer.alloc(8))).rejects.toMatchObject({ kind: 'Internal', message: expect.stringMatching(/errno 1/) });
    await expect(s.op(99 as GuestOp)).rejects.toMatchObject({ message: expect.stringMatching(/errno 38/) });
  });

  it('when the host goes away the guest drops its streams and keeps running', async () => {
    const g = startGuest();
    const s = await VmuxSession.start(g.port, { timeoutMs: 10_000, what: 'test guest' });
    const lost: Error[] = [];
    s.onLost((e) => lost.push(e));
    const c = await AgentClient.connect(await endpoint(s));
    const gone = new Promise<void>((r) => c.onLost(() => r()));
    g.port.destroy(); // the port's host end closes
    await gone;
    expect(lost).toHaveLength(1);
    await waitFor('the guest to notice', () => /vmux: host disconnected/.test(g.log()));
    expect(g.child.exitCode).toBeNull();
  });

  it('the host side refuses a HELLO_ACK it did not ask for and times out naming what', async () => {
    const [a, b] = await new Promise<[net.Socket, net.Socket]>((resolve) => {
      const p = path.join(tmp, `pair-${randomBytes(4).toString('hex')}.sock`);
      const srv = net.createServer((x) => { srv.close(); resolve([x, y]); });
      let y: net.Socket;
      srv.listen(p, () => { y = net.createConnection(p); });
    });
    closers.push(() => { a.destroy(); b.destroy(); });
    // A "guest" that answers with the wrong nonce.
    b.on('data', () => {
      const ack = Buffer.alloc(18);
      ack.writeUInt16BE(1, 0);
      b.write(encodeMuxFrame(MuxType.HELLO_ACK, 0, ack));
    });
    await expect(VmuxSession.start(a, { timeoutMs: 300, what: 'sandbox x' })).rejects.toMatchObject({
      kind: 'DeadlineExceeded', message: 'sandbox x: the guest agent did not answer the mux HELLO within 300 ms',
    });
  });
});
