import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { main } from '../../cli/main.js';
import { apiErrorHint } from '../../cli/util/errors.js';
import { DsecApiError, type Event, type ExecResult, type HostInfo, type Sandbox } from '../../sdk/index.js';
import { Interrupts, Sink, fail, fakeExecInfo, fakeSandbox, json, ok, runCli, serveStreamedExec, startFakeDsecd, type FakeDsecd, type Ran, type Route, type Seen } from '../fixtures/fake-dsecd.js';

// The CLI runs in-process against a tiny fake dsecd (test/fixtures/fake-dsecd.ts: node:http
// on a temp Unix socket) whose answers each test sets through `route`.

let fake: FakeDsecd;
let dir: string;
let socketPath: string;
let seen: Seen[];
let routes: Record<string, Route>;
let onRequest: ((s: Seen) => void) | undefined;

beforeEach(async () => {
  fake = await startFakeDsecd();
  ({ dir, socketPath, seen, routes } = fake);
  onRequest = undefined;
  fake.onRequest = (s) => onRequest?.(s);
});

afterEach(async () => {
  await fake.close();
});

interface RunOpts {
  stdin?: Readable & { isTTY?: boolean };
  env?: Record<string, string | undefined>;
  socket?: string | null;
}

const interrupts = new Interrupts();
const interruptHandlers = interrupts.handlers;
function interrupt(sig: NodeJS.Signals = 'SIGINT'): void {
  interrupts.fire(sig);
}

/** Runs `dsec --socket <fake> ...args` in-process. */
async function dsec(args: string[], opts: RunOpts = {}): Promise<Ran> {
  return runCli(args, { socket: opts.socket === null ? null : opts.socket ?? socketPath, stdin: opts.stdin, env: opts.env, interrupts });
}

const ID = '0123456789abcdef';
const sandbox = fakeSandbox;
const execResult = (over: Partial<ExecResult> = {}): ExecResult => ({
  exit_code: 0,
  signal: null,
  stdout_b64: '',
  stderr_b64: '',
  stdout_truncated: false,
  stderr_truncated: false,
  duration_ms: 2,
  oom: false,
  timed_out: false,
  ...over,
});
const b64 = (s: string | Buffer) => Buffer.from(s).toString('base64');

/** A stack trace line, which must never appear for a user error. */
const STACK = /^\s+at /m;

describe('help and usage errors', () => {
  it('--help and VERB --help exit 0 and write help to stdout', async () => {
    const r = await dsec(['--help'], { socket: null });
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/Usage: dsec/);
    expect(r.out).toMatch(/exec/);
    expect(r.err).toBe('');
    const v = await dsec(['exec', '--help'], { socket: null });
    expect(v.code).toBe(0);
    expect(v.out).toMatch(/Usage: dsec exec/);
    expect((await dsec(['host', 'info', '--help'], { socket: null })).code).toBe(0);
    expect((await dsec(['help', 'ls'], { socket: null })).code).toBe(0);
  });

  it('an unknown option is one line and exit 125', async () => {
    const r = await dsec(['ls', '--bogus']);
    expect(r.code).toBe(125);
    expect(r.err).toBe("dsec: unknown option '--bogus'; see `dsec ls --help`\n");
    expect(r.out).toBe('');
    expect(seen).toHaveLength(0);
  });

  it('an unknown verb, a missing argument and a missing verb are one line each, exit 125', async () => {
    for (const args of [['bogus'], ['inspect'], [], ['host'], ['inspect', 'a', 'b']]) {
      const r = await dsec(args);
      expect(r.code, args.join(' ')).toBe(125);
      expect(r.err.split('\n'), args.join(' ')).toHaveLength(2); // one line + final newline
      expect(r.err).toMatch(/^dsec: /);
    }
    expect((await dsec(['host'])).err).toBe('dsec: missing command (one of: info, reload, cordon, uncordon, drain, forget); see `dsec host --help`\n');
  });

  it('exec with an option-like command word not after -- says to use --', async () => {
    const r = await dsec(['exec', ID, 'ls', '-la']);
    expect(r.code).toBe(125);
    expect(r.err).toMatch(/^dsec: unknown option '-la' \(put the command after --/);
  });

  it('a bad flag value is a user error with a hint, no stack, no request', async () => {
    const r = await dsec(['create', '--memory', 'lots']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: --memory: invalid size "lots"\nhint: sizes are bytes or a number with K, M, G (KiB, MiB, GiB), e.g. 512M or 2GiB\n');
    expect(seen).toHaveLength(0);
  });
});

describe('API errors', () => {
  it('404 → exit 125, message with code, hint, no stack', async () => {
    routes['GET /v1/sandboxes/:id'] = fail(404, 'NotFound', 'sandbox nope not found');
    const r = await dsec(['inspect', 'nope']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: sandbox nope not found (NotFound)\nhint: list sandboxes with `dsec ls`\n');
    expect(r.out).toBe('');
    expect(r.err).not.toMatch(STACK);
  });

  it('400 → hint points at the verb help', async () => {
    routes['POST /v1/sandboxes'] = fail(400, 'InvalidArgument', 'memory_bytes: too small');
    const r = await dsec(['create', '--memory', '1K']);
    expect(r.code).toBe(125);
    // The API's field name is said as the flag that set it (cli/util/fields.ts).
    expect(r.err).toBe('dsec: --memory: too small (InvalidArgument)\nhint: see `dsec create --help`\n');
  });

  it('a failed create names no sandbox in its hint; a refused writable path gets a hint per verb', async () => {
    routes['POST /v1/sandboxes'] = fail(412, 'FailedPrecondition', `sandbox ${ID}: writable path /data resolves through the symlink /data -> /usr to /usr, which is or contains the read-only path /usr`, 'writable_path_refused');
    const c = await dsec(['create', '--writable', '/data']);
    expect(c.err).toMatch(/\nhint: nothing was created: the image has a symlink where that writable path is/);
    expect(c.err.split('\n')[1]).not.toMatch(/inspect|[0-9a-f]{16}/);
    routes['POST /v1/sandboxes'] = fail(412, 'FailedPrecondition', 'seccomp: unknown syscall');
    expect((await dsec(['create'])).err.split('\n')[1]).toBe('hint: nothing was created: the message names what the image or this host cannot honour; `dsec host info` shows what this host supports');
    expect(apiErrorHint(new DsecApiError('FailedPrecondition', 'x', 412, { reason: 'writable_path_refused' }), 'restore')).toMatch(/^nothing was created: the snapshot holds a symlink/);
    expect(apiErrorHint(new DsecApiError('FailedPrecondition', 'x', 412, { reason: 'writable_path_refused' }), 'start')).toMatch(/^the sandbox keeps its files .*dsec snapshot create ID/);
  });

  it('a read-only path: the hint suggests neither --no-readonly nor a file as a writable path (dsecd\'s message names the directory)', async () => {
    const h = apiErrorHint(new DsecApiError('FailedPrecondition', 'write /etc/passwd: Read-only file system: ...', 412, { reason: 'readonly_path' }), 'cp');
    expect(h).not.toMatch(/--no-readonly|--writable PATH/);
    expect(h).toMatch(/--writable DIR/);
  });

  it('a missing socket is Unavailable naming the path, with a hint to start dsecd', async () => {
    const missing = join(dir, 'missing.sock');
    const r = await dsec(['ls'], { socket: missing });
    expect(r.code).toBe(125);
    const [line, hint] = r.err.split('\n');
    expect(line).toMatch(/^dsec: cannot connect to dsecd socket .*missing\.sock: .*is dsecd running\? \(Unavailable\)$/);
    expect(hint).toBe("hint: start dsecd (systemctl start dsecd, or see docs/OPERATIONS.md 'Without systemd')");
    expect(r.err).not.toMatch(STACK);
  });

  it('DSEC_SOCKET picks the socket when --socket is absent', async () => {
    routes['GET /v1/sandboxes'] = ok({ sandboxes: [] });
    const r = await dsec(['ls', '-q'], { socket: null, env: { DSEC_SOCKET: socketPath } });
    expect(r.code).toBe(0);
    expect(seen).toHaveLength(1);
  });

  it('a bug prints "internal error" and asks for a report; the stack only with DSEC_DEBUG=1', async () => {
    routes['GET /v1/sandboxes'] = ok({}); // no `sandboxes` array: the table code trips
    const r = await dsec(['ls']);
    expect(r.code).toBe(125);
    expect(r.err).toMatch(/^dsec: internal error: /);
    expect(r.err).toMatch(/please report it/);
    expect(r.err).not.toMatch(STACK);
    const d = await dsec(['ls'], { env: { DSEC_DEBUG: '1' } });
    expect(d.code).toBe(125);
    expect(d.err).toMatch(STACK);
  });
});

describe('version and host info', () => {
  it('version prints client and daemon versions', async () => {
    routes['GET /v1/version'] = ok({ version: '0.1.0', api: 'v1', agent_protocol: 2, node: 'v20.20.2' });
    const r = await dsec(['version']);
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/^dsec   \d+\.\d+\.\d+\n/);
    expect(r.out).toMatch(/dsecd  0\.1\.0 \(api v1, agent protocol 2, node v20\.20\.2\)/);
    const j = JSON.parse((await dsec(['--json', 'version'])).out);
    expect(j.client.version).toMatch(/^\d+\.\d+\.\d+$/);
    expect(j.daemon).toEqual({ version: '0.1.0', api: 'v1', agent_protocol: 2, node: 'v20.20.2' });
  });

  it('--version and -V print the client\'s version alone, without asking dsecd', async () => {
    for (const flag of ['--version', '-V']) {
      const r = await dsec([flag], { socket: join(dir, 'missing.sock') });
      expect(r.code, flag).toBe(0);
      expect(r.out).toMatch(/^\d+\.\d+\.\d+\n$/);
      expect(r.err).toBe('');
    }
  });

  it('--json with --version or -V prints JSON, the client half of `dsec --json version`, on either side of the flag', async () => {
    for (const args of [['--json', '--version'], ['--version', '--json'], ['--json', '-V']]) {
      const r = await dsec(args, { socket: join(dir, 'missing.sock') });
      expect(r.code, args.join(' ')).toBe(0);
      expect(JSON.parse(r.out)).toEqual({ client: { version: expect.stringMatching(/^\d+\.\d+\.\d+$/) } });
      expect(r.err).toBe('');
    }
  });

  it('version still exits 0 when the daemon is unreachable', async () => {
    const r = await dsec(['version'], { socket: join(dir, 'missing.sock') });
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/dsecd  not reachable: .*\(Unavailable\)/);
    const j = JSON.parse((await dsec(['version', '--json'], { socket: join(dir, 'missing.sock') })).out);
    expect(j.daemon).toBeNull();
    expect(j.daemon_error.code).toBe('Unavailable');
  });

  it('host info renders facts and tables, or the JSON', async () => {
    const host: HostInfo = {
      version: '0.1.0',
      instance: 'default',
      root: '/var/lib/dsec',
      socket: '/run/dsec/dsecd.sock',
      kernel: '6.18.0',
      cores: 2,
      memory_bytes: 24 * 1024 ** 3,
      cgroup: { version: 1, parents: { memory: '/sys/fs/cgroup/memory/dsec' } },
      runtime: { name: 'runc', path: '/usr/sbin/runc', version: '1.1.5' },
      backends: { container: { available: true, reason: null }, microvm: { available: false, reason: 'no /dev/vhost-vsock' } },
      uid_pool: { base: 100000, size: 6553600, range_size: 65536, in_use: 3, free: 97 },
      sandboxes: { running: 3 },
      fncall_pools: [{ image: 'busybox:latest', workers: 2, idle: 1, busy: 1, starting: 0, queued: 3, calls: 1234, replaced: 1 }],
      features: { filesystem_snapshots: { available: true, reason: null }, process_checkpoints: { available: false, reason: 'criu check failed on this kernel: vdso' } },
      defences: { seccomp: { enforced: true, detail: 'default profile' }, apparmor: { enforced: false, detail: 'kernel lacks AppArmor' } },
      storage: { kind: 'btrfs', quota: 'squota', location: '/var/lib/dsec/storage/upper.img', size_bytes: 40 * 1024 ** 3, used_bytes: 2 * 1024 ** 3, layers: 3 },
    };
    routes['GET /v1/host'] = ok(host);
    const r = await dsec(['host', 'info']);
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/^kernel\s+6\.18\.0$/m);
    expect(r.out).toMatch(/^memory\s+24GiB$/m);
    expect(r.out).toMatch(/^cgroup\s+v1 \(memory=\/sys\/fs\/cgroup\/memory\/dsec\)$/m);
    expect(r.out).toMatch(/^microvm\s+no\s+no \/dev\/vhost-vsock$/m);
    expect(r.out).toMatch(/^apparmor\s+no\s+kernel lacks AppArmor$/m);
    expect(r.out).toMatch(/^process_checkpoints\s+no\s+criu check failed on this kernel: vdso$/m);
    expect(r.out).toMatch(/^busybox:latest\s+2\s+1\s+1\s+3\s+1234\s+1$/m);
    expect(r.out).toMatch(/^storage\s+btrfs \(quota squota\) at \/var\/lib\/dsec\/storage\/upper\.img, 2GiB used of 40GiB, 3 writable layers$/m);
    expect(r.out).not.toMatch(/\x1b\[/);
    expect(JSON.parse((await dsec(['--json', 'host', 'info'])).out)).toEqual(host);
  });
});

describe('create, ls, inspect, stop, start', () => {
  it('create translates every flag and prints the id alone', async () => {
    routes['POST /v1/sandboxes'] = ok(sandbox(), 201);
    const r = await dsec([
      'create', '--backend', 'container', '--image', 'python:3.12', '--cpus', '0.5', '--memory', '512M', '--pids', '128', '--disk', '2G',
      '--label', 'job=a', '--label', 'round=3', '--env', 'A=1', '--env', 'B=x=y', '--ttl', '90s',
    ]);
    expect(r.code).toBe(0);
    expect(r.out).toBe(`${ID}\n`);
    expect(seen[0].body).toEqual({
      backend: 'container', image: 'python:3.12', cpus: 0.5, memory_bytes: 512 * 1024 ** 2, pids: 128, disk_bytes: 2 * 1024 ** 3,
      labels: { job: 'a', round: '3' }, env: { A: '1', B: 'x=y' }, ttl_s: 90,
    });
  });

  it('create with no flags sends an empty request; --json prints the Sandbox', async () => {
    routes['POST /v1/sandboxes'] = ok(sandbox(), 201);
    const r = await dsec(['create', '--json']);
    expect(r.code).toBe(0);
    expect(seen[0].body).toEqual({});
    expect(JSON.parse(r.out)).toEqual(sandbox({ created_at: JSON.parse(r.out).created_at, updated_at: JSON.parse(r.out).updated_at }));
  });

  it('create refuses an unknown backend locally', async () => {
    const r = await dsec(['create', '--backend', 'docker']);
    expect(r.code).toBe(125);
    expect(r.err).toMatch(/^dsec: --backend: unknown backend "docker"\nhint: backends are container, fncall, microvm, vm/);
  });

  it('ls prints a plain table with human memory, age and sorted labels', async () => {
    routes['GET /v1/sandboxes'] = ok({ sandboxes: [sandbox(), sandbox({ id: 'fedcba9876543210', state: 'paused', labels: {}, memory_bytes: 1.5 * 1024 ** 3, cpus: 2 })] });
    const r = await dsec(['ls', '--selector', 'job=a', '--state', 'running']);
    expect(r.code).toBe(0);
    const lines = r.out.trimEnd().split('\n');
    expect(lines[0].split(/\s+/)).toEqual(['ID', 'STATE', 'IMAGE', 'CPUS', 'MEMORY', 'AGE', 'LABELS']);
    expect(lines[1].split(/\s+/)).toEqual([ID, 'running', 'busybox:latest', '0.5', '512MiB', '3m', 'job=a,round=3']);
    expect(lines[2].split(/\s+/)).toEqual(['fedcba9876543210', 'paused', 'busybox:latest', '2', '1.5GiB', '3m', '-']);
    expect(r.out).not.toMatch(/\x1b\[/);
    expect(seen[0].query.get('selector')).toBe('job=a');
    expect(seen[0].query.get('state')).toBe('running');
  });

  it('ls --json prints {sandboxes}; -q prints ids', async () => {
    routes['GET /v1/sandboxes'] = ok({ sandboxes: [sandbox()] });
    const j = JSON.parse((await dsec(['ls', '--json'])).out);
    expect(j.sandboxes).toHaveLength(1);
    expect(j.sandboxes[0].id).toBe(ID);
    expect((await dsec(['ls', '-q'])).out).toBe(`${ID}\n`);
    expect((await dsec(['ls', '--state', 'zombie'])).code).toBe(125);
  });

  it('inspect prints pretty JSON with or without --json', async () => {
    const s = sandbox();
    routes['GET /v1/sandboxes/:id'] = ok(s);
    for (const args of [['inspect', ID], ['--json', 'inspect', ID]]) {
      const r = await dsec(args);
      expect(r.code).toBe(0);
      expect(r.out).toBe(JSON.stringify(s, null, 2) + '\n');
    }
    expect(seen[0].path).toBe(`/v1/sandboxes/${ID}`);
  });

  it('stop and start print the id; with --json start prints the Sandbox, stop {results} like rm', async () => {
    routes['POST /v1/sandboxes/:id/stop'] = ok(sandbox({ state: 'stopped' }));
    routes['POST /v1/sandboxes/:id/start'] = ok(sandbox({ state: 'running' }));
    expect((await dsec(['stop', ID])).out).toBe(`${ID}\n`);
    expect((await dsec(['start', ID])).out).toBe(`${ID}\n`);
    expect(JSON.parse((await dsec(['stop', ID, '--json'])).out)).toEqual({ results: [{ id: ID, ok: true, sandbox: expect.objectContaining({ state: 'stopped' }) }] });
    expect(JSON.parse((await dsec(['--json', 'start', ID])).out).state).toBe('running');
    expect(seen.map((s) => `${s.method} ${s.path}`)).toEqual([
      `POST /v1/sandboxes/${ID}/stop`, `POST /v1/sandboxes/${ID}/start`, `POST /v1/sandboxes/${ID}/stop`, `POST /v1/sandboxes/${ID}/start`,
    ]);
  });

  it('a FailedPrecondition on stop gets a state hint, a Conflict a retry hint', async () => {
    routes['POST /v1/sandboxes/:id/stop'] = fail(412, 'FailedPrecondition', `sandbox ${ID} is stopped; cannot stop it`);
    const r = await dsec(['stop', ID]);
    expect(r.code).toBe(125);
    expect(r.out).toBe('');
    expect(r.err).toBe(`dsec: stop ${ID}: sandbox ${ID} is stopped; cannot stop it (FailedPrecondition)\nhint: check the sandbox state with \`dsec inspect ID\`\n`);
    routes['POST /v1/sandboxes/:id/stop'] = fail(409, 'Conflict', `sandbox ${ID} was destroyed while the command ran`);
    const c = await dsec(['stop', ID]);
    expect(c.code).toBe(125);
    expect(c.err).toBe(`dsec: stop ${ID}: sandbox ${ID} was destroyed while the command ran (Conflict)\nhint: retry, or check \`dsec inspect ID\`\n`);
  });

  it('images lists images (an alias of `image ls`)', async () => {
    const config = { env: [], cwd: '/', user: '0', cmd: ['/bin/sh'] };
    routes['GET /v1/images'] = ok({ images: [{ ref: 'busybox:latest', name: 'busybox', tag: 'latest', tenant: 'system', layers: ['sha256:a', 'sha256:b'], config, size_bytes: 3 * 1024 ** 2, created_at: Date.now() - 7_200_000 }] });
    const r = await dsec(['images']);
    expect(r.out.trimEnd().split('\n')[1].split(/\s+/)).toEqual(['busybox:latest', 'system', '2', '3MiB', '2h', 'ago']);
    expect(JSON.parse((await dsec(['images', '--json'])).out).images).toHaveLength(1);
  });
});

describe('rm', () => {
  it('destroys each id, reports per id, exits 125 if any failed', async () => {
    routes['DELETE /v1/sandboxes/:id'] = (req, res) =>
      req.path.endsWith('/gone') ? json(res, 404, { error: { code: 'NotFound', message: 'sandbox gone not found' } }) : json(res, 200, sandbox({ id: req.path.split('/')[3], state: 'destroyed' }));
    const r = await dsec(['rm', 'aaa', 'gone', 'bbb']);
    expect(r.code).toBe(125);
    expect(r.out).toBe('aaa\nbbb\n');
    expect(r.err).toBe('dsec: rm gone: sandbox gone not found (NotFound)\nhint: list sandboxes with `dsec ls`\n');
    expect(seen.every((s) => !s.query.has('force'))).toBe(true);
  });

  it('-f forces; all succeeding exits 0; --json reports results', async () => {
    routes['DELETE /v1/sandboxes/:id'] = (req, res) => json(res, 200, sandbox({ id: req.path.split('/')[3], state: 'destroyed' }));
    const r = await dsec(['rm', '-f', 'aaa', 'bbb']);
    expect(r.code).toBe(0);
    expect(seen.map((s) => s.query.get('force'))).toEqual(['true', 'true']);
    const j = await dsec(['rm', '--json', 'aaa']);
    expect(j.code).toBe(0);
    expect(JSON.parse(j.out).results).toEqual([{ id: 'aaa', ok: true, sandbox: expect.objectContaining({ id: 'aaa', state: 'destroyed' }) }]);
  });

  it('rm of a running sandbox without -f hints at -f', async () => {
    routes['DELETE /v1/sandboxes/:id'] = fail(412, 'FailedPrecondition', 'sandbox aaa is running');
    const r = await dsec(['rm', 'aaa']);
    expect(r.code).toBe(125);
    expect(r.err).toMatch(/hint: stop it first with `dsec stop ID`, or pass -f/);
    const j = await dsec(['rm', 'aaa', '--json']);
    expect(j.code).toBe(125);
    expect(JSON.parse(j.out).results[0]).toEqual({
      id: 'aaa', ok: false, error: { code: 'FailedPrecondition', message: 'sandbox aaa is running', hint: 'stop it first with `dsec stop ID`, or pass -f to destroy it anyway' },
    });
  });
});

describe('exec', () => {
  const started = () => seen.find((x) => x.method === 'POST' && x.path === `/v1/sandboxes/${ID}/execs`)!;
  const attached = () => seen.find((x) => x.path === `/v1/sandboxes/${ID}/execs/a1b2c3d4e5f60718293a4b5c6d7e8f90/attach`);

  it('streams the command\'s stdout and stderr bytes through a paced session and exits with its code', async () => {
    const bin = Buffer.from([0xde, 0xad, 0xbe, 0xef, 0x0a, 0x00, 0xff]);
    const atts = serveStreamedExec(fake, { frames: [[1, bin.subarray(0, 3)], [2, 'oo'], [1, bin.subarray(3)], [2, 'ps\n']], end: { exit_code: 3 } });
    const r = await dsec(['exec', ID, '--env', 'A=1', '--cwd', '/work', '--user', 'nobody', '--', 'sh', '-c', 'exit 3']);
    expect(r.code).toBe(3);
    expect(r.outBuf.equals(bin)).toBe(true);
    expect(r.err).toBe('oops\n');
    expect(started().body).toEqual({ argv: ['sh', '-c', 'exit 3'], env: { A: '1' }, cwd: '/work', user: 'nobody', paced: true });
    // Killed if we go away; no one-shot exec call.
    expect(atts[0].query.get('kill_on_detach')).toBe('true');
    expect(attached()).toBeDefined();
    expect(seen.some((x) => x.path.endsWith('/exec'))).toBe(false);
    expect(interruptHandlers.size).toBe(0);
  });

  it('output without a final newline and more than 4 MiB comes through whole, in order per stream', async () => {
    const chunks = Array.from({ length: 40 }, (_, i) => Buffer.alloc(256 * 1024, i));
    serveStreamedExec(fake, { frames: [...chunks.map((c) => [1, c] as [1, Buffer]), [1, 'no newline'], [2, 'e1\n'], [2, 'e2']] });
    const r = await dsec(['exec', ID, '--', 'big']);
    expect(r.code).toBe(0);
    expect(r.outBuf.equals(Buffer.concat([...chunks, Buffer.from('no newline')]))).toBe(true);
    expect(r.err).toBe('e1\ne2');
  });

  it('words after -- belong to the command, even ones that look like dsec flags', async () => {
    serveStreamedExec(fake, { frames: [[1, 'raw\n']] });
    const r = await dsec(['exec', ID, '--', 'tool', '--json', '--timeout', 'x', '-i']);
    expect(r.code).toBe(0);
    expect(r.out).toBe('raw\n');
    expect(started().body).toEqual({ argv: ['tool', '--json', '--timeout', 'x', '-i'], paced: true });
  });

  it('a command killed by SIGKILL exits 137 with a note', async () => {
    serveStreamedExec(fake, { end: { exit_code: null, signal: 'SIGKILL' } });
    const r = await dsec(['exec', ID, '--', 'sleep', '1']);
    expect(r.code).toBe(137);
    expect(r.err).toBe('dsec: command killed by SIGKILL (exit 137)\n');
  });

  it('127 (not found) and 126 (not executable) pass through', async () => {
    serveStreamedExec(fake, { end: { exit_code: 127, error: 'exec: nope: No such file or directory' } });
    const r = await dsec(['exec', ID, 'nope']);
    expect(r.code).toBe(127);
    expect(r.err).toBe('dsec: exec: nope: No such file or directory\n');
    serveStreamedExec(fake, { end: { exit_code: 126, error: 'exec: /etc/passwd: Permission denied' } });
    expect((await dsec(['exec', ID, '/etc/passwd'])).code).toBe(126);
  });

  it('a timeout exits 124 with a note and sends timeout_ms', async () => {
    serveStreamedExec(fake, { frames: [[1, 'partial']], end: { exit_code: null, signal: 'SIGKILL', timed_out: true } });
    const r = await dsec(['exec', ID, '--timeout', '2s', '--', 'sleep', '10']);
    expect(r.code).toBe(124);
    expect(r.out).toBe('partial');
    expect(r.err).toBe('dsec: command timed out after 2s and was killed (exit 124)\n');
    expect(started().body.timeout_ms).toBe(2000);
  });

  it('--json runs it in one call and prints the ExecResult as the API sent it, keeping the exit code', async () => {
    const res = execResult({ exit_code: 3, stdout_b64: b64('hi\n') });
    routes['POST /v1/sandboxes/:id/exec'] = ok(res);
    const r = await dsec(['--json', 'exec', ID, '--', 'sh', '-c', 'echo hi; exit 3']);
    expect(r.code).toBe(3);
    expect(JSON.parse(r.out)).toEqual(res);
    expect(r.err).toBe('');
    expect(seen.map((x) => `${x.method} ${x.path}`)).toEqual([`POST /v1/sandboxes/${ID}/exec`]);
  });

  it('--json notes truncated output and OOM on stderr', async () => {
    routes['POST /v1/sandboxes/:id/exec'] = ok(execResult({ exit_code: null, signal: 'SIGKILL', oom: true, oom_kills: 1, stdout_truncated: true }));
    const r = await dsec(['--json', 'exec', ID, 'big']);
    expect(r.code).toBe(137);
    expect(r.err).toMatch(/stdout was truncated/);
    expect(r.err).toMatch(/ran out of memory/);
  });

  it('OOM kills during the exec are noted whatever its exit status (a pipeline whose head was killed exits 0)', async () => {
    serveStreamedExec(fake, { frames: [[1, 'partial\n']], end: { exit_code: 0, oom_kills: 1 } });
    let r = await dsec(['exec', ID, '--', 'sh', '-c', 'head -c 1G /dev/zero | sort | tail -1']);
    expect(r.code).toBe(0);
    expect(r.out).toBe('partial\n');
    expect(r.err).toBe('dsec: note: the OOM killer killed a process in the sandbox while this command ran (one it started, or one of another command running at the same time); its output may be incomplete\n');
    serveStreamedExec(fake, { end: { exit_code: 0, oom_kills: 3 } });
    r = await dsec(['exec', ID, '--', 'pipeline']);
    expect(r.err).toMatch(/^dsec: note: the OOM killer killed 3 processes in the sandbox while this command ran/);
    // The command itself killed: the note the one-shot `oom` gives.
    serveStreamedExec(fake, { end: { exit_code: null, signal: 'SIGKILL', oom_kills: 1 } });
    r = await dsec(['exec', ID, '--', 'hog']);
    expect(r.code).toBe(137);
    expect(r.err).toBe('dsec: note: the sandbox ran out of memory during this command (OOM kill)\ndsec: command killed by SIGKILL (exit 137)\n');
    // None, or unknown (a VM guest): no note.
    serveStreamedExec(fake, { end: { exit_code: 0, oom_kills: null } });
    expect((await dsec(['exec', ID, '--', 'true'])).err).toBe('');
    // The one-shot form (--json) says so too.
    routes['POST /v1/sandboxes/:id/exec'] = ok(execResult({ exit_code: 0, oom: false, oom_kills: 2 }));
    r = await dsec(['--json', 'exec', ID, '--', 'pipeline']);
    expect(r.code).toBe(0);
    expect(r.err).toMatch(/^dsec: note: the OOM killer killed 2 processes in the sandbox while this command ran/);
  });

  it('the first ^C goes to the command as SIGINT (its exit is ours), a second one kills it (exit 130)', async () => {
    serveStreamedExec(fake, { hold: true, onControl: (m, ws) => m.type === 'signal' && ws.send(JSON.stringify({ type: 'exit', ...fakeExecInfo({ state: 'exited', signal: 'SIGINT', oom_kills: 0 }) }), () => ws.close(1000)) });
    onRequest = (x) => { if (x.path.endsWith('/attach')) setTimeout(() => interrupt('SIGINT'), 20); };
    let r = await dsec(['exec', ID, '--', 'sleep', 'inf']);
    expect(r.code).toBe(130);
    expect(r.err).toBe('dsec: command killed by SIGINT (exit 130)\n');
    expect(interruptHandlers.size).toBe(0);

    // A command that ignores SIGINT: the second ^C lets go, which kills it (kill_on_detach).
    const atts = serveStreamedExec(fake, { hold: true, onControl: (m) => m.type === 'signal' && interrupt('SIGINT') });
    onRequest = (x) => { if (x.path.endsWith('/attach')) setTimeout(() => interrupt('SIGINT'), 20); };
    r = await dsec(['exec', ID, '--', 'sleep', 'inf']);
    expect(r.code).toBe(130);
    expect(r.err).toBe('dsec: interrupted by SIGINT; the command was killed\n');
    expect(atts[0].control).toEqual([{ type: 'signal', signal: 'SIGINT' }]);
    expect(interruptHandlers.size).toBe(0);
  });

  it('an exec on a missing sandbox is 125 with the NotFound hint', async () => {
    routes['POST /v1/sandboxes/:id/execs'] = fail(404, 'NotFound', 'sandbox nope not found');
    const r = await dsec(['exec', 'nope', '--', 'true']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: sandbox nope not found (NotFound)\nhint: list sandboxes with `dsec ls`\n');
  });

  it('10,000 --env reach dsecd whole and in order', async () => {
    serveStreamedExec(fake);
    const args = Array.from({ length: 10_000 }, (_, i) => ['--env', `V${i}=x${i}`]).flat();
    const r = await dsec(['exec', ID, ...args, '--', 'env']);
    expect(r.code).toBe(0);
    expect(started().body.env).toEqual(Object.fromEntries(Array.from({ length: 10_000 }, (_, i) => [`V${i}`, `x${i}`])));
    expect(Object.keys(started().body.env)).toEqual(Array.from({ length: 10_000 }, (_, i) => `V${i}`));
  });
});

describe('run', () => {
  it('creates, execs (streamed), destroys and exits with the command\'s code', async () => {
    routes['POST /v1/sandboxes'] = ok(sandbox(), 201);
    serveStreamedExec(fake, { frames: [[1, 'out\n']], end: { exit_code: 3 } });
    routes['DELETE /v1/sandboxes/:id'] = ok(sandbox({ state: 'destroyed' }));
    const r = await dsec(['run', '--image', 'busybox', '--memory', '64M', '--label', 'job=a', '--timeout', '5s', '--', 'sh', '-c', 'exit 3']);
    expect(r.code).toBe(3);
    expect(r.out).toBe('out\n');
    expect(seen.map((s) => `${s.method} ${s.path}`)).toEqual([
      'POST /v1/sandboxes', `POST /v1/sandboxes/${ID}/execs`, `GET /v1/sandboxes/${ID}/execs/a1b2c3d4e5f60718293a4b5c6d7e8f90/attach`, `DELETE /v1/sandboxes/${ID}`,
    ]);
    expect(seen[0].body).toEqual({ image: 'busybox', memory_bytes: 64 * 1024 ** 2, labels: { job: 'a' } });
    expect(seen[1].body).toEqual({ argv: ['sh', '-c', 'exit 3'], timeout_ms: 5000, paced: true });
    expect(seen[2].query.get('kill_on_detach')).toBe('true');
    expect(seen[3].query.get('force')).toBe('true');
  });

  it('-i streams our stdin to the command, then EOF', async () => {
    routes['POST /v1/sandboxes'] = ok(sandbox(), 201);
    routes['DELETE /v1/sandboxes/:id'] = ok(sandbox({ state: 'destroyed' }));
    const atts = serveStreamedExec(fake, {
      hold: true,
      onControl: (m, ws) => {
        if (m.type !== 'stdin_eof') return;
        ws.send(Buffer.concat([Buffer.from([1]), ...atts[0].stdin]));
        ws.send(JSON.stringify({ type: 'exit', ...fakeExecInfo({ state: 'exited', exit_code: 0, oom_kills: 0 }) }), () => ws.close(1000));
      },
    });
    const r = await dsec(['run', '-i', '--', 'cat'], { stdin: Readable.from([Buffer.from('in '), Buffer.from('put')]) });
    expect(r.code).toBe(0);
    expect(r.out).toBe('in put');
    expect(seen[1].body).toEqual({ argv: ['cat'], stdin: true, paced: true });
  });

  it('--json runs in one call and prints the ExecResult with the sandbox id', async () => {
    routes['POST /v1/sandboxes'] = ok(sandbox(), 201);
    routes['POST /v1/sandboxes/:id/exec'] = ok(execResult({ exit_code: null, signal: 'SIGKILL' }));
    routes['DELETE /v1/sandboxes/:id'] = ok(sandbox({ state: 'destroyed' }));
    const r = await dsec(['run', '--json', '--', 'sleep', '100']);
    expect(r.code).toBe(137);
    expect(JSON.parse(r.out)).toEqual({ sandbox_id: ID, ...execResult({ exit_code: null, signal: 'SIGKILL' }) });
  });

  it('destroys the sandbox even when exec fails, then exits 125', async () => {
    routes['POST /v1/sandboxes'] = ok(sandbox(), 201);
    routes['POST /v1/sandboxes/:id/execs'] = fail(412, 'FailedPrecondition', `sandbox ${ID} is not running`);
    routes['DELETE /v1/sandboxes/:id'] = ok(sandbox({ state: 'destroyed' }));
    const r = await dsec(['run', '--', 'true']);
    expect(r.code).toBe(125);
    expect(r.err).toMatch(/^dsec: sandbox 0123456789abcdef is not running \(FailedPrecondition\)\nhint: /);
    expect(seen.map((s) => s.method)).toEqual(['POST', 'POST', 'DELETE']);
  });

  it('destroys the sandbox on SIGINT and exits 130', async () => {
    routes['POST /v1/sandboxes'] = ok(sandbox(), 201);
    const atts = serveStreamedExec(fake, { hold: true, onControl: (m) => m.type === 'signal' && interrupt('SIGINT') });
    routes['DELETE /v1/sandboxes/:id'] = ok(sandbox({ state: 'destroyed' }));
    onRequest = (s) => {
      if (s.path.endsWith('/attach')) setTimeout(() => interrupt('SIGINT'), 20);
    };
    const r = await dsec(['run', '--', 'sleep', 'inf']);
    expect(r.code).toBe(130);
    expect(r.err).toBe('dsec: interrupted by SIGINT; the command was killed\n');
    expect(atts[0].control).toEqual([{ type: 'signal', signal: 'SIGINT' }]);
    expect(seen.map((s) => `${s.method} ${s.path}`).at(-1)).toBe(`DELETE /v1/sandboxes/${ID}`);
    expect(interruptHandlers.size).toBe(0);
  });

  it('a SIGINT while the one-shot exec (--json) runs abandons it and destroys the sandbox', async () => {
    routes['POST /v1/sandboxes'] = ok(sandbox(), 201);
    routes['POST /v1/sandboxes/:id/exec'] = () => {
      /* a command that never finishes */
    };
    routes['DELETE /v1/sandboxes/:id'] = ok(sandbox({ state: 'destroyed' }));
    onRequest = (s) => {
      if (s.path.endsWith('/exec')) setImmediate(() => interrupt('SIGINT'));
    };
    const r = await dsec(['run', '--json', '--', 'sleep', 'inf']);
    expect(r.code).toBe(130);
    expect(r.err).toBe(`dsec: interrupted by SIGINT; destroying sandbox ${ID}\n`);
    expect(seen.map((s) => `${s.method} ${s.path}`)).toEqual(['POST /v1/sandboxes', `POST /v1/sandboxes/${ID}/exec`, `DELETE /v1/sandboxes/${ID}`]);
    expect(interruptHandlers.size).toBe(0);
  });

  it('a SIGINT during create still destroys the sandbox once it exists', async () => {
    routes['POST /v1/sandboxes'] = (_req, res) => {
      interrupt('SIGTERM');
      json(res, 201, sandbox());
    };
    routes['DELETE /v1/sandboxes/:id'] = ok(sandbox({ state: 'destroyed' }));
    const r = await dsec(['run', '--', 'true']);
    expect(r.code).toBe(143);
    expect(seen.map((s) => s.method)).toEqual(['POST', 'DELETE']);
  });

  it('a failed destroy is a warning naming the sandbox; the command\'s code is kept', async () => {
    routes['POST /v1/sandboxes'] = ok(sandbox(), 201);
    serveStreamedExec(fake);
    routes['DELETE /v1/sandboxes/:id'] = fail(500, 'Internal', 'runc delete failed');
    const r = await dsec(['run', '--', 'true']);
    expect(r.code).toBe(0);
    expect(r.err).toMatch(new RegExp(`^dsec: warning: could not destroy sandbox ${ID}: runc delete failed \\(Internal\\)\\nhint: remove it with \`dsec rm -f ${ID}\``));
  });

  it('a failed create is 125 and nothing is destroyed', async () => {
    routes['POST /v1/sandboxes'] = fail(501, 'Unimplemented', 'backend vm is not implemented');
    const r = await dsec(['run', '--backend', 'vm', '--', 'true']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: backend vm is not implemented (Unimplemented)\nhint: `dsec host info` lists which backends this host supports\n');
    expect(seen).toHaveLength(1);
  });
});

describe('events', () => {
  const evs: Event[] = [
    { time: Date.UTC(2026, 10, 29, 6, 0, 0), type: 'sandbox.created', sandbox_id: ID, state: 'creating', labels: { job: 'a' } },
    { time: Date.UTC(2026, 10, 29, 6, 0, 1), type: 'sandbox.started', sandbox_id: ID, state: 'running' },
    { time: Date.UTC(2026, 10, 29, 6, 0, 2), type: 'host.note', sandbox_id: null, message: 'ünïcode ✓' },
  ];
  /** Streams the events as NDJSON in 5-byte pieces, so lines and characters straddle chunks. */
  const stream = (keepOpen = false): Route => async (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    const bytes = Buffer.from(evs.map((e) => JSON.stringify(e) + '\n').join(''));
    for (let i = 0; i < bytes.length; i += 5) {
      res.write(bytes.subarray(i, i + 5));
      await new Promise((r) => setTimeout(r, 1));
    }
    if (!keepOpen) res.end();
  };

  it('prints TIME TYPE SANDBOX STATE [MESSAGE] lines', async () => {
    routes['GET /v1/events'] = stream();
    const r = await dsec(['events', '--selector', 'job=a']);
    expect(r.code).toBe(0);
    expect(r.out).toBe(
      [
        `2026-11-29T06:00:00.000Z sandbox.created ${ID} creating`,
        `2026-11-29T06:00:01.000Z sandbox.started ${ID} running`,
        '2026-11-29T06:00:02.000Z host.note - - ünïcode ✓',
      ].join('\n') + '\n',
    );
    expect(seen[0].query.get('selector')).toBe('job=a');
    expect(seen[0].query.has('follow')).toBe(false);
  });

  it('--label k=v (repeatable) filters like a selector', async () => {
    routes['GET /v1/events'] = stream();
    const r = await dsec(['events', '--label', 'job=a', '--label', 'round=3']);
    expect(r.code).toBe(0);
    expect(seen[0].query.get('selector')).toBe('job=a,round=3');
  });

  it('--json prints NDJSON, one Event per line', async () => {
    routes['GET /v1/events'] = stream();
    const r = await dsec(['events', '--json']);
    expect(r.out.trimEnd().split('\n').map((l) => JSON.parse(l))).toEqual(evs);
  });

  it('-f follows until interrupted, then exits 130', async () => {
    routes['GET /v1/events'] = stream(true);
    const stdout = new Sink();
    const done = main(['node', 'dsec', '--socket', socketPath, 'events', '-f'], {
      stdout,
      stderr: new Sink(),
      stdin: Readable.from([]),
      env: {},
      onInterrupt: interrupts.hook,
    });
    while (stdout.text.split('\n').length < 4) await new Promise((r) => setTimeout(r, 2));
    interrupt('SIGINT');
    expect(await done).toBe(130);
    expect(stdout.text.split('\n')).toHaveLength(4);
    expect(seen[0].query.get('follow')).toBe('true');
  });
});

describe('durations need a unit', () => {
  it('a bare number for --timeout, --ttl, --since or stop -t is refused before any request', async () => {
    const cases: [string[], string][] = [
      [['exec', ID, '--timeout', '10', '--', 'true'], 'dsec: --timeout "10" has no unit\nhint: write 10s or 10ms\n'],
      [['run', '--timeout', '10', '--', 'true'], 'dsec: --timeout "10" has no unit\nhint: write 10s or 10ms\n'],
      [['create', '--ttl', '600'], 'dsec: --ttl "600" has no unit\nhint: write 600s or 600ms\n'],
      [['events', '--since', '5'], 'dsec: --since "5" has no unit\nhint: write 5s or 5ms\n'],
      [['stop', '-t', '3', ID], 'dsec: --time "3" has no unit\nhint: write 3s or 3ms\n'],
    ];
    for (const [args, err] of cases) {
      const r = await dsec(args);
      expect(r.code, args.join(' ')).toBe(125);
      expect(r.err, args.join(' ')).toBe(err);
    }
    expect(seen).toHaveLength(0);
  });

  it('units are accepted as before: 500ms, 2s, 1m, 1h, 1d and combinations', async () => {
    serveStreamedExec(fake);
    routes['POST /v1/sandboxes'] = ok(sandbox(), 201);
    for (const [dur, ms] of [['500ms', 500], ['2s', 2000], ['1m', 60_000], ['1h', 3_600_000], ['1m30s', 90_000]] as const) {
      expect((await dsec(['exec', ID, '--timeout', dur, '--', 'true'])).code).toBe(0);
      expect(seen.filter((x) => x.method === 'POST').at(-1)!.body.timeout_ms).toBe(ms);
    }
    expect((await dsec(['create', '--ttl', '1d'])).code).toBe(0);
    expect(seen.at(-1)!.body.ttl_s).toBe(86_400);
  });

  it('help texts show durations with units', async () => {
    const help = async (...args: string[]) => (await dsec([...args, '--help'])).out.replace(/\s+/g, ' ');
    expect(await help('exec')).toContain('--timeout <dur> kill the command after this long; a number with a unit, ms, s, m or h (e.g. 500ms, 30s, 5m); exit 124');
    expect(await help('run')).toContain('--timeout <dur> kill the command after this long; a number with a unit');
    expect(await help('create')).toContain('--ttl <dur> destroy the sandbox this long after creation; a number with a unit, s, m, h or d (e.g. 90s, 10m, 2h;');
    expect(await help('events')).toContain('--since <dur> only events from this long ago onwards; a number with a unit, s, m, h or d (e.g. 10m, 2h)');
    expect(await help('stop')).toContain("-t, --time <dur> grace period between SIGTERM and SIGKILL, with a unit (e.g. 500ms, 30s, 2m); 0 kills at once (default: dsecd's, 10s)");
  });
});

describe('stop', () => {
  it('sends no body without -t; -t/--time sends timeout_ms, -t 0 included', async () => {
    routes['POST /v1/sandboxes/:id/stop'] = ok(sandbox({ state: 'stopped' }));
    expect((await dsec(['stop', ID])).code).toBe(0);
    expect(seen[0].text).toBe('');
    expect((await dsec(['stop', '-t', '0', ID])).code).toBe(0);
    expect(seen[1].body).toEqual({ timeout_ms: 0 });
    expect((await dsec(['stop', '--time', '30s', ID])).code).toBe(0);
    expect(seen[2].body).toEqual({ timeout_ms: 30_000 });
    expect((await dsec(['stop', '-t', '25h', ID])).code).toBe(125);
    expect(seen).toHaveLength(3);
  });

  it('stops each id, reports per id, exits 125 if any failed; --json reports results and an error', async () => {
    routes['POST /v1/sandboxes/:id/stop'] = (req, res) =>
      req.params.id === 'gone' ? json(res, 404, { error: { code: 'NotFound', message: 'sandbox gone not found' } }) : json(res, 200, sandbox({ id: req.params.id, state: 'stopped' }));
    const r = await dsec(['stop', '-t', '1s', 'aaa', 'gone', 'bbb']);
    expect(r.code).toBe(125);
    expect(r.out).toBe('aaa\nbbb\n');
    expect(r.err).toBe('dsec: stop gone: sandbox gone not found (NotFound)\nhint: list sandboxes with `dsec ls`\n');
    expect(seen.map((s) => s.body)).toEqual([{ timeout_ms: 1000 }, { timeout_ms: 1000 }, { timeout_ms: 1000 }]);
    const j = await dsec(['--json', 'stop', 'aaa', 'gone']);
    expect(j.code).toBe(125);
    expect(JSON.parse(j.out)).toEqual({
      results: [
        { id: 'aaa', ok: true, sandbox: expect.objectContaining({ id: 'aaa', state: 'stopped' }) },
        { id: 'gone', ok: false, error: { code: 'NotFound', message: 'sandbox gone not found', hint: 'list sandboxes with `dsec ls`' } },
      ],
      error: { code: 'NotFound', message: 'stop failed for 1 of 2 sandboxes: gone', hint: 'list sandboxes with `dsec ls`' },
    });
    expect(j.err).toBe('dsec: stop gone: sandbox gone not found (NotFound)\nhint: list sandboxes with `dsec ls`\n');
  });
});

describe('selectors', () => {
  it('ls and events pass k=v, k and k!=v terms through as typed', async () => {
    routes['GET /v1/sandboxes'] = ok({ sandboxes: [] });
    routes['GET /v1/events'] = ok({});
    routes['GET /v1/events'] = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.end();
    };
    for (const sel of ['job', 'job!=a', 'job=a,team,round!=3']) {
      expect((await dsec(['ls', '-q', '--selector', sel])).code, sel).toBe(0);
      expect(seen.at(-1)!.query.get('selector')).toBe(sel);
      expect((await dsec(['events', '--selector', sel])).code, sel).toBe(0);
      expect(seen.at(-1)!.query.get('selector')).toBe(sel);
    }
  });

  it('what dsecd would refuse is refused here, with the syntax as hint', async () => {
    const r = await dsec(['ls', '--selector', 'job=a,=b']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: --selector: selector term "=b" has an empty key\nhint: a selector is comma-separated terms: key=value, key!=value or key (has the key), e.g. job=a,round!=3,team\n');
    expect((await dsec(['events', '--selector', 'bad key'])).code).toBe(125);
    expect(seen).toHaveLength(0);
  });

  it("dsecd's InvalidArgument for a selector is reported with the verb's help", async () => {
    routes['GET /v1/sandboxes'] = fail(400, 'InvalidArgument', 'bad selector key "x y"');
    const r = await dsec(['ls', '--selector', 'job']);
    expect(r.err).toBe('dsec: bad selector key "x y" (InvalidArgument)\nhint: see `dsec ls --help`\n');
  });
});

describe('--json errors', () => {
  /** Checks a failed --json run: exit 125, one JSON error line on stdout, the usual report on stderr. */
  function expectJsonError(r: Ran, code: string, message: string | RegExp, hint: string | RegExp | null): void {
    expect(r.code).toBe(125);
    expect(r.out.endsWith('\n')).toBe(true);
    expect(r.out.trimEnd().split('\n')).toHaveLength(1);
    const doc = JSON.parse(r.out);
    expect(Object.keys(doc)).toEqual(['error']);
    expect(Object.keys(doc.error)).toEqual(['code', 'message', 'hint']);
    expect(doc.error.code).toBe(code);
    if (typeof message === 'string') expect(doc.error.message).toBe(message);
    else expect(doc.error.message).toMatch(message);
    if (hint === null || typeof hint === 'string') expect(doc.error.hint).toBe(hint);
    else expect(doc.error.hint).toMatch(hint);
    expect(r.err).toMatch(/^dsec: /);
    expect(r.err).not.toMatch(STACK);
  }

  it('an API error, on any verb, wherever --json is', async () => {
    routes['GET /v1/sandboxes/:id'] = fail(404, 'NotFound', 'sandbox nope not found');
    routes['POST /v1/sandboxes/:id/exec'] = fail(404, 'NotFound', 'sandbox nope not found');
    routes['POST /v1/sandboxes/:id/start'] = fail(412, 'FailedPrecondition', 'sandbox nope is running; cannot start it');
    routes['POST /v1/sandboxes'] = fail(429, 'ResourceExhausted', 'no free uid range');
    routes['GET /v1/host'] = fail(500, 'Internal', 'boom');
    routes['GET /v1/images/:ref'] = fail(404, 'NotFound', 'image nope:latest not found');
    for (const args of [['--json', 'inspect', 'nope'], ['inspect', 'nope', '--json'], ['--json', 'exec', 'nope', '--', 'true']]) {
      const r = await dsec(args);
      expectJsonError(r, 'NotFound', 'sandbox nope not found', 'list sandboxes with `dsec ls`');
      expect(r.err).toBe('dsec: sandbox nope not found (NotFound)\nhint: list sandboxes with `dsec ls`\n');
    }
    expectJsonError(await dsec(['start', 'nope', '--json']), 'FailedPrecondition', 'sandbox nope is running; cannot start it', 'check the sandbox state with `dsec inspect ID`');
    expectJsonError(await dsec(['create', '--json']), 'ResourceExhausted', 'no free uid range', /dsec host info/);
    expectJsonError(await dsec(['run', '--json', '--', 'true']), 'ResourceExhausted', 'no free uid range', /dsec host info/);
    expectJsonError(await dsec(['host', 'info', '--json']), 'Internal', 'boom', /journalctl -u dsecd/);
    expectJsonError(await dsec(['image', 'inspect', 'nope', '--json']), 'NotFound', 'image nope:latest not found', 'list images with `dsec image ls`');
    expectJsonError(await dsec(['ls', '--json'], { socket: join(dir, 'missing.sock') }), 'Unavailable', /missing\.sock/, /^start dsecd/);
  });

  it('an events stream that fails: the error object is one NDJSON line', async () => {
    routes['GET /v1/events'] = fail(400, 'InvalidArgument', 'bad selector');
    expectJsonError(await dsec(['events', '--json']), 'InvalidArgument', 'bad selector', 'see `dsec events --help`');
  });

  it('usage and user errors are InvalidArgument, even when --json comes after the bad flag', async () => {
    const u = await dsec(['--json', 'ls', '--bogus']);
    expectJsonError(u, 'InvalidArgument', "unknown option '--bogus'", 'see `dsec ls --help`');
    expect(u.err).toBe("dsec: unknown option '--bogus'; see `dsec ls --help`\n");
    expectJsonError(await dsec(['bogus', '--json']), 'InvalidArgument', /unknown command 'bogus'/, 'see `dsec --help`');
    expectJsonError(await dsec(['--json', 'inspect']), 'InvalidArgument', /missing required argument/, 'see `dsec inspect --help`');
    const f = await dsec(['create', '--memory', 'lots', '--json']);
    expectJsonError(f, 'InvalidArgument', '--memory: invalid size "lots"', /512M/);
    expectJsonError(await dsec(['--json', 'exec', ID, '--timeout', '10', '--', 'true']), 'InvalidArgument', '--timeout "10" has no unit', 'write 10s or 10ms');
    expect(seen).toHaveLength(0);
  });

  it('a bug is Internal', async () => {
    routes['POST /v1/sandboxes/:id/exec'] = ok({}); // no stdout_b64: decoding it trips
    expectJsonError(await dsec(['--json', 'exec', ID, '--', 'true']), 'Internal', /^internal error: /, /this is a bug in dsec/);
  });

  it('--json after -- belongs to the command, not to dsec', async () => {
    routes['POST /v1/sandboxes/:id/exec'] = fail(404, 'NotFound', 'sandbox nope not found');
    const r = await dsec(['exec', 'nope', '--', 'tool', '--json']);
    expect(r.code).toBe(125);
    expect(r.out).toBe('');
  });

  it('without --json stdout stays empty on failure', async () => {
    routes['GET /v1/sandboxes/:id'] = fail(404, 'NotFound', 'sandbox nope not found');
    const r = await dsec(['inspect', 'nope']);
    expect(r.code).toBe(125);
    expect(r.out).toBe('');
  });
});

describe('hints tell why dsecd is unavailable', () => {
  const START = "start dsecd (systemctl start dsecd, or see docs/OPERATIONS.md 'Without systemd')";
  const PERM = 'the socket is root:dsec 0660: run as root or join the dsec group';
  const AGENT = "the sandbox's agent is unreachable; `dsec inspect ID` shows its state";
  const LOG = "see dsecd's log (journalctl -u dsecd, or /var/log/dsecd.log without systemd)";
  const connErr = (errno: string) => new DsecApiError('Unavailable', 'cannot connect', 0, { cause: Object.assign(new Error(errno), { code: errno }) });

  it('no socket or refused: start dsecd (end to end)', async () => {
    const missing = await dsec(['ls'], { socket: join(dir, 'missing.sock') });
    expect(missing.err.split('\n')[1]).toBe(`hint: ${START}`);
    const notListening = join(dir, 'stale.sock');
    writeFileSync(notListening, ''); // connect() to a non-listening path: ECONNREFUSED
    const refused = await dsec(['ls'], { socket: notListening });
    expect(refused.err).toMatch(/connection refused/);
    expect(refused.err.split('\n')[1]).toBe(`hint: ${START}`);
  });

  it('by errno of the failed connection', () => {
    expect(apiErrorHint(connErr('ENOENT'), 'ls')).toBe(START);
    expect(apiErrorHint(connErr('ECONNREFUSED'), 'exec')).toBe(START);
    expect(apiErrorHint(connErr('EACCES'), 'ls')).toBe(PERM);
    expect(apiErrorHint(connErr('EPERM'), 'image ls')).toBe(PERM);
    expect(apiErrorHint(connErr('ECONNRESET'), 'ls')).toBe(`the connection to dsecd broke (did it restart?); ${LOG}`);
  });

  it("dsecd's own 503 about an agent: the agent is unreachable, not dsecd", async () => {
    routes['POST /v1/sandboxes/:id/execs'] = fail(503, 'Unavailable', `sandbox ${ID}: cannot reach its agent: connect ENOENT`);
    const r = await dsec(['exec', ID, '--', 'true']);
    expect(r.code).toBe(125);
    expect(r.err).toBe(`dsec: sandbox ${ID}: cannot reach its agent: connect ENOENT (Unavailable)\nhint: ${AGENT}\n`);
    routes['POST /v1/sandboxes/:id/stop'] = fail(503, 'Unavailable', 'agent connection lost (EOF) [/run/x.sock]');
    expect((await dsec(['stop', ID])).err).toMatch(new RegExp(`\\nhint: ${AGENT.replace(/[()`';]/g, '\\$&')}\\n$`));
    expect(apiErrorHint(new DsecApiError('Unavailable', `sandbox ${ID}: exec interrupted: EOF`, 503), 'run')).toBe(AGENT);
  });

  it("dsecd's own 503 about something else points at its log", async () => {
    routes['POST /v1/sandboxes'] = fail(503, 'Unavailable', 'no OCI runtime found: install runc (apt-get install runc)');
    const r = await dsec(['create']);
    expect(r.err.split('\n')[1]).toBe(`hint: dsecd could not use something it needs (named above); ${LOG}`);
  });

  it('Internal points at the log; Conflict says retry', async () => {
    routes['GET /v1/sandboxes'] = fail(500, 'Internal', 'database is locked');
    expect((await dsec(['ls'])).err).toBe(`dsec: database is locked (Internal)\nhint: ${LOG}\n`);
    routes['POST /v1/sandboxes/:id/execs'] = fail(409, 'Conflict', `sandbox ${ID} was stopped while the command ran`);
    expect((await dsec(['exec', ID, '--', 'true'])).err).toBe(`dsec: sandbox ${ID} was stopped while the command ran (Conflict)\nhint: retry, or check \`dsec inspect ID\`\n`);
  });
});

describe('duplicate flags and an empty --socket', () => {
  it('--label or --env given twice for one key is refused, naming it, before any request', async () => {
    const l = await dsec(['create', '--label', 'a=b', '--label', 'a=c']);
    expect(l.code).toBe(125);
    expect(l.err).toBe('dsec: --label: label a given twice (a=b and a=c)\nhint: give each label key once, e.g. --label a=c\n');
    const e = await dsec(['exec', ID, '--env', 'A=1', '--env', 'A=2', '--', 'env']);
    expect(e.code).toBe(125);
    expect(e.err).toMatch(/^dsec: --env: env A given twice\n/);
    expect((await dsec(['run', '--env', 'B=1', '--env', 'B=1', '--', 'true'])).code).toBe(125);
    expect((await dsec(['run', '--label', 'x=1', '--label', 'x=1', '--', 'true'])).code).toBe(125);
    expect(seen).toHaveLength(0);
  });

  it("--socket '' is a user error, not the default socket", async () => {
    for (const args of [['--socket', '', 'ls'], ['--socket=', 'version'], ['ls', '--socket', '']]) {
      const r = await dsec(args, { socket: null, env: { DSEC_SOCKET: socketPath } });
      expect(r.code, args.join(' ')).toBe(125);
      expect(r.err).toBe('dsec: empty --socket\nhint: pass --socket PATH, or leave it out to use $DSEC_SOCKET or /run/dsec/dsecd.sock\n');
    }
    const j = await dsec(['--json', '--socket', '', 'ls'], { socket: null });
    expect(JSON.parse(j.out).error.message).toBe('empty --socket');
    expect(seen).toHaveLength(0);
  });
});

describe('exec interrupted (the one-shot form: --json)', () => {
  it('SIGINT stops waiting, says the command may still run, exits 130 and unregisters', async () => {
    routes['POST /v1/sandboxes/:id/exec'] = () => {
      /* a command that never finishes */
    };
    onRequest = () => setImmediate(() => interrupt('SIGINT'));
    const r = await dsec(['--json', 'exec', ID, '--', 'sleep', 'inf']);
    expect(r.code).toBe(130);
    expect(r.out).toBe('');
    expect(r.err).toBe(`dsec: interrupted; the command may still be running in sandbox ${ID} (stop it with dsec exec ${ID} -- kill ...)\n`);
    expect(interruptHandlers.size).toBe(0);
    expect(seen).toHaveLength(1);
  });

  it('SIGTERM exits 143', async () => {
    routes['POST /v1/sandboxes/:id/exec'] = () => {};
    onRequest = () => setImmediate(() => interrupt('SIGTERM'));
    expect((await dsec(['--json', 'exec', ID, '--', 'sleep', 'inf'])).code).toBe(143);
  });

  it('a finished exec unregisters its handler', async () => {
    routes['POST /v1/sandboxes/:id/exec'] = ok(execResult());
    expect((await dsec(['--json', 'exec', ID, '--', 'true'])).code).toBe(0);
    expect(interruptHandlers.size).toBe(0);
  });
});

describe('version --json', () => {
  it('pins the shape without a daemon: daemon null plus daemon_error, exit 0', async () => {
    const r = await dsec(['--json', 'version'], { socket: join(dir, 'missing.sock') });
    expect(r.code).toBe(0);
    const j = JSON.parse(r.out);
    expect(Object.keys(j)).toEqual(['client', 'daemon', 'daemon_error']);
    expect(j).toEqual({
      client: { version: expect.stringMatching(/^\d+\.\d+\.\d+/) },
      daemon: null,
      daemon_error: { code: 'Unavailable', message: expect.stringMatching(/missing\.sock/) },
    });
    expect(r.err).toBe('');
  });

  it('with a daemon: no daemon_error key', async () => {
    routes['GET /v1/version'] = ok({ version: '0.1.0', api: 'v1', agent_protocol: 2, node: 'v20.20.2' });
    const j = JSON.parse((await dsec(['--json', 'version'])).out);
    expect(Object.keys(j)).toEqual(['client', 'daemon']);
  });
});
