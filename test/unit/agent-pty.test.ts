/**
 * The agent's PTY execs (EXEC tag TTY, RESIZE) and DETACHED execs, with the agent run as a
 * normal (non-PID-1) process on a fresh listening socket, like test/unit/agent.test.ts.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { AgentClient } from '../../daemon/agent/client.js';
import {
  FrameType, decodeExecRequest, decodeExit, encodeExecRequest, encodeFrame, encodeU32, encodeWinsize,
} from '../../daemon/agent/protocol.js';
import { AgentHarness, BB, buildAgent, procState, waitFor } from '../fixtures/agent.js';

const ENV = ['PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin'];

// ---- harness (test/fixtures/agent.ts, same fd hand-over as agent.test.ts) --------------

const harness = new AgentHarness({ prefix: 'dsec-agent-pty-test-' });

function sh(script: string): string[] {
  return [BB, 'sh', '-c', script];
}

/** Run a tty exec to completion, feeding `input` (if any) after it started. */
async function runTty(c: AgentClient, argv: string[], opts: { rows?: number; cols?: number; env?: string[]; input?: string[] } = {}) {
  let out = '';
  const h = c.startExec(
    { argv, env: opts.env ?? ENV, tty: { rows: opts.rows ?? 24, cols: opts.cols ?? 80 } },
    { onStdout: (b) => { out += b.toString(); }, onStderr: () => { throw new Error('a tty exec has no stderr stream'); } },
  );
  await h.pid;
  for (const s of opts.input ?? []) h.writeStdin(Buffer.from(s));
  const outcome = await h.done;
  return { outcome, out };
}

beforeAll(() => buildAgent());

afterEach(() => harness.cleanup());

afterAll(() => harness.removeAll());

// ---- codec ----------------------------------------------------------------------------

describe('protocol codec: TTY and DETACHED', () => {
  it('round-trips the new EXEC tags and validates the window size', () => {
    const req = { argv: ['sh'], env: ['A=1'], tty: { rows: 24, cols: 80 }, detached: true };
    expect(decodeExecRequest(encodeExecRequest(req))).toEqual(req);
    expect(encodeWinsize(40, 100).toString('hex')).toBe('00280064');
    expect(() => encodeWinsize(70000, 1)).toThrow(/rows/);
    expect(() => encodeExecRequest({ argv: ['sh'], env: [], tty: { rows: -1, cols: 80 } })).toThrow(/rows/);
  });
});

// ---- PTY ------------------------------------------------------------------------------

describe('dsec-agent PTY execs', () => {
  it('gives the child a terminal of the requested size as stdio and controlling tty', async () => {
    const c = await harness.connect(await harness.start());
    const { outcome, out } = await runTty(c, sh(
      `${BB} stty size; ${BB} tty; echo "TERM=$TERM"; ` +
      'for f in 0 1 2; do readlink /proc/self/fd/$f; done; ' +
      // field 7 of /proc/self/stat is tty_nr (0 = no controlling terminal); the sid is field 6
      'read -r l < /proc/self/stat; set -- ${l##*) }; echo "ctty=$5 sid=$4 pid=$$"; echo ok > /dev/tty',
    ));
    expect(outcome).toMatchObject({ kind: 'exit', exitCode: 0 });
    const lines = out.split('\r\n');
    expect(lines).toContain('24 80');
    const tty = lines.find((l) => l.startsWith('/dev/pts/'));
    expect(tty).toMatch(/^\/dev\/pts\/\d+$/);
    expect(lines).toContain('TERM=xterm'); // default when the request env has no TERM
    expect(lines.filter((l) => l === tty)).toHaveLength(4); // `tty` plus fds 0, 1, 2
    const m = /ctty=(\d+) sid=(\d+) pid=(\d+)/.exec(out);
    expect(Number(m?.[1])).not.toBe(0);
    expect(m?.[2]).toBe(m?.[3]); // session leader (setsid)
    expect(lines).toContain('ok'); // /dev/tty opens: it is the controlling terminal

    const vt = await runTty(c, sh('echo "TERM=$TERM"'), { env: [...ENV, 'TERM=vt100'] });
    expect(vt.out).toBe('TERM=vt100\r\n');
  });

  it('resizes the terminal (stty in an interactive shell) and signals SIGWINCH', async () => {
    const c = await harness.connect(await harness.start());
    let out = '';
    const h = c.startExec({ argv: [BB, 'sh'], env: [...ENV, 'PS1=$ '], tty: { rows: 24, cols: 80 } }, {
      onStdout: (b) => { out += b.toString(); },
    });
    await h.pid;
    h.resize(40, 100);
    h.writeStdin(Buffer.from('stty size\n'));
    h.writeStdin(Buffer.from('exit 3\n'));
    expect(await h.done).toMatchObject({ kind: 'exit', exitCode: 3, signal: null });
    expect(out).toMatch(/\r\n40 100\r\n/);
    expect(() => h.resize(1, 1)).not.toThrow(); // ended: a no-op
    expect(() => h.resize(1, 70000)).toThrow(/cols/);

    let out2 = '';
    const w = c.startExec({
      argv: sh('trap "echo WINCH; $0 stty size" WINCH; echo ready; while :; do sleep 0.05; done'.replace('$0', BB)),
      env: ENV, tty: { rows: 10, cols: 20 },
    }, { onStdout: (b) => { out2 += b.toString(); } });
    await waitFor('the trap to be installed', () => out2.includes('ready'));
    w.resize(33, 77);
    await waitFor('SIGWINCH to be handled', () => out2.includes('33 77'));
    expect(out2).toContain('WINCH');
    w.signal(9);
    expect(await w.done).toMatchObject({ kind: 'exit', signal: 9 });
  });

  it('answers RESIZE on a non-tty exec with ERROR on its stream and lets it finish', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const h = c.startExec({ argv: [BB, 'true'], env: ENV });
    expect(() => h.resize(24, 80)).toThrow(/resize: exec has no tty/);
    await h.done;

    const raw = harness.raw(a.socketPath);
    await raw.hello();
    raw.send(FrameType.EXEC, 1, encodeExecRequest({ argv: sh('sleep 0.3; echo finished'), env: ENV }));
    expect((await raw.next()).type).toBe(FrameType.STARTED);
    raw.send(FrameType.RESIZE, 1, encodeWinsize(24, 80));
    let f = await raw.next();
    expect([f.type, f.stream, f.payload.toString()]).toEqual([FrameType.ERROR, 1, 'resize: exec has no tty']);
    raw.send(FrameType.RESIZE, 1, Buffer.from([1])); // malformed
    f = await raw.next();
    expect([f.type, f.payload.toString()]).toEqual([FrameType.ERROR, expect.stringMatching(/malformed RESIZE/)]);
    raw.send(FrameType.RESIZE, 99, encodeWinsize(1, 1)); // not live: dropped
    f = await raw.next();
    expect([f.type, f.stream, f.payload.toString()]).toEqual([FrameType.STDOUT, 1, 'finished\n']);
    f = await raw.next();
    expect([f.type, f.stream]).toEqual([FrameType.EXIT, 1]);
    expect(decodeExit(f.payload)).toMatchObject({ how: 0, code: 0 });
  });

  it('turns Ctrl-C typed into the terminal into SIGINT for the foreground job', async () => {
    const c = await harness.connect(await harness.start());
    const h = c.startExec({ argv: [BB, 'sleep', '30'], env: ENV, tty: { rows: 24, cols: 80 } });
    const pid = await h.pid;
    harness.strayPids.push(pid);
    h.writeStdin(Buffer.from('\x03'));
    expect(await h.done).toMatchObject({ kind: 'exit', exitCode: null, signal: 2, timedOut: false });
  });

  it('ignores STDIN_EOF for a tty: the client types ^D itself', async () => {
    const c = await harness.connect(await harness.start());
    let out = '';
    const h = c.startExec({ argv: [BB, 'cat'], env: ENV, tty: { rows: 24, cols: 80 } }, { onStdout: (b) => { out += b.toString(); } });
    await h.pid;
    h.writeStdin(Buffer.from('abc\n'));
    h.closeStdin(); // a no-op for a tty
    await waitFor('the echo and cat output', () => out.split('abc').length >= 3);
    expect(procState(await h.pid)).not.toBeNull(); // still waiting for input
    h.writeStdin(Buffer.from('\x04'));
    expect(await h.done).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(out).toBe('abc\r\nabc\r\n'); // echoed by the terminal, then written by cat
  });

  it('delivers all terminal output before EXIT, however much', async () => {
    const c = await harness.connect(await harness.start());
    for (let round = 0; round < 3; round++) {
      const { outcome, out } = await runTty(c, sh('i=0; while [ $i -lt 5000 ]; do echo "line $i"; i=$((i+1)); done'));
      expect(outcome).toMatchObject({ kind: 'exit', exitCode: 0 });
      const lines = out.split('\r\n');
      expect(lines.pop()).toBe('');
      expect(lines).toHaveLength(5000);
      expect(lines.every((l, i) => l === `line ${i}`)).toBe(true);
    }
    // Large binary-ish output through the terminal (raw mode: no \n translation).
    const big = await runTty(c, sh(`${BB} stty raw -echo; ${BB} head -c 3000000 /dev/zero | ${BB} tr '\\0' x`));
    expect(big.outcome).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(big.out.length).toBe(3_000_000);
  });

  it('reports exec errors for tty execs like for pipe execs', async () => {
    const c = await harness.connect(await harness.start());
    const h = c.startExec({ argv: ['/nonexistent/prog'], env: ENV, tty: { rows: 24, cols: 80 } });
    await expect(h.pid).rejects.toThrow('exec: /nonexistent/prog: No such file or directory');
    expect(await h.done).toMatchObject({ kind: 'exec_error', errno: 2 });
  });

  it('runs many tty execs side by side', async () => {
    const c = await harness.connect(await harness.start());
    const results = await Promise.all(Array.from({ length: 12 }, (_, i) =>
      runTty(c, sh(`${BB} stty size; exit ${i % 4}`), { rows: 10 + i, cols: 50 + i })));
    results.forEach((r, i) => {
      expect(r.outcome).toMatchObject({ kind: 'exit', exitCode: i % 4 });
      expect(r.out).toBe(`${10 + i} ${50 + i}\r\n`);
    });
  });
});

// ---- DETACHED ---------------------------------------------------------------------------

describe('dsec-agent detached execs', () => {
  it('keeps a detached exec running when its connection closes, and still reaps it', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const file = path.join(a.dir, 'detached-done');
    const killedFile = path.join(a.dir, 'attached-done');
    const d = c.startExec({ argv: sh(`sleep 1; echo done > ${file}`), env: ENV, detached: true });
    const n = c.startExec({ argv: sh(`sleep 1; echo done > ${killedFile}`), env: ENV });
    const dPid = await d.pid;
    const nPid = await n.pid;
    harness.strayPids.push(dPid, nPid);
    c.close();
    await expect(d.done).rejects.toThrow(/agent connection lost/);
    await waitFor('the detached exec to write its file', () => fs.existsSync(file));
    expect(fs.readFileSync(file, 'utf8')).toBe('done\n');
    await waitFor('the detached exec to be reaped', () => procState(dPid) === null);
    expect(procState(nPid)).toBeNull(); // the attached one was killed at once
    await new Promise((r) => setTimeout(r, 200));
    expect(fs.existsSync(killedFile)).toBe(false);
    const log = fs.readFileSync(a.logPath, 'utf8');
    expect(log).toMatch(new RegExp(`pid=${dPid} detached: keeps running`));
    expect(log).toMatch(new RegExp(`pid=${dPid} \\(detached, connection gone\\) reaped`));
  });

  it('discards the output of an orphaned detached exec instead of blocking it', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const file = path.join(a.dir, 'after-output');
    const file2 = path.join(a.dir, 'tty-after-output');
    // Far more output than a pipe or pty buffer holds, produced after the disconnect.
    const d = c.startExec({
      argv: sh(`sleep 0.3; ${BB} head -c 20000000 /dev/zero; ${BB} head -c 1000000 /dev/zero >&2; echo ok > ${file}`),
      env: ENV, detached: true,
    });
    const t = c.startExec({
      argv: sh(`sleep 0.3; ${BB} head -c 5000000 /dev/zero | ${BB} tr '\\0' y; echo ok > ${file2}`),
      env: ENV, detached: true, tty: { rows: 24, cols: 80 },
    });
    harness.strayPids.push(await d.pid, await t.pid);
    c.close();
    await waitFor('both detached execs to finish', () => fs.existsSync(file) && fs.existsSync(file2), 30_000);
    // The agent keeps serving.
    const c2 = await harness.connect(a);
    const r = await c2.exec({ argv: [BB, 'echo', 'alive'], env: ENV, maxOutputBytes: 100 });
    expect(r.stdout.toString()).toBe('alive\n');
  });

  it('still applies the timeout of a detached exec after its connection closed', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const d = c.startExec({ argv: [BB, 'sleep', '30'], env: ENV, detached: true, timeoutMs: 300 });
    const pid = await d.pid;
    harness.strayPids.push(pid);
    c.close();
    await waitFor('the timed-out detached exec to be killed and reaped', () => procState(pid) === null);
    expect(fs.readFileSync(a.logPath, 'utf8')).toMatch(/timed out/);
  });

  it('reports a detached exec normally while its connection lives', async () => {
    const c = await harness.connect(await harness.start());
    const r = await c.exec({ argv: sh('echo hi; exit 4'), env: ENV, detached: true, maxOutputBytes: 100 });
    expect(r).toMatchObject({ kind: 'exit', exitCode: 4 });
    expect(r.stdout.toString()).toBe('hi\n');
  });
});

// ---- older agents ----------------------------------------------------------------------

describe('AgentClient against an agent without the additions', () => {
  it('refuses tty, detached and file operations with Unimplemented', async () => {
    const dir = fs.mkdtempSync(path.join(harness.tmpRoot, 'old-'));
    const conns = new Set<net.Socket>();
    const old = net.createServer((s) => {
      conns.add(s);
      s.once('data', () => s.write(encodeFrame(FrameType.HELLO, 0, Buffer.concat([
        encodeU32(1), Buffer.from('{"agent":"dsec-agent","version":"0.0.9","protocol":1,"pid":1}'),
      ]))));
    });
    await new Promise<void>((r) => old.listen(path.join(dir, 'old.sock'), r));
    try {
      const c = await AgentClient.connect(path.join(dir, 'old.sock'));
      harness.track(c);
      expect(() => c.startExec({ argv: ['sh'], env: [], tty: { rows: 1, cols: 1 } })).toThrow(/does not support "tty"/);
      expect(() => c.startExec({ argv: ['sh'], env: [], detached: true })).toThrow(/does not support "detached"/);
      await expect(c.stat('/')).rejects.toMatchObject({ kind: 'Unimplemented' });
      const r = c.readFile('/etc/passwd');
      await expect(r.done).rejects.toMatchObject({ kind: 'Unimplemented' });
      await expect(c.writeFile('/x', Buffer.from('x'))).rejects.toMatchObject({ kind: 'Unimplemented' });
    } finally {
      for (const s of conns) s.destroy();
      await new Promise<void>((r) => old.close(() => r()));
    }
  });
});
