/**
 * The Python client's rollout example (sdk/python/examples/rollouts.py) through a gateway
 * (issue 20) instead of one dsecd: a fleet of two hosts and one gateway on this machine
 * (test/fixtures/fleet.ts); the example is configured only by DSEC_HOST, DSEC_TOKEN and
 * DSEC_CA (the gateway's URL, an admin token, the fleet CA). Killed midway and run again,
 * its recorded steps replay and every rollout's counter ends at the step count.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import path from 'node:path';
import { existsSync } from 'node:fs';
import { execa } from 'execa';
import { IS_ROOT, REPO } from './harness.js';
import { TestFleet } from '../fixtures/fleet.js';

const PYTHON = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

describe.skipIf(!IS_ROOT)('the Python client through a gateway', () => {
  const f = TestFleet.create({ hosts: ['h1', 'h2'], gateways: 1 });
  beforeAll(() => f.up(), 300_000);
  afterAll(() => f.stop(), 180_000);

  it('runs the rollout example: killed midway, run again, the recorded steps replay', async () => {
    const env: Record<string, string> = {};
    for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !k.startsWith('DSEC_')) env[k] = v;
    Object.assign(env, { PYTHONDONTWRITEBYTECODE: '1', DSEC_HOST: `https://127.0.0.1:${f.gateways[0].port}`, DSEC_TOKEN: f.tokens.admin, DSEC_CA: f.caFile });
    const r = await execa(PYTHON, ['-m', 'unittest', 'discover', '-s', 'tests', '-t', 'tests', '-p', 'test_example.py', '-v'], {
      cwd: path.join(REPO, 'sdk', 'python'), env, extendEnv: false, reject: false, all: true,
    });
    expect(r.exitCode, String(r.all)).toBe(0);
    expect(String(r.all)).toMatch(/test_killed_midway_then_resumed_replays_and_never_reruns_a_step .* \.\.\. ok/);
  }, 30 * 60_000);
});
