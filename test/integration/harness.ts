/**
 * Integration-test harness: a real dsecd (bin/dsecd, compiled dist/) on a private root,
 * socket, instance name and uid pool, plus leak accounting across every place a
 * sandbox leaves traces (mountinfo, every cgroup hierarchy, runtime state, sandbox
 * dirs, store rows).
 *
 * Each test daemon leases a uid-pool slot of its own at start (test/fixtures/slots.ts,
 * shared with the benchmarks' daemons), so parallel files get disjoint uid pools and
 * builder ranges (dsecd refuses overlapping ranges of live instances). The `slot` a test
 * passes is only a label in its temp root's name.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import http from 'node:http';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import Database from 'better-sqlite3';
import { expect } from 'vitest';
import { DsecClient, isDsecApiError, type DsecApiError } from '../../sdk/client.js';
import { detectCgroups, type CgroupManager } from '../../daemon/host/cgroups/index.js';
import { instanceNameFor } from '../../daemon/config.js';
import { detectRuntime, OciRuntime, runtimeStateDir } from '../../daemon/drivers/container/runtime.js';
import { builderRangeForSlot, leaseSlot, releaseSlot, uidPoolForSlot } from '../fixtures/slots.js';

export { SLOTS, builderRangeForSlot, leaseSlot, releaseSlot, uidPoolForSlot } from '../fixtures/slots.js';
import { kernelRelease } from '../../daemon/drivers/vmm/kmod.js';

/** Repository root. */
export const REPO = path.resolve(new URL('../..', import.meta.url).pathname);
/** True when running as root (integration tests need it). */
export const IS_ROOT = process.getuid?.() === 0;

/** Options of {@link TestDaemon.start}. */
export interface StartOptions {
  /** A label for the temp root's name; the uid pool comes from a leased slot. */
  slot: number;
  /** Use this daemon's uid pool instead of leasing one (to test that dsecd refuses overlapping pools). */
  samePoolAs?: TestDaemon;
  /** Extra environment (e.g. DSEC_FAILPOINT). */
  env?: Record<string, string>;
  /** Extra TOML appended to the config. */
  config?: string;
  /**
   * `[uid_pool] range_size` (ids per sandbox); default dsecd's 65,536, which gives a slot's
   * pool 256 ranges. Tests that hold more sandboxes at once ask for smaller ranges
   * (16,384: 1,024 sandboxes).
   */
  uidRangeSize?: number;
  /** Extra dsecd flags (e.g. `--etcd URL --host-name h1`), kept for restarts. */
  args?: string[];
  /** Run dsecd inside this named network namespace (`nsenter --net=/run/netns/<netns>`: the host's mount namespace stays). */
  netns?: string;
  /**
   * Serve the TCP door too: dsecd gets `--listen 127.0.0.1:PORT` on a free port
   * ({@link TestDaemon.remotePort}); `true`, or extra dsecd flags (e.g. `--tls-ca`).
   */
  listen?: boolean | { args: string[] };
}

import { freePort } from '../fixtures/ports.js';
export { freePort };

/** What a sandbox left on the host, per place. Empty lists everywhere = no leak. */
export interface HostTraces {
  mounts: string[];
  cgroups: string[];
  runtime: string[];
  dirs: string[];
  rows: string[];
  uidRanges: number;
  /** Entries of the writable-layer store (`<root>/storage/mnt/sb/<id>`: btrfs subvolumes, XFS project dirs). */
  store: string[];
}

/**
 * Guest kernel directory the microvm/vm tests boot, from the environment variable
 * `DSEC_TEST_GUEST_DIR` (a DEST of scripts/guest-kernel.sh: it holds `vmlinuz` and
 * `modules`), e.g. `DSEC_TEST_GUEST_DIR=/usr/local/lib/dsec/guest-6.12` to run the tier's
 * tests on another kernel without switching the host's default; null (dsecd's
 * defaults) when unset.
 */
export const TEST_GUEST_DIR: string | null = process.env.DSEC_TEST_GUEST_DIR || null;
/** The guest kernel directory the tests boot: {@link TEST_GUEST_DIR}, else dsecd's default (config.ts DEFAULT_GUEST_KERNEL's directory). */
export const GUEST_DIR = TEST_GUEST_DIR ?? '/usr/local/lib/dsec/guest';
/** The guest kernel (bzImage) the tests boot: `<GUEST_DIR>/vmlinuz`. */
export const GUEST_KERNEL = path.join(GUEST_DIR, 'vmlinuz');

/**
 * The build configuration of the guest kernel the tests boot (`CONFIG_X=y` lines), read
 * from its unpacked package (`<package>/boot/config-<release>` beside
 * `<package>/lib/modules/<release>`, which `<GUEST_DIR>/modules` points at); '' when absent.
 */
export function guestKernelConfig(): string {
  try {
    const mods = realpathSync(path.join(GUEST_DIR, 'modules'));
    const pkg = path.resolve(mods, '../../..');
    return readFileSync(path.join(pkg, 'boot', `config-${path.basename(mods)}`), 'utf8');
  } catch {
    return '';
  }
}

/** The release string of {@link GUEST_KERNEL} (what `uname -r` prints in its guests, e.g. `6.12.118+deb12-amd64`), from its bzImage header. */
export function guestKernelRelease(): string {
  const rel = kernelRelease(readFileSync(GUEST_KERNEL));
  if (!rel) throw new Error(`${GUEST_KERNEL} is not a bzImage with a version string`);
  return rel;
}

/**
 * `extra` (a test's TOML) with `kernel` and `modules` of {@link TEST_GUEST_DIR} put into
 * its `[vm]` table (one is appended when it has none); unchanged when the variable is
 * unset or the test names its own `kernel` (e.g. the missing-kernel test).
 */
export function withGuestKernel(extra: string, dir: string | null = TEST_GUEST_DIR): string {
  if (!dir || /^\s*kernel\s*=/m.test(extra)) return extra;
  const keys = `kernel = ${JSON.stringify(path.join(dir, 'vmlinuz'))}\nmodules = ${JSON.stringify(path.join(dir, 'modules'))}\n`;
  return /^\[vm\]\s*$/m.test(extra) ? extra.replace(/^\[vm\]\s*$\n?/m, `[vm]\n${keys}`) : `${extra}\n[vm]\n${keys}`;
}

/** A dsecd process under test. */
export class TestDaemon {
  proc: ChildProcess | null = null;
  stderr = '';
  readonly client: DsecClient;
  readonly instance: string;
  private exitPromise: Promise<{ code: number | null; signal: string | null }> | null = null;
  /** Whether cleanup() releases the slot (false when the pool is borrowed, see StartOptions.samePoolAs). */
  private ownsSlot = true;
  private cg: CgroupManager | null = null;
  /** Extra dsecd flags of every launch (StartOptions.args). */
  args: string[] = [];
  /** Network namespace dsecd runs in (StartOptions.netns), or null for the caller's. */
  netns: string | null = null;
  /** The TCP door's port on 127.0.0.1, when started with `listen`. */
  remotePort: number | null = null;
  /** Extra dsecd flags of every launch (the TCP door's). */
  private extraArgs: string[] = [];

  private constructor(readonly root: string, readonly slot: number, private baseConfig: string, private readonly pool: { base: number; size: number; rangeSize?: number }) {
    this.instance = instanceNameFor(root);
    this.client = new DsecClient({ socketPath: this.socket, timeoutMs: 120_000 });
  }

  /** API socket path. */
  get socket(): string {
    return path.join(this.root, 'dsecd.sock');
  }

  /** Starts a fresh daemon on a new temp root. */
  static async start(opts: StartOptions): Promise<TestDaemon> {
    const root = mkdtempSync(`/tmp/dsec-it${opts.slot}-`);
    const slot = opts.samePoolAs ? opts.samePoolAs.slot : leaseSlot();
    const pool = { ...uidPoolForSlot(slot), ...(opts.uidRangeSize ? { rangeSize: opts.uidRangeSize } : {}) };
    const d = new TestDaemon(root, slot, '', pool);
    d.setConfig(opts.config ?? '');
    d.args = opts.args ?? [];
    d.netns = opts.netns ?? null;
    d.ownsSlot = !opts.samePoolAs;
    if (opts.listen) {
      d.remotePort = await freePort();
      d.extraArgs = ['--listen', `127.0.0.1:${d.remotePort}`, ...(typeof opts.listen === 'object' ? opts.listen.args : [])];
    }
    try {
      await d.launch(opts.env);
    } catch (e) {
      await d.cleanup();
      throw e;
    }
    return d;
  }

  /**
   * Replaces the extra TOML (StartOptions.config) for the next {@link launch} or
   * {@link restart}; the uid pool and the slot's builder range stay (an `[builder]` table
   * in `extra` replaces the latter).
   */
  setConfig(extra: string): void {
    const b = this.builderRange;
    const builder = /^\[builder\]/m.test(extra) ? '' : `[builder]\nbase = ${b.base}\nsize = ${b.size}\n`;
    const rs = this.pool.rangeSize ? `range_size = ${this.pool.rangeSize}\n` : '';
    this.baseConfig = `[uid_pool]\nbase = ${this.pool.base}\nsize = ${this.pool.size}\n${rs}${builder}${withGuestKernel(extra)}\n`;
  }

  /** The builder range of this daemon's slot ({@link builderRangeForSlot}); a `[builder]` table in its config overrides it. */
  get builderRange(): { base: number; size: number } {
    return builderRangeForSlot(this.slot);
  }

  /** The writable-layer store's mount point and image (daemon/storage/writable-layers.ts). */
  get storeMount(): string {
    return path.join(this.root, 'storage', 'mnt');
  }

  /**
   * Host path of a sandbox's writable layer (its overlay upper dir): its store entry, else
   * the host-filesystem layout `<root>/sandboxes/<id>/upper`.
   */
  upperDir(id: string): string {
    const inStore = path.join(this.storeMount, 'sb', id, 'upper');
    return existsSync(inStore) ? inStore : path.join(this.root, 'sandboxes', id, 'upper');
  }

  /** The TCP door's URL (`https://127.0.0.1:PORT`). @throws Error when started without `listen`. */
  get remoteUrl(): string {
    if (this.remotePort === null) throw new Error('this daemon was started without listen');
    return `https://127.0.0.1:${this.remotePort}`;
  }

  /** The CA certificate dsecd made for its TCP door (`<root>/tls/ca.crt`). */
  get caFile(): string {
    return path.join(this.root, 'tls', 'ca.crt');
  }

  /** Starts dsecd on this root and waits until the API answers. */
  async launch(env: Record<string, string> = {}): Promise<void> {
    writeFileSync(path.join(this.root, 'dsecd.toml'), this.baseConfig);
    this.stderr = '';
    const argv = [path.join(REPO, 'bin/dsecd'), '--root', this.root, '--socket', this.socket, '--config', path.join(this.root, 'dsecd.toml'), ...this.extraArgs, ...this.args];
    // nsenter joins only the network namespace and then execs dsecd (same pid).
    const cmd = this.netns ? ['nsenter', `--net=/run/netns/${this.netns}`, ...argv] : argv;
    const proc = spawn(cmd[0], cmd.slice(1), {
      env: { ...process.env, DSEC_LOG_LEVEL: process.env.DSEC_LOG_LEVEL ?? 'warn', ...env },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    this.proc = proc;
    proc.stderr!.on('data', (b: Buffer) => {
      this.stderr += b.toString();
      if (process.env.DSEC_TEST_VERBOSE) process.stderr.write(b);
    });
    this.exitPromise = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
    const deadline = Date.now() + 60_000;
    let exited = false;
    void this.exitPromise.then(() => { exited = true; });
    while (Date.now() < deadline) {
      if (exited) throw new Error(`dsecd exited during start:\n${this.stderr}`);
      try {
        await this.client.version();
        // The TCP door listens after the socket: wait for it too.
        if (this.remotePort !== null) await tcpAccepts(this.remotePort);
        return;
      } catch {
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    throw new Error(`dsecd did not answer within 60 s:\n${this.stderr}`);
  }

  /** Pid of the running daemon. */
  get pid(): number {
    return this.proc!.pid!;
  }

  /** Resolves when the daemon process exits. */
  waitExit(): Promise<{ code: number | null; signal: string | null }> {
    return this.exitPromise!;
  }

  /** SIGKILLs the daemon (sandboxes stay). */
  async kill9(): Promise<void> {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill('SIGKILL');
      await this.waitExit();
    }
  }

  /** SIGTERMs the daemon and waits (sandboxes stay). */
  async stop(): Promise<void> {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill('SIGTERM');
      await this.waitExit();
    }
  }

  /** Stops (if running) and starts again on the same root. */
  async restart(env: Record<string, string> = {}): Promise<void> {
    await this.stop();
    await this.launch(env);
  }

  /** The cgroup manager for this instance (reads only, plus cleanup). */
  async cgroups(): Promise<CgroupManager> {
    this.cg ??= await detectCgroups({ instance: this.instance });
    return this.cg;
  }

  /**
   * The OCI runtimes whose state dir this instance has (<root>/runtime/<name>), each as
   * dsecd invokes it for containers it holds (RuntimeSet: crun through its launcher on a
   * cgroup v1 host).
   */
  async runtimes(): Promise<OciRuntime[]> {
    const out: OciRuntime[] = [];
    for (const name of ['runc', 'crun'] as const) {
      const dir = runtimeStateDir(this.root, name);
      if (!existsSync(dir)) continue;
      out.push(new OciRuntime(await detectRuntime({ name, path: null }, (await this.cgroups()).version, { existing: true }), dir));
    }
    return out;
  }

  /** Every trace of sandboxes on the host, excluding the shared layer mounts. */
  async traces(): Promise<HostTraces> {
    const mi = readFileSync('/proc/self/mountinfo', 'utf8').split('\n');
    const sbPrefix = path.join(this.root, 'sandboxes') + '/';
    const mounts = mi.map((l) => l.split(' ')[4]).filter((m) => m && m.startsWith(sbPrefix));
    const cg = await this.cgroups();
    const cgroups = await cg.list();
    const runtime = (await Promise.all((await this.runtimes()).map((rt) => rt.list()))).flat().map((c) => c.id);
    const sbDir = path.join(this.root, 'sandboxes');
    const dirs = existsSync(sbDir) ? readdirSync(sbDir) : [];
    const entries = path.join(this.storeMount, 'sb');
    const store = existsSync(entries) ? readdirSync(entries).sort() : [];
    const db = new Database(path.join(this.root, 'dsec.db'), { readonly: true, fileMustExist: true });
    try {
      const rows = (db.prepare('SELECT id FROM sandboxes').all() as { id: string }[]).map((x) => x.id);
      const uidRanges = (db.prepare('SELECT COUNT(*) n FROM uid_ranges').get() as { n: number }).n;
      return { mounts, cgroups: cgroups.sort(), runtime: runtime.sort(), dirs: dirs.sort(), rows: rows.sort(), uidRanges, store };
    } finally {
      db.close();
    }
  }

  /** This daemon's uid pool (host ids `base .. base + size - 1`). */
  get uidPool(): { base: number; size: number } {
    return { base: this.pool.base, size: this.pool.size };
  }

  /** Layer (EROFS blob) mounts of this instance. */
  layerMounts(): string[] {
    const prefix = path.join(this.root, 'layers') + '/';
    return readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')[4]).filter((m) => m && m.startsWith(prefix));
  }

  /**
   * Removes the instance network namespace and stops its slirp4netns (by the recorded
   * pid, checked against its starttime), as `dsecd --purge` would. Safe to call twice.
   */
  async removeNetwork(): Promise<void> {
    try {
      const rec = JSON.parse(readFileSync(path.join(this.root, 'net', 'slirp4netns.pid'), 'utf8')) as { pid: number; start: number };
      if (aliveAt(rec.pid, rec.start)) process.kill(rec.pid, 'SIGKILL');
    } catch { /* none recorded */ }
    await execa('ip', ['netns', 'del', netnsOf(this)], { reject: false });
  }

  /**
   * Stops the daemon and removes everything it or its sandboxes left: runtime
   * containers, mounts (the writable-layer store's too: its loop device has autoclear,
   * so it detaches once the lazily unmounted filesystem is released), cgroups, the
   * instance netns, the root. Safe to call twice.
   */
  async cleanup(): Promise<void> {
    await this.stop().catch(() => {});
    for (const rt of await this.runtimes().catch(() => [])) {
      for (const c of await rt.list()) await rt.deleteForce(c.id).catch(() => {});
    }
    const cg = await this.cgroups().catch(() => null);
    if (cg) {
      for (const id of await cg.list()) {
        await cg.killAll(id).catch(() => {});
        await cg.remove(id).catch(() => {});
      }
      await cg.removeInstance().catch(() => {});
    }
    await this.removeNetwork();
    const mi = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')[4]).filter((m) => m && m.startsWith(this.root + '/'));
    for (const m of mi.sort((a, b) => b.length - a.length)) await execa('umount', ['-l', m], { reject: false });
    rmSync(this.root, { recursive: true, force: true });
    if (this.ownsSlot) releaseSlot(this.slot);
  }
}

/** Resolves when 127.0.0.1:`port` accepts a TCP connection; rejects when it refuses. */
function tcpAccepts(port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    import('node:net').then((net) => {
      const c = net.connect(port, '127.0.0.1');
      c.once('connect', () => { c.destroy(); resolve(); });
      c.once('error', reject);
    }, reject);
  });
}

/** Name of the instance network namespace (daemon/net/instance.ts). */
export function netnsOf(d: TestDaemon): string {
  return `dsec-${d.instance}`;
}

/** Whether a pid is alive with the given /proc starttime. */
function aliveAt(pid: number, start: number): boolean {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return f[0] !== 'Z' && Number(f[19]) === start;
  } catch {
    return false;
  }
}

/**
 * What sandbox networking of an instance leaves while dsecd is stopped, for leak checks:
 * the instance netns, its recorded slirp4netns when alive, the bridge ports in it.
 */
export async function networkTraces(d: TestDaemon): Promise<{ netns: boolean; slirp: number | null; veths: string[] }> {
  const netns = (await execa('ip', ['netns', 'list'], { reject: false })).stdout.split('\n').some((l) => l.split(' ')[0] === netnsOf(d));
  let slirp: number | null = null;
  try {
    const rec = JSON.parse(readFileSync(path.join(d.root, 'net', 'slirp4netns.pid'), 'utf8')) as { pid: number; start: number };
    if (aliveAt(rec.pid, rec.start)) slirp = rec.pid;
  } catch { /* none */ }
  const veths = netns ? (JSON.parse(String((await execa('ip', ['-n', netnsOf(d), '-j', 'link', 'show', 'master', 'dsec0'], { reject: false })).stdout) || '[]') as { ifname: string }[]).map((l) => l.ifname) : [];
  return { netns, slirp, veths };
}

/**
 * RSS growth a test allows dsecd during a 1 GiB copy: a quarter of the file. What
 * dsecd's buffers hold of a transfer is bounded by design and asserted exactly (the
 * `dsec_file_transfer_buffered_bytes*` metrics, daemon/api/transfer.ts); RSS also holds
 * garbage the JavaScript heap has not collected yet (V8 collects once external Buffer
 * memory has grown by its soft limit, 64 MiB, since the last collection, and allocation
 * goes on while it runs: 67.9 MiB was seen), so RSS is only a sanity check: a copy that
 * buffered the file would grow by the file's size.
 */
export const RSS_SLACK_BYTES = 256 * 2 ** 20;

/**
 * The value of the series `name` (no labels) in dsecd's Prometheus metrics (GET /metrics
 * on its socket). Rejects when dsecd does not export it.
 */
export function metricValue(d: TestDaemon, name: string): Promise<number> {
  return new Promise((resolve, reject) => {
    http.get({ socketPath: d.socket, path: '/metrics' }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      res.on('end', () => {
        const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
        if (m) resolve(Number(m[1]));
        else reject(new Error(`dsecd exports no metric ${name}`));
      });
      res.on('error', reject);
    }).on('error', reject);
  });
}

/** Runs `bin/dsec` with args against a daemon; resolves with exit code and output (never throws). */
export async function runCli(d: TestDaemon, args: string[], input?: string): Promise<{ code: number; stdout: string; stderr: string }> {
  const r = await execa(process.execPath, [path.join(REPO, 'bin/dsec'), '--socket', d.socket, ...args], { reject: false, input, stripFinalNewline: false });
  return { code: r.exitCode ?? -1, stdout: String(r.stdout), stderr: String(r.stderr) };
}

/** Decodes an exec result's stdout. */
export function out(r: { stdout_b64: string }): string {
  return Buffer.from(r.stdout_b64, 'base64').toString();
}

/** Decodes an exec result's stderr. */
export function err(r: { stderr_b64: string }): string {
  return Buffer.from(r.stderr_b64, 'base64').toString();
}

/**
 * POSTs `body` to `path` through the SDK's raw request path (no HTTP deadline), so a test
 * sees the wire format itself (e.g. `stdout_b64`). Rejects with a DsecApiError.
 */
export function postJson<T>(d: TestDaemon, path: string, body: unknown): Promise<T> {
  return (d.client as unknown as { request<R>(m: string, p: string, b?: unknown, o?: unknown): Promise<R> }).request<T>('POST', path, body, { timeoutMs: 0 });
}

/** Awaits a promise that must reject with a DsecApiError, and returns that error. */
export async function rejection(p: Promise<unknown>): Promise<DsecApiError> {
  const e = await p.then(() => null, (x: unknown) => x);
  expect(isDsecApiError(e)).toBe(true);
  return e as DsecApiError;
}

/**
 * Loop devices attached to a file under `prefix` (/sys/block/loop*\/loop/backing_file),
 * as `/dev/loopN backing-file` lines: what a test run must not leave behind.
 */
export function loopDevicesUnder(prefix: string): string[] {
  const out: string[] = [];
  for (const dev of readdirSync('/sys/block').filter((n) => /^loop\d+$/.test(n))) {
    let f: string;
    try {
      f = readFileSync(`/sys/block/${dev}/loop/backing_file`, 'utf8').trim();
    } catch {
      continue;
    }
    if (f.startsWith(prefix)) out.push(`/dev/${dev} ${f}`);
  }
  return out.sort();
}

/**
 * {@link loopDevicesUnder} once it is empty, or what is left after `limitMs` (a hang
 * bound, not a timing check): a loop device with autoclear detaches when the filesystem
 * on it is finally released, which the kernel finishes after the unmount returns (dirty
 * data written back to the backing file first, slower on a loaded host).
 */
export async function loopDevicesReleased(prefix: string, limitMs = 60_000): Promise<string[]> {
  const end = Date.now() + limitMs;
  let left = loopDevicesUnder(prefix);
  while (left.length > 0 && Date.now() < end) {
    await new Promise((r) => setTimeout(r, 100));
    left = loopDevicesUnder(prefix);
  }
  return left;
}

/** True while `pid` exists and is not a zombie (a reparented process may wait for its reaper: PID 1 here reaps late). */
export function alive(pid: number): boolean {
  try {
    const st = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return !/^[ZX]$/.test(st.slice(st.lastIndexOf(')') + 2).split(' ')[0]);
  } catch {
    return false;
  }
}

/** Pids of live (not zombie) processes, other than this one, whose command line contains `needle` (e.g. a QEMU of a test root). */
export function procsMentioning(needle: string): number[] {
  const out: number[] = [];
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p) || Number(p) === process.pid || !alive(Number(p))) continue;
    try {
      if (readFileSync(`/proc/${p}/cmdline`, 'utf8').includes(needle)) out.push(Number(p));
    } catch { /* gone */ }
  }
  return out;
}
