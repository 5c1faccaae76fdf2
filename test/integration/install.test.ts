/**
 * scripts/install-release.sh installs a release that does not depend on the checkout it
 * was built in: dsecd started from the installed location, in a mount namespace where
 * the checkout is hidden under an empty tmpfs, finds its profiles, agent, addon, seccomp
 * monitor, builder tools and BPF objects, and serves sandboxes; re-installing while it
 * runs (an upgrade) switches `current` without disturbing it, keeps an edited config and
 * removes releases nothing uses. The install goes into a temporary prefix: this host's
 * /usr/local and /etc are never touched.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync, chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, realpathSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import { DsecClient } from '../../sdk/client.js';
import { IS_ROOT, REPO, out } from './harness.js';
import { builderTomlForSlot, leaseSlot, releaseSlot, uidPoolForSlot } from '../fixtures/slots.js';

/** A PATH without the checkout's node_modules/.bin (vitest puts it first). */
const PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** Runs scripts/install-release.sh into the temporary prefix; resolves with its stderr (progress lines). */
async function install(tmp: string): Promise<string> {
  const r = await execa('bash', [path.join(REPO, 'scripts/install-release.sh'), '--prefix', path.join(tmp, 'usr'), '--sysconfdir', path.join(tmp, 'etc'), '--unitdir', path.join(tmp, 'systemd')], { env: { PATH }, reject: false });
  expect(r.exitCode, String(r.stderr)).toBe(0);
  return String(r.stderr);
}

/**
 * argv that runs `cmd` in a mount namespace of its own in which the checkout is an empty
 * tmpfs, with / as its working directory.
 */
function withoutCheckout(cmd: string[]): string[] {
  return ['unshare', '--mount', '--propagation', 'private', '--', 'sh', '-c', 'mount -t tmpfs -o size=64k,mode=0700 dsec-hidden "$1" && shift && cd / && exec "$@"', 'sh', REPO, ...cmd];
}

/** Every symlink under `dir`, recursively. */
function symlinksUnder(dir: string): string[] {
  const outp: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isSymbolicLink()) outp.push(p);
    else if (e.isDirectory()) outp.push(...symlinksUnder(p));
  }
  return outp;
}

describe.skipIf(!IS_ROOT)('install: the installed host does not need the checkout', () => {
  let tmp = '';
  let root = '';
  let slot = -1;
  let dsecd: ChildProcess | null = null;
  let stderr = '';
  let client: DsecClient;
  let release = '';

  const prefix = () => path.join(tmp, 'usr');
  const daemonArgs = () => ['--root', root, '--socket', path.join(root, 'dsecd.sock'), '--config', path.join(root, 'dsecd.toml')];

  beforeAll(async () => {
    tmp = mkdtempSync('/tmp/dsec-install-');
    // The builder identity (an unprivileged uid) runs the release's worker: the prefix must be traversable, as /usr/local is.
    chmodSync(tmp, 0o755);
    await install(tmp);
    release = realpathSync(path.join(prefix(), 'lib/dsec/current'));
    slot = leaseSlot();
    root = path.join(tmp, 'root');
    mkdirSync(root, { mode: 0o711 });
    const pool = uidPoolForSlot(slot);
    writeFileSync(path.join(root, 'dsecd.toml'), `[uid_pool]\nbase = ${pool.base}\nsize = ${pool.size}\n${builderTomlForSlot(slot)}`);
  }, 600_000);

  afterAll(async () => {
    client?.close();
    if (dsecd && dsecd.exitCode === null && dsecd.signalCode === null) {
      dsecd.kill('SIGTERM');
      await new Promise((r) => dsecd!.once('exit', r));
    }
    if (root && existsSync(path.join(prefix(), 'bin/dsecd'))) {
      // --purge from the installed release too: destroys what is left, stops the seccomp monitor, unmounts.
      const purge = withoutCheckout([path.join(prefix(), 'bin/dsecd'), ...daemonArgs(), '--purge']);
      await execa(purge[0], purge.slice(1), { env: { PATH, DSEC_LOG_LEVEL: 'warn' }, reject: false });
    }
    if (root) {
      const mi = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')[4]).filter((m) => m && m.startsWith(root + '/'));
      for (const m of mi.sort((a, b) => b.length - a.length)) await execa('umount', ['-l', m], { reject: false });
    }
    if (tmp) rmSync(tmp, { recursive: true, force: true });
    if (slot >= 0) releaseSlot(slot);
  });

  it('installs one self-contained release: bin links through current, nothing links out of it, no dev dependencies', async () => {
    expect(path.dirname(release)).toBe(path.join(prefix(), 'lib/dsec/releases'));
    expect(path.basename(release)).toMatch(/^\d+\.\d+\.\d+-[0-9a-f]{12}$/);
    for (const b of ['dsec', 'dsecd']) {
      expect(readlinkSync(path.join(prefix(), 'bin', b))).toBe(`../lib/dsec/current/bin/${b}`);
      expect(realpathSync(path.join(prefix(), 'bin', b))).toBe(path.join(release, 'bin', b));
    }
    for (const f of ['native/agent/dsec-agent', 'native/addon/build/Release/dsec_native.node', 'native/seccomp-monitor/dsec-seccomp-monitor',
      'native/seccomp-monitor/syscalls.json', 'native/vmm/dsec-vmm-launch', 'native/oci-exec/dsec-oci-exec', 'native/builder/dsec-builder', 'native/builder/libdsec-mkfs.so',
      'native/bpf/build/egress.bpf.o', 'daemon/security/profiles/seccomp-default.json', 'daemon/security/profiles/apparmor.template',
      'dist/daemon/main.js', 'dist/daemon/image/builder-worker.js', 'dist/cli/main.js', 'node_modules/better-sqlite3/package.json']) {
      expect(existsSync(path.join(release, f)), f).toBe(true);
    }
    for (const dev of ['vitest', 'typescript', 'vite', 'node-pty']) expect(existsSync(path.join(release, 'node_modules', dev)), dev).toBe(false);
    for (const l of symlinksUnder(release)) expect(realpathSync(l).startsWith(release + '/'), `${l} -> ${realpathSync(l)}`).toBe(true);
    // Everything readable by others (the builder identity), writable by root only.
    expect(statSync(path.join(release, 'dist/daemon/image/builder-worker.js')).mode & 0o7777).toBe(0o644);
    expect(statSync(path.join(release, 'native/agent/dsec-agent')).mode & 0o7777).toBe(0o755);
    // User-editable configuration and the unit, which starts the installed dsecd.
    expect(existsSync(path.join(tmp, 'etc/dsec/network-policies'))).toBe(true);
    expect(readFileSync(path.join(tmp, 'etc/dsec/dsecd.toml'), 'utf8')).toBe(readFileSync(path.join(REPO, 'etc/dsecd.toml'), 'utf8'));
    const unit = readFileSync(path.join(tmp, 'systemd/dsecd.service'), 'utf8');
    expect(unit).toMatch(new RegExp(`^ExecStart=${path.join(prefix(), 'bin/dsecd')} `, 'm'));
    const v = await execa('systemd-analyze', ['verify', path.join(tmp, 'systemd/dsecd.service')], { reject: false });
    expect(String(v.stderr).split('\n').filter((l) => l.includes('dsecd.service')), String(v.stderr)).toEqual([]);
  });

  it('dsecd runs from the installed release with the checkout hidden, and an upgrade while it runs leaves it working', async () => {
    const argv = withoutCheckout([path.join(prefix(), 'bin/dsecd'), ...daemonArgs()]);
    dsecd = spawn(argv[0], argv.slice(1), { env: { PATH, DSEC_LOG_LEVEL: 'warn' }, stdio: ['ignore', 'ignore', 'pipe'] });
    dsecd.stderr!.on('data', (b: Buffer) => { stderr += b.toString(); });
    client = new DsecClient({ socketPath: path.join(root, 'dsecd.sock'), timeoutMs: 120_000 });
    for (let i = 0; ; i++) {
      try {
        await client.version();
        break;
      } catch {
        if (dsecd.exitCode !== null || i > 1200) throw new Error(`installed dsecd did not start:\n${stderr}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    // The profile, the addon, SQLite's addon and the monitor all come from the release.
    const info = (await client.hostInfo()) as unknown as { defences: Record<string, { enforced: boolean; detail: string }> };
    expect(info.defences.seccomp.detail).toContain(path.join(release, 'daemon/security/profiles/seccomp-default.json'));
    expect(info.defences.seccomp_denial_counting.enforced).toBe(true);
    // unshare and sh exec in turn, so the spawned pid is dsecd's.
    expect(readFileSync(`/proc/${dsecd.pid}/cmdline`, 'utf8')).toContain(path.join(prefix(), 'bin/dsecd'));
    const maps = readFileSync(`/proc/${dsecd.pid}/maps`, 'utf8');
    expect(maps).toContain(path.join(release, 'native/addon/build/Release/dsec_native.node'));
    expect(maps).toContain(path.join(release, 'node_modules/better-sqlite3'));
    expect(maps).not.toContain(REPO + '/');
    const monitor = Number(readFileSync(path.join(root, 'seccomp/monitor.pid'), 'utf8').trim());
    expect(readlinkSync(`/proc/${monitor}/exe`)).toBe(path.join(release, 'native/seccomp-monitor/dsec-seccomp-monitor'));
    // crun is the runtime, started through the release's launcher (without it auto falls back to runc).
    expect((await client.hostInfo()).runtime.name).toBe('crun');

    // A sandbox (the agent), one with networking (the BPF objects) and an import (the builder tools and worker).
    const sb = await client.createSandbox({ image: 'busybox' });
    expect(out(await client.exec(sb.id, { argv: ['sh', '-c', 'echo installed'] }))).toBe('installed\n');
    const netSb = await client.createSandbox({ image: 'busybox', network: { mode: 'open' } });
    expect((await client.exec(netSb.id, { argv: ['true'] })).exit_code).toBe(0);
    const tree = path.join(tmp, 'tree');
    mkdirSync(path.join(tree, 'opt'), { recursive: true });
    writeFileSync(path.join(tree, 'opt/marker'), 'from the builder\n');
    await client.importImage({ type: 'dir', path: tree, image: 'installed:1', base: 'busybox' });
    const imported = await client.createSandbox({ image: 'installed:1' });
    expect(out(await client.exec(imported.id, { argv: ['cat', '/opt/marker'] }))).toBe('from the builder\n');

    // Upgrade while it runs: an edited config is kept, the previous release stays, unused ones go.
    const releases = path.join(prefix(), 'lib/dsec/releases');
    mkdirSync(path.join(releases, '0.0.1-000000000001'));
    mkdirSync(path.join(releases, '0.0.1-000000000002'));
    const current = path.join(prefix(), 'lib/dsec/current');
    rmSync(current);
    symlinkSync('releases/0.0.1-000000000001', current);
    appendFileSync(path.join(tmp, 'etc/dsec/dsecd.toml'), 'log_level = "info"  # edited\n');
    const log = await install(tmp);
    expect(log).toMatch(/is installed already/);
    expect(realpathSync(current)).toBe(release);
    expect(readdirSync(releases).filter((r) => !r.startsWith('.')).sort()).toEqual(['0.0.1-000000000001', path.basename(release)].sort());
    expect(readFileSync(path.join(tmp, 'etc/dsec/dsecd.toml'), 'utf8')).toContain('# edited');
    expect(readFileSync(path.join(tmp, 'etc/dsec/dsecd.toml.dist'), 'utf8')).toBe(readFileSync(path.join(REPO, 'etc/dsecd.toml'), 'utf8'));
    expect(dsecd.exitCode).toBe(null);
    expect(out(await client.exec(sb.id, { argv: ['sh', '-c', 'echo still'] }))).toBe('still\n');
    const after = await client.createSandbox({ image: 'busybox' });
    expect((await client.exec(after.id, { argv: ['true'] })).exit_code).toBe(0);
    for (const id of [sb.id, netSb.id, imported.id, after.id]) await client.deleteSandbox(id, { force: true });
  });
});
