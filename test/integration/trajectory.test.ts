/**
 * The trajectory log across client death and dsecd restarts: recorded steps replay
 * without running (a counter file the commands increment proves it), a changed
 * command is refused, a step cut off by a dsecd crash is `outcome_unknown`, and the
 * log follows a rollout into a restored sandbox.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import path from 'node:path';
import { execa } from 'execa';
import { IS_ROOT, REPO, TestDaemon, runCli, rejection } from './harness.js';

/** The command of step k: increments /root/counter (the top level is read-only) and prints the step and the new count. */
const stepArgv = (k: number) => ['sh', '-c', `n=$(cat /root/counter 2>/dev/null || echo 0); n=$((n+1)); echo $n > /root/counter; echo step${k} n=$n`];

describe.skipIf(!IS_ROOT)('trajectory log', () => {
  let d: TestDaemon;
  let sb: string;
  const T = 'rollout-7.a:b@c';
  const counter = async (id = sb) => (await d.client.exec(id, { argv: ['cat', '/root/counter'] })).stdout.toString().trim();

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 25 });
    sb = (await d.client.createSandbox({ image: 'busybox' })).id;
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('steps 1-5 run from a client that is then killed; after a dsecd restart they replay without running', async () => {
    // The client is a separate process, SIGKILLed once its five steps are recorded.
    const script = `
      import { DsecClient } from ${JSON.stringify(path.join(REPO, 'dist/sdk/client.js'))};
      const c = new DsecClient({ socketPath: ${JSON.stringify(d.socket)} });
      for (let k = 1; k <= 5; k++) {
        const r = await c.exec(${JSON.stringify(sb)}, { argv: ${JSON.stringify(stepArgv(0))}.map((a) => a.replace('step0', 'step' + k)), trajectory: ${JSON.stringify(T)}, step: k });
        process.stdout.write(r.stdout.toString() + (r.replayed ? 'REPLAYED\\n' : ''));
      }
      process.stdout.write('done\\n');
      setInterval(() => {}, 1000);
    `;
    const child = execa(process.execPath, ['--input-type=module', '-e', script], { reject: false });
    let seen = '';
    await new Promise<void>((resolve, reject) => {
      child.stdout!.on('data', (b: Buffer) => {
        seen += b.toString();
        if (seen.includes('done\n')) resolve();
      });
      void child.then((r) => reject(new Error(`client exited early: ${r.stderr}`)));
    });
    child.kill('SIGKILL');
    await child;
    expect(seen).toBe([1, 2, 3, 4, 5].map((k) => `step${k} n=${k}\n`).join('') + 'done\n');

    await d.kill9();
    await d.launch();
    expect((await d.client.getSandbox(sb)).state).toBe('running');
    for (let k = 1; k <= 5; k++) {
      const r = await d.client.exec(sb, { argv: stepArgv(k), trajectory: T, step: k });
      expect(r.replayed).toBe(true);
      expect(r.stdout.toString()).toBe(`step${k} n=${k}\n`);
      expect(r.exit_code).toBe(0);
    }
    expect(await counter()).toBe('5');
  });

  it('step 6 executes; a different command at step 3 is Conflict step_mismatch naming the step', async () => {
    const r6 = await d.client.exec(sb, { argv: stepArgv(6), trajectory: T, step: 6 });
    expect(r6.replayed).toBe(false);
    expect(r6.stdout.toString()).toBe('step6 n=6\n');
    expect(await counter()).toBe('6');
    const e = await rejection(d.client.exec(sb, { argv: ['sh', '-c', 'echo other'], trajectory: T, step: 3 }));
    expect(e.code).toBe('Conflict');
    expect(e.reason).toBe('step_mismatch');
    expect(e.message).toMatch(/step 3 of trajectory/);
    // Same argv with a different env is a different request too.
    const e2 = await rejection(d.client.exec(sb, { argv: stepArgv(3), env: { X: '1' }, trajectory: T, step: 3 }));
    expect(e2.reason).toBe('step_mismatch');
    expect(await counter()).toBe('6');
  });

  it('a dsecd crash during step 7 makes it outcome_unknown; truncate runs it again', async () => {
    await d.restart({ DSEC_FAILPOINT: 'trajectory.before-record' });
    await expect(d.client.exec(sb, { argv: stepArgv(7), trajectory: T, step: 7 })).rejects.toBeDefined();
    expect((await d.waitExit()).signal).toBe('SIGKILL');
    await d.launch();
    expect(await counter()).toBe('7'); // the command did run before the crash
    const e = await rejection(d.client.exec(sb, { argv: stepArgv(7), trajectory: T, step: 7 }));
    expect(e.code).toBe('Conflict');
    expect(e.reason).toBe('outcome_unknown');
    expect(e.message).toMatch(/step 7/);
    expect(await counter()).toBe('7'); // refused, not run twice
    const detail = await d.client.getTrajectory(T);
    expect(detail.step_list.map((s) => [s.step, s.state])).toEqual([[1, 'finished'], [2, 'finished'], [3, 'finished'], [4, 'finished'], [5, 'finished'], [6, 'finished'], [7, 'unknown']]);
    expect(detail.unknown).toBe(1);
    const r = await d.client.exec(sb, { argv: stepArgv(7), trajectory: T, step: 7, truncate: true });
    expect(r.replayed).toBe(false);
    expect(r.stdout.toString()).toBe('step7 n=8\n');
    expect((await d.client.getTrajectory(T)).truncations).toBe(1);
  });

  it('truncating from a step discards it and every later one', async () => {
    const r = await d.client.exec(sb, { argv: ['sh', '-c', 'echo new6'], trajectory: T, step: 6, truncate: true });
    expect(r.stdout.toString()).toBe('new6\n');
    const steps = (await d.client.getTrajectory(T)).step_list.map((s) => s.step);
    expect(steps).toEqual([1, 2, 3, 4, 5, 6]);
    expect((await d.client.exec(sb, { argv: ['sh', '-c', 'echo new6'], trajectory: T, step: 6 })).replayed).toBe(true);
    expect(await counter()).toBe('8');
  });

  it('the log is keyed by trajectory, not sandbox: a restored sandbox replays the recorded steps', async () => {
    const snap = await d.client.snapshot(sb);
    const moved = await d.client.restore(snap.id);
    expect(await counter(moved.id)).toBe('8');
    const r = await d.client.exec(moved.id, { argv: stepArgv(2), trajectory: T, step: 2 });
    expect(r.replayed).toBe(true);
    expect(r.stdout.toString()).toBe('step2 n=2\n');
    const r7 = await d.client.exec(moved.id, { argv: ['sh', '-c', 'echo moved'], trajectory: T, step: 7 });
    expect(r7.replayed).toBe(false);
    expect((await d.client.getTrajectory(T)).sandbox_id).toBe(moved.id);
    await d.client.deleteSandbox(moved.id, { force: true });
    await d.client.deleteSnapshot(snap.id);
  });

  it('a stopped sandbox still answers replays, and refuses a new step without recording it', async () => {
    const other = (await d.client.createSandbox({ image: 'busybox' })).id;
    await d.client.exec(other, { argv: ['true'], trajectory: 'stopped-t', step: 0 });
    await d.client.stopSandbox(other, { timeoutMs: 0 });
    expect((await d.client.exec(other, { argv: ['true'], trajectory: 'stopped-t', step: 0 })).replayed).toBe(true);
    const e = await rejection(d.client.exec(other, { argv: ['true'], trajectory: 'stopped-t', step: 1 }));
    expect(e.code).toBe('FailedPrecondition');
    expect((await d.client.getTrajectory('stopped-t')).step_list.map((s) => s.step)).toEqual([0]);
    await d.client.deleteSandbox(other, { force: true });
  });

  it('export gives one JSONL record per step with its output; the CLI shows and exports it', async () => {
    const recs = [];
    for await (const r of d.client.exportTrajectory(T)) recs.push(r);
    expect(recs.map((r) => r.step)).toEqual([1, 2, 3, 4, 5, 6, 7]);
    expect(Buffer.from(recs[0].stdout_b64!, 'base64').toString()).toBe('step1 n=1\n');
    expect(recs[0].trajectory).toBe(T);
    expect(recs[0].hash).toMatch(/^[0-9a-f]{64}$/);
    expect(recs[1].replays).toBeGreaterThanOrEqual(2);
    const cli = await runCli(d, ['traj', 'export', T]);
    expect(cli.code).toBe(0);
    const lines = cli.stdout.trim().split('\n').map((l) => JSON.parse(l));
    expect(lines.map((l) => l.step)).toEqual([1, 2, 3, 4, 5, 6, 7]);
    const show = await runCli(d, ['traj', 'show', T]);
    expect(show.code).toBe(0);
    expect(show.stdout).toMatch(/step6 n=6|new6|echo new6/);
  });

  it('refuses bad input: negative steps, bad ids, a step without a trajectory, out-of-order steps, a removed trajectory', async () => {
    for (const bad of [{ trajectory: T, step: -1 }, { trajectory: 'bad id!', step: 1 }, { trajectory: '', step: 1 }, { trajectory: 'x'.repeat(129), step: 1 }, { step: 1 }, { trajectory: T }, { trajectory: T, step: 1.5 }]) {
      const e = await rejection(d.client.exec(sb, { argv: ['true'], ...bad }));
      expect(e.code).toBe('InvalidArgument');
    }
    await d.client.exec(sb, { argv: ['true'], trajectory: 'gappy', step: 5 });
    const oo = await rejection(d.client.exec(sb, { argv: ['true'], trajectory: 'gappy', step: 2 }));
    expect(oo.code).toBe('Conflict');
    expect(oo.reason).toBe('out_of_order');
    const before = await counter();
    const rm = await runCli(d, ['traj', 'rm', T]);
    expect(rm.code).toBe(0);
    // A rollout that expects replays of a removed log is refused, never re-run.
    const gone = await rejection(d.client.exec(sb, { argv: stepArgv(1), trajectory: T, step: 1 }));
    expect(gone.code).toBe('FailedPrecondition');
    expect(gone.reason).toBe('trajectory_removed');
    expect(await counter()).toBe(before);
    expect((await d.client.listTrajectories()).map((t) => t.id)).not.toContain(T);
    await expect(d.client.getTrajectory(T)).rejects.toMatchObject({ code: 'NotFound' });
  });
});
