import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { BulkResult } from '../../sdk/index.js';
import { fail, fakeLease, fakeReclaim, fakeSandbox, json, ok, runCli, serveStreamedExec, startFakeDsecd, type FakeDsecd, type Ran, type Route, type Seen } from '../fixtures/fake-dsecd.js';

// The RL-round verbs of the CLI (pause, resume, --selector on pause/resume/stop/rm, ttl,
// job lease/renew/ls/rm, create/run --priority/--idle-timeout, ls --wide), run in-process
// against the fake dsecd of test/fixtures/fake-dsecd.ts.

let fake: FakeDsecd;
let seen: Seen[];
let routes: Record<string, Route>;

beforeEach(async () => {
  fake = await startFakeDsecd();
  ({ seen, routes } = fake);
});

afterEach(async () => {
  await fake.close();
});

/** Runs `dsec --socket <fake> ...args` in-process. */
function dsec(args: string[]): Promise<Ran> {
  return runCli(args, { socket: fake.socketPath });
}

const ID = '0123456789abcdef';
const ID2 = 'fedcba9876543210';
const MiB = 1024 ** 2;
const STACK = /^\s+at /m;
const calls = () => seen.map((s) => `${s.method} ${s.path}`);
const PAUSED_LINE = (id: string) => `${id} paused, reclaimed 38MiB (file 40MiB -> 2MiB; no swap: anon 30MiB stays)`;
const EXPIRED_HINT = 'the lease expired; its sandboxes are paused and will be destroyed; create a new lease: `dsec job rm JOB`, then `dsec job lease JOB --ttl DUR`';

/** Checks a usage or user error: exit 125, one `dsec:` line plus an optional hint line, nothing on stdout, no request. */
function expectUserError(r: Ran, message: string | RegExp, hint?: string | RegExp): void {
  expect(r.code).toBe(125);
  expect(r.out).toBe('');
  const lines = r.err.trimEnd().split('\n');
  expect(lines.length).toBeLessThanOrEqual(2);
  if (typeof message === 'string') expect(lines[0]).toBe(`dsec: ${message}`);
  else expect(lines[0]).toMatch(message);
  if (hint !== undefined) {
    if (typeof hint === 'string') expect(lines[1]).toBe(`hint: ${hint}`);
    else expect(lines[1]).toMatch(hint);
  }
  expect(r.err).not.toMatch(STACK);
  expect(seen).toHaveLength(0);
}

/** Parses a --json run's stdout as one document. */
const doc = (r: Ran) => JSON.parse(r.out);

describe('pause ID...', () => {
  beforeEach(() => {
    routes['POST /v1/sandboxes/:id/pause'] = (req, res) =>
      req.params.id === 'stopped1'
        ? json(res, 412, { error: { code: 'FailedPrecondition', message: 'sandbox stopped1 is stopped; only a running sandbox can be paused' } })
        : req.params.id === ID2
          ? json(res, 200, { sandbox: fakeSandbox({ id: ID2, state: 'paused' }), reclaim: null })
          : json(res, 200, { sandbox: fakeSandbox({ id: req.params.id, state: 'paused' }), reclaim: fakeReclaim() });
  });

  it('prints what each pause reclaimed, in argument order; already paused is not an error', async () => {
    const r = await dsec(['pause', ID, ID2]);
    expect(r.code).toBe(0);
    expect(r.out).toBe(`${PAUSED_LINE(ID)}\n${ID2} paused (already paused; nothing reclaimed)\n`);
    expect(r.err).toBe('');
    expect(calls().sort()).toEqual([`POST /v1/sandboxes/${ID}/pause`, `POST /v1/sandboxes/${ID2}/pause`].sort());
  });

  it('with swap the anonymous memory is swappable, not staying', async () => {
    routes['POST /v1/sandboxes/:id/pause'] = ok({ sandbox: fakeSandbox({ state: 'paused' }), reclaim: fakeReclaim({ swap: true, anon_bytes: 1.5 * 1024 * MiB }) });
    expect((await dsec(['pause', ID])).out).toBe(`${ID} paused, reclaimed 38MiB (file 40MiB -> 2MiB; anon 1.5GiB swappable)\n`);
  });

  it('--json prints {results} with the sandbox and the reclaim report', async () => {
    const r = await dsec(['--json', 'pause', ID, ID2]);
    expect(r.code).toBe(0);
    expect(r.err).toBe('');
    expect(doc(r)).toEqual({
      results: [
        { id: ID, ok: true, sandbox: expect.objectContaining({ id: ID, state: 'paused' }), reclaim: fakeReclaim() },
        { id: ID2, ok: true, sandbox: expect.objectContaining({ id: ID2, state: 'paused' }), reclaim: null },
      ],
    });
  });

  it('a refused id: the others are still paused, a per-id line and a hint on stderr, exit 125', async () => {
    const r = await dsec(['pause', ID, 'stopped1']);
    expect(r.code).toBe(125);
    expect(r.out).toBe(`${PAUSED_LINE(ID)}\n`);
    expect(r.err).toBe(
      'dsec: pause stopped1: sandbox stopped1 is stopped; only a running sandbox can be paused (FailedPrecondition)\n' +
        'hint: check the sandbox state with `dsec inspect ID`; a stopped sandbox needs `dsec start ID` first\n',
    );
    const j = await dsec(['pause', ID, 'stopped1', '--json']);
    expect(j.code).toBe(125);
    const d = doc(j);
    expect(d.results[1]).toEqual({
      id: 'stopped1', ok: false,
      error: { code: 'FailedPrecondition', message: 'sandbox stopped1 is stopped; only a running sandbox can be paused', hint: 'check the sandbox state with `dsec inspect ID`; a stopped sandbox needs `dsec start ID` first' },
    });
    expect(d.error).toEqual({ code: 'FailedPrecondition', message: 'pause failed for 1 of 2 sandboxes: stopped1', hint: expect.any(String) });
  });
});

describe('resume ID...', () => {
  it('prints each id; --json prints {results} with the sandbox', async () => {
    routes['POST /v1/sandboxes/:id/resume'] = (req, res) => json(res, 200, fakeSandbox({ id: req.params.id }));
    const r = await dsec(['resume', ID, ID2]);
    expect(r.code).toBe(0);
    expect(r.out).toBe(`${ID}\n${ID2}\n`);
    const j = await dsec(['resume', '--json', ID]);
    expect(doc(j)).toEqual({ results: [{ id: ID, ok: true, sandbox: expect.objectContaining({ id: ID, state: 'running' }) }] });
    expect(calls()).toContain(`POST /v1/sandboxes/${ID2}/resume`);
  });

  it('a missing sandbox is a per-id failure with the NotFound hint', async () => {
    routes['POST /v1/sandboxes/:id/resume'] = fail(404, 'NotFound', 'sandbox nope not found');
    const r = await dsec(['resume', 'nope']);
    expect(r.code).toBe(125);
    expect(r.out).toBe('');
    expect(r.err).toBe('dsec: resume nope: sandbox nope not found (NotFound)\nhint: list sandboxes with `dsec ls`\n');
  });
});

describe('--selector on pause, resume, stop, rm', () => {
  const ok2 = (state: string, extra: Partial<BulkResult> = {}): BulkResult[] => [
    { id: ID, ok: true, state, ...extra },
    { id: ID2, ok: true, state },
  ];

  it('pause --selector sends one bulk request and prints a reclaim line per sandbox', async () => {
    routes['POST /v1/sandboxes/bulk'] = ok({ results: ok2('paused', { reclaim: fakeReclaim() }) });
    const r = await dsec(['pause', '--selector', 'job=a,round=3']);
    expect(r.code).toBe(0);
    expect(r.out).toBe(`${PAUSED_LINE(ID)}\n${ID2} paused (already paused; nothing reclaimed)\n`);
    expect(r.err).toBe('');
    expect(calls()).toEqual(['POST /v1/sandboxes/bulk']);
    expect(seen[0].body).toEqual({ selector: 'job=a,round=3', action: 'pause' });
  });

  it('pause --selector --json prints the results as dsecd sent them', async () => {
    const results = ok2('paused', { reclaim: fakeReclaim() });
    routes['POST /v1/sandboxes/bulk'] = ok({ results });
    const r = await dsec(['--json', 'pause', '--selector', 'job=a']);
    expect(r.code).toBe(0);
    expect(doc(r)).toEqual({ results });
  });

  it('resume, stop and rm -f map to resume, stop and destroy; stop -t sends timeout_ms', async () => {
    routes['POST /v1/sandboxes/bulk'] = (req, res) => json(res, 200, { results: ok2(req.body.action === 'destroy' ? 'destroyed' : req.body.action === 'stop' ? 'stopped' : 'running') });
    for (const args of [['resume', '--selector', 'job=a'], ['stop', '--selector', 'job=a'], ['stop', '-t', '0', '--selector', 'job=a'], ['rm', '-f', '--selector', 'job=a']]) {
      const r = await dsec(args);
      expect(r.code, args.join(' ')).toBe(0);
      expect(r.out, args.join(' ')).toBe(`${ID}\n${ID2}\n`);
    }
    expect(seen.map((s) => s.body)).toEqual([
      { selector: 'job=a', action: 'resume' },
      { selector: 'job=a', action: 'stop' },
      { selector: 'job=a', action: 'stop', timeout_ms: 0 },
      { selector: 'job=a', action: 'destroy' },
    ]);
    const j = await dsec(['--json', 'rm', '-f', '--selector', 'job=a']);
    expect(doc(j)).toEqual({ results: ok2('destroyed') });
  });

  it('a bulk result with a failure: the rest print, per-id lines and a hint on stderr, exit 125', async () => {
    const results: BulkResult[] = [
      { id: ID, ok: true, state: 'paused', reclaim: fakeReclaim() },
      { id: 'bad1', ok: false, error: { code: 'FailedPrecondition', message: 'sandbox bad1 is stopped; only a running sandbox can be paused' } },
      { id: 'bad2', ok: false, error: { code: 'FailedPrecondition', message: 'sandbox bad2 is failed; only a running sandbox can be paused' } },
    ];
    routes['POST /v1/sandboxes/bulk'] = ok({ results });
    const r = await dsec(['pause', '--selector', 'job=a']);
    expect(r.code).toBe(125);
    expect(r.out).toBe(`${PAUSED_LINE(ID)}\n`);
    expect(r.err).toBe(
      'dsec: pause bad1: sandbox bad1 is stopped; only a running sandbox can be paused (FailedPrecondition)\n' +
        'dsec: pause bad2: sandbox bad2 is failed; only a running sandbox can be paused (FailedPrecondition)\n' +
        'hint: check the sandbox state with `dsec inspect ID`; a stopped sandbox needs `dsec start ID` first\n',
    );
    const j = await dsec(['pause', '--selector', 'job=a', '--json']);
    expect(j.code).toBe(125);
    const d = doc(j);
    expect(d.results[0]).toEqual(results[0]);
    expect(d.results[1]).toEqual({ id: 'bad1', ok: false, error: { ...results[1].error, hint: expect.stringMatching(/dsec inspect ID/) } });
    expect(d.error).toEqual({ code: 'FailedPrecondition', message: 'pause failed for 2 of 3 sandboxes matching job=a: bad1, bad2', hint: expect.any(String) });
    expect(j.err).toMatch(/^dsec: pause bad1: /);
  });

  it('rm --selector failures get their own hints (an Unavailable result is dsecd talking, not dsecd down)', async () => {
    routes['POST /v1/sandboxes/bulk'] = ok({
      results: [
        { id: ID, ok: true, state: 'destroyed' },
        { id: 'x1', ok: false, error: { code: 'Internal', message: 'destroy x1: umount failed' } },
        { id: 'x2', ok: false, error: { code: 'Unavailable', message: 'cannot reach its agent' } },
      ],
    });
    const r = await dsec(['rm', '-f', '--selector', 'job=a']);
    expect(r.code).toBe(125);
    expect(r.out).toBe(`${ID}\n`);
    const lines = r.err.trimEnd().split('\n');
    expect(lines.slice(0, 2)).toEqual(['dsec: rm x1: destroy x1: umount failed (Internal)', 'dsec: rm x2: cannot reach its agent (Unavailable)']);
    expect(lines[2]).toMatch(/^hint: see dsecd's log/);
    expect(lines[3]).toBe("hint: the sandbox's agent is unreachable; `dsec inspect ID` shows its state");
  });

  it('a selector that matches nothing is not a failure: a note on stderr, exit 0', async () => {
    routes['POST /v1/sandboxes/bulk'] = ok({ results: [] });
    const r = await dsec(['resume', '--selector', 'job=none']);
    expect(r.code).toBe(0);
    expect(r.out).toBe('');
    expect(r.err).toBe('dsec: no sandbox matches --selector job=none; nothing to resume\n');
    expect(doc(await dsec(['--json', 'resume', '--selector', 'job=none']))).toEqual({ results: [] });
  });

  it("dsecd refusing the bulk call itself (bad selector) is one error with the verb's help", async () => {
    routes['POST /v1/sandboxes/bulk'] = fail(400, 'InvalidArgument', 'bad selector key "x y"');
    const r = await dsec(['stop', '--selector', 'job=a']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: bad selector key "x y" (InvalidArgument)\nhint: see `dsec stop --help`\n');
  });
});

describe('ids vs --selector', () => {
  it('ids and --selector together are refused before any request, on every verb', async () => {
    for (const verb of ['pause', 'resume', 'stop', 'rm']) {
      const r = await dsec([verb, ID, '--selector', 'job=a']);
      expectUserError(r, `give sandbox ids or --selector, not both (got an id and --selector job=a)`, `e.g. \`dsec ${verb} ID...\` or \`dsec ${verb} --selector job=a,round=3\``);
    }
    expectUserError(await dsec(['rm', '-f', ID, ID2, '--selector', 'job=a']), /^dsec: give sandbox ids or --selector, not both \(got 2 ids/);
  });

  it('neither ids nor --selector is refused', async () => {
    for (const verb of ['pause', 'resume', 'stop', 'rm']) {
      expectUserError(await dsec([verb]), 'missing sandbox ids (or --selector)', new RegExp(`dsec ${verb} --selector`));
    }
  });

  it('rm --selector needs -f', async () => {
    expectUserError(
      await dsec(['rm', '--selector', 'job=a']),
      'rm --selector destroys every matching sandbox, running ones too, so it needs -f',
      '`dsec ls --selector job=a` shows what matches; then `dsec rm -f --selector job=a`',
    );
  });

  it('a malformed selector is refused locally with the syntax as hint', async () => {
    expectUserError(await dsec(['pause', '--selector', '=a']), '--selector: selector term "=a" has an empty key', /comma-separated terms/);
    expectUserError(await dsec(['stop', '--selector', ' , ']), '--selector: empty selector', /comma-separated terms/);
  });

  it('with --json the refusal is an InvalidArgument error document', async () => {
    const r = await dsec(['--json', 'pause', ID, '--selector', 'job=a']);
    expect(r.code).toBe(125);
    expect(doc(r)).toEqual({ error: { code: 'InvalidArgument', message: 'give sandbox ids or --selector, not both (got an id and --selector job=a)', hint: expect.stringMatching(/dsec pause ID/) } });
    expect(seen).toHaveLength(0);
  });
});

describe('ttl', () => {
  const young = [fakeSandbox({ created_at: Date.now() - 60_000 }), fakeSandbox({ id: ID2, created_at: Date.now() - 120_000 })];

  it('--selector S DUR checks ages, then sets ttl_s in whole seconds and prints each id', async () => {
    routes['GET /v1/sandboxes'] = ok({ sandboxes: young });
    routes['POST /v1/sandboxes/bulk'] = ok({ results: [{ id: ID, ok: true, state: 'running' }, { id: ID2, ok: true, state: 'running' }] });
    const r = await dsec(['ttl', '--selector', 'job=a', '2h']);
    expect(r.code).toBe(0);
    expect(r.out).toBe(`${ID}\n${ID2}\n`);
    expect(calls()).toEqual(['GET /v1/sandboxes', 'POST /v1/sandboxes/bulk']);
    expect(seen[0].query.get('selector')).toBe('job=a');
    expect(seen[1].body).toEqual({ selector: 'job=a', action: 'set_ttl', ttl_s: 7200 });
    const j = await dsec(['--json', 'ttl', '1h30.5s', '--selector', 'job=a']);
    expect(j.code).toBe(0);
    expect(doc(j)).toEqual({ results: [{ id: ID, ok: true, state: 'running' }, { id: ID2, ok: true, state: 'running' }] });
    expect(seen.at(-1)!.body.ttl_s).toBe(3631);
  });

  it('none removes the TTL (ttl_s null) without the age check', async () => {
    routes['POST /v1/sandboxes/bulk'] = ok({ results: [{ id: ID, ok: true, state: 'paused' }] });
    const r = await dsec(['ttl', '--selector', 'job=a', 'none']);
    expect(r.code).toBe(0);
    expect(calls()).toEqual(['POST /v1/sandboxes/bulk']);
    expect(seen[0].body).toEqual({ selector: 'job=a', action: 'set_ttl', ttl_s: null });
  });

  it('a TTL already past for some sandboxes (counted from creation) is refused unless -f', async () => {
    routes['GET /v1/sandboxes'] = ok({ sandboxes: [fakeSandbox({ created_at: Date.now() - 2 * 3_600_000 }), fakeSandbox({ id: ID2, created_at: Date.now() - 60_000 })] });
    routes['POST /v1/sandboxes/bulk'] = ok({ results: [{ id: ID, ok: true, state: 'running' }, { id: ID2, ok: true, state: 'running' }] });
    const r = await dsec(['ttl', '--selector', 'job=a', '10m']);
    expect(r.code).toBe(125);
    expect(r.out).toBe('');
    expect(r.err).toBe(
      `dsec: TTL 10m counts from creation: 1 of 2 matching sandboxes are older (${ID}) and would be destroyed at once\n` +
        "hint: give a TTL longer than the oldest one's age (2h), or pass -f to destroy them\n",
    );
    expect(calls()).toEqual(['GET /v1/sandboxes']);
    const j = await dsec(['--json', 'ttl', '--selector', 'job=a', '10m']);
    expect(doc(j).error.code).toBe('FailedPrecondition');
    const f = await dsec(['ttl', '-f', '--selector', 'job=a', '10m']);
    expect(f.code).toBe(0);
    expect(calls().at(-1)).toBe('POST /v1/sandboxes/bulk');
    expect(calls().filter((c) => c === 'GET /v1/sandboxes')).toHaveLength(2); // -f skips the check
  });

  it('ids are refused: dsecd sets TTLs by selector only', async () => {
    expectUserError(
      await dsec(['ttl', ID, ID2, '10m']),
      'dsecd sets TTLs by label selector only (there is no per-sandbox TTL call), so `dsec ttl` takes --selector, not ids',
      'e.g. `dsec ttl --selector job=a 2h` (counted from creation), or `dsec ttl --selector job=a none`',
    );
    expectUserError(await dsec(['ttl', '10m']), 'missing --selector', /dsec ttl --selector job=a 2h/);
    expectUserError(await dsec(['ttl', '--selector', 'job=a', ID, '10m']), `give one TTL with --selector, not sandbox ids (got "${ID}" "10m")`);
  });

  it('a bad TTL is refused before any request', async () => {
    expectUserError(await dsec(['ttl', '--selector', 'job=a', '600']), 'TTL "600" has no unit', 'write 600s or 600ms');
    expectUserError(await dsec(['ttl', '--selector', 'job=a', '500ms']), 'TTL must be at least 1s, got "500ms"', 'e.g. 10m');
    expectUserError(await dsec(['ttl', '--selector', 'job=a', '31d']), 'TTL "31d" is longer than 30 days');
    expectUserError(await dsec(['ttl', '--selector', 'job=a']), "missing required argument 'ttl'; see `dsec ttl --help`");
  });

  it('help shows the selector form', async () => {
    const r = await runCli(['ttl', '--help'], { socket: null });
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/Usage: dsec ttl --selector <sel> \[-f\] <dur\|none>/);
    expect(r.out).toMatch(/counted from each\s+sandbox's creation/);
  });
});

describe('job lease, renew, ls, rm', () => {
  // Expiring 10m30s from now renders as `10m` whatever the test's own delay.
  const lease = (over = {}) => fakeLease({ expires_at: Date.now() + 630_000, ...over });

  it('job lease JOB --ttl DUR creates or renews, printing the lease line; --json the lease', async () => {
    const l = lease();
    routes['POST /v1/leases'] = ok(l);
    const r = await dsec(['job', 'lease', 'a', '--ttl', '10m']);
    expect(r.code).toBe(0);
    expect(r.out).toBe('job a: lease active, expires in 10m (ttl 10m), 2 sandboxes\n');
    expect(seen[0].body).toEqual({ job: 'a', ttl_s: 600 });
    const j = await dsec(['--json', 'job', 'lease', 'a', '--ttl', '90s']);
    expect(doc(j)).toEqual(l);
    expect(seen[1].body).toEqual({ job: 'a', ttl_s: 90 });
  });

  it('job lease needs --ttl with a unit; the job name is checked by dsecd', async () => {
    expectUserError(await dsec(['job', 'lease', 'a']), "required option '--ttl <dur>' not specified; see `dsec job lease --help`");
    expectUserError(await dsec(['job', 'lease', 'a', '--ttl', '10']), '--ttl "10" has no unit', 'write 10s or 10ms');
    routes['POST /v1/leases'] = fail(400, 'InvalidArgument', 'lease request: job: job must be a label value: [A-Za-z0-9._/-]{1,63}');
    const r = await dsec(['job', 'lease', 'a b', '--ttl', '1m']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: lease request: job: job must be a label value: [A-Za-z0-9._/-]{1,63} (InvalidArgument)\nhint: see `dsec job lease --help`\n');
  });

  it('job renew JOB sends {} (keep the TTL) or {ttl_s}; prints the lease line or the lease', async () => {
    routes['POST /v1/leases/:job/renew'] = (req, res) => json(res, 200, lease({ job: req.params.job, ttl_s: req.body.ttl_s ?? 600, sandboxes: 1 }));
    const r = await dsec(['job', 'renew', 'team/rl']);
    expect(r.code).toBe(0);
    expect(r.out).toBe('job team/rl: lease active, expires in 10m (ttl 10m), 1 sandbox\n');
    expect(calls()).toEqual(['POST /v1/leases/team%2Frl/renew']);
    expect(seen[0].body).toEqual({});
    const j = await dsec(['job', 'renew', 'a', '--ttl', '1h', '--json']);
    expect(doc(j)).toEqual(expect.objectContaining({ job: 'a', ttl_s: 3600 }));
    expect(seen[1].body).toEqual({ ttl_s: 3600 });
  });

  it('a renewal refused after expiry says so, with the hint to create a new lease', async () => {
    const message = 'lease of job a expired at 2026-01-01T00:00:00.000Z; its sandboxes are being reclaimed. Delete the lease and create a new one';
    routes['POST /v1/leases/:job/renew'] = fail(412, 'FailedPrecondition', message);
    routes['POST /v1/leases'] = fail(412, 'FailedPrecondition', message);
    const r = await dsec(['job', 'renew', 'a']);
    expect(r.code).toBe(125);
    expect(r.out).toBe('');
    expect(r.err).toBe(`dsec: ${message} (FailedPrecondition)\nhint: ${EXPIRED_HINT}\n`);
    expect(r.err).not.toMatch(STACK);
    const j = await dsec(['--json', 'job', 'renew', 'a']);
    expect(j.code).toBe(125);
    expect(doc(j)).toEqual({ error: { code: 'FailedPrecondition', message, hint: EXPIRED_HINT } });
    // Create-or-renew of an expired lease is refused the same way.
    const l = await dsec(['job', 'lease', 'a', '--ttl', '10m']);
    expect(l.code).toBe(125);
    expect(l.err).toBe(`dsec: ${message} (FailedPrecondition)\nhint: ${EXPIRED_HINT}\n`);
  });

  it('renewing a job without a lease points at job lease', async () => {
    routes['POST /v1/leases/:job/renew'] = fail(404, 'NotFound', 'no lease for job zz');
    const r = await dsec(['job', 'renew', 'zz']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: no lease for job zz (NotFound)\nhint: no lease for that job: create one with `dsec job lease JOB --ttl DUR`; `dsec job ls` lists leases\n');
  });

  it('job ls prints JOB, TTL, EXPIRES IN, STATE, SANDBOXES; -q the jobs; --json {leases}', async () => {
    const now = Date.now();
    const leases = [
      lease(),
      fakeLease({ job: 'b', ttl_s: 90, expires_at: now - 185_000, lapsed_at: now - 184_000, sandboxes: 5 }),
      fakeLease({ job: 'c', ttl_s: 3600, expires_at: now - 1000, lapsed_at: null, sandboxes: 0 }),
    ];
    routes['GET /v1/leases'] = ok({ leases });
    const r = await dsec(['job', 'ls']);
    expect(r.code).toBe(0);
    const rows = r.out.trimEnd().split('\n').map((l) => l.split(/\s{2,}/));
    expect(rows).toEqual([
      ['JOB', 'TTL', 'EXPIRES IN', 'STATE', 'SANDBOXES'],
      ['a', '10m', '10m', 'active', '2'],
      ['b', '1m30s', '3m ago', 'lapsed', '5'],
      ['c', '1h', '1s ago', 'lapsed', '0'], // past expires_at: renewal refused even before dsecd's sweep
    ]);
    expect((await dsec(['job', 'ls', '-q'])).out).toBe('a\nb\nc\n');
    expect(doc(await dsec(['job', 'ls', '--json']))).toEqual({ leases });
    routes['GET /v1/leases'] = ok({ leases: [] });
    expect((await dsec(['job', 'ls'])).out).toBe('JOB  TTL  EXPIRES IN  STATE  SANDBOXES\n');
  });

  it('job rm JOB... deletes each lease, reports per job, exits 125 if any failed', async () => {
    routes['DELETE /v1/leases/:job'] = (req, res) =>
      req.params.job === 'gone' ? json(res, 404, { error: { code: 'NotFound', message: 'no lease for job gone' } }) : json(res, 200, lease({ job: req.params.job }));
    const r = await dsec(['job', 'rm', 'a']);
    expect(r.code).toBe(0);
    expect(r.out).toBe('a\n');
    const f = await dsec(['job', 'rm', 'a', 'gone']);
    expect(f.code).toBe(125);
    expect(f.out).toBe('a\n');
    expect(f.err).toBe('dsec: job rm gone: no lease for job gone (NotFound)\nhint: list leases with `dsec job ls`\n');
    const j = await dsec(['--json', 'job', 'rm', 'a', 'gone']);
    expect(j.code).toBe(125);
    const d = doc(j);
    expect(d.results).toEqual([
      { job: 'a', ok: true, lease: expect.objectContaining({ job: 'a' }) },
      { job: 'gone', ok: false, error: { code: 'NotFound', message: 'no lease for job gone', hint: 'list leases with `dsec job ls`' } },
    ]);
    expect(d.error.message).toBe('job rm failed for 1 of 2 leases: gone');
    expect(calls()[0]).toBe('DELETE /v1/leases/a');
  });

  it('`dsec job` alone names its subcommands', async () => {
    expectUserError(await dsec(['job']), 'missing command (one of: lease, renew, ls, rm); see `dsec job --help`');
  });
});

describe('create and run: --priority, --idle-timeout', () => {
  it('create sends priority and idle_timeout_s (whole seconds, rounded up)', async () => {
    routes['POST /v1/sandboxes'] = ok(fakeSandbox({ priority: 'batch', idle_timeout_s: 300 }), 201);
    const r = await dsec(['create', '--priority', 'batch', '--idle-timeout', '4m59.5s']);
    expect(r.code).toBe(0);
    expect(r.out).toBe(`${ID}\n`);
    expect(seen[0].body).toEqual({ priority: 'batch', idle_timeout_s: 300 });
    const j = await dsec(['--json', 'create', '--priority', 'latency']);
    expect(doc(j)).toEqual(expect.objectContaining({ id: ID, priority: 'batch', idle_timeout_s: 300 }));
    expect(seen[1].body).toEqual({ priority: 'latency' });
  });

  it('create sends a seccomp override from --seccomp-allow/--seccomp-deny and refuses bad names', async () => {
    routes['POST /v1/sandboxes'] = ok(fakeSandbox(), 201);
    const r = await dsec(['create', '--seccomp-allow', 'ptrace', '--seccomp-allow', 'io_uring_setup', '--seccomp-deny', 'getpid']);
    expect(r.code).toBe(0);
    expect(seen[0].body).toEqual({ seccomp: { allow: ['ptrace', 'io_uring_setup'], deny: ['getpid'] } });
  });

  it('create sends the filesystem flags; unset flags leave the fields to the image and config', async () => {
    routes['POST /v1/sandboxes'] = ok(fakeSandbox(), 201);
    expect((await dsec(['create', '--writable', '/work', '--writable', '/usr/local', '--readonly', '/usr', '--readonly', '/lib*', '--no-landlock'])).code).toBe(0);
    expect(seen[0].body).toEqual({ filesystem: { writable_paths: ['/work', '/usr/local'], readonly_paths: ['/usr', '/lib*'], landlock: false } });
    expect((await dsec(['create', '--no-readonly', '--landlock'])).code).toBe(0);
    expect(seen[1].body).toEqual({ filesystem: { readonly_paths: [], landlock: true } });
    expect((await dsec(['create'])).code).toBe(0);
    expect(seen[2].body).toEqual({});
  });

  it('a relative --writable path is refused before any request', async () => {
    expectUserError(await dsec(['create', '--writable', 'work']), /--writable: "work" is not an absolute path/, /\/work/);
  });

  it('a file operation refused on a read-only path gets a hint on where filesystem options are set (dsecd names the option)', async () => {
    routes['GET /v1/sandboxes/:id/files/stat'] = fail(404, 'NotFound', 'stat /work/f: No such file or directory');
    routes['PUT /v1/sandboxes/:id/files'] = fail(412, 'FailedPrecondition', `mkdir /work: Read-only file system: the path is read-only in sandbox ${ID}`, 'readonly_path');
    const r = await dsec(['cp', '/etc/hostname', `${ID}:/work/f`]);
    expect(r.code).not.toBe(0);
    expect(r.err).toMatch(/Read-only file system/);
    expect(r.err).toMatch(/^hint: filesystem options are fixed when a sandbox is made: .*`dsec restore SNAPSHOT --writable DIR`/m);
    expect(r.err).not.toMatch(/--no-readonly/);
  });

  it('a bad syscall name is refused before any request', async () => {
    expectUserError(await dsec(['create', '--seccomp-allow', 'Ptrace!']), /"Ptrace!" is not a syscall name/, /lowercase/);
  });

  it('run sends them too', async () => {
    routes['POST /v1/sandboxes'] = ok(fakeSandbox(), 201);
    routes['POST /v1/sandboxes/:id/exec'] = ok({ exit_code: 0, signal: null, stdout_b64: '', stderr_b64: '', stdout_truncated: false, stderr_truncated: false, duration_ms: 1, oom: false, timed_out: false });
    routes['DELETE /v1/sandboxes/:id'] = ok(fakeSandbox({ state: 'destroyed' }));
    serveStreamedExec(fake);
    const r = await dsec(['run', '--priority', 'batch', '--idle-timeout', '1h', '--', 'true']);
    expect(r.code).toBe(0);
    expect(seen[0].body).toEqual({ priority: 'batch', idle_timeout_s: 3600 });
    const j = await dsec(['--json', 'run', '--priority', 'batch', '--', 'true']);
    expect(doc(j)).toEqual(expect.objectContaining({ exit_code: 0, sandbox_id: ID }));
  });

  it('a bad priority or idle timeout is refused before any request', async () => {
    expectUserError(await dsec(['create', '--priority', 'high']), '--priority: unknown priority "high"', /latency \(the default\) or batch/);
    expectUserError(await dsec(['run', '--priority', 'high', '--', 'true']), /unknown priority "high"/);
    expectUserError(await dsec(['create', '--idle-timeout', '30']), '--idle-timeout "30" has no unit', 'write 30s or 30ms');
    expectUserError(await dsec(['create', '--idle-timeout', '0']), '--idle-timeout must be at least 1s, got "0"', 'e.g. --idle-timeout 10m');
    const j = await dsec(['--json', 'create', '--priority', 'high']);
    expect(doc(j).error.code).toBe('InvalidArgument');
  });

  it('help lists both flags', async () => {
    const r = await runCli(['create', '--help'], { socket: null });
    expect(r.out).toMatch(/--priority <class>/);
    expect(r.out).toMatch(/--idle-timeout <dur>/);
  });
});

describe('ls --wide', () => {
  it('adds PRIORITY after STATE; the default table is unchanged', async () => {
    routes['GET /v1/sandboxes'] = ok({ sandboxes: [fakeSandbox(), fakeSandbox({ id: ID2, state: 'paused', priority: 'batch', labels: {} })] });
    const plain = (await dsec(['ls'])).out.trimEnd().split('\n').map((l) => l.split(/\s+/));
    expect(plain[0]).toEqual(['ID', 'STATE', 'IMAGE', 'CPUS', 'MEMORY', 'AGE', 'LABELS']);
    expect(plain[1]).toEqual([ID, 'running', 'busybox:latest', '0.5', '512MiB', '3m', 'job=a,round=3']);
    const wide = (await dsec(['ls', '--wide'])).out.trimEnd().split('\n').map((l) => l.split(/\s+/));
    expect(wide[0]).toEqual(['ID', 'STATE', 'PRIORITY', 'IMAGE', 'CPUS', 'MEMORY', 'AGE', 'LABELS']);
    expect(wide[1]).toEqual([ID, 'running', 'latency', 'busybox:latest', '0.5', '512MiB', '3m', 'job=a,round=3']);
    expect(wide[2]).toEqual([ID2, 'paused', 'batch', 'busybox:latest', '0.5', '512MiB', '3m', '-']);
    expect((await dsec(['ls', '-w', '-q'])).out).toBe(`${ID}\n${ID2}\n`);
    const j = doc(await dsec(['ls', '--wide', '--json']));
    expect(j.sandboxes[1].priority).toBe('batch');
  });

  it('a sandbox from a dsecd without priorities shows -', async () => {
    const old = fakeSandbox() as Partial<ReturnType<typeof fakeSandbox>>;
    delete old.priority;
    routes['GET /v1/sandboxes'] = ok({ sandboxes: [old] });
    expect((await dsec(['ls', '--wide'])).out.trimEnd().split('\n')[1].split(/\s+/)[2]).toBe('-');
  });
});

describe('help', () => {
  it('dsec --help lists the new verbs', async () => {
    const r = await runCli(['--help'], { socket: null });
    for (const verb of ['pause', 'resume', 'ttl', 'job']) expect(r.out).toMatch(new RegExp(`^  ${verb} `, 'm'));
    const p = await runCli(['pause', '--help'], { socket: null });
    expect(p.out).toMatch(/Usage: dsec pause \[options\] \[id\.\.\.\]/);
    expect(p.out).toMatch(/--selector <sel>/);
  });
});
