// Progress of creates: dsecd's phase reports (daemon/sandbox/progress.ts, from the create
// failpoints), the SDK's streamed create, and the CLI's spinner text; off a terminal the
// CLI asks for no stream and prints nothing on stderr. The spinner on a real terminal is
// tested in test/integration/cli-pty.test.ts.
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { formatSpinnerLine, startSpinner } from '../../cli/ui/progress.js';
import { describeCreate } from '../../cli/util/long.js';
import { Failpoints } from '../../daemon/sandbox/failpoints.js';
import { createObserver, type CreateProgress } from '../../daemon/sandbox/progress.js';
import { DsecClient } from '../../sdk/client.js';
import type { CreateProgress as SdkProgress } from '../../sdk/index.js';
import { Sink, fakeSandbox, json, ndjson, runCli, startFakeDsecd, type FakeDsecd } from '../fixtures/fake-dsecd.js';

const ID = '0123456789abcdef';

describe('create phases (dsecd)', () => {
  it('each phase once, in order, from the create failpoints every driver marks; worded per backend', () => {
    const got: CreateProgress[] = [];
    const fp = new Failpoints(undefined).observed(createObserver(ID, 'vm', false, (p) => got.push(p)));
    for (const step of ['create.after-intent', 'create.after-layers', 'create.after-rootfs', 'create.after-bundle', 'create.after-runtime', 'create.after-agent', 'create.after-ack'] as const) fp.hit(step);
    fp.hit('create.after-rootfs'); // out of order: nothing new
    expect(got).toEqual([
      { phase: 'rootfs', id: ID, message: 'preparing the disks' },
      { phase: 'launch', id: ID, message: 'starting QEMU' },
      { phase: 'boot', id: ID, message: 'booting the guest (waiting for its agent)' },
      { phase: 'ready', id: ID, message: 'running' },
    ]);
    const c: CreateProgress[] = [];
    const cfp = new Failpoints(undefined).observed(createObserver(ID, 'container', false, (p) => c.push(p)));
    cfp.hit('create.after-runtime');
    expect(c).toEqual([{ phase: 'boot', id: ID, message: 'waiting for the agent' }]);
    const r: CreateProgress[] = [];
    new Failpoints(undefined).observed(createObserver(ID, 'vm', true, (p) => r.push(p))).hit('create.after-runtime');
    expect(r[0].message).toBe('loading the machine state');
  });
});

describe('streamed create (SDK) and the CLI off a terminal', () => {
  let fake: FakeDsecd;
  beforeEach(async () => {
    fake = await startFakeDsecd();
  });
  afterEach(async () => {
    await fake.close();
  });

  it('createSandbox with onProgress streams: the reports in order, then the sandbox; an error line rejects', async () => {
    fake.routes['POST /v1/sandboxes'] = ndjson([
      { type: 'progress', phase: 'rootfs', id: ID, message: 'preparing the disks' },
      { type: 'progress', phase: 'boot', id: ID, message: 'booting the guest (waiting for its agent)' },
      { type: 'result', result: fakeSandbox({ id: ID }) },
    ]);
    const client = new DsecClient({ socketPath: fake.socketPath });
    const got: SdkProgress[] = [];
    const sb = await client.createSandbox({ backend: 'microvm' }, { onProgress: (p) => got.push(p) });
    expect(sb.id).toBe(ID);
    expect(got.map((p) => p.phase)).toEqual(['rootfs', 'boot']);
    expect(fake.seen[0].headers.accept).toBe('application/x-ndjson');
    fake.routes['POST /v1/sandboxes'] = ndjson([{ type: 'progress', phase: 'rootfs', id: ID, message: 'x' }, { type: 'error', error: { code: 'DeadlineExceeded', message: 'the microVM did not boot' } }]);
    await expect(client.createSandbox({}, { onProgress: () => {} })).rejects.toMatchObject({ code: 'DeadlineExceeded' });
    client.close();
  });

  it('dsec create off a terminal: one plain call, nothing on stderr, the id on stdout', async () => {
    fake.routes['POST /v1/sandboxes'] = (_req, res) => json(res, 201, fakeSandbox({ id: ID }));
    const r = await runCli(['create', '--backend', 'microvm'], { socket: fake.socketPath });
    expect(r).toMatchObject({ code: 0, out: `${ID}\n`, err: '' });
    expect(fake.seen[0].headers.accept).not.toMatch(/ndjson/);
    // TERM=dumb on a terminal: no spinner either.
    const dumb = await runCli(['create'], { socket: fake.socketPath, stderrTTY: true, env: { TERM: 'dumb' } });
    expect(dumb).toMatchObject({ code: 0, err: '' });
    expect(fake.seen[1].headers.accept).not.toMatch(/ndjson/);
  });
});

describe('spinner text', () => {
  it('one sandbox: its short id and phase; a group: how many are running and where the rest are', () => {
    const p = (id: string, phase: string, message = phase): SdkProgress => ({ id, phase, message });
    expect(describeCreate(new Map([[ID, p(ID, 'boot', 'booting the guest')]]), 1)).toBe('0123456789ab: booting the guest');
    expect(describeCreate(new Map(), 1)).toBe('');
    const group = new Map([['a', p('a', 'ready')], ['b', p('b', 'boot')], ['c', p('c', 'boot')], ['d', p('d', 'rootfs')]]);
    expect(describeCreate(group, 8)).toBe('1/8 running, 2 booting, 1 preparing, 4 waiting');
  });

  it('frame, label, phase and seconds with a decimal, cut to the width', () => {
    expect(formatSpinnerLine(2, 'creating a vm sandbox', 'booting', 4230)).toBe('⠹ creating a vm sandbox: booting 4.2s');
    expect(formatSpinnerLine(0, 'restoring base', undefined, 0)).toBe('⠋ restoring base 0.0s');
    const cut = formatSpinnerLine(0, 'x'.repeat(100), 'y', 1000, 40);
    expect([...cut].length).toBeLessThanOrEqual(40);
    expect(cut).toMatch(/… 1\.0s$/);
    // dsecd's text cannot drive the terminal.
    expect(formatSpinnerLine(0, 'l', 'a\x1b[2Jb', 0)).toBe('⠋ l: a [2Jb 0.0s');
  });

  it('draws nothing before its delay, erases what it drew when done', async () => {
    const out = new Sink(true, 80);
    let now = 0;
    const quick = startSpinner(out, { label: 'x', delayMs: 10_000, now: () => now });
    quick.done();
    expect(out.text).toBe('');
    const slow = startSpinner(out, { label: 'creating', delayMs: 0, now: () => now });
    slow.update('booting');
    for (let i = 0; i < 200 && !out.text.includes('booting'); i++) await new Promise((r) => setTimeout(r, 5));
    now = 1500;
    slow.done();
    expect(out.text).toMatch(/^\r\x1b\[2K⠋ creating: booting 0\.0s/);
    expect(out.text.endsWith('\r\x1b[2K')).toBe(true);
  });
});
