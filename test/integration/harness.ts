/**
 * Integration-test harness: a real dsecd (bin/dsecd, compiled dist/) on a private root,
 * socket, instance name and uid pool, plus leak accounting across every place a
 * sandbox leaves traces (mountinfo, every cgroup hierarchy, runtime state, sandbox
 * dirs, store rows).
 *
 * Each test file takes a distinct `slot` (0..39) so parallel files get disjoint uid
 * pools and builder ranges (dsecd refuses overlapping ranges of live instances).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import Database from 'better-sqlite3';
import { expect } from 'vitest';
import { DsecClient, isDsecApiError, type DsecApiError } from '../../sdk/client.js';
import { detectCgroups, type CgroupManager } from '../../daemon/host/cgroups/index.js';
import { instanceNameFor } from '../../daemon/config.js';

/** Repository root. */
export const REPO = path.resolve(new URL('../..', import.meta.url).pathname);
/** True when running as root (integration tests need it). */
export const IS_ROOT = process.getuid?.() === 0;

/**
 * `DSEC_TEST_SLOT_OFFSET` (0, 30, 60 or 90; default 0) shifts every slot, so up to four
 * checkouts of this repository can run their integration tests on one host at once.
 */
const SLOT_OFFSET = Number(process.env.DSEC_TEST_SLOT_OFFSET ?? 0);

/**
 * Index of an extension slot (30..39 of any checkout) in the extension grid (0..39):
 * ten per checkout, keyed by `DSEC_TEST_SLOT_OFFSET / 30`.
 */
function extensionIndex(slot: number): number {
  const checkout = SLOT_OFFSET / 30;
  if (!Number.isInteger(checkout) || checkout < 0 || checkout > 3) throw new Error(`DSEC_TEST_SLOT_OFFSET ${SLOT_OFFSET} is not 0, 30, 60 or 90: slots 30-39 need one of those`);
  return checkout * 10 + (slot - 30);
}

/**
 * Uid pool of a test slot: 16 Mi ids (256 ranges of 65,536), away from the default pool
 * (2^31 .. 2^31+2^30). Slots 0-29 (after the offset: 0-63) lie above 3 GiB, or (64-119)
 * above 1 GiB. Slots 30-39 are an extension grid of ten more slots per checkout below
 * 1 GiB: pools at 2^24 * (1 + i) for extension index i in 0..39, i.e. [16 Mi, 656 Mi).
 */
export function uidPoolForSlot(slot: number): { base: number; size: number } {
  if (slot < 0 || slot > 39) throw new Error(`slot ${slot} out of range`);
  if (slot >= 30) return { base: 2 ** 24 * (1 + extensionIndex(slot)), size: 2 ** 24 };
  const s = slot + SLOT_OFFSET;
  if (!Number.isInteger(s) || s < 0 || s > 119) throw new Error(`DSEC_TEST_SLOT_OFFSET ${SLOT_OFFSET} puts slot ${slot} out of range`);
  return { base: s < 64 ? 3 * 2 ** 30 + s * 2 ** 24 : 2 ** 30 + (s - 64) * 2 ** 24, size: 2 ** 24 };
}

/**
 * Builder range (daemon/host/builder.ts) of a test slot: 1 Mi ids (16 builder slots).
 * Slots 0-29 pack theirs into the gap between the slots' uid pools (which end at
 * 2^30 + 56 * 2^24) and the default builder range (which starts at 2^31 - 2^20);
 * extension slots 30-39 right above the extension pools ([656 Mi, 696 Mi)). So no
 * builder range overlaps a test pool, another slot's builder range, the default pool or
 * the default builder range (test/unit/builder.test.ts checks every pair).
 */
export function builderRangeForSlot(slot: number): { base: number; size: number } {
  if (slot < 0 || slot > 39) throw new Error(`slot ${slot} out of range`);
  if (slot >= 30) return { base: 41 * 2 ** 24 + extensionIndex(slot) * 2 ** 20, size: 2 ** 20 };
  const s = slot + SLOT_OFFSET;
  if (!Number.isInteger(s) || s < 0 || s > 119) throw new Error(`DSEC_TEST_SLOT_OFFSET ${SLOT_OFFSET} puts slot ${slot} out of range`);
  return { base: 2 ** 30 + 56 * 2 ** 24 + s * 2 ** 20, size: 2 ** 20 };
}

/** Options of {@link TestDaemon.start}. */
export interface StartOptions {
  slot: number;
  /** Extra environment (e.g. DSEC_FAILPOINT). */
  env?: Record<string, string>;
  /** Extra TOML appended to the config. */
  config?: string;
}

/** What a sandbox left on the host, per place. Empty lists everywhere = no leak. */
export interface HostTraces {
  mounts: string[];
  cgroups: string[];
  runtime: string[];
  dirs: string[];
  rows: string[];
  uidRanges: number;
}

/** A dsecd process under test. */
export class TestDaemon {
  proc: ChildProcess | null = null;
  stderr = '';
  readonly client: DsecClient;
  readonly instance: string;
  private exitPromise: Promise<{ code: number | null; signal: string | null }> | null = null;
  private cg: CgroupManager | null = null;

  private constructor(readonly root: string, readonly slot: number, private baseConfig: string) {
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
    const pool = uidPoolForSlot(opts.slot);
    const builder = builderRangeForSlot(opts.slot);
    // A test's own `[builder]` table (opts.config) replaces this one.
    const builderToml = /^\[builder\]/m.test(opts.config ?? '') ? '' : `[builder]\nbase = ${builder.base}\nsize = ${builder.size}\n`;
    const cfg = `[uid_pool]\nbase = ${pool.base}\nsize = ${pool.size}\n${builderToml}${opts.config ?? ''}\n`;
    const d = new TestDaemon(root, opts.slot, cfg);
    try {
      await d.launch(opts.env);
    } catch (e) {
      await d.cleanup();
      throw e;
    }
    return d;
  }

  /** Starts dsecd on this root and waits until the API answers. */
  async launch(env: Record<string, string> = {}): Promise<void> {
    writeFileSync(path.join(this.root, 'dsecd.toml'), this.baseConfig);
    this.stderr = '';
    const proc = spawn(path.join(REPO, 'bin/dsecd'), ['--root', this.root, '--socket', this.socket, '--config', path.join(this.root, 'dsecd.toml')], {
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

  /** Every trace of sandboxes on the host, excluding the shared layer mounts. */
  async traces(): Promise<HostTraces> {
    const mi = readFileSync('/proc/self/mountinfo', 'utf8').split('\n');
    const sbPrefix = path.join(this.root, 'sandboxes') + '/';
    const mounts = mi.map((l) => l.split(' ')[4]).filter((m) => m && m.startsWith(sbPrefix));
    const cg = await this.cgroups();
    const cgroups = await cg.list();
    const r = await execa('runc', ['--root', path.join(this.root, 'runtime', 'runc'), 'list', '--format', 'json'], { reject: false });
    const runtime = ((JSON.parse(String(r.stdout) || 'null') ?? []) as { id: string }[]).map((c) => c.id);
    const sbDir = path.join(this.root, 'sandboxes');
    const dirs = existsSync(sbDir) ? readdirSync(sbDir) : [];
    const db = new Database(path.join(this.root, 'dsec.db'), { readonly: true, fileMustExist: true });
    try {
      const rows = (db.prepare('SELECT id FROM sandboxes').all() as { id: string }[]).map((x) => x.id);
      const uidRanges = (db.prepare('SELECT COUNT(*) n FROM uid_ranges').get() as { n: number }).n;
      return { mounts, cgroups: cgroups.sort(), runtime: runtime.sort(), dirs: dirs.sort(), rows: rows.sort(), uidRanges };
    } finally {
      db.close();
    }
  }

  /** Layer (EROFS blob) mounts of this instance. */
  layerMounts(): string[] {
    const prefix = path.join(this.root, 'layers') + '/';
    return readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')[4]).filter((m) => m && m.startsWith(prefix));
  }

  /**
   * Stops the daemon and removes everything it or its sandboxes left: runtime
   * containers, mounts, cgroups, the root. Safe to call twice.
   */
  async cleanup(): Promise<void> {
    await this.stop().catch(() => {});
    const stateDir = path.join(this.root, 'runtime', 'runc');
    if (existsSync(stateDir)) {
      const r = await execa('runc', ['--root', stateDir, 'list', '--format', 'json'], { reject: false });
      for (const c of (JSON.parse(String(r.stdout) || 'null') ?? []) as { id: string }[]) {
        await execa('runc', ['--root', stateDir, 'delete', '--force', c.id], { reject: false });
      }
    }
    const cg = await this.cgroups().catch(() => null);
    if (cg) {
      for (const id of await cg.list()) {
        await cg.killAll(id).catch(() => {});
        await cg.remove(id).catch(() => {});
      }
      await cg.removeInstance().catch(() => {});
    }
    const mi = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')[4]).filter((m) => m && m.startsWith(this.root + '/'));
    for (const m of mi.sort((a, b) => b.length - a.length)) await execa('umount', ['-l', m], { reject: false });
    rmSync(this.root, { recursive: true, force: true });
  }
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
