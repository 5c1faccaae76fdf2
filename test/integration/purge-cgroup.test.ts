/**
 * `dsecd --purge` run from another cgroup than the dsecd that made the sandboxes (an ssh
 * session's while the service ran under systemd; a job runner that gives every command a
 * memory cgroup of its own): it joins the cgroups recorded in `<root>/cgroup-parents.json`
 * and removes everything there, where it used to refuse and leave the sandboxes' cgroups
 * behind. A plain start from that cgroup is still refused while sandboxes exist.
 *
 * The other cgroup is made by the test under its own memory cgroup (beside the instance
 * parent dsecd made there) and removed at the end.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, mkdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import { IS_ROOT, REPO, TestDaemon, alive } from './harness.js';

describe.skipIf(!IS_ROOT)('dsecd --purge from another cgroup', () => {
  let d: TestDaemon;
  let other = '';
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 61 });
  });
  afterAll(async () => {
    await d?.cleanup();
    if (other && existsSync(other)) rmdirSync(other);
  });

  /** Runs bin/dsecd with `args` after moving its shell into the cgroup `dir`. */
  function dsecdIn(dir: string, args: string[]) {
    const argv = [path.join(REPO, 'bin/dsecd'), '--root', d.root, '--socket', d.socket, '--config', path.join(d.root, 'dsecd.toml'), ...args];
    return execa('sh', ['-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', dir, ...argv], { reject: false });
  }

  it('is refused as a start, and as a purge joins the recorded cgroups and leaves no cgroup, process or mount', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    const pid = (await d.client.exec(sb.id, { argv: ['sh', '-c', 'sleep 600 >/dev/null 2>&1 & echo $!'] })).stdout.toString().trim();
    const cg = await d.cgroups();
    const key = cg.version === 2 ? 'unified' : 'memory';
    const recorded = JSON.parse(readFileSync(path.join(d.root, 'cgroup-parents.json'), 'utf8')) as Record<string, string>;
    expect(recorded[key]).toBe(cg.parents[key]);
    const sandboxDirs = Object.values(cg.sandboxPaths(sb.id));
    expect(sandboxDirs.every((p) => existsSync(p))).toBe(true);
    const hostPids = readFileSync(path.join(cg.sandboxPaths(sb.id)[key], 'cgroup.procs'), 'utf8').trim().split('\n').map(Number);
    expect(hostPids.length).toBeGreaterThanOrEqual(3); // the agent, its helper, the sleep
    expect(pid).toMatch(/^\d+$/);
    await d.stop();

    // A memory cgroup beside the instance parent, below this test's own.
    other = path.join(path.dirname(recorded[key]), `dsec-purge-other-${process.pid}`);
    mkdirSync(other);

    const start = await dsecdIn(other, []);
    expect(start.exitCode).not.toBe(0);
    expect(start.stderr).toContain('dsecd was started from another cgroup');
    expect(start.stderr).toContain('1 sandbox(es)');

    const purge = await dsecdIn(other, ['--purge']);
    expect(purge.exitCode, purge.stderr).toBe(0);
    expect(purge.stderr).toContain('--purge was run from another cgroup than this instance\'s dsecd: it joined the cgroups dsecd ran in');
    expect(Object.values(recorded).filter((p) => existsSync(p))).toEqual([]);
    expect(sandboxDirs.filter((p) => existsSync(p))).toEqual([]);
    expect(hostPids.filter(alive)).toEqual([]);
    expect(readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.split(' ')[4]?.startsWith(path.join(d.root, 'sandboxes') + '/'))).toEqual([]);
    // The purge moved itself out: the other cgroup is empty and can go.
    expect(readFileSync(path.join(other, 'cgroup.procs'), 'utf8').trim()).toBe('');
    rmdirSync(other);
  });

  // The record cut short, missing, or naming a path that is no cgroup (an edited file):
  // the purge finds the instance's cgroups by their name, writes nowhere else, and
  // leaves the record as it found it.
  const records: Array<[string, (recorded: Record<string, string>, root: string) => string | null]> = [
    ['is cut short', (r) => JSON.stringify(r, null, 1).slice(0, 40)],
    ['is missing', () => null],
    ['names a directory outside cgroupfs', (r, root) => JSON.stringify({ ...r, memory: path.join(root, 'fake', path.basename(r.memory)) })],
  ];
  for (const [what, make] of records) {
    it(`finds the sandboxes when cgroup-parents.json ${what}`, async () => {
      await d.launch();
      const sb = await d.client.createSandbox({ image: 'busybox' });
      const cg = await d.cgroups();
      const dirs = Object.values(cg.sandboxPaths(sb.id));
      expect(dirs.every((p) => existsSync(p))).toBe(true);
      await d.stop();
      const file = path.join(d.root, 'cgroup-parents.json');
      const recorded = JSON.parse(readFileSync(file, 'utf8')) as Record<string, string>;
      const text = make(recorded, d.root);
      if (text === null) rmSync(file);
      else {
        mkdirSync(path.join(d.root, 'fake'), { recursive: true });
        writeFileSync(file, text);
      }
      other = path.join(path.dirname(recorded[cg.version === 2 ? 'unified' : 'memory']), `dsec-purge-other-${process.pid}`);
      mkdirSync(other);
      const purge = await dsecdIn(other, ['--purge']);
      expect(purge.exitCode, purge.stderr).toBe(0);
      expect(dirs.filter((p) => existsSync(p))).toEqual([]);
      expect(Object.values(recorded).filter((p) => existsSync(p))).toEqual([]);
      expect(existsSync(path.join(d.root, 'fake', 'cgroup.procs'))).toBe(false);
      expect(text === null ? existsSync(file) : readFileSync(file, 'utf8')).toBe(text === null ? false : text);
      rmdirSync(other);
    });
  }
});
