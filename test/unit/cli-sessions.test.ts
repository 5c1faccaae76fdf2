// Exec sessions from the CLI: exec -d/-i/-t, attach, execs (ls, inspect, kill, rm) and
// logs, in-process against the fake dsecd (test/fixtures/fake-dsecd.ts) whose attach
// WebSocket each test scripts. The terminal is a fake: a Readable stdin with isTTY and a
// setRawMode spy, a Sink stdout with isTTY/rows/columns that can emit 'resize'.
import { PassThrough, Readable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { WebSocket } from 'ws';
import { DetachKeys } from '../../cli/util/terminal.js';
import type { ExecInfo } from '../../sdk/index.js';
import { Interrupts, Sink, fail, json, ok, runCli, startFakeDsecd, type FakeDsecd, type Ran, type Seen } from '../fixtures/fake-dsecd.js';

let fake: FakeDsecd;
let interrupts: Interrupts;

beforeEach(async () => {
  fake = await startFakeDsecd();
  interrupts = new Interrupts();
});
afterEach(async () => {
  await fake.close();
});

const ID = '0123456789abcdef';
const EID = 'a1b2c3d4e5f60718293a4b5c6d7e8f90';

const info = (over: Partial<ExecInfo> = {}): ExecInfo => ({
  exec_id: EID,
  sandbox_id: ID,
  argv: ['sh'],
  tty: false,
  state: 'running',
  pid: 42,
  started_at: Date.now() - 65_000,
  finished_at: null,
  exit_code: null,
  signal: null,
  timed_out: false,
  error: null,
  stdout_bytes: 0,
  stderr_bytes: 0,
  stdout_dropped_bytes: 0,
  stderr_dropped_bytes: 0,
  ...over,
});

/** A fake terminal stdin: a stream we push keys into, with isTTY and a raw-mode log. */
function ttyStdin(isTTY = true) {
  const s = new PassThrough() as PassThrough & { isTTY: boolean; setRawMode(raw: boolean): void; rawLog: boolean[] };
  s.isTTY = isTTY;
  s.rawLog = [];
  s.setRawMode = (raw: boolean) => {
    s.rawLog.push(raw);
  };
  return s;
}

interface RunOpts {
  stdin?: Readable & { isTTY?: boolean };
  stdout?: Sink;
}

function dsec(args: string[], opts: RunOpts = {}): Promise<Ran> {
  return runCli(args, { socket: fake.socketPath, stdin: opts.stdin, stdout: opts.stdout, interrupts });
}

/** What the fake's attach endpoint received from the CLI. */
interface AttachLog {
  stdin: Buffer[];
  control: any[];
  query: URLSearchParams;
  ws: WebSocket;
}

/**
 * Serves the attach endpoint with `script(ws, log)`; resolves `connected` with the log of
 * each connection as it arrives.
 */
function serveAttach(script: (ws: WebSocket, log: AttachLog) => void): AttachLog[] {
  const logs: AttachLog[] = [];
  fake.wsRoutes['GET /v1/sandboxes/:id/execs/:eid/attach'] = (ws, req) => {
    const log: AttachLog = { stdin: [], control: [], query: req.query, ws };
    logs.push(log);
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      if (isBinary) log.stdin.push(data.subarray(1));
      else log.control.push(JSON.parse(data.toString()));
    });
    script(ws, log);
  };
  return logs;
}

const frame = (channel: number, text: string | Buffer) => Buffer.concat([Buffer.from([channel]), Buffer.from(text)]);
const exitMsg = (over: Partial<ExecInfo>) => JSON.stringify({ type: 'exit', ...info({ state: 'exited', finished_at: Date.now(), ...over }) });
const until = async (cond: () => boolean, what = 'condition') => {
  for (let i = 0; i < 500 && !cond(); i++) await new Promise((r) => setTimeout(r, 5));
  if (!cond()) throw new Error(`timed out waiting for ${what}`);
};

describe('exec -d', () => {
  it('starts a session without stdin and prints its id; --json prints the ExecInfo', async () => {
    fake.routes['POST /v1/sandboxes/:id/execs'] = ok(info(), 201);
    const r = await dsec(['exec', '-d', ID, '--env', 'A=1', '--cwd', '/w', '--user', 'u', '--timeout', '5s', '--', 'sleep', '30']);
    expect(r.code).toBe(0);
    expect(r.out).toBe(`${EID}\n`);
    expect(fake.seen[0].body).toEqual({ argv: ['sleep', '30'], env: { A: '1' }, cwd: '/w', user: 'u', timeout_ms: 5000 });
    const j = await dsec(['--json', 'exec', '--detach', ID, '--', 'true']);
    expect(j.code).toBe(0);
    expect(JSON.parse(j.out)).toMatchObject({ exec_id: EID, state: 'running' });
  });

  it('with -i keeps stdin open for a later attach; with -t asks for a PTY (24x80 off a terminal)', async () => {
    fake.routes['POST /v1/sandboxes/:id/execs'] = ok(info(), 201);
    await dsec(['exec', '-d', '-i', '-t', ID, '--', 'sh']);
    expect(fake.seen[0].body).toEqual({ argv: ['sh'], stdin: true, tty: { rows: 24, cols: 80 } });
  });

  it('a command that could not start is reported with its exit code', async () => {
    fake.routes['POST /v1/sandboxes/:id/execs'] = ok(info({ state: 'exited', exit_code: 127, error: 'exec nope: no such file or directory' }), 201);
    const r = await dsec(['exec', '-d', ID, '--', 'nope']);
    expect(r.code).toBe(127);
    expect(r.out).toBe(`${EID}\n`);
    expect(r.err).toBe('dsec: exec nope: no such file or directory\n');
  });
});

describe('exec -t / -i', () => {
  it('-t without a terminal on stdin is "the input device is not a TTY", exit 125, no request', async () => {
    const r = await dsec(['exec', '-it', ID, '--', 'sh'], { stdin: Readable.from([]) });
    expect(r.code).toBe(125);
    expect(r.err).toMatch(/^dsec: the input device is not a TTY\nhint: /);
    expect(fake.seen).toHaveLength(0);
  });

  it('-it: PTY of our size, raw mode, keys (^C too) go in, resize follows, exit code comes back, terminal restored', async () => {
    fake.routes['POST /v1/sandboxes/:id/execs'] = ok(info({ tty: true }), 201);
    const logs = serveAttach((ws) => ws.send(frame(1, '$ ')));
    const stdin = ttyStdin();
    const stdout = new Sink(true, 100, 40);
    const run = dsec(['exec', '-it', ID, '--', 'sh'], { stdin, stdout });
    await until(() => logs.length === 1 && stdout.text === '$ ', 'prompt');
    expect(fake.seen[0].body).toEqual({ argv: ['sh'], stdin: true, tty: { rows: 40, cols: 100 }, paced: true });
    expect(logs[0].query.get('kill_on_detach')).toBe('true');
    expect(stdin.rawLog).toEqual([true]);
    stdin.write('ls\r');
    stdin.write(Buffer.from([3]));
    stdout.columns = 120;
    stdout.rows = 50;
    stdout.emit('resize');
    await until(() => Buffer.concat(logs[0].stdin).length === 4 && logs[0].control.length === 1, 'keys and resize');
    expect(Buffer.concat(logs[0].stdin)).toEqual(Buffer.from('ls\r\x03'));
    expect(logs[0].control).toEqual([{ type: 'resize', rows: 50, cols: 120 }]);
    logs[0].ws.send(frame(1, 'bye\r\n'));
    logs[0].ws.send(exitMsg({ exit_code: 7, tty: true }), () => logs[0].ws.close(1000));
    const r = await run;
    expect(r.code).toBe(7);
    expect(stdout.text).toBe('$ bye\r\n');
    expect(r.err).toBe('');
    expect(stdin.rawLog).toEqual([true, false]);
    expect(interrupts.handlers.size).toBe(0);
  });

  it('a command killed by a signal exits 128+N with a note', async () => {
    fake.routes['POST /v1/sandboxes/:id/execs'] = ok(info({ tty: true }), 201);
    serveAttach((ws) => ws.send(exitMsg({ exit_code: null, signal: 'SIGKILL' }), () => ws.close(1000)));
    const stdin = ttyStdin();
    const r = await dsec(['exec', '-it', ID, '--', 'sh'], { stdin, stdout: new Sink(true, 80, 24) });
    expect(r.code).toBe(137);
    expect(r.err).toBe('dsec: command killed by SIGKILL (exit 137)\n');
    expect(stdin.rawLog).toEqual([true, false]);
  });

  it('restores the terminal on every way out: error message, dropped socket, SIGTERM', async () => {
    fake.routes['POST /v1/sandboxes/:id/execs'] = ok(info({ tty: true }), 201);

    // An error message from dsecd.
    serveAttach((ws) => ws.send(JSON.stringify({ type: 'error', error: { code: 'Unavailable', message: 'agent connection lost' } }), () => ws.close(1011)));
    let stdin = ttyStdin();
    let r = await dsec(['exec', '-it', ID, '--', 'sh'], { stdin, stdout: new Sink(true, 80, 24) });
    expect(r.code).toBe(125);
    expect(r.err).toBe("dsec: agent connection lost (Unavailable)\nhint: the sandbox's agent is unreachable; `dsec inspect ID` shows its state\n");
    expect(stdin.rawLog).toEqual([true, false]);

    // The socket drops without an exit message.
    serveAttach((ws) => setTimeout(() => ws.terminate(), 20));
    stdin = ttyStdin();
    r = await dsec(['exec', '-it', ID, '--', 'sh'], { stdin, stdout: new Sink(true, 80, 24) });
    expect(r.code).toBe(125);
    expect(r.err).toMatch(/closed before the command ended/);
    expect(stdin.rawLog).toEqual([true, false]);

    // Our own SIGTERM: we let go (which kills the command: kill_on_detach) and exit 143.
    const logs = serveAttach(() => {});
    stdin = ttyStdin();
    const run = dsec(['exec', '-it', ID, '--', 'sh'], { stdin, stdout: new Sink(true, 80, 24) });
    await until(() => logs.length === 1 && interrupts.handlers.size === 1, 'attached');
    interrupts.fire('SIGTERM');
    r = await run;
    expect(r.code).toBe(143);
    expect(r.err).toBe('dsec: interrupted by SIGTERM; the command was killed\n');
    expect(stdin.rawLog).toEqual([true, false]);
    await until(() => logs[0].ws.readyState === logs[0].ws.CLOSED, 'socket closed');
  });

  it('-i alone streams a pipe in (then EOF) and stdout/stderr out separately; no raw mode', async () => {
    fake.routes['POST /v1/sandboxes/:id/execs'] = ok(info(), 201);
    const logs = serveAttach((ws, log) => {
      ws.on('message', (_d: Buffer, isBinary: boolean) => {
        if (isBinary) return;
        if (log.control.at(-1)?.type !== 'stdin_eof') return;
        const all = Buffer.concat(log.stdin);
        ws.send(frame(1, all));
        ws.send(frame(2, 'warn\n'));
        ws.send(exitMsg({ exit_code: 3 }), () => ws.close(1000));
      });
    });
    const r = await dsec(['exec', '-i', ID, '--', 'cat'], { stdin: Readable.from([Buffer.from('hello '), Buffer.from('world')]) });
    expect(r.code).toBe(3);
    expect(r.out).toBe('hello world');
    expect(r.err).toBe('warn\n');
    expect(fake.seen[0].body).toEqual({ argv: ['cat'], stdin: true, paced: true });
    expect(logs[0].control).toEqual([{ type: 'stdin_eof' }]);
  });

  it('-i: the first ^C is sent in as SIGINT, the second lets go (exit 130)', async () => {
    fake.routes['POST /v1/sandboxes/:id/execs'] = ok(info(), 201);
    const logs = serveAttach(() => {});
    const stdin = new PassThrough();
    const run = dsec(['exec', '-i', ID, '--', 'sleep', '30'], { stdin });
    await until(() => logs.length === 1 && interrupts.handlers.size === 1, 'attached');
    interrupts.fire('SIGINT');
    await until(() => logs[0].control.length === 1, 'signal');
    expect(logs[0].control).toEqual([{ type: 'signal', signal: 'SIGINT' }]);
    interrupts.fire('SIGINT');
    const r = await run;
    expect(r.code).toBe(130);
  });

  it('--json is refused with -i/-t', async () => {
    const r = await dsec(['--json', 'exec', '-i', ID, '--', 'cat']);
    expect(r.code).toBe(125);
    expect(JSON.parse(r.out).error.code).toBe('InvalidArgument');
  });
});

describe('attach', () => {
  it('replays and follows output, does not kill on detach, exits with the code (timeout → 124)', async () => {
    fake.routes['GET /v1/sandboxes/:id/execs/:eid'] = ok(info());
    const logs = serveAttach((ws) => {
      ws.send(frame(1, 'line1\n'));
      ws.send(frame(2, 'err1\n'));
      ws.send(exitMsg({ exit_code: null, signal: 'SIGKILL', timed_out: true }), () => ws.close(1000));
    });
    const r = await dsec(['attach', ID, EID], { stdin: Readable.from([]) });
    expect(r.code).toBe(124);
    expect(r.out).toBe('line1\n');
    expect(r.err).toBe('err1\ndsec: command timed out and was killed (exit 124)\n');
    expect(logs[0].query.get('kill_on_detach')).toBe('false');
    expect(logs[0].control).toEqual([]); // our stdin ending does not close the command's
  });

  it('resolves a 12-character id prefix through the session list', async () => {
    fake.routes['GET /v1/sandboxes/:id/execs'] = ok({ execs: [info(), info({ exec_id: 'ffff' + EID.slice(4) })] });
    fake.routes['GET /v1/sandboxes/:id/execs/:eid'] = ok(info());
    serveAttach((ws) => ws.send(exitMsg({ exit_code: 0 }), () => ws.close(1000)));
    const r = await dsec(['attach', ID, EID.slice(0, 12)], { stdin: Readable.from([]) });
    expect(r.code).toBe(0);
    expect(fake.seen.map((s) => s.path)).toContain(`/v1/sandboxes/${ID}/execs/${EID}/attach`);
    const none = await dsec(['attach', ID, '0000']);
    expect(none.code).toBe(125);
    expect(none.err).toMatch(/^dsec: no exec session 0000 in sandbox/);
  });

  it('a tty session in raw mode: sends our size, Ctrl-P Ctrl-Q detaches and leaves it running (exit 0)', async () => {
    fake.routes['GET /v1/sandboxes/:id/execs/:eid'] = ok(info({ tty: true }));
    const logs = serveAttach((ws) => ws.send(frame(1, '# ')));
    const stdin = ttyStdin();
    const stdout = new Sink(true, 90, 30);
    const run = dsec(['attach', ID, EID], { stdin, stdout });
    await until(() => stdout.text === '# ' && logs[0]?.control.length === 1, 'prompt and size');
    expect(logs[0].control[0]).toEqual({ type: 'resize', rows: 30, cols: 90 });
    stdin.write(Buffer.from([0x10, 0x61])); // Ctrl-P a: passed on
    stdin.write(Buffer.from([0x10]));
    stdin.write(Buffer.from([0x11])); // Ctrl-P Ctrl-Q split across reads: detach
    const r = await run;
    expect(r.code).toBe(0);
    await until(() => logs[0].stdin.length > 0, 'stdin to arrive');
    expect(Buffer.concat(logs[0].stdin)).toEqual(Buffer.from([0x10, 0x61]));
    await until(() => logs[0].ws.readyState === logs[0].ws.CLOSED, 'detached socket closed');
    expect(r.err).toMatch(/dsec: detached; exec a1b2c3d4e5f6 keeps running/);
    expect(stdin.rawLog).toEqual([true, false]);
  });

  it('a session started without stdin: re-attaches read-only from where the output was', async () => {
    fake.routes['GET /v1/sandboxes/:id/execs/:eid'] = ok(info());
    let n = 0;
    const logs = serveAttach((ws) => {
      n++;
      if (n === 1) {
        ws.send(frame(1, 'abc'));
        ws.on('message', (_d: Buffer, isBinary: boolean) => {
          if (isBinary) ws.send(JSON.stringify({ type: 'error', error: { code: 'FailedPrecondition', message: `exec ${EID} was started without stdin ("stdin": true opens it)` } }), () => ws.close(1008));
        });
      } else {
        ws.send(frame(1, 'def'));
        ws.send(exitMsg({ exit_code: 0 }), () => ws.close(1000));
      }
    });
    const stdin = new PassThrough();
    const stdout = new Sink();
    const run = dsec(['attach', ID, EID], { stdin, stdout });
    await until(() => stdout.text === 'abc', 'first output');
    stdin.write('typed\n');
    const r = await run;
    expect(r.code).toBe(0);
    expect(stdout.text).toBe('abcdef');
    expect(logs[1].query.get('stdout_offset')).toBe('3');
    expect(r.err).toMatch(/was started without stdin; input is not sent/);
  });

  it('--no-stdin never sends input', async () => {
    fake.routes['GET /v1/sandboxes/:id/execs/:eid'] = ok(info());
    const logs = serveAttach((ws) => setTimeout(() => ws.send(exitMsg({ exit_code: 2 }), () => ws.close(1000)), 30));
    const r = await dsec(['attach', '--no-stdin', ID, EID], { stdin: Readable.from([Buffer.from('x')]) });
    expect(r.code).toBe(2);
    expect(logs[0].stdin).toEqual([]);
  });

  it('an unknown session is NotFound with a hint to list sessions', async () => {
    fake.routes['GET /v1/sandboxes/:id/execs/:eid'] = fail(404, 'NotFound', `exec ${EID} not found`);
    const r = await dsec(['attach', ID, EID]);
    expect(r.code).toBe(125);
    expect(r.err).toBe(`dsec: exec ${EID} not found (NotFound)\nhint: list sandboxes with \`dsec ls\`, the exec sessions of one with \`dsec execs ID\`\n`);
  });
});

describe('DetachKeys', () => {
  it('holds a Ctrl-P until the next byte decides', () => {
    const k = new DetachKeys();
    expect(k.feed(Buffer.from('ab'))).toEqual({ forward: Buffer.from('ab'), detach: false });
    expect(k.feed(Buffer.from([0x10]))).toEqual({ forward: Buffer.alloc(0), detach: false });
    expect(k.feed(Buffer.from([0x10, 0x10, 0x41]))).toEqual({ forward: Buffer.from([0x10, 0x10, 0x10, 0x41]), detach: false });
    expect(k.feed(Buffer.from([0x61, 0x10, 0x11, 0x62]))).toEqual({ forward: Buffer.from([0x61]), detach: true });
  });
});

describe('execs', () => {
  // Ages are rendered against Date.now(): the clock stands still at NOW while these tests
  // run, so a slow run cannot turn the 5 s of the first row into 6 s.
  const NOW = Date.now();
  beforeEach(() => {
    vi.useFakeTimers({ toFake: ['Date'], now: NOW });
  });
  afterEach(() => {
    vi.useRealTimers();
  });
  const list = [
    info({ exec_id: 'b'.repeat(32), argv: ['sh', '-c', 'echo "hi there"; sleep 1'], started_at: NOW - 5_000 }),
    info({ exec_id: 'c'.repeat(32), state: 'exited', pid: 7, exit_code: null, signal: 'SIGKILL', argv: ['sleep', '30'], started_at: NOW - 3_600_000 }),
    info({ exec_id: 'd'.repeat(32), state: 'exited', exit_code: 0, argv: ['true'], started_at: NOW - 120_000 }),
  ];

  it('`execs ID` and `execs ls ID` print the table newest first; -q full ids; --json {execs}', async () => {
    fake.routes['GET /v1/sandboxes/:id/execs'] = ok({ execs: list });
    for (const args of [['execs', ID], ['execs', 'ls', ID]]) {
      const r = await dsec(args);
      expect(r.code).toBe(0);
      const lines = r.out.trimEnd().split('\n');
      expect(lines[0].split(/\s+/)).toEqual(['EXEC_ID', 'STATE', 'PID', 'EXIT', 'AGE', 'COMMAND']);
      expect(lines[1]).toMatch(/^b{12}\s+running\s+42\s+-\s+5s\s+sh -c 'echo "hi there"; sleep 1'$/);
      expect(lines[2]).toMatch(/^d{12}\s+exited\s+42\s+0\s+2m\s+true$/);
      expect(lines[3]).toMatch(/^c{12}\s+exited\s+7\s+SIGKILL\s+1h\s+sleep 30$/);
    }
    expect((await dsec(['execs', '-q', ID])).out).toBe(list.map((e) => e.exec_id + '\n').join(''));
    expect(JSON.parse((await dsec(['--json', 'execs', ID])).out).execs).toHaveLength(3);
    expect((await dsec(['execs', '--no-trunc', ID])).out).toContain('b'.repeat(32));
    const missing = await dsec(['execs']);
    expect(missing.code).toBe(125);
    expect(missing.err).toMatch(/^dsec: missing sandbox id/);
  });

  it('inspect prints the ExecInfo; kill sends SIGKILL or -s; rm refuses a running one without -f', async () => {
    fake.routes['GET /v1/sandboxes/:id/execs'] = ok({ execs: list });
    fake.routes['GET /v1/sandboxes/:id/execs/:eid'] = (req, res) => json(res, 200, list.find((e) => e.exec_id === req.params.eid));
    fake.routes['POST /v1/sandboxes/:id/execs/:eid/signal'] = (req, res) => json(res, 200, list.find((e) => e.exec_id === req.params.eid));
    fake.routes['DELETE /v1/sandboxes/:id/execs/:eid'] = (req, res) => json(res, 200, list.find((e) => e.exec_id === req.params.eid));
    expect(JSON.parse((await dsec(['execs', 'inspect', ID, 'bbbb'])).out).exec_id).toBe('b'.repeat(32));
    const k = await dsec(['execs', 'kill', ID, 'bbbb']);
    expect(k.out).toBe('b'.repeat(32) + '\n');
    await dsec(['execs', 'kill', '-s', 'term', ID, 'b'.repeat(32)]);
    const sigs = fake.seen.filter((s: Seen) => s.path.endsWith('/signal')).map((s) => s.body);
    expect(sigs).toEqual([{ signal: 'SIGKILL' }, { signal: 'TERM' }]);
    expect((await dsec(['execs', 'kill', '-s', 'no such', ID, 'bbbb'])).code).toBe(125);

    const rm = await dsec(['execs', 'rm', ID, 'bbbb', 'dddd']);
    expect(rm.code).toBe(125);
    expect(rm.out).toBe('dddd\n');
    expect(rm.err).toMatch(/^dsec: execs rm bbbb: exec bbbbbbbbbbbb is running \(FailedPrecondition\)\nhint: .*pass -f/);
    const forced = await dsec(['execs', 'rm', '-f', ID, 'bbbb']);
    expect(forced.code).toBe(0);
    expect(fake.seen.filter((s) => s.method === 'DELETE').map((s) => s.path.split('/').pop())).toEqual(['d'.repeat(32), 'b'.repeat(32)]);
  });
});

describe('logs', () => {
  it('prints the lines; --json as {line}; control characters escaped on a terminal', async () => {
    fake.routes['GET /v1/sandboxes/:id/logs'] = (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.write('2026-01-01T00:00:00.000Z sandbox.created state=creating\n2026-01-01T00:00:01.000Z sandbox.st');
      res.end('arted state=running\nagent: \x1b[31mred\n');
    };
    const r = await dsec(['logs', ID]);
    expect(r.code).toBe(0);
    expect(r.out).toBe('2026-01-01T00:00:00.000Z sandbox.created state=creating\n2026-01-01T00:00:01.000Z sandbox.started state=running\nagent: \x1b[31mred\n');
    const t = await dsec(['logs', ID], { stdout: new Sink(true) });
    expect(t.code).toBe(0);
    const j = await dsec(['logs', '--json', ID]);
    expect(j.out.trim().split('\n').map((l) => JSON.parse(l).line)[0]).toBe('2026-01-01T00:00:00.000Z sandbox.created state=creating');
    expect(fake.seen[0].query.get('follow')).toBeNull();
  });

  it('-f follows until interrupted (exit 130)', async () => {
    fake.routes['GET /v1/sandboxes/:id/logs'] = (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.write('first\n');
    };
    const stdout = new Sink();
    const run = dsec(['logs', '-f', ID], { stdout });
    await until(() => stdout.text === 'first\n', 'first line');
    expect(fake.seen[0].query.get('follow')).toBe('true');
    interrupts.fire('SIGINT');
    expect((await run).code).toBe(130);
  });

  it('an unknown sandbox is NotFound', async () => {
    fake.routes['GET /v1/sandboxes/:id/logs'] = fail(404, 'NotFound', 'sandbox nope not found');
    const r = await dsec(['logs', 'nope']);
    expect(r.code).toBe(125);
    expect(r.err).toMatch(/^dsec: sandbox nope not found \(NotFound\)/);
  });
});
