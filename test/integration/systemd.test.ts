/** systemd/dsecd.service is valid and keeps sandboxes alive across daemon restarts. */
import { describe, expect, it } from 'vitest';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { tmpdir } from 'node:os';
import { execa } from 'execa';
import { REPO } from './harness.js';

const unit = readFileSync(path.join(REPO, 'systemd/dsecd.service'), 'utf8');

describe('systemd unit', () => {
  it('delegates the cgroup subtree, kills only dsecd on stop, restarts on failure', () => {
    expect(unit).toMatch(/^Delegate=yes$/m);
    expect(unit).toMatch(/^KillMode=process$/m);
    expect(unit).toMatch(/^Restart=on-failure$/m);
  });
  it('passes systemd-analyze verify', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'dsec-unit-'));
    try {
      const f = path.join(dir, 'dsecd.service');
      writeFileSync(f, unit.replace('/usr/local/bin/dsecd', path.join(REPO, 'bin/dsecd')));
      const r = await execa('systemd-analyze', ['verify', f], { reject: false });
      const problems = String(r.stderr).split('\n').filter((l) => l.includes('dsecd.service'));
      expect(problems, String(r.stderr)).toEqual([]);
      expect(r.exitCode, String(r.stderr)).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
