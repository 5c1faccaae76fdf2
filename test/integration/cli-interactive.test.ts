/**
 * The interactive CLI against a real dsecd: `dsec exec -it` under a real PTY (node-pty)
 * — terminal size, resize, ^C delivered inside, exit code — plus exec -d / execs /
 * attach (and its detach keys from a terminal), exec -i with a pipe, a create's progress
 * reports, `dsec cp` of a 1 GiB file and of a directory tree in and out (what dsecd's
 * buffers held of it, against the bound of daemon/api/transfer.ts), `dsec logs` and
 * `dsec top --once`.
 */
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, createReadStream, createWriteStream, lstatSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import pty from 'node-pty';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, REPO, RSS_SLACK_BYTES, TestDaemon, metricValue, runCli } from './harness.js';
import { TRANSFER_BUFFER_BOUND_BYTES } from '../../daemon/api/transfer.js';

/** RSS of a process in bytes (VmRSS); 0 once it is gone. */
function rss(pid: number): number {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

/** sha256 of a local file, streamed. */
async function sha256(file: string): Promise<string> {
  const h = createHash('sha256');
  for await (const c of createReadStream(file, { highWaterMark: 1 << 20 })) h.update(c as Buffer);
  return h.digest('hex');
}

/** Relative path → `type mode size sha256|target` of every entry under `root`, sorted. */
function listing(root: string): string[] {
  const out: string[] = [];
  const walk = (rel: string) => {
    for (const name of readdirSync(path.join(root, rel)).sort()) {
      const r = path.join(rel, name);
      const st = lstatSync(path.join(root, r));
      if (st.isSymbolicLink()) out.push(`${r} link ${readlinkSync(path.join(root, r))}`);
      else if (st.isDirectory()) {
        out.push(`${r} dir ${(st.mode & 0o777).toString(8)}`);
        walk(r);
      } else out.push(`${r} file ${(st.mode & 0o777).toString(8)} ${st.size} ${createHash('sha256').update(readFileSync(path.join(root, r))).digest('hex').slice(0, 16)}`);
    }
  };
  walk('');
  return out;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe.skipIf(!IS_ROOT)('interactive CLI', () => {
  let d: TestDaemon;
  let sb: string;
  let tmp: string;
  const dsec = (args: string[], input?: string) => runCli(d, args, input);

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 18, config: '[defaults]\nmemory_bytes = 1073741824\n' });
    // cp copies trees under /srv, a top-level directory busybox lacks: dsecd creates it
    // as a writable place (the top level itself is read-only).
    sb = (await d.client.createSandbox({ image: 'busybox', filesystem: { writable_paths: ['/srv'] } })).id;
    tmp = mkdtempSync('/tmp/dsec-cli-it-');
  });
  afterAll(async () => {
    if (tmp) rmSync(tmp, { recursive: true, force: true });
    await d?.cleanup();
  });

  /** `dsec ARGS` in a real PTY of cols × rows; collects its output. */
  function inPty(args: string[], cols = 80, rows = 24) {
    const p = pty.spawn(process.execPath, [path.join(REPO, 'bin/dsec'), '--socket', d.socket, ...args], { name: 'xterm', cols, rows, cwd: REPO, env: { ...process.env, NO_COLOR: '1' } as Record<string, string> });
    let out = '';
    p.onData((s) => {
      // busybox ash asks the terminal where the cursor is (DSR, ESC [6n); answer as a
      // terminal would, so line editing goes on. The query itself is not kept.
      if (s.includes('\x1b[6n')) p.write('\x1b[1;5R');
      out += s.replaceAll('\x1b[6n', '');
    });
    const exit = new Promise<{ exitCode: number; signal?: number }>((resolve) => p.onExit(resolve));
    let exited = false;
    void exit.then(() => {
      exited = true;
    });
    return {
      p,
      get out() {
        return out;
      },
      get exited() {
        return exited;
      },
      exit,
      /** Waits until the output after `from` matches `re`. */
      async waitFor(re: RegExp, from = 0, ms = 20_000): Promise<string> {
        const until = Date.now() + ms;
        while (Date.now() < until) {
          if (re.test(out.slice(from))) return out.slice(from);
          if (exited) break;
          await sleep(20);
        }
        throw new Error(`no ${re} in PTY output (exited: ${exited}):\n${JSON.stringify(out.slice(from))}`);
      },
    };
  }

  it('exec -it sh: stty size follows our PTY and its resize, ^C reaches the command inside, exit 7 comes back', async () => {
    const t = inPty(['exec', '-it', sb, '--', 'sh'], 80, 24);
    await t.waitFor(/[#$] $/);
    // Let ash read our answer to its cursor query before typing (it drops input typed meanwhile).
    await sleep(300);
    let mark = t.out.length;
    t.p.write('stty size\r');
    await t.waitFor(/24 80\r\n/, mark);
    // Our terminal is fully raw (no output processing): \r\n is not turned into \r\r\n.
    expect(t.out).not.toContain('\r\r\n');

    // SIGWINCH → resize message → the PTY inside; retried until the shell sees it.
    t.p.resize(100, 40);
    let seen = false;
    for (let i = 0; i < 20 && !seen; i++) {
      await sleep(100);
      mark = t.out.length;
      t.p.write('stty size\r');
      const after = await t.waitFor(/\d+ \d+\r\n[^]*[#$] $/, mark);
      await sleep(100);
      seen = /40 100/.test(after);
    }
    expect(seen).toBe(true);

    // ^C while `sleep 30` runs inside: byte 3 goes in, the PTY inside sends SIGINT to
    // sleep, the shell prompt returns; dsec itself keeps running.
    mark = t.out.length;
    const started = Date.now();
    t.p.write('sleep 30\r');
    await sleep(500);
    t.p.write('\x03');
    await t.waitFor(/[#$] $/, mark + 'sleep 30'.length);
    await sleep(300);
    mark = t.out.length;
    t.p.write('echo after-$((6*7))\r');
    await t.waitFor(/after-42/, mark);
    expect(Date.now() - started).toBeLessThan(20_000);
    expect(t.exited).toBe(false);

    await sleep(300);
    t.p.write('exit 7\r');
    const e = await t.exit;
    expect(e.exitCode).toBe(7);
    expect(t.out).not.toMatch(/dsec: /); // no error, no interrupt note
    expect(t.out).not.toMatch(/internal error|hint:/);
  });

  it('the terminal is back in cooked mode after the command exits and after a SIGTERM to dsec', async () => {
    const dsecCmd = `${process.execPath} ${path.join(REPO, 'bin/dsec')} --socket ${d.socket}`;
    const modes = (out: string) => {
      const m = /speed[^]*$/.exec(out);
      return m ? m[0] : '';
    };
    // 1. The command exits: `stty -a` in the same PTY right after shows cooked mode.
    let p = pty.spawn('/bin/sh', ['-c', `${dsecCmd} exec -it ${sb} -- sh -c 'read x; exit 3'; echo rc=$?; stty -a`], { name: 'xterm', cols: 80, rows: 24 });
    let out = '';
    p.onData((x) => (out += x));
    let exit = new Promise((r) => p.onExit(r));
    for (let i = 0; i < 200 && !/stty|rc=/.test(out); i++) {
      await sleep(50);
      if (i === 20) p.write('line\r');
    }
    await exit;
    expect(out).toMatch(/rc=3/);
    for (const flag of ['icanon', 'echo', 'isig', 'opost', 'icrnl']) expect(modes(out)).toMatch(new RegExp(`(^|[\\s;])${flag}([\\s;]|$)`));

    // 2. dsec gets SIGTERM while attached: it lets go (the command is killed), exits 143, cooked mode again.
    // The SIGTERM lands while dsec is still inside its `stty -opost` (an `stty` first on its
    // PATH that lingers after changing the modes): raw mode is already on there, so the
    // handler must already be in place.
    const slowStty = mkdtempSync('/tmp/dsec-slow-stty-');
    writeFileSync(path.join(slowStty, 'stty'), '#!/bin/sh\n/usr/bin/stty "$@"; rc=$?\ncase " $* " in *" -opost "*) sleep 1 ;; esac\nexit $rc\n', { mode: 0o755 });
    p = pty.spawn('/bin/sh', ['-c', `PATH=${slowStty}:$PATH ${dsecCmd} exec -it ${sb} -- sleep 30; echo rc=$?; stty -a`], { name: 'xterm', cols: 80, rows: 24 });
    out = '';
    p.onData((x) => (out += x));
    exit = new Promise((r) => p.onExit(r));
    let child = 0;
    for (let i = 0; i < 100 && !child; i++) {
      await sleep(50);
      for (const e of readdirSync('/proc')) {
        if (!/^\d+$/.test(e)) continue;
        try {
          const stat = readFileSync(`/proc/${e}/stat`, 'utf8');
          if (Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === p.pid) child = Number(e);
        } catch {
          // gone
        }
      }
    }
    expect(child).toBeGreaterThan(0);
    // Wait until it is attached (the PTY in raw mode, output processing off), then SIGTERM it.
    // (Read through the PTY's master fd, which reports the terminal's modes: its /dev/pts
    // may be a devpts instance this process cannot open by name.)
    const masterFd = (p as unknown as { _fd: number })._fd;
    let raw = '';
    // Raw mode (-icanon) and -opost are set in two steps: wait for both.
    for (let i = 0; i < 100 && !(/-icanon/.test(raw) && /-opost/.test(raw)); i++) {
      await sleep(50);
      raw = String(spawnSync('stty', ['-a'], { stdio: [masterFd, 'pipe', 'pipe'] }).stdout);
    }
    expect(raw).toMatch(/-icanon/);
    expect(raw).toMatch(/-opost/);
    process.kill(child, 'SIGTERM');
    await exit;
    rmSync(slowStty, { recursive: true, force: true });
    expect(out).toMatch(/rc=143/);
    expect(out).toMatch(/dsec: interrupted by SIGTERM; the command was killed/);
    for (const flag of ['icanon', 'echo', 'isig', 'opost']) expect(modes(out)).toMatch(new RegExp(`(^|[\\s;])${flag}([\\s;]|$)`));
    // ... and the command inside really was killed (kill_on_detach).
    const slept = (await d.client.listExecs(sb)).find((e) => e.argv.join(' ') === 'sleep 30');
    expect(slept).toBeDefined();
    expect(await d.client.waitExec(sb, slept!.exec_id, { timeoutMs: 10_000 })).toMatchObject({ state: 'exited', signal: 'SIGKILL' });
  });

  it('a create asked with progress reports rootfs, launch, boot and ready for its sandbox, in order', async () => {
    const got: { phase: string; id: string; message: string }[] = [];
    const made = await d.client.createSandbox({ image: 'busybox' }, { onProgress: (p) => got.push(p) });
    expect(got.map((p) => p.phase)).toEqual(['rootfs', 'launch', 'boot', 'ready']);
    expect(got.every((p) => p.id === made.id)).toBe(true);
    expect(got[2].message).toBe('waiting for the agent');
    expect(made.state).toBe('running');
    await d.client.deleteSandbox(made.id, { force: true });
  });

  it('exec -it without a terminal on stdin is refused with 125', async () => {
    const r = await dsec(['exec', '-it', sb, '--', 'sh'], '');
    expect(r.code).toBe(125);
    expect(r.stderr).toMatch(/^dsec: the input device is not a TTY\n/);
  });

  it('exec -i streams a pipe through cat; exec -d, execs and attach follow a background session', async () => {
    const piped = await dsec(['exec', '-i', sb, '--', 'sh', '-c', 'cat; echo err >&2; exit 3'], 'through the pipe\n');
    expect(piped).toMatchObject({ code: 3, stdout: 'through the pipe\n', stderr: 'err\n' });

    // The session waits for a gate file, not a sleep: it is certainly running while
    // `execs` lists it and `attach` joins, however slowly the CLI starts on a loaded host.
    const gate = `/tmp/gate-${Date.now()}`;
    const started = await dsec(['exec', '-d', sb, '--', 'sh', '-c', `echo one; while [ ! -e ${gate} ]; do sleep 0.05; done; echo two; exit 4`]);
    expect(started.code).toBe(0);
    const eid = started.stdout.trim();
    expect(eid).toMatch(/^[0-9a-f]{32}$/);
    const list = await dsec(['execs', sb]);
    expect(list.stdout).toMatch(new RegExp(`^${eid.slice(0, 12)}\\s+running\\s+\\d+\\s+-\\s+\\d+s\\s+sh -c`, 'm'));
    const attaching = dsec(['attach', '--no-stdin', sb, eid.slice(0, 12)]);
    await d.client.exec(sb, { argv: ['touch', gate] });
    const att = await attaching;
    expect(att).toMatchObject({ code: 4, stdout: 'one\ntwo\n', stderr: '' });
    const inspect = JSON.parse((await dsec(['execs', 'inspect', sb, eid])).stdout);
    expect(inspect).toMatchObject({ exec_id: eid, state: 'exited', exit_code: 4 });
    expect((await dsec(['execs', 'rm', sb, eid])).code).toBe(0);
  });

  it("the README's pair: `exec -d` (no stdin, no PTY), then `attach` from a terminal; Ctrl-P Ctrl-Q detaches and the command keeps running", async () => {
    const started = await dsec(['exec', '-d', sb, '--', 'sh', '-c', 'echo started; sleep 30']);
    const eid = started.stdout.trim();
    expect(eid).toMatch(/^[0-9a-f]{32}$/);
    const t = inPty(['attach', sb, eid.slice(0, 12)]);
    await t.waitFor(/started/);
    // No Enter: the keys reach dsec at once.
    t.p.write('\x10\x11');
    await t.waitFor(/dsec: detached; exec [0-9a-f]{12} keeps running/);
    expect((await t.exit).exitCode).toBe(0);
    expect(await d.client.getExec(sb, eid)).toMatchObject({ state: 'running' });
    await d.client.signalExec(sb, eid, 'SIGKILL');
  });

  it('cp of a 1 GiB file in and out: equal sha256, dsecd holds at most the transfer bound of it', async () => {
    // 1 GiB that differs in every MiB (a counter in each), written quickly.
    const src = path.join(tmp, 'big.bin');
    const chunk = Buffer.alloc(1 << 20, 0x5a);
    await new Promise<void>((resolve, reject) => {
      const ws = createWriteStream(src);
      let i = 0;
      const more = () => {
        while (i < 1024) {
          chunk.writeUInt32BE(i++, 0);
          if (!ws.write(Buffer.from(chunk))) return void ws.once('drain', more);
        }
        ws.end(resolve);
      };
      ws.on('error', reject);
      more();
    });
    const want = await sha256(src);

    const base = rss(d.pid);
    let peak = base;
    let cliPeak = 0;
    let cliPid = 0;
    const timer = setInterval(() => {
      peak = Math.max(peak, rss(d.pid));
      if (cliPid) cliPeak = Math.max(cliPeak, rss(cliPid));
    }, 50);
    const bin = path.join(REPO, 'bin/dsec');
    const t0 = Date.now();
    const up = execa(process.execPath, [bin, '--socket', d.socket, 'cp', src, `${sb}:/root/big.bin`], { reject: false });
    cliPid = up.pid!;
    const upR = await up;
    const t1 = Date.now();
    const back = path.join(tmp, 'big.back');
    const down = execa(process.execPath, [bin, '--socket', d.socket, 'cp', `${sb}:/root/big.bin`, back], { reject: false });
    cliPid = down.pid!;
    const downR = await down;
    const t2 = Date.now();
    clearInterval(timer);
    expect(upR.exitCode, String(upR.stderr)).toBe(0);
    expect(downR.exitCode, String(downR.stderr)).toBe(0);
    expect(await sha256(back)).toBe(want);
    const grew = peak - base;
    const held = await metricValue(d, 'dsec_file_transfer_buffered_bytes_peak');
    console.log(
      `cli cp: 1 GiB in ${((t1 - t0) / 1000).toFixed(1)} s, out ${((t2 - t1) / 1000).toFixed(1)} s; dsecd held at most ${(held / 2 ** 20).toFixed(2)} MiB of it ` +
        `(bound ${(TRANSFER_BUFFER_BOUND_BYTES / 2 ** 20).toFixed(2)} MiB); dsecd RSS ${Math.round(base / 2 ** 20)} MiB -> peak ${Math.round(peak / 2 ** 20)} MiB (+${(grew / 2 ** 20).toFixed(1)} MiB); dsec CLI peak RSS ${Math.round(cliPeak / 2 ** 20)} MiB`,
    );
    // What the buffers held is the bound by design; RSS only a sanity check (RSS_SLACK_BYTES says why).
    expect(held).toBeGreaterThan(0);
    expect(held).toBeLessThanOrEqual(TRANSFER_BUFFER_BOUND_BYTES);
    expect(grew).toBeLessThan(RSS_SLACK_BYTES);
    rmSync(src);
    rmSync(back);
    await d.client.exec(sb, { argv: ['rm', '-f', '/root/big.bin'] });
  });

  it('cp of a directory tree in and out: same listing and contents', async () => {
    const tree = path.join(tmp, 'tree');
    mkdirSync(path.join(tree, 'a', 'b', 'c'), { recursive: true });
    mkdirSync(path.join(tree, 'empty'));
    writeFileSync(path.join(tree, 'top.txt'), 'top\n');
    writeFileSync(path.join(tree, 'a', 'empty.txt'), '');
    writeFileSync(path.join(tree, 'a', 'b', 'data.bin'), Buffer.alloc(3 * 1024 * 1024 + 17, 0xab));
    writeFileSync(path.join(tree, 'a', 'b', 'c', 'run.sh'), '#!/bin/sh\necho run\n');
    chmodSync(path.join(tree, 'a', 'b', 'c', 'run.sh'), 0o755);
    writeFileSync(path.join(tree, 'a', 'private'), 'secret');
    chmodSync(path.join(tree, 'a', 'private'), 0o600);
    symlinkSync('b/c/run.sh', path.join(tree, 'a', 'link'));

    await d.client.exec(sb, { argv: ['mkdir', '-p', '/srv'] });
    // Onto a missing path: the tree becomes /srv/copied. Into an existing dir: /srv/tree.
    const inR = await dsec(['cp', tree, `${sb}:/srv/copied`]);
    expect(inR.code, inR.stderr).toBe(0);
    expect((await dsec(['cp', tree, `${sb}:/srv`])).code).toBe(0);
    const ran = await d.client.exec(sb, { argv: ['sh', '-c', '/srv/copied/a/b/c/run.sh && ls /srv/tree && cat /srv/copied/a/link'] });
    expect(ran.stdout.toString()).toBe('run\na\nempty\ntop.txt\n#!/bin/sh\necho run\n');

    const out = path.join(tmp, 'tree.back');
    const outR = await dsec(['cp', `${sb}:/srv/copied`, out]);
    expect(outR.code, outR.stderr).toBe(0);
    expect(listing(out)).toEqual(listing(tree));

    // Into an existing local directory: out/copied.
    expect((await dsec(['cp', `${sb}:/srv/copied`, out])).code).toBe(0);
    expect(listing(path.join(out, 'copied'))).toEqual(listing(tree));

    // A tar stream through `-` both ways.
    const tarOut = await execa('sh', ['-c', `node ${path.join(REPO, 'bin/dsec')} --socket ${d.socket} cp ${sb}:/srv/copied - | tar t | sort`]);
    expect(String(tarOut.stdout).split('\n')).toContain('copied/a/b/c/run.sh');
  });

  it('logs shows sandbox.created; top --once prints a table with the sandbox', async () => {
    const logs = await dsec(['logs', sb]);
    expect(logs.code).toBe(0);
    expect(logs.stdout).toMatch(/sandbox\.created/);

    const top = await dsec(['top', '--once', '--interval', '300ms']);
    expect(top.code).toBe(0);
    expect(top.stderr).toBe('');
    const lines = top.stdout.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^ID\s+STATE\s+CPU%\s+MEM\s+LIMIT\s+PIDS\s+DISK\s+OOM\s+DENIED\s+IDLE\/RECL\s+AGE\s+LABELS$/);
    expect(lines.some((l) => l.startsWith(sb.slice(0, 12)) && /\srunning\s+\d+\.\d\s/.test(l))).toBe(true);

    const piped = await dsec(['top', '--interval', '200ms']);
    expect(piped.stderr).toBe('(stdout is not a terminal: printing one snapshot)\n');
    const j = JSON.parse((await dsec(['--json', 'top', '--interval', '200ms'])).stdout);
    expect(j.sandboxes.find((s: { id: string }) => s.id === sb)).toMatchObject({ state: 'running' });
  });
});
