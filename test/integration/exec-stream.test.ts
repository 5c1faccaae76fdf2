/**
 * Exec sessions: streamed output with bounded daemon memory, stdin, signals, PTYs,
 * background execs that outlive their client and re-attach, ownership, bad input; paced
 * sessions and the streamed `dsec exec`/`dsec run` (uncapped, byte-exact, flow-controlled
 * from our stdout back to the command); OOM kills of a pipeline reported whatever the
 * exit status.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, mkdtempSync, openSync, readFileSync, chmodSync, rmSync, statSync, createReadStream } from 'node:fs';
import { tmpdir } from 'node:os';
import { performance } from 'node:perf_hooks';
import path from 'node:path';
import http from 'node:http';
import { execa } from 'execa';
import WebSocket from 'ws';
import { IS_ROOT, REPO, TestDaemon, runCli } from './harness.js';
import { waitFor } from '../fixtures/agent.js';

interface Info { exec_id: string; state: string; exit_code: number | null; signal: string | null; stdout_bytes: number; error: string | null; pid: number | null; paced: boolean; oom_kills: number | null }

/** RSS of a process in bytes (VmRSS). */
function rss(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : 0;
}

/** What a host process is blocked in (/proc/PID/wchan), or '' when it is gone. */
function wchan(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/wchan`, 'utf8');
  } catch {
    return '';
  }
}

/** sha256 (hex) of a file, streamed. */
async function sha256File(file: string): Promise<string> {
  const h = createHash('sha256');
  for await (const c of createReadStream(file)) h.update(c as Buffer);
  return h.digest('hex');
}

describe.skipIf(!IS_ROOT)('exec sessions', () => {
  let d: TestDaemon;
  let sb: string;
  const api = <T>(method: string, p: string, body?: unknown) => d.client.request<T>(method, `/v1/sandboxes/${sb}${p}`, body);
  /** Streams GET .../output and returns the bytes (or just their count when `count`). */
  const output = (eid: string, q: string, onChunk?: (n: number) => void): Promise<Buffer> => new Promise((resolve, reject) => {
    http.get({ socketPath: d.socket, path: `/v1/sandboxes/${sb}/execs/${eid}/output?${q}` }, (res) => {
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => (onChunk ? onChunk(c.length) : parts.push(c)));
      res.on('end', () => resolve(Buffer.concat(parts)));
      res.on('error', reject);
    }).on('error', reject);
  });
  const ws = (eid: string, q = '') => new WebSocket(`ws+unix://${d.socket}:/v1/sandboxes/${sb}/execs/${eid}/attach${q ? `?${q}` : ''}`);

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 16 });
    sb = (await d.client.createSandbox({ image: 'busybox' })).id;
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('streams 100 MB of output while dsecd memory stays bounded', async () => {
    const base = rss(d.pid);
    let peak = base;
    const timer = setInterval(() => { peak = Math.max(peak, rss(d.pid)); }, 20);
    const e = await api<Info>('POST', '/execs', { argv: ['head', '-c', '104857600', '/dev/zero'] });
    let got = 0;
    await output(e.exec_id, 'follow=true', (n) => { got += n; });
    clearInterval(timer);
    const done = await api<Info>('GET', `/execs/${e.exec_id}`);
    expect(got).toBe(104857600);
    expect(done).toMatchObject({ state: 'exited', exit_code: 0, stdout_bytes: 104857600 });
    const grew = peak - base;
    console.log(`exec-stream: 100 MiB streamed; dsecd RSS ${Math.round(base / 2 ** 20)} MiB -> peak ${Math.round(peak / 2 ** 20)} MiB (+${(grew / 2 ** 20).toFixed(1)} MiB)`);
    expect(grew).toBeLessThan(64 * 2 ** 20);
  });

  it('stdin round trip through cat, by HTTP and by WebSocket', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['cat'], stdin: true });
    await d.client.request('POST', `/v1/sandboxes/${sb}/execs/${e.exec_id}/stdin?eof=true`, 'hello through stdin');
    await api('POST', `/execs/${e.exec_id}/wait`);
    expect((await output(e.exec_id, '')).toString()).toBe('hello through stdin');

    const e2 = await api<Info>('POST', '/execs', { argv: ['cat'], stdin: true });
    const sock = ws(e2.exec_id);
    const out: Buffer[] = [];
    const exit = await new Promise<Record<string, unknown>>((resolve, reject) => {
      sock.on('open', () => {
        sock.send(Buffer.concat([Buffer.from([0]), Buffer.from('via ws\n')]));
        sock.send(JSON.stringify({ type: 'stdin_eof' }));
      });
      sock.on('message', (m: Buffer, binary: boolean) => {
        if (binary) out.push(m.subarray(1));
        else {
          const j = JSON.parse(m.toString());
          if (j.type === 'exit') resolve(j);
          else reject(new Error(m.toString()));
        }
      });
      sock.on('error', reject);
    });
    expect(Buffer.concat(out).toString()).toBe('via ws\n');
    expect(exit).toMatchObject({ state: 'exited', exit_code: 0 });
  });

  it('stdin nobody reads holds back its uploader, not the sandbox\'s other execs or dsecd memory', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['sleep', '60'], stdin: true });
    const base = rss(d.pid);
    const post = new Promise<number>((resolve, reject) => {
      const r = http.request({ socketPath: d.socket, method: 'POST', path: `/v1/sandboxes/${sb}/execs/${e.exec_id}/stdin`, headers: { 'content-type': 'application/octet-stream' } }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode!));
      });
      r.on('error', reject);
      r.end(Buffer.alloc(64 << 20));
    });
    const posted = post.then(() => 'stdin');
    await new Promise((r) => setTimeout(r, 500));
    const other = d.client.exec(sb, { argv: ['echo', 'not blocked'] }).then((x) => x.stdout.toString());
    expect(await Promise.race([other, posted])).toBe('not blocked\n');
    expect(rss(d.pid) - base).toBeLessThan(48 * 2 ** 20);
    // Killing the session works even though its connection is backed up with stdin.
    await api('DELETE', `/execs/${e.exec_id}`);
    await posted.catch(() => {});
  });

  it('delivers SIGTERM to a running exec', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['sh', '-c', 'trap "echo term; exit 7" TERM; while :; do sleep 0.1; done'] });
    await new Promise((r) => setTimeout(r, 300));
    await api('POST', `/execs/${e.exec_id}/signal`, { signal: 'TERM' });
    const done = await api<Info>('POST', `/execs/${e.exec_id}/wait?timeout_ms=10000`);
    expect(done.exit_code).toBe(7);
    expect((await output(e.exec_id, '')).toString()).toBe('term\n');
  });

  it('a background exec outlives its client, and a new client re-attaches from an offset', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['sh', '-c', 'for i in 1 2 3 4 5 6; do echo line$i; sleep 0.2; done'] });
    const first = ws(e.exec_id);
    const firstLine = await new Promise<string>((resolve) => first.on('message', (m: Buffer, b: boolean) => { if (b) resolve(m.subarray(1).toString()); }));
    first.terminate();
    expect(firstLine).toBe('line1\n');
    const again = ws(e.exec_id, `stdout_offset=${firstLine.length}`);
    const rest: Buffer[] = [];
    const exit = await new Promise<Record<string, unknown>>((resolve) => again.on('message', (m: Buffer, b: boolean) => {
      if (b) rest.push(m.subarray(1));
      else resolve(JSON.parse(m.toString()));
    }));
    expect(Buffer.concat(rest).toString()).toBe('line2\nline3\nline4\nline5\nline6\n');
    expect(exit).toMatchObject({ type: 'exit', exit_code: 0 });
  });

  it('kill_on_detach kills the command when its WebSocket closes', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['sleep', '30'] });
    const sock = ws(e.exec_id, 'kill_on_detach=true');
    await new Promise((r) => sock.on('open', r));
    sock.close();
    const done = await api<Info>('POST', `/execs/${e.exec_id}/wait?timeout_ms=10000`);
    expect(done).toMatchObject({ state: 'exited', signal: 'SIGKILL' });
  });

  it('runs under a PTY with resize', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['sh', '-c', 'stty size; read x; stty size; exit 3'], tty: { rows: 30, cols: 90 }, stdin: true });
    await new Promise((r) => setTimeout(r, 300));
    await api('POST', `/execs/${e.exec_id}/resize`, { rows: 50, cols: 120 });
    await d.client.request('POST', `/v1/sandboxes/${sb}/execs/${e.exec_id}/stdin`, 'go\n');
    const done = await api<Info>('POST', `/execs/${e.exec_id}/wait?timeout_ms=10000`);
    expect(done.exit_code).toBe(3);
    const text = (await output(e.exec_id, '')).toString();
    expect(text).toContain('30 90');
    expect(text).toContain('50 120');
  });

  it('bad input: missing binary is 127 with a message; resize without tty, unknown signal are InvalidArgument; garbage on the WebSocket closes it', async () => {
    const nf = await api<Info>('POST', '/execs', { argv: ['no-such-thing'] });
    const done = await api<Info>('POST', `/execs/${nf.exec_id}/wait`);
    expect(done.exit_code).toBe(127);
    expect(done.error).toMatch(/no-such-thing/);
    const e = await api<Info>('POST', '/execs', { argv: ['sleep', '30'] });
    await expect(api('POST', `/execs/${e.exec_id}/resize`, { rows: 5, cols: 5 })).rejects.toMatchObject({ code: 'InvalidArgument' });
    await expect(api('POST', `/execs/${e.exec_id}/signal`, { signal: 'SIGNOPE' })).rejects.toMatchObject({ code: 'InvalidArgument' });
    // Each kind of garbage closes the socket (policy violation) with an InvalidArgument.
    for (const garbage of ['this is not json', 'null', '[]', JSON.stringify({ type: 'signal', signal: { name: 'TERM' } })]) {
      const sock = ws(e.exec_id);
      const said: string[] = [];
      const closeCode = await new Promise<number>((resolve) => {
        sock.on('open', () => sock.send(garbage));
        sock.on('message', (m: Buffer, binary: boolean) => { if (!binary) said.push(m.toString()); });
        sock.on('close', (code: number) => resolve(code));
      });
      expect(closeCode, garbage).toBe(1008);
      expect(said.map((m) => JSON.parse(m))).toEqual([{ type: 'error', error: { code: 'InvalidArgument', message: expect.any(String) } }]);
    }
    await api('DELETE', `/execs/${e.exec_id}`);
    await expect(api('GET', `/execs/${e.exec_id}`)).rejects.toMatchObject({ code: 'NotFound' });
    expect((await d.client.version()).api).toBe('v1');
  });

  it('exec ids belong to the uid that started them', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['sleep', '30'] });
    chmodSync(d.socket, 0o666);
    try {
      const script = `const h=require('http');h.get({socketPath:${JSON.stringify(d.socket)},path:'/v1/sandboxes/${sb}/execs/${e.exec_id}'},r=>{let s='';r.on('data',c=>s+=c);r.on('end',()=>{console.log(r.statusCode, s)})})`;
      const r = await execa(process.execPath, ['-e', script], { uid: 65534, gid: 65534 });
      expect(String(r.stdout)).toMatch(/^404 .*NotFound/);
    } finally {
      chmodSync(d.socket, 0o660);
      await api('DELETE', `/execs/${e.exec_id}`);
    }
  });
  /** Host pid of the process named `comm` in sandbox `id`, or 0. */
  async function hostPid(id: string, comm: string): Promise<number> {
    for (const pid of await (await d.cgroups()).pids(id)) {
      try {
        if (readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === comm) return pid;
      } catch { /* exited */ }
    }
    return 0;
  }
  const DSEC = path.join(REPO, 'bin/dsec');

  it('a paced session holds the command back while no reader takes its output, and loses nothing', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['sh', '-c', 'head -c 50000000 /dev/zero; echo done >&2'], paced: true });
    expect(e.paced).toBe(true);
    // Nobody reads: dsecd stops reading the agent, the agent the pipe, and `head` blocks
    // writing it. A spooled session would have taken all 50 MB and ended.
    await waitFor('head to block writing its pipe', async () => {
      const i = await api<Info>('GET', `/execs/${e.exec_id}`);
      if (i.state !== 'running') throw new Error(`the command ended with no reader (${i.stdout_bytes} bytes taken): not paced`);
      return /pipe_write/.test(wchan(await hostPid(sb, 'head')));
    }, 60_000);
    // What it wrote so far: dsecd's window, the agent's queue, the pipe; far below 50 MB.
    expect((await api<Info>('GET', `/execs/${e.exec_id}`)).stdout_bytes).toBeLessThan(16 * 2 ** 20);
    let got = 0;
    await output(e.exec_id, 'follow=true', (n) => { got += n; });
    expect(got).toBe(50_000_000);
    const done = await api<Info>('POST', `/execs/${e.exec_id}/wait?timeout_ms=60000`);
    expect(done).toMatchObject({ state: 'exited', exit_code: 0, stdout_bytes: 50_000_000, stdout_dropped_bytes: 0, paced: true, oom_kills: 0 });
    expect((await output(e.exec_id, 'stream=stderr')).toString()).toBe('done\n');
  });

  it('dsec exec streams 200 MB into a file, whole and byte for byte, with no note', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'dsec-exec-out-'));
    try {
      const file = path.join(dir, 'out');
      const fd = openSync(file, 'w');
      const cli = spawn(process.execPath, [DSEC, '--socket', d.socket, 'exec', sb, '--', 'head', '-c', '200000000', '/dev/zero'], { stdio: ['ignore', fd, 'pipe'] });
      closeSync(fd);
      let err = '';
      cli.stderr!.on('data', (c: Buffer) => { err += c.toString(); });
      let peak = 0;
      const sample = setInterval(() => { try { peak = Math.max(peak, rss(cli.pid!)); } catch { /* exited */ } }, 50);
      const code = await new Promise<number | null>((resolve) => cli.on('exit', (c) => resolve(c)));
      clearInterval(sample);
      expect(err).toBe('');
      expect(code).toBe(0);
      expect(statSync(file).size).toBe(200_000_000);
      expect(await sha256File(file)).toBe(createHash('sha256').update(Buffer.alloc(200_000_000)).digest('hex'));
      console.log(`exec-stream: dsec exec of 200 MB into a file; the CLI's peak RSS ${(peak / 2 ** 20).toFixed(1)} MiB`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a dsec exec whose stdout nobody reads holds the command back, and the CLI does not buffer it', async () => {
    const cli = spawn(process.execPath, [DSEC, '--socket', d.socket, 'exec', sb, '--', 'head', '-c', '200000000', '/dev/zero'], { stdio: ['ignore', 'pipe', 'pipe'] });
    cli.stdout!.pause();
    let exited = false;
    const exit = new Promise<number | null>((resolve) => cli.on('exit', (c) => { exited = true; resolve(c); }));
    // Our stdout is full: the CLI stops reading its WebSocket, dsecd its paced buffer's
    // reader, the agent the pipe, and `head` blocks writing. Flow control end to end.
    await waitFor('head to block writing its pipe', async () => {
      if (exited) throw new Error('the CLI exited while its stdout was not read');
      return /pipe_write/.test(wchan(await hostPid(sb, 'head')));
    }, 60_000);
    // A generous design bound: the CLI holds what is in flight, not the 200 MB.
    const held = rss(cli.pid!);
    console.log(`exec-stream: dsec exec with an unread stdout: command blocked, the CLI's RSS ${(held / 2 ** 20).toFixed(1)} MiB`);
    expect(held).toBeLessThan(160 * 2 ** 20);
    let got = 0;
    cli.stdout!.on('data', (c: Buffer) => { got += c.length; });
    cli.stdout!.resume();
    expect(await exit).toBe(0);
    expect(got).toBe(200_000_000);
  });

  it('dsec exec: binary output byte-exact, stdout and stderr apart and in order, no newline added', async () => {
    const script = 'head -c 20000000 /dev/urandom > /tmp/r; sha256sum /tmp/r > /tmp/r.sum; cat /tmp/r; '
      + 'i=0; while [ $i -lt 300 ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done; printf "tail"; printf "err-tail" >&2';
    const r = await execa(process.execPath, [DSEC, '--socket', d.socket, 'exec', sb, '--', 'sh', '-c', script], { encoding: 'buffer', reject: false, stripFinalNewline: false });
    expect(r.exitCode).toBe(0);
    const out = Buffer.from(r.stdout as Uint8Array);
    const lines = Array.from({ length: 300 }, (_, i) => `out ${i}\n`).join('');
    expect(out.length).toBe(20_000_000 + lines.length + 4);
    const sum = (await d.client.exec(sb, { argv: ['cat', '/tmp/r.sum'] })).stdout.toString().split(' ')[0];
    expect(createHash('sha256').update(out.subarray(0, 20_000_000)).digest('hex')).toBe(sum);
    expect(out.subarray(20_000_000).toString()).toBe(lines + 'tail');
    expect(Buffer.from(r.stderr as Uint8Array).toString()).toBe(Array.from({ length: 300 }, (_, i) => `err ${i}\n`).join('') + 'err-tail');
  });

  it('dsec exec exit codes: its own status, 128+N on a signal, 124 timeout, 126/127, 125 for a bad --cwd', async () => {
    const cli = (...args: string[]) => runCli(d, ['exec', sb, ...args]);
    expect((await cli('--', 'sh', '-c', 'echo hi; exit 3'))).toMatchObject({ code: 3, stdout: 'hi\n', stderr: '' });
    expect((await cli('--', 'sh', '-c', 'kill -KILL $$'))).toMatchObject({ code: 137, stderr: 'dsec: command killed by SIGKILL (exit 137)\n' });
    expect((await cli('--', 'sh', '-c', 'kill -TERM $$')).code).toBe(143);
    const nf = await cli('--', 'no-such-binary');
    expect(nf.code).toBe(127);
    expect(nf.stderr).toMatch(/^dsec: .*no-such-binary/);
    await d.client.exec(sb, { argv: ['sh', '-c', 'echo x > /tmp/noexec; chmod 644 /tmp/noexec'] });
    expect((await cli('--', '/tmp/noexec')).code).toBe(126);
    const slow = await cli('--timeout', '300ms', '--', 'sleep', '30');
    expect(slow).toMatchObject({ code: 124, stderr: 'dsec: command timed out after 300ms and was killed (exit 124)\n' });
    const cwd = await cli('--cwd', '/does/not/exist', '--', 'true');
    expect(cwd.code).toBe(125);
    expect(cwd.stderr).toMatch(/^dsec: .*\/does\/not\/exist.*\(InvalidArgument\)/);
    // No session is left behind by the refused one.
    expect((await d.client.listExecs(sb)).filter((x) => x.state === 'running')).toEqual([]);
  });

  it('dsec run streams its command the same way: more than 4 MiB, whole', async () => {
    const r = await runCli(d, ['run', '--', 'sh', '-c', 'head -c 10000000 /dev/zero; echo end >&2']);
    expect(r.code).toBe(0);
    expect(r.stdout.length).toBe(10_000_000);
    expect(r.stderr).toBe('end\n');
  });

  it('10,000 --env reach the command', async () => {
    const env = Array.from({ length: 10_000 }, (_, i) => ['--env', `V${i}=x${i}`]).flat();
    const t0 = performance.now();
    const r = await runCli(d, ['exec', sb, ...env, '--', 'sh', '-c', 'env | grep -c "^V[0-9]*=x"; echo $V9999']);
    console.log(`exec-stream: dsec exec with 10,000 --env, start to exit: ${Math.round(performance.now() - t0)} ms`);
    expect(r).toMatchObject({ code: 0, stdout: '10000\nx9999\n' });
  });

  it('OOM kills inside a pipeline are reported though the command exits 0: API one-shot, session, CLI note', async () => {
    const small = await d.client.createSandbox({ image: 'busybox', memory_bytes: 32 * 1024 * 1024 });
    try {
      // The inner shell collects 200 MB into a variable (not NULs: a shell drops those): its
      // RSS makes it the OOM victim; the outer shell reports the pipeline's status (137)
      // and exits 0.
      const argv = ['sh', '-c', 'head -c 200000000 /dev/zero | tr "\\000" a | sh -c "x=\\$(cat)"; echo "pipeline $?"; exit 0'];
      const freed = async () => {
        const limit = (await d.client.sandboxStats(small.id)).memory_limit_bytes!;
        await waitFor('the memory charge to fall below half the limit', async () => (await d.client.sandboxStats(small.id)).memory_bytes! < limit / 2, 60_000);
      };
      const one = await d.client.exec(small.id, { argv });
      expect(one).toMatchObject({ exit_code: 0, oom: false });
      expect(one.stdout.toString()).toBe('pipeline 137\n');
      expect(one.oom_kills).toBeGreaterThanOrEqual(1);
      await freed();
      const quiet = await d.client.exec(small.id, { argv: ['true'] });
      expect(quiet).toMatchObject({ exit_code: 0, oom: false, oom_kills: 0 });

      const cli = await runCli(d, ['exec', small.id, '--', ...argv]);
      expect(cli.code).toBe(0);
      expect(cli.stdout).toBe('pipeline 137\n');
      // The shell's own "Killed" comes first, then our note after the command's output.
      expect(cli.stderr).toMatch(/\ndsec: note: the OOM killer killed (a process|\d+ processes) in the sandbox while this command ran [^\n]*\n$/);
      const last = (await d.client.listExecs(small.id)).at(-1)!;
      expect(last).toMatchObject({ state: 'exited', exit_code: 0, paced: true });
      expect(last.oom_kills).toBeGreaterThanOrEqual(1);
      await freed();
      expect((await runCli(d, ['exec', small.id, '--', 'true'])).stderr).toBe('');
    } finally {
      await d.client.deleteSandbox(small.id, { force: true });
    }
  });

  // Last: it stops the daemon.
  it('dsecd exits on SIGTERM while an attach WebSocket holds an exec with stdin open and a log is followed', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['cat'], stdin: true });
    const sock = ws(e.exec_id);
    await new Promise<void>((resolve, reject) => {
      sock.on('open', () => resolve());
      sock.on('error', reject);
    });
    const closed = new Promise<void>((resolve) => sock.on('close', () => resolve()));
    // A followed log polls the store: it must end before the store closes.
    const log = await new Promise<{ ended: Promise<void> }>((resolve, reject) => {
      http.get({ socketPath: d.socket, path: `/v1/sandboxes/${sb}/logs?follow=true` }, (res) => {
        res.resume();
        resolve({ ended: new Promise<void>((r) => res.on('close', () => r())) });
      }).on('error', reject);
    });
    const before = d.stderr.length;
    await d.stop(); // resolves once the process exited; before, the exec's own agent connection kept it alive
    await closed;
    await log.ended;
    expect(d.proc?.exitCode).toBe(0);
    expect(d.stderr.slice(before)).not.toMatch(/database connection is not open|"level":(50|60)/);
  });
});
