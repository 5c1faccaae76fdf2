import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { ExecResult, TrajectoryDetail } from '../../sdk/index.js';
import {
  Interrupts,
  fail,
  fakeRecord,
  fakeSandbox,
  fakeSnapshot,
  fakeStep,
  fakeTrajectory,
  installSnapshotRoutes,
  json,
  ndjson,
  ok,
  runCli,
  startFakeDsecd,
  type FakeDsecd,
  type Ran,
  type Route,
  type Seen,
} from '../fixtures/fake-dsecd.js';

// The snapshot, restore, fork and traj verbs of the CLI, and `exec --trajectory`, run
// in-process against the fake dsecd (test/fixtures/fake-dsecd.ts).

let fake: FakeDsecd;
let routes: Record<string, Route>;
let seen: Seen[];
let interrupts: Interrupts;

beforeEach(async () => {
  fake = await startFakeDsecd();
  ({ routes, seen } = fake);
  interrupts = new Interrupts();
});

afterEach(async () => {
  await fake.close();
});

/** Runs `dsec --socket <fake> ...args` in-process. */
function dsec(args: string[]): Promise<Ran> {
  return runCli(args, { socket: fake.socketPath, interrupts });
}

const ID = '0123456789abcdef';
const SNAP = 'snap-00000000000000a1';
const STACK = /^\s+at /m;
const b64 = (s: string) => Buffer.from(s).toString('base64');
const execResult = (over: Partial<ExecResult> = {}): ExecResult => ({
  exit_code: 0,
  signal: null,
  stdout_b64: b64('out\n'),
  stderr_b64: b64('err\n'),
  stdout_truncated: false,
  stderr_truncated: false,
  duration_ms: 2,
  oom: false,
  timed_out: false,
  ...over,
});

describe('dsec snapshot', () => {
  it('`snapshot ID NAME` snapshots the sandbox: the id on stdout, a one-line note on stderr', async () => {
    routes['POST /v1/sandboxes/:id/snapshot'] = ok(fakeSnapshot(), 201);
    const r = await dsec(['snapshot', ID, 'base']);
    expect(r.code).toBe(0);
    expect(r.out).toBe(`${SNAP}\n`);
    expect(r.err).toBe(`snapshot ${SNAP} "base" of sandbox ${ID}: layer 555555555555 (12MiB)\n`);
    expect(seen.map((s) => `${s.method} ${s.url}`)).toEqual([`POST /v1/sandboxes/${ID}/snapshot`]);
    expect(seen[0].body).toEqual({ name: 'base' });
  });

  it('without NAME the body is empty; --process is sent as process: true; `snapshot create` is the same verb', async () => {
    routes['POST /v1/sandboxes/:id/snapshot'] = ok(fakeSnapshot({ name: null }), 201);
    const r = await dsec(['snapshot', ID]);
    expect(r.code).toBe(0);
    expect(r.err).toBe(`snapshot ${SNAP} of sandbox ${ID}: layer 555555555555 (12MiB)\n`);
    expect((await dsec(['snapshot', ID, '--process'])).code).toBe(0);
    expect((await dsec(['snapshot', '--process', ID, 'n1'])).code).toBe(0);
    expect((await dsec(['snapshot', 'create', ID, 'n2'])).code).toBe(0);
    expect(seen.map((s) => s.body)).toEqual([{}, { process: true }, { name: 'n1', process: true }, { name: 'n2' }]);
  });

  it('a machine snapshot (kind vm) notes its state digest, size and how long the vCPUs were stopped', async () => {
    routes['POST /v1/sandboxes/:id/snapshot'] = ok(fakeSnapshot({
      kind: 'vm', backend: 'microvm', layer: 'sha256:' + '7'.repeat(64), size_bytes: 40 * 1024 * 1024,
      machine: {
        qemu_version: '7.2.22', accel: 'tcg', memory_mib: 256, vcpus: 1, state_bytes: 36 * 1024 * 1024, state_sha256: '7'.repeat(64),
        disk_bytes: 10 * 1024 ** 3, disk_allocated_bytes: 4 * 1024 * 1024, disk_reflinked: false, paused_ms: 350,
      },
    }), 201);
    const r = await dsec(['snapshot', ID, 'base']);
    expect(r.code).toBe(0);
    expect(r.err).toBe(`snapshot ${SNAP} "base" of sandbox ${ID}: machine state 777777777777 (40MiB), vCPUs stopped 350 ms\n`);
  });

  it('`snapshot ls`, `inspect` and `rm` are subcommands, never taken for a sandbox id', async () => {
    routes['GET /v1/snapshots'] = ok({ snapshots: [fakeSnapshot(), fakeSnapshot({ id: 'snap-00000000000000a2', name: null, sandbox_id: 'fedcba9876543210', size_bytes: 1536 })] });
    routes['GET /v1/snapshots/:ref'] = ok(fakeSnapshot());
    routes['DELETE /v1/snapshots/:ref'] = ok(fakeSnapshot());
    routes['POST /v1/sandboxes/:id/snapshot'] = fail(500, 'Internal', 'must not be called');
    const ls = await dsec(['snapshot', 'ls']);
    expect(ls.code).toBe(0);
    expect(ls.out).toBe(
      [
        'ID                     NAME  SANDBOX           IMAGE           SIZE    CREATED',
        `${SNAP}  base  ${ID}  busybox:latest  12MiB   2h ago`,
        'snap-00000000000000a2  -     fedcba9876543210  busybox:latest  1.5KiB  2h ago',
        '',
      ].join('\n'),
    );
    expect((await dsec(['snapshot', 'inspect', 'base'])).code).toBe(0);
    expect((await dsec(['snapshot', 'rm', 'base'])).code).toBe(0);
    expect(seen.map((s) => `${s.method} ${s.url}`)).toEqual(['GET /v1/snapshots', 'GET /v1/snapshots/base', 'DELETE /v1/snapshots/base']);
  });

  it('`snapshot ls -q` prints ids; --json prints {snapshots}', async () => {
    const snaps = [fakeSnapshot()];
    routes['GET /v1/snapshots'] = ok({ snapshots: snaps });
    expect((await dsec(['snapshot', 'ls', '-q'])).out).toBe(`${SNAP}\n`);
    const j = await dsec(['--json', 'snapshot', 'ls']);
    expect(JSON.parse(j.out)).toEqual({ snapshots: snaps });
  });

  it('--json prints the Snapshot and no note', async () => {
    const snap = fakeSnapshot();
    routes['POST /v1/sandboxes/:id/snapshot'] = ok(snap, 201);
    const r = await dsec(['--json', 'snapshot', ID, 'base']);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out)).toEqual(snap);
    expect(r.err).toBe('');
    const after = await dsec(['snapshot', ID, 'base', '--json']);
    expect([after.code, JSON.parse(after.out), after.err]).toEqual([0, snap, '']);
    expect(seen.map((x) => x.body)).toEqual([{ name: 'base' }, { name: 'base' }]);
  });

  it('`snapshot inspect REF` prints the snapshot as JSON', async () => {
    const snap = fakeSnapshot();
    routes['GET /v1/snapshots/:ref'] = ok(snap);
    const r = await dsec(['snapshot', 'inspect', SNAP]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out)).toEqual(snap);
    expect(r.out).toBe(JSON.stringify(snap, null, 2) + '\n');
  });

  it('`snapshot rm` reports per ref and exits 125 if any failed', async () => {
    routes['DELETE /v1/snapshots/:ref'] = (req, res) =>
      req.params.ref === 'nope' ? json(res, 404, { error: { code: 'NotFound', message: 'snapshot nope not found' } }) : json(res, 200, fakeSnapshot());
    const r = await dsec(['snapshot', 'rm', 'base', 'nope']);
    expect(r.code).toBe(125);
    expect(r.out).toBe('base\n');
    expect(r.err).toBe('dsec: snapshot rm nope: snapshot nope not found (NotFound)\nhint: list snapshots with `dsec snapshot ls`\n');
    const j = await dsec(['--json', 'snapshot', 'rm', 'base', 'nope']);
    const doc = JSON.parse(j.out);
    expect(doc.results).toEqual([
      { ref: 'base', ok: true, snapshot: fakeSnapshot({ created_at: doc.results[0].snapshot.created_at }) },
      { ref: 'nope', ok: false, error: { code: 'NotFound', message: 'snapshot nope not found', hint: 'list snapshots with `dsec snapshot ls`' } },
    ]);
    expect(doc.error).toMatchObject({ code: 'NotFound', message: 'snapshot rm failed for 1 of 2 snapshots: nope' });
  });

  it('a bad name is refused before any request', async () => {
    const r = await dsec(['snapshot', ID, 'Base!']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: invalid snapshot name "Base!"\nhint: snapshot names are 1-128 of [a-z0-9._-], starting with a lowercase letter or digit, e.g. step-12\n');
    expect(seen).toHaveLength(0);
  });

  it('API errors get snapshot hints: --process Unimplemented points at CRIU, a taken name at `snapshot rm`', async () => {
    routes['POST /v1/sandboxes/:id/snapshot'] = (req, res) =>
      req.body.process
        ? json(res, 501, { error: { code: 'Unimplemented', message: 'process snapshots need CRIU: criu check failed' } })
        : json(res, 409, { error: { code: 'AlreadyExists', message: 'snapshot base already exists' } });
    const p = await dsec(['snapshot', ID, '--process']);
    expect(p.code).toBe(125);
    expect(p.err).toBe(
      "dsec: process snapshots need CRIU: criu check failed (Unimplemented)\nhint: process snapshots need CRIU working on dsecd's host (`criu check`); drop --process for a filesystem snapshot\n",
    );
    const n = await dsec(['snapshot', ID, 'base']);
    expect(n.err).toBe('dsec: snapshot base already exists (AlreadyExists)\nhint: list snapshots with `dsec snapshot ls`; pick another name or remove the old one with `dsec snapshot rm NAME`\n');
    expect(n.err).not.toMatch(STACK);
  });

  it('a backend that takes no snapshots gets a hint about backends, not CRIU', async () => {
    routes['POST /v1/sandboxes/:id/snapshot'] = (_req, res) => json(res, 501, { error: { code: 'Unimplemented', message: 'snapshots of vm sandboxes are not built yet' } });
    const r = await dsec(['snapshot', ID, 'base']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: snapshots of vm sandboxes are not built yet (Unimplemented)\nhint: snapshots are built for container and microvm sandboxes (docs/TRAJECTORIES.md); `dsec commit` needs a container\n');
  });

  it('`snapshot --help` lists the subcommands; a missing id is one usage line', async () => {
    const h = await dsec(['snapshot', '--help']);
    expect(h.code).toBe(0);
    expect(h.out).toMatch(/Usage: dsec snapshot/);
    expect(h.out).toMatch(/create \[options\] <id> \[name\]/);
    expect(h.out).toMatch(/ls\|list/);
    const m = await dsec(['snapshot']);
    expect(m.code).toBe(125);
    expect(m.err).toBe("dsec: missing required argument 'id'; see `dsec snapshot create --help`\n");
    const u = await dsec(['snapshot', 'ls', '--process']);
    expect(u.err).toBe("dsec: unknown option '--process'; see `dsec snapshot ls --help`\n");
    expect(seen).toHaveLength(0);
  });
});

describe('dsec restore', () => {
  it('maps the create flags to the request body and prints the new id', async () => {
    routes['POST /v1/snapshots/:ref/restore'] = ok(fakeSandbox({ id: 'b'.repeat(16), snapshot: SNAP }), 201);
    const r = await dsec([
      'restore', 'base',
      '--label', 'job=b', '--label', 'round=4', '--env', 'K=V', '--env', 'E=',
      '--cpus', '1.5', '--memory', '1G', '--pids', '64', '--disk', '512M', '--ttl', '10m', '--priority', 'batch', '--idle-timeout', '90s',
    ]);
    expect(r.code).toBe(0);
    expect(r.out).toBe('b'.repeat(16) + '\n');
    expect(r.err).toBe('');
    expect(seen.map((s) => `${s.method} ${s.url}`)).toEqual(['POST /v1/snapshots/base/restore']);
    expect(seen[0].body).toEqual({
      labels: { job: 'b', round: '4' },
      env: { K: 'V', E: '' },
      cpus: 1.5,
      memory_bytes: 1024 ** 3,
      pids: 64,
      disk_bytes: 512 * 1024 ** 2,
      ttl_s: 600,
      priority: 'batch',
      idle_timeout_s: 90,
    });
  });

  it('without flags sends an empty body; --json prints the Sandbox', async () => {
    const sb = fakeSandbox({ snapshot: SNAP });
    routes['POST /v1/snapshots/:ref/restore'] = ok(sb, 201);
    const r = await dsec(['--json', 'restore', SNAP]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out)).toEqual(sb);
    expect(seen[0].body).toEqual({});
  });

  it('bad flag values are refused by the create parsers, before any request; --image is not a restore flag', async () => {
    for (const [args, err] of [
      [['--memory', 'lots'], 'dsec: --memory: invalid size "lots"\n'],
      [['--label', 'nokv'], 'dsec: --label: invalid label "nokv": expected key=value\n'],
      [['--ttl', '10'], 'dsec: --ttl "10" has no unit\n'],
      [['--cpus', 'many'], 'dsec: --cpus: invalid CPU amount "many"\n'],
    ] as const) {
      const r = await dsec(['restore', 'base', ...args]);
      expect(r.code, args.join(' ')).toBe(125);
      expect(r.err.split('\n')[0] + '\n', args.join(' ')).toBe(err);
    }
    expect((await dsec(['restore', 'base', '--image', 'x'])).err).toBe("dsec: unknown option '--image'; see `dsec restore --help`\n");
    expect(seen).toHaveLength(0);
  });

  it('an unknown snapshot is NotFound with the snapshot hint', async () => {
    routes['POST /v1/snapshots/:ref/restore'] = fail(404, 'NotFound', 'snapshot nope not found');
    const r = await dsec(['restore', 'nope']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: snapshot nope not found (NotFound)\nhint: list snapshots with `dsec snapshot ls`\n');
  });
});

describe('dsec fork', () => {
  it('-n N with overrides: {count, ...} in the body, the N ids one per line', async () => {
    const ids = ['b000000000000001', 'b000000000000002', 'b000000000000003'];
    routes['POST /v1/snapshots/:ref/fork'] = ok({ sandboxes: ids.map((id) => fakeSandbox({ id, snapshot: SNAP })) }, 201);
    const r = await dsec(['fork', 'base', '-n', '3', '--label', 'round=5', '--memory', '256M', '--ttl', '1h']);
    expect(r.code).toBe(0);
    expect(r.out).toBe(ids.join('\n') + '\n');
    expect(seen.map((s) => `${s.method} ${s.url}`)).toEqual(['POST /v1/snapshots/base/fork']);
    expect(seen[0].body).toEqual({ count: 3, labels: { round: '5' }, memory_bytes: 256 * 1024 ** 2, ttl_s: 3600 });
  });

  it('--json prints {sandboxes}; --count is the long form', async () => {
    const sandboxes = [fakeSandbox({ snapshot: SNAP })];
    routes['POST /v1/snapshots/:ref/fork'] = ok({ sandboxes }, 201);
    const r = await dsec(['--json', 'fork', SNAP, '--count', '1']);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out)).toEqual({ sandboxes });
    expect(seen[0].body).toEqual({ count: 1 });
  });

  it('-n is required and must be 1-256; refused before any request', async () => {
    expect((await dsec(['fork', 'base'])).err).toBe("dsec: required option '-n, --count <n>' not specified; see `dsec fork --help`\n");
    const zero = await dsec(['fork', 'base', '-n', '0']);
    expect(zero.code).toBe(125);
    expect(zero.err).toBe('dsec: -n: invalid count "0"\nhint: write a positive whole number\n');
    const big = await dsec(['fork', 'base', '-n', '257']);
    expect(big.err).toBe('dsec: -n: fork count 257 is more than 256\nhint: fork at most 256 per call; run `dsec fork` several times for a larger group\n');
    expect(seen).toHaveLength(0);
  });

  it('errors: NotFound hints at `snapshot ls`; --json writes the error document', async () => {
    routes['POST /v1/snapshots/:ref/fork'] = fail(404, 'NotFound', 'snapshot nope not found');
    const r = await dsec(['--json', 'fork', 'nope', '-n', '2']);
    expect(r.code).toBe(125);
    expect(JSON.parse(r.out)).toEqual({ error: { code: 'NotFound', message: 'snapshot nope not found', hint: 'list snapshots with `dsec snapshot ls`' } });
  });
});

describe('dsec traj', () => {
  const detail = (): TrajectoryDetail => ({
    ...fakeTrajectory({ unknown: 1 }),
    step_list: [
      fakeStep({ step: 0, argv: ['echo', 'hello world'], replays: 2 }),
      fakeStep({ step: 1, argv: ['sleep', '100'], exit_code: null, signal: null, timed_out: true, duration_ms: 1500.4 }),
      fakeStep({ step: 2, argv: ['python3', '-c', 'x'.repeat(80)], state: 'unknown', exit_code: null, finished_at: null, duration_ms: null, oom: null, timed_out: null, error: 'dsecd restarted mid-step' }),
    ],
  });

  it('`traj ls` prints a table, -q the ids, --json {trajectories}', async () => {
    const list = [fakeTrajectory(), fakeTrajectory({ id: 'ep-8', steps: 0, first_step: null, last_step: null, sandbox_id: null })];
    routes['GET /v1/trajectories'] = ok({ trajectories: list });
    const r = await dsec(['traj', 'ls']);
    expect(r.code).toBe(0);
    expect(r.out).toBe(
      [
        'ID    STEPS  LAST  UNKNOWN  SANDBOX           HOST  UPDATED',
        `ep-7  3      2     0        ${ID}  h1    3m ago`,
        'ep-8  0      -     0        -                 h1    3m ago',
        '',
      ].join('\n'),
    );
    expect((await dsec(['traj', 'ls', '-q'])).out).toBe('ep-7\nep-8\n');
    expect(JSON.parse((await dsec(['--json', 'trajectory', 'ls'])).out)).toEqual({ trajectories: list });
  });

  it('`traj show ID` prints the steps (step, state, exit, duration, argv, replays) and a note per unknown step', async () => {
    routes['GET /v1/trajectories/:id'] = ok(detail());
    const r = await dsec(['traj', 'show', 'ep-7']);
    expect(r.code).toBe(0);
    expect(r.out).toBe(
      [
        'STEP  STATE     EXIT     DURATION  ARGV                                                          REPLAYS',
        "0     finished  0        12ms      echo 'hello world'                                            2",
        '1     finished  timeout  1s500ms   sleep 100                                                     0',
        `2     unknown   -        -         python3 -c ${'x'.repeat(48)}…  0`,
        '',
      ].join('\n'),
    );
    expect(r.err).toBe('dsec: note: step 2 of ep-7: outcome unknown (dsecd restarted mid-step); rerun it with `dsec exec --trajectory ep-7 --step 2 --truncate ID -- CMD`\n');
    expect(seen.map((s) => s.url)).toEqual(['/v1/trajectories/ep-7']);
    const wide = await dsec(['traj', 'show', '--no-trunc', 'ep-7']);
    expect(wide.out).toContain(`python3 -c ${'x'.repeat(80)}  0\n`);
  });

  it('`traj show --json` prints the TrajectoryDetail and no note', async () => {
    const d = detail();
    routes['GET /v1/trajectories/:id'] = ok(d);
    const r = await dsec(['--json', 'traj', 'show', 'ep-7']);
    expect(JSON.parse(r.out)).toEqual(d);
    expect(r.err).toBe('');
  });

  it('`traj show` of an unknown trajectory hints at `traj ls`', async () => {
    routes['GET /v1/trajectories/:id'] = fail(404, 'NotFound', 'trajectory nope not found');
    const r = await dsec(['traj', 'show', 'nope']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: trajectory nope not found (NotFound)\nhint: list trajectories with `dsec traj ls`\n');
  });

  it('`traj export ID` writes the records as JSON lines on stdout, in order', async () => {
    const records = [0, 1, 2].map((step) => fakeRecord({ step, argv: ['echo', `ü ${step}`] }));
    routes['GET /v1/trajectories/:id/export'] = ndjson(records, { chunk: 29 });
    const r = await dsec(['traj', 'export', 'ep:7@h']);
    expect(r.code).toBe(0);
    expect(r.out).toBe(records.map((x) => JSON.stringify(x) + '\n').join(''));
    expect(r.out.trim().split('\n').map((l) => JSON.parse(l))).toEqual(records);
    expect(r.err).toBe('');
    expect(seen[0].url).toBe('/v1/trajectories/ep%3A7%40h/export');
    // --json changes nothing on stdout: the output is JSON lines already; `-o -` is stdout.
    expect((await dsec(['--json', 'traj', 'export', 'ep-7'])).out).toBe(r.out);
    expect((await dsec(['traj', 'export', 'ep-7', '-o', '-'])).out).toBe(r.out);
  });

  it('`traj export -o FILE` writes the file, a note on stderr; with --json a summary on stdout', async () => {
    const records = [fakeRecord(), fakeRecord({ step: 1 })];
    routes['GET /v1/trajectories/:id/export'] = ndjson(records);
    const file = join(fake.dir, 'out', 'ep.jsonl');
    mkdirSync(join(fake.dir, 'out'));
    writeFileSync(file, 'old content\n');
    const r = await dsec(['traj', 'export', 'ep-7', '-o', file]);
    expect(r.code).toBe(0);
    expect(r.out).toBe('');
    expect(r.err).toBe(`exported 2 steps of ep-7 to ${file}\n`);
    expect(readFileSync(file, 'utf8')).toBe(records.map((x) => JSON.stringify(x) + '\n').join(''));
    const j = await dsec(['--json', 'traj', 'export', 'ep-7', '--output', file]);
    expect(JSON.parse(j.out)).toEqual({ trajectory: 'ep-7', file, steps: 2 });
    expect(j.err).toBe('');
    expect(readdirSync(join(fake.dir, 'out'))).toEqual(['ep.jsonl']);
  });

  it('`traj export -o FILE` that fails leaves FILE as it was and no temporary file', async () => {
    routes['GET /v1/trajectories/:id/export'] = (req, res) => {
      if (req.params.id === 'nope') return json(res, 404, { error: { code: 'NotFound', message: 'trajectory nope not found' } });
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.end(JSON.stringify(fakeRecord()) + '\nnot json\n');
    };
    const dir = join(fake.dir, 'out');
    mkdirSync(dir);
    const file = join(dir, 'ep.jsonl');
    const r = await dsec(['traj', 'export', 'nope', '-o', file]);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: trajectory nope not found (NotFound)\nhint: list trajectories with `dsec traj ls`\n');
    writeFileSync(file, 'old\n');
    const bad = await dsec(['traj', 'export', 'bad', '-o', file]);
    expect(bad.code).toBe(125);
    expect(bad.err).toMatch(/^dsec: dsecd sent a malformed line in the export of trajectory bad: "not json" \(Internal\)\n/);
    expect(readFileSync(file, 'utf8')).toBe('old\n');
    expect(readdirSync(dir)).toEqual(['ep.jsonl']);
    const missing = await dsec(['traj', 'export', 'ep-7', '-o', join(fake.dir, 'no', 'such', 'f.jsonl')]);
    expect(missing.code).toBe(125);
    expect(missing.err).toBe(`dsec: --output ${join(fake.dir, 'no', 'such', 'f.jsonl')}: no such directory\nhint: check that the directory exists\n`);
  });

  it('`traj export` stops on SIGINT: exit 130, and -o FILE is not written', async () => {
    routes['GET /v1/trajectories/:id/export'] = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(JSON.stringify(fakeRecord()) + '\n');
      setTimeout(() => interrupts.fire('SIGINT'), 20);
      // never ends
    };
    const file = join(fake.dir, 'ep.jsonl');
    const r = await dsec(['traj', 'export', 'ep-7', '-o', file]);
    expect(r.code).toBe(130);
    expect(r.err).toBe(`dsec: interrupted by SIGINT after 1 step; ${file} was not written\n`);
    expect(existsSync(file)).toBe(false);
    expect(readdirSync(fake.dir).filter((n) => n.includes('ep.jsonl'))).toEqual([]);
    const out = await dsec(['traj', 'export', 'ep-7']);
    expect(out.code).toBe(130);
    expect(out.out.split('\n').slice(0, -1).map((l) => JSON.parse(l).step)).toEqual([0]);
    expect(out.err).toBe('dsec: interrupted by SIGINT after 1 step; the export is incomplete\n');
  });

  it('`traj rm` of a trajectory with a running step is a Conflict with its own hint', async () => {
    routes['DELETE /v1/trajectories/:id'] = fail(409, 'Conflict', 'trajectory ep-7 has a step running now; remove it after the step ends', 'in_progress');
    const r = await dsec(['traj', 'rm', 'ep-7']);
    expect(r.code).toBe(125);
    expect(r.err).toBe(
      'dsec: traj rm ep-7: trajectory ep-7 has a step running now; remove it after the step ends (Conflict)\n' +
        'hint: a step of it is running now; retry when the step has ended (`dsec traj show ID` shows it)\n',
    );
  });

  it('`traj rm` reports per id; --json results carry removed_steps', async () => {
    routes['DELETE /v1/trajectories/:id'] = (req, res) =>
      req.params.id === 'nope' ? json(res, 404, { error: { code: 'NotFound', message: 'trajectory nope not found' } }) : json(res, 200, { id: req.params.id, removed_steps: 3 });
    const r = await dsec(['traj', 'rm', 'ep-7', 'nope']);
    expect(r.code).toBe(125);
    expect(r.out).toBe('ep-7\n');
    expect(r.err).toBe('dsec: traj rm nope: trajectory nope not found (NotFound)\nhint: list trajectories with `dsec traj ls`\n');
    const j = await dsec(['--json', 'traj', 'rm', 'ep-7']);
    expect(j.code).toBe(0);
    expect(JSON.parse(j.out)).toEqual({ results: [{ id: 'ep-7', ok: true, removed_steps: 3 }] });
  });
});

describe('dsec exec --trajectory', () => {
  it('sends trajectory, step and truncate; output and exit code as usual', async () => {
    routes['POST /v1/sandboxes/:id/exec'] = ok(execResult({ exit_code: 3, trajectory: 'ep-7', step: 4, replayed: false }));
    const r = await dsec(['exec', '--trajectory', 'ep-7', '--step', '4', '--truncate', ID, '--', 'make', 'test']);
    expect(r.code).toBe(3);
    expect(r.out).toBe('out\n');
    expect(r.err).toBe('err\n');
    expect(seen[0].body).toEqual({ argv: ['make', 'test'], trajectory: 'ep-7', step: 4, truncate: true });
    await dsec(['exec', '--trajectory', 'ep-7', '--step', '0', ID, '--', 'ls']);
    expect(seen[1].body).toEqual({ argv: ['ls'], trajectory: 'ep-7', step: 0 });
    // Without --trajectory the command is streamed (a paced session), with no step fields.
    await dsec(['exec', ID, '--', 'ls']);
    expect(seen[2].path).toBe(`/v1/sandboxes/${ID}/execs`);
    expect(seen[2].body).toEqual({ argv: ['ls'], paced: true });
  });

  it('a replayed result prints the recorded output and the note on stderr', async () => {
    routes['POST /v1/sandboxes/:id/exec'] = ok(execResult({ trajectory: 'ep-7', step: 4, replayed: true }));
    const r = await dsec(['exec', '--trajectory', 'ep-7', '--step', '4', ID, '--', 'make']);
    expect(r.code).toBe(0);
    expect(r.out).toBe('out\n');
    expect(r.err).toBe('err\ndsec: step 4 of ep-7 replayed from the log; nothing ran\n');
  });

  it('with --json the ExecResult says replayed: true and there is no note', async () => {
    const res = execResult({ trajectory: 'ep-7', step: 4, replayed: true });
    routes['POST /v1/sandboxes/:id/exec'] = ok(res);
    const r = await dsec(['--json', 'exec', '--trajectory', 'ep-7', '--step', '4', ID, '--', 'make']);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out)).toEqual(res);
    expect(r.err).toBe('');
  });

  it('outcome_unknown and step_mismatch refusals hint at --truncate; --json carries the reason', async () => {
    let reason = 'outcome_unknown';
    routes['POST /v1/sandboxes/:id/exec'] = (_req, res) => json(res, 409, { error: { code: 'Conflict', message: `step 4 of ep-7: ${reason}`, reason } });
    const u = await dsec(['exec', '--trajectory', 'ep-7', '--step', '4', ID, '--', 'make']);
    expect(u.code).toBe(125);
    expect(u.err).toBe(
      'dsec: step 4 of ep-7: outcome_unknown (Conflict)\n' +
        'hint: the step started but never finished (dsecd or the sandbox died mid-step), so there is no result to replay; check the sandbox, then rerun the step with --truncate to discard it and the steps after it\n',
    );
    expect(u.err).not.toMatch(STACK);
    reason = 'step_mismatch';
    const m = await dsec(['exec', '--trajectory', 'ep-7', '--step', '4', ID, '--', 'make']);
    expect(m.err.split('\n')[1]).toMatch(/^hint: the step is recorded with a different command .*--truncate/);
    const j = await dsec(['--json', 'exec', '--trajectory', 'ep-7', '--step', '4', ID, '--', 'make']);
    expect(JSON.parse(j.out)).toEqual({
      error: {
        code: 'Conflict',
        message: 'step 4 of ep-7: step_mismatch',
        hint: 'the step is recorded with a different command (argv, env, cwd, user, stdin or timeout); rerun with --truncate to discard the recorded step and the steps after it, or use a new step number',
        reason: 'step_mismatch',
      },
    });
    // Without a reason, a Conflict keeps its usual hint and the JSON error no reason field.
    routes['POST /v1/sandboxes/:id/exec'] = fail(409, 'Conflict', 'busy');
    const plain = await dsec(['--json', 'exec', ID, '--', 'make']);
    expect(JSON.parse(plain.out)).toEqual({ error: { code: 'Conflict', message: 'busy', hint: 'retry, or check `dsec inspect ID`' } });
  });

  it('the trajectory flags go together and only with the plain form; refused before any request', async () => {
    const cases: [string[], string][] = [
      [['--trajectory', 'ep-7'], 'dsec: --trajectory needs --step\nhint: give both: e.g. `dsec exec --trajectory T --step 3 ID -- CMD`\n'],
      [['--step', '1'], 'dsec: --step needs --trajectory\nhint: give both: e.g. `dsec exec --trajectory T --step 3 ID -- CMD`\n'],
      [['--truncate'], 'dsec: --truncate needs --trajectory and --step\nhint: give all three: `dsec exec --trajectory T --step 3 --truncate ID -- CMD`\n'],
      [['--trajectory', 'ep-7', '--step', '1', '-d'], 'dsec: --trajectory cannot be combined with -d\nhint: a trajectory step runs to completion and is recorded whole: drop -d\n'],
      [['--trajectory', 'ep-7', '--step', '1', '-i'], 'dsec: --trajectory cannot be combined with -i\nhint: a trajectory step runs to completion and is recorded whole: drop -i\n'],
      [['--trajectory', 'ep-7', '--step', '1', '-it'], 'dsec: --trajectory cannot be combined with -i, -t\nhint: a trajectory step runs to completion and is recorded whole: drop -i, -t\n'],
      [['--trajectory', 'ep 7', '--step', '1'], 'dsec: --trajectory: invalid trajectory id "ep 7"\nhint: trajectory ids are 1-128 of [A-Za-z0-9._:@-], starting with a letter or digit, e.g. run-7:ep-12\n'],
      [['--trajectory', 'ep-7', '--step', '1.5'], 'dsec: --step: invalid step "1.5"\nhint: steps are whole numbers from 0 to 2147483647\n'],
      [['--trajectory', 'ep-7', '--step', '2147483648'], 'dsec: --step: invalid step "2147483648"\nhint: steps are whole numbers from 0 to 2147483647\n'],
    ];
    for (const [flags, err] of cases) {
      const r = await dsec(['exec', ...flags, ID, '--', 'ls']);
      expect(r.code, flags.join(' ')).toBe(125);
      expect(r.err, flags.join(' ')).toBe(err);
    }
    expect(seen).toHaveLength(0);
  });
});

describe('dsec inspect', () => {
  it('shows the snapshot a sandbox was restored from', async () => {
    routes['GET /v1/sandboxes/:id'] = ok(fakeSandbox({ snapshot: SNAP }));
    const r = await dsec(['inspect', ID]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out).snapshot).toBe(SNAP);
    expect(r.out).toContain(`"snapshot": "${SNAP}"`);
  });
});

describe('against the in-memory model of dsecd', () => {
  it('snapshot, restore, fork; exec records a step, a rerun replays it, --truncate rewrites it; traj shows it', async () => {
    const state = installSnapshotRoutes(fake);
    const snap = await dsec(['snapshot', ID, 'base']);
    expect(snap.out).toBe('snap-00000000000000a1\n');
    const restored = await dsec(['restore', 'base', '--label', 'round=2']);
    const rid = restored.out.trim();
    expect(rid).toMatch(/^[0-9a-f]{16}$/);
    expect(JSON.parse((await dsec(['--json', 'fork', 'base', '-n', '2'])).out).sandboxes.map((s: { snapshot: string }) => s.snapshot)).toEqual([
      'snap-00000000000000a1',
      'snap-00000000000000a1',
    ]);
    expect(state.sandboxes.get(rid)).toMatchObject({ labels: { round: '2' }, snapshot: 'snap-00000000000000a1' });

    const run = (...extra: string[]) => dsec(['exec', '--trajectory', 'ep-1', '--step', '0', ...extra, rid, '--', 'echo', 'hi']);
    const first = await run();
    expect([first.code, first.out, first.err]).toEqual([0, 'echo hi\n', '']);
    const again = await run();
    expect([again.code, again.out, again.err]).toEqual([0, 'echo hi\n', 'dsec: step 0 of ep-1 replayed from the log; nothing ran\n']);
    expect(state.ran).toHaveLength(1);
    const other = await dsec(['exec', '--trajectory', 'ep-1', '--step', '0', rid, '--', 'echo', 'bye']);
    expect(other.code).toBe(125);
    expect(other.err).toMatch(/\(Conflict\)\nhint: .*--truncate/);
    const rewritten = await dsec(['exec', '--trajectory', 'ep-1', '--step', '0', '--truncate', rid, '--', 'echo', 'bye']);
    expect([rewritten.code, rewritten.out]).toEqual([0, 'echo bye\n']);

    const show = await dsec(['traj', 'show', 'ep-1']);
    expect(show.out.split('\n')[1].split(/\s{2,}/)).toEqual(['0', 'finished', '0', '3ms', 'echo bye', '0']);
    const ls = await dsec(['traj', 'ls', '-q']);
    expect(ls.out).toBe('ep-1\n');
    const exported = await dsec(['traj', 'export', 'ep-1']);
    expect(exported.out.trim().split('\n').map((l) => JSON.parse(l)).map((x) => [x.trajectory, x.step, x.argv])).toEqual([['ep-1', 0, ['echo', 'bye']]]);
    expect((await dsec(['traj', 'rm', 'ep-1'])).out).toBe('ep-1\n');
    expect((await dsec(['traj', 'ls', '-q'])).out).toBe('');
    // The removed id stays reserved: its steps are neither replayed nor run again.
    const reused = await run();
    expect(reused.code).toBe(125);
    expect(reused.err).toBe(
      'dsec: trajectory ep-1 was removed; use a new trajectory id (FailedPrecondition)\n' +
        'hint: this trajectory id was removed (`dsec traj rm`, or by retention) and stays reserved, so its steps are neither replayed nor run again; use a new trajectory id\n',
    );
    expect(state.ran).toHaveLength(2);
    expect((await dsec(['snapshot', 'rm', 'base'])).out).toBe('base\n');
    expect((await dsec(['snapshot', 'ls', '-q'])).out).toBe('');
  });
});
