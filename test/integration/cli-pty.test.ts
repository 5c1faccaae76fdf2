/**
 * The CLI in a real pseudo-terminal (node-pty) against the fake dsecd of
 * test/fixtures/fake-dsecd.ts: what only a terminal shows. Runs `bin/dsec` (the built
 * dist/), needs no root.
 *
 * - `attach` to a session without a PTY: Ctrl-P Ctrl-Q detaches (with and without stdin
 *   forwarded), typed lines still go through line by line, and the terminal settings are
 *   back afterwards;
 * - `create` shows a spinner with the elapsed time and dsecd's phase on a terminal's
 *   stderr, nothing on a pipe or with --json, and erases it before the id is printed;
 * - `top` draws on the alternate screen and leaves it on quit; a pasted filter (`/job=a`
 *   and Enter in one write) applies; row actions (pause/resume, destroy after a
 *   confirmation, exec a shell and come back).
 */
import path from 'node:path';
import pty from 'node-pty';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { WebSocket } from 'ws';
import type { ExecInfo } from '../../sdk/index.js';
import { fakeSandbox, json, ok, startFakeDsecd, type FakeDsecd } from '../fixtures/fake-dsecd.js';

const REPO = path.resolve(import.meta.dirname, '../..');
const BIN = path.join(REPO, 'bin/dsec');
const ID = '0123456789abcdef';
const EID = 'a1b2c3d4e5f60718293a4b5c6d7e8f90';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Waits until `cond()` holds (polling; a hang detector, not a time bound). */
async function until(cond: () => boolean, what: string, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (cond()) return;
    await sleep(20);
  }
  throw new Error(`timed out waiting for ${what}`);
}

let fake: FakeDsecd;
/** PTYs started by the current test, killed (by their pid) if still running at its end. */
const started: { p: pty.IPty; exited: boolean }[] = [];
beforeEach(async () => {
  fake = await startFakeDsecd();
});
afterEach(async () => {
  for (const t of started.splice(0)) if (!t.exited) t.p.kill('SIGKILL');
  await fake.close();
});

/** A process in a real PTY of cols × rows (env: over the test's, undefined removes; default NO_COLOR=1); collects its output. */
function inPty(file: string, args: string[], cols = 100, rows = 30, env: Record<string, string | undefined> = { NO_COLOR: '1' }) {
  const p = pty.spawn(file, args, { name: 'xterm-256color', cols, rows, cwd: REPO, env: Object.fromEntries(Object.entries({ ...process.env, ...env }).filter(([, v]) => v !== undefined)) as Record<string, string> });
  let out = '';
  p.onData((s) => (out += s));
  let exited = false;
  const exit = new Promise<{ exitCode: number; signal?: number }>((resolve) => p.onExit((e) => {
    exited = true;
    resolve(e);
  }));
  const t = {
    p,
    get out() {
      return out;
    },
    get exited() {
      return exited;
    },
    exit,
    /** Waits for the exit (failing the test after 20 s, rather than hanging it). */
    async ended(): Promise<{ exitCode: number; signal?: number }> {
      await until(() => exited, 'the process to exit');
      return exit;
    },
    /** Waits until the output after `from` matches `re`; returns that output. */
    async waitFor(re: RegExp, from = 0): Promise<string> {
      await until(() => re.test(out.slice(from)) || exited, `${re}`).catch(() => {});
      if (!re.test(out.slice(from))) throw new Error(`no ${re} in PTY output (exited: ${exited}):\n${JSON.stringify(out.slice(from))}`);
      return out.slice(from);
    },
  };
  started.push(t);
  return t;
}

/** `dsec ARGS` against the fake in a PTY. */
const dsecPty = (args: string[], cols?: number, rows?: number, env?: Record<string, string | undefined>) => inPty(process.execPath, [BIN, '--socket', fake.socketPath, ...args], cols, rows, env);

/** `stty -g; dsec ARGS; stty -g` in one shell in a PTY: the terminal's settings right before and right after dsec. */
const dsecBetweenStty = (args: string[]) => inPty('/bin/sh', ['-c', `echo "before=$(stty -g)"; ${[process.execPath, BIN, '--socket', fake.socketPath, ...args].map((a) => `'${a}'`).join(' ')}; echo "rc=$?"; echo "after=$(stty -g)"`]);

/** The `stty -g` settings printed as `NAME=...`. */
const settings = (out: string, name: string) => new RegExp(`${name}=([0-9a-f:]+)`).exec(out)?.[1];

const info = (over: Partial<ExecInfo> = {}): ExecInfo => ({
  exec_id: EID, sandbox_id: ID, argv: ['make', 'test'], tty: false, state: 'running', pid: 42, started_at: Date.now() - 5000, finished_at: null,
  exit_code: null, signal: null, timed_out: false, error: null, stdout_bytes: 0, stderr_bytes: 0, stdout_dropped_bytes: 0, stderr_dropped_bytes: 0, ...over,
});
const frame = (channel: number, text: string) => Buffer.concat([Buffer.from([channel]), Buffer.from(text)]);

describe('attach to a session without a PTY, from a terminal', () => {
  /** Serves the attach WebSocket: output `hello`, records the stdin frames; `noStdin` refuses input as dsecd does for a session started without it. */
  function serve(noStdin: boolean) {
    const got = { stdin: [] as Buffer[], sockets: [] as WebSocket[] };
    fake.routes['GET /v1/sandboxes/:id/execs/:eid'] = ok(info());
    fake.wsRoutes['GET /v1/sandboxes/:id/execs/:eid/attach'] = (ws) => {
      got.sockets.push(ws);
      ws.send(frame(1, 'hello from make\n'));
      ws.on('message', (data: Buffer, isBinary: boolean) => {
        if (!isBinary) return;
        if (noStdin) {
          ws.send(JSON.stringify({ type: 'error', error: { code: 'FailedPrecondition', message: `exec ${EID} was started without stdin ("stdin": true opens it)` } }), () => ws.close(1008));
          return;
        }
        got.stdin.push(data.subarray(1));
      });
    };
    return got;
  }

  it('stdin forwarded: lines go through as typed, Ctrl-P Ctrl-Q detaches at once (exit 0), the terminal modes are restored', async () => {
    const got = serve(false);
    const t = dsecBetweenStty(['attach', ID, EID]);
    await t.waitFor(/hello from make/);
    t.p.write('a line\r');
    await until(() => Buffer.concat(got.stdin).toString() === 'a line\n', 'the line at the command');
    // No Enter after the keys: Ctrl-Q ends the line, so they arrive as typed.
    t.p.write('half');
    await sleep(100);
    t.p.write('\x10');
    await sleep(100);
    t.p.write('\x11');
    await t.waitFor(/dsec: detached; exec a1b2c3d4e5f6 keeps running/);
    await t.ended();
    expect(t.out).toMatch(/rc=0/);
    // What was typed on the line before the keys was sent; the keys were not.
    expect(Buffer.concat(got.stdin).toString()).toBe('a line\nhalf');
    await until(() => got.sockets[0].readyState === got.sockets[0].CLOSED, 'the attachment closed');
    // Flow control and the line end (changed while attached) are as they were.
    expect(settings(t.out, 'before')).toBeDefined();
    expect(settings(t.out, 'after')).toBe(settings(t.out, 'before'));
  });

  it('a session started without stdin (the README\'s `exec -d` then `attach`): Ctrl-P Ctrl-Q still detaches', async () => {
    const got = serve(true);
    const t = dsecPty(['attach', ID, EID.slice(0, 32)]);
    await t.waitFor(/hello from make/);
    // Something typed first: dsecd refuses it, dsec re-attaches watching only.
    t.p.write('x\r');
    await t.waitFor(/was started without stdin; input is not sent/);
    await until(() => got.sockets.length === 2, 'the re-attach');
    t.p.write('\x10\x11');
    await t.waitFor(/dsec: detached; exec a1b2c3d4e5f6 keeps running/);
    expect((await t.ended()).exitCode).toBe(0);
  });
});

describe('create on a terminal: a spinner with the elapsed time and the phase', () => {
  /**
   * Serves POST /v1/sandboxes: streamed (when asked) rootfs, launch and boot reports, then
   * holds the answer until `release()`; records the Accept headers it got.
   */
  function serveSlowCreate() {
    let release = () => {};
    const held = new Promise<void>((r) => (release = r));
    const accepts: string[] = [];
    fake.routes['POST /v1/sandboxes'] = async (req, res) => {
      accepts.push(String(req.headers.accept ?? ''));
      if (!String(req.headers.accept).includes('application/x-ndjson')) {
        await held;
        return json(res, 201, fakeSandbox({ id: ID, backend: 'microvm' }));
      }
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      for (const [phase, message] of [['rootfs', 'preparing the disks'], ['launch', 'starting QEMU'], ['boot', 'booting the guest (waiting for its agent)']]) {
        res.write(JSON.stringify({ type: 'progress', phase, id: ID, message }) + '\n');
      }
      await held;
      res.write(JSON.stringify({ type: 'progress', phase: 'ready', id: ID, message: 'running' }) + '\n');
      res.end(JSON.stringify({ type: 'result', result: fakeSandbox({ id: ID, backend: 'microvm' }) }) + '\n');
    };
    return { release, accepts };
  }

  it('shows the phase and a ticking elapsed time on stderr, then erases it and prints the id alone', async () => {
    const slow = serveSlowCreate();
    const t = dsecPty(['create', '--backend', 'microvm']);
    await t.waitFor(/⠋|⠙|⠹|⠸|⠼|⠴|⠦|⠧|⠇|⠏/);
    const first = await t.waitFor(/creating a microvm sandbox: 0123456789ab: booting the guest \(waiting for its agent\) \d+\.\ds/);
    const seen = (s: string) => new Set([...s.matchAll(/agent\) (\d+\.\d)s/g)].map((m) => m[1]));
    // The time moves while dsecd works (two different readings).
    await until(() => seen(t.out).size >= 2, 'the elapsed time to change');
    expect(seen(first).size).toBeGreaterThanOrEqual(1);
    slow.release();
    expect((await t.ended()).exitCode).toBe(0);
    expect(slow.accepts).toEqual(['application/x-ndjson']);
    // The last thing on the screen is the id on a line of its own: the spinner line was cleared first.
    expect(t.out).toMatch(/\r\x1b\[2K0123456789abcdef\r\n$/);
  });

  it('with --json the terminal gets no spinner, and the create is one plain call', async () => {
    const slow = serveSlowCreate();
    const t = dsecPty(['--json', 'create', '--backend', 'microvm']);
    await until(() => slow.accepts.length === 1, 'the create call');
    slow.release();
    expect((await t.ended()).exitCode).toBe(0);
    expect(slow.accepts[0]).not.toMatch(/ndjson/);
    expect(t.out).not.toMatch(/creating a|\x1b\[2K/);
    expect(JSON.parse(t.out.trim()).id).toBe(ID);
  });

  it('^C while waiting: the spinner goes, stderr names the sandbox dsecd goes on making, exit 130', async () => {
    serveSlowCreate();
    const t = dsecPty(['create', '--backend', 'microvm']);
    await t.waitFor(/booting the guest/);
    t.p.write('\x03');
    await t.waitFor(/dsec: interrupted by SIGINT; dsecd goes on making sandbox 0123456789abcdef/);
    expect((await t.ended()).exitCode).toBe(130);
  });
});

describe('top on a terminal', () => {
  const A = 'aaaaaaaaaaaaaaaa';
  const B = 'bbbbbbbbbbbbbbbb';
  const C = 'cccccccccccccccc';
  const MiB = 1024 ** 2;
  const ENTER_ALT = '\x1b[?1049h';
  const LEAVE_ALT = '\x1b[?1049l';
  let n = 0;
  let states: Record<string, string>;
  beforeEach(() => {
    n = 0;
    states = { [A]: 'running', [B]: 'paused', [C]: 'running' };
    const sb = (id: string, labels: Record<string, string>, cpu: number) => ({
      id, state: states[id], image: 'busybox:latest', labels, created_at: Date.now() - 60_000, cpus: 1, cpu_usage_ns: states[id] === 'running' ? cpu : null,
      memory_bytes: 10 * MiB, memory_limit_bytes: 512 * MiB, pids: 3, oom_kills: 0, disk_used_bytes: null, disk_limit_bytes: null,
    });
    fake.routes['GET /v1/stats'] = (_req, res) => {
      n++;
      json(res, 200, {
        time: Date.now(),
        host: { cores: 2, memory_bytes: 24 * 1024 * MiB, memory_available_bytes: 20 * 1024 * MiB, load_avg: [0.5, 0.25, 0.125] },
        sandboxes: [sb(A, { job: 'train' }, n * 1e9), sb(B, { job: 'eval' }, 0), sb(C, { job: 'train' }, n * 2e8)].filter((s) => s.state !== 'destroyed'),
      });
    };
  });
  // CI=true as a CI runner sets it: the live view must draw on a terminal whatever it says
  // (Ink alone would hold every frame until exit).
  const topPty = () => dsecPty(['top', '--interval', '200ms', '--sort', 'id'], 150, 30, { NO_COLOR: '1', CI: 'true' });

  it('draws on the alternate screen and gives the screen back on q: no frame is left on the normal screen', async () => {
    const t = topPty();
    await t.waitFor(/cccccccccccc\s+running/);
    t.p.write('q');
    expect((await t.ended()).exitCode).toBe(0);
    const out = t.out;
    // The alternate screen is entered before the first frame and left after the last:
    // nothing of top's is drawn on the normal screen.
    expect(out.indexOf(ENTER_ALT)).toBeGreaterThanOrEqual(0);
    expect(out.indexOf(ENTER_ALT)).toBeLessThan(out.indexOf('host:'));
    const after = out.slice(out.lastIndexOf(LEAVE_ALT) + LEAVE_ALT.length);
    expect(out.lastIndexOf(LEAVE_ALT)).toBeGreaterThan(out.lastIndexOf('sandboxes'));
    expect(after).not.toMatch(/host:|aaaaaaaaaaaa|sort:/);
  });

  it('colours states on a colour terminal (running green, paused cyan), none under NO_COLOR', async () => {
    const t = dsecPty(['top', '--interval', '200ms', '--sort', 'id'], 150, 30, { NO_COLOR: undefined, FORCE_COLOR: undefined, CI: 'true' });
    await t.waitFor(/\x1b\[32mrunning/);
    await t.waitFor(/\x1b\[36mpaused/);
    t.p.write('q');
    expect((await t.ended()).exitCode).toBe(0);
    const plain = topPty();
    await plain.waitFor(/cccccccccccc\s+running/);
    plain.p.write('q');
    expect((await plain.ended()).exitCode).toBe(0);
    expect(plain.out).not.toMatch(/\x1b\[3[0-9]m/);
  });

  it('a pasted filter (`/job=eval` and Enter in one write) applies', async () => {
    const t = topPty();
    await t.waitFor(/cccccccccccc\s+running/);
    const mark = t.out.length;
    t.p.write('/job=eval\r');
    await t.waitFor(/filter: job=eval[^]*1 of 3 sandboxes|1 of 3 sandboxes[^]*filter: job=eval/, mark);
    t.p.write('q');
    expect((await t.ended()).exitCode).toBe(0);
  });

  it('row actions: p pauses the selected row, d asks and destroys only after y', async () => {
    const calls: string[] = [];
    fake.routes['POST /v1/sandboxes/:id/pause'] = (req, res) => {
      calls.push(`pause ${req.params.id}`);
      states[req.params.id] = 'paused';
      json(res, 200, { sandbox: fakeSandbox({ id: req.params.id, state: 'paused' }), reclaim: null });
    };
    fake.routes['DELETE /v1/sandboxes/:id'] = (req, res) => {
      calls.push(`destroy ${req.params.id} force=${req.query.get('force')}`);
      states[req.params.id] = 'destroyed';
      json(res, 200, fakeSandbox({ id: req.params.id, state: 'destroyed' }));
    };
    const t = topPty();
    await t.waitFor(/cccccccccccc\s+running/);
    // The first row (A, by id) is selected: pause it.
    t.p.write('p');
    await until(() => calls.length === 1, 'the pause call');
    expect(calls).toEqual([`pause ${A}`]);
    await t.waitFor(/aaaaaaaaaaaa\s+paused/);
    // Down to C; d asks; n keeps it.
    t.p.write('\x1b[B');
    await sleep(100);
    t.p.write('\x1b[B');
    let mark = t.out.length;
    t.p.write('d');
    await t.waitFor(/destroy sandbox cccccccccccccccc \(running\), killing its processes\? \[y\/N\]/, mark);
    mark = t.out.length;
    t.p.write('n');
    await t.waitFor(/kept cccccccccccc/, mark);
    expect(calls).toHaveLength(1);
    t.p.write('d');
    await t.waitFor(/\[y\/N\]/, mark);
    t.p.write('y');
    await until(() => calls.length === 2, 'the destroy call');
    expect(calls[1]).toBe(`destroy ${C} force=true`);
    await t.waitFor(/cccccccccccccccc destroyed/, mark);
    t.p.write('q');
    expect((await t.ended()).exitCode).toBe(0);
  });

  it('s runs a shell in the selected sandbox with the terminal to itself, then top comes back', async () => {
    const typed: Buffer[] = [];
    let execBody: unknown;
    fake.routes['POST /v1/sandboxes/:id/execs'] = (req, res) => {
      execBody = req.body;
      json(res, 201, info({ sandbox_id: req.params.id, argv: ['sh'], tty: true }));
    };
    fake.wsRoutes['GET /v1/sandboxes/:id/execs/:eid/attach'] = (ws) => {
      ws.send(frame(1, 'fake-sh$ '));
      ws.on('message', (data: Buffer, isBinary: boolean) => {
        if (!isBinary) return;
        typed.push(data.subarray(1));
        if (Buffer.concat(typed).toString().includes('exit\r')) {
          ws.send(JSON.stringify({ type: 'exit', ...info({ state: 'exited', exit_code: 0, finished_at: Date.now() }) }), () => ws.close(1000));
        }
      });
    };
    const t = topPty();
    await t.waitFor(/cccccccccccc\s+running/);
    const mark = t.out.length;
    t.p.write('s');
    await t.waitFor(/fake-sh\$ /, mark);
    // top left the alternate screen before the shell got the terminal.
    const leftAt = t.out.indexOf(LEAVE_ALT, mark);
    expect(leftAt).toBeGreaterThan(0);
    expect(leftAt).toBeLessThan(t.out.indexOf('fake-sh$', mark));
    expect(execBody).toMatchObject({ argv: ['sh'], stdin: true, tty: { rows: 30, cols: 150 } });
    t.p.write('exit\r');
    // Back on the alternate screen, with how the shell ended.
    await t.waitFor(/shell in aaaaaaaaaaaa ended \(exit 0\)/, mark);
    expect(t.out.indexOf(ENTER_ALT, leftAt)).toBeGreaterThan(leftAt);
    await t.waitFor(/cccccccccccc\s+running/, t.out.indexOf(ENTER_ALT, leftAt));
    t.p.write('q');
    expect((await t.ended()).exitCode).toBe(0);
    expect(t.out.endsWith(LEAVE_ALT) || /\x1b\[\?1049l[^]*$/.test(t.out)).toBe(true);
  });

  it('l follows the log of the selected sandbox; q comes back to top', async () => {
    fake.routes['GET /v1/sandboxes/:id/logs'] = (req, res) => {
      expect(req.query.get('follow')).toBe('true');
      res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8' });
      res.write(`2026-01-01T00:00:00.000Z sandbox.created ${req.params.id}\n`);
      res.write('agent: \x1b[31mred\x1b[0m line\n');
      // Left open: followed.
    };
    const t = topPty();
    await t.waitFor(/cccccccccccc\s+running/);
    const mark = t.out.length;
    t.p.write('l');
    await t.waitFor(/sandbox\.created aaaaaaaaaaaaaaaa/, mark);
    // Escape sequences from the sandbox's log are shown, not obeyed.
    await t.waitFor(/agent: \^\[\[31mred\^\[\[0m line/, mark);
    t.p.write('q');
    await t.waitFor(/left the log of aaaaaaaaaaaa/, mark);
    t.p.write('q');
    expect((await t.ended()).exitCode).toBe(0);
  });
});
