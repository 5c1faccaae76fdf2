/**
 * The OCI runtime binary (runc or crun), invoked with argument arrays. Its state dir
 * (`--root`) is per instance, so two dsecd instances never see each other's containers.
 * Used for create/start/stop/delete only: exec goes through the in-sandbox agent, never
 * through a runtime binary per call.
 *
 * Every call on a sandbox's lifecycle path goes through {@link spawnNative}
 * (posix_spawn from the native addon), not child_process: a fork of dsecd blocks its event
 * loop 10-15 ms per call here, which made these spawns the largest share of dsecd's CPU
 * under a creation burst (daemon/host/spawn.ts).
 */
import { execa } from 'execa';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { internal, unavailable } from '../../errors.js';
import { spawnNative } from '../../host/spawn.js';

/** Which runtime and why it was chosen. */
export interface RuntimeInfo {
  name: 'runc' | 'crun';
  path: string;
  version: string;
  /** Why this runtime was picked (e.g. "crun refuses hybrid cgroup v1 hosts"). */
  reason: string;
}

/** State of one container as the runtime reports it. */
export interface RuntimeState {
  id: string;
  /** created | running | paused | stopped */
  status: string;
  pid: number;
}

const SEARCH = ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin'];

function which(name: string): string | null {
  for (const d of SEARCH) if (existsSync(`${d}/${name}`)) return `${d}/${name}`;
  return null;
}

/**
 * Chooses the runtime. `auto` takes crun only on a pure cgroup v2 host (crun 1.8
 * refuses hybrid v1 hosts such as this development machine, DESIGN.md §5), runc otherwise.
 * @throws DsecError Unavailable when no usable runtime binary exists.
 */
export async function detectRuntime(pref: { name: 'auto' | 'runc' | 'crun'; path: string | null }, cgroupVersion: 1 | 2): Promise<RuntimeInfo> {
  const pick = async (name: 'runc' | 'crun', reason: string): Promise<RuntimeInfo | null> => {
    const p = pref.path ?? which(name);
    if (!p) return null;
    try {
      const r = await execa(p, ['--version']);
      const v = /version\s+(\S+)/.exec(r.stdout)?.[1] ?? r.stdout.split('\n')[0];
      return { name, path: p, version: v, reason };
    } catch {
      return null;
    }
  };
  if (pref.name !== 'auto') {
    const r = await pick(pref.name, 'configured');
    if (!r) throw unavailable(`OCI runtime ${pref.name} not found or not working${pref.path ? ` at ${pref.path}` : ''}; install it (apt-get install ${pref.name})`);
    return r;
  }
  if (cgroupVersion === 2) {
    const c = await pick('crun', 'auto: crun on a cgroup v2 host');
    if (c) return c;
  }
  const r = await pick('runc', cgroupVersion === 2 ? 'auto: crun not installed' : 'auto: crun refuses hybrid cgroup v1 hosts');
  if (!r) throw unavailable('no OCI runtime found: install runc (apt-get install runc)');
  return r;
}

/** A runtime bound to a state dir. */
export class OciRuntime {
  constructor(
    readonly info: RuntimeInfo,
    /** `--root` state dir of this instance, e.g. <root>/runtime/runc. */
    readonly stateDir: string,
  ) {}

  private base(): string[] {
    return ['--root', this.stateDir];
  }

  /**
   * `run --detach`: creates and starts the container. `extraFd` becomes fd 3 inside
   * (`--preserve-fds 1`); container stdout/stderr go to `logFd`.
   * @returns the init's host pid (from --pid-file).
   * @throws DsecError Internal with the runtime's own error text.
   */
  async run(id: string, bundle: string, opts: { pidFile: string; logFile: string; stdioFd: number; extraFd: number }): Promise<number> {
    const args = [...this.base(), '--log', opts.logFile, '--log-format', 'json', 'run', '--detach', '--bundle', bundle,
      '--pid-file', opts.pidFile, '--preserve-fds', '1', id];
    // The container's stdio is the runtime's own (--detach passes it through), so the
    // runtime's stderr must be the log file too: a pipe here would stay open as long as
    // the sandbox lives. Its error text is read back from the logs on failure.
    const r = await spawnNative(this.info.path, args, { fds: { 1: opts.stdioFd, 2: opts.stdioFd, 3: opts.extraFd }, timeoutMs: 60_000, maxOutputBytes: 0 })
      .catch((e: Error) => ({ exitCode: -1, signal: null, stderr: e.message, timedOut: false }));
    const res = { code: r.exitCode, stderr: r.timedOut ? 'timed out after 60 s' : r.signal ? `killed by ${r.signal}` : r.stderr };
    if (res.code !== 0) {
      throw internal(`${this.info.name} run ${id} failed: ${await this.explain(res.stderr, opts.logFile)}`);
    }
    const pid = Number((await readFile(opts.pidFile, 'utf8')).trim());
    if (!Number.isInteger(pid) || pid <= 0) throw internal(`${this.info.name} run ${id}: bad pid file ${opts.pidFile}`);
    return pid;
  }

  /** `delete --force`: kills every process and removes runtime state and cgroups. Safe when the container does not exist. */
  async deleteForce(id: string): Promise<void> {
    const r = await spawnNative(this.info.path, [...this.base(), 'delete', '--force', id], { timeoutMs: 60_000 });
    if (r.exitCode !== 0 && !/does not exist|not found|no such file/i.test(`${r.stderr}`)) {
      throw internal(`${this.info.name} delete ${id} failed: ${String(r.stderr).trim()}`);
    }
  }

  /** `kill ID SIGNAL` (to init). Errors are ignored when the container is gone. */
  async kill(id: string, signal = 'KILL'): Promise<void> {
    await spawnNative(this.info.path, [...this.base(), 'kill', id, signal], { timeoutMs: 30_000, maxOutputBytes: 0 });
  }

  /** `state ID`, or null when the runtime does not know the container. */
  async state(id: string): Promise<RuntimeState | null> {
    const r = await spawnNative(this.info.path, [...this.base(), 'state', id], { timeoutMs: 30_000 });
    if (r.exitCode !== 0) return null;
    const j = JSON.parse(String(r.stdout));
    return { id: j.id, status: j.status, pid: j.pid };
  }

  /** Ids of every container in this state dir. */
  async list(): Promise<RuntimeState[]> {
    if (!existsSync(this.stateDir)) return [];
    const r = await spawnNative(this.info.path, [...this.base(), 'list', '--format', 'json'], { timeoutMs: 30_000, maxOutputBytes: 64 << 20 });
    if (r.exitCode !== 0) return [];
    const arr = JSON.parse(String(r.stdout) || 'null') as { id: string; status: string; pid: number }[] | null;
    return (arr ?? []).map((j) => ({ id: j.id, status: j.status, pid: j.pid }));
  }

  private async explain(stderrText: string, logFile: string): Promise<string> {
    let msg = '';
    try {
      const lines = (await readFile(logFile, 'utf8')).trim().split('\n');
      const errs = lines.map((l) => { try { return JSON.parse(l); } catch { return null; } }).filter((j) => j && (j.level === 'error' || j.level === 'fatal'));
      msg = errs.map((j) => j.msg).join('; ');
    } catch { /* no log */ }
    return msg || stderrText.trim() || 'no error output';
  }
}
