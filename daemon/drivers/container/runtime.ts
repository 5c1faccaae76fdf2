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
import { existsSync, mkdirSync, readdirSync, readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { internal, invalidArgument, unavailable } from '../../errors.js';
import path from 'node:path';
import type { CgroupLimits, CgroupManager } from '../../host/cgroups/index.js';
import * as native from '../../host/native.js';
import { CONTAINER_DEVICE_RULES } from '../cgroup-limits.js';
import { spawnNative } from '../../host/spawn.js';

/** Which runtime and why it was chosen. */
export interface RuntimeInfo {
  name: 'runc' | 'crun';
  path: string;
  version: string;
  /** Why this runtime was picked (e.g. "auto: crun, no Go runtime to start per sandbox"). */
  reason: string;
  /**
   * Absolute path of native/oci-exec/dsec-oci-exec when every invocation goes through it
   * (crun on a cgroup v1 host: it creates and joins the sandbox's cgroups and hides a
   * hybrid host's cgroup2 controllers from crun, which otherwise refuses the host), else null.
   */
  launcher: string | null;
  /**
   * True when dsecd creates each sandbox's cgroups, writes their limits and device rules,
   * and the runtime only starts in them (crun on a cgroup v1 host: run with
   * `--cgroup-manager=disabled` through the launcher, which joins the cgroups first).
   * crun resolves a relative cgroupsPath from each hierarchy's root, not from its own
   * cgroup as runc does, which on a host where dsecd's cgroups differ by hierarchy would
   * put sandboxes outside dsecd's subtree.
   */
  cgroupsByDsecd: boolean;
}

/** Where native/oci-exec builds its launcher. */
export function ociExecPath(): string {
  return path.join(native.repoRoot(), 'native/oci-exec/dsec-oci-exec');
}

/** The state dir (`--root`) of runtime `name` under a dsecd root: `<root>/runtime/<name>`. */
export function runtimeStateDir(root: string, name: 'runc' | 'crun'): string {
  return path.join(root, 'runtime', name);
}

/**
 * True on a hybrid host whose cgroup2 mount has a controller bound to it (crun 1.8
 * refuses such a host unless started through dsec-oci-exec). Reads one cgroupfs file.
 */
function hybridWithV2Controllers(cgroupVersion: 1 | 2): boolean {
  if (cgroupVersion !== 1) return false;
  try {
    return readFileSync('/sys/fs/cgroup/unified/cgroup.controllers', 'utf8').trim() !== '';
  } catch {
    return false;
  }
}

/** The cgroup a container is to run in: the instance's manager and the sandbox's limits. */
export interface RunCgroup {
  manager: CgroupManager;
  /** As the spec's linux.resources carry them (containerCgroupLimits). */
  limits: CgroupLimits;
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
 * Chooses the runtime. On a cgroup v1 host (legacy or hybrid) `auto` takes crun where it
 * and native/oci-exec are installed, runc otherwise: crun is C and starts in a few ms,
 * runc starts a Go runtime twice per container (`runc run` and `runc init`), which was
 * 63% of the host's CPU in a pool-empty burst (docs/BENCHMARKS.md, "Cold create: crun
 * against runc"). crun always starts through dsec-oci-exec ({@link RuntimeInfo.launcher})
 * with dsecd doing the cgroup work ({@link RuntimeInfo.cgroupsByDsecd}). On a cgroup v2
 * host `auto` takes runc and a configured crun is refused: there device rules are a BPF
 * program the runtime loads, which dsecd does not do for it.
 * `opts.existing` (RuntimeSet: a state dir an earlier configuration left) takes crun on
 * any host, without the launcher where it cannot be used: such a runtime only inspects,
 * signals and deletes its containers.
 * @throws DsecError InvalidArgument (`path` with `auto`: a path names one runtime),
 *   Unavailable when no usable runtime binary exists (the message says what is missing).
 */
export async function detectRuntime(pref: { name: 'auto' | 'runc' | 'crun'; path: string | null }, cgroupVersion: 1 | 2, opts: { existing?: boolean } = {}): Promise<RuntimeInfo> {
  if (pref.name === 'auto' && pref.path) {
    throw invalidArgument(`[runtime] path = "${pref.path}" needs name = "runc" or "crun": with "auto" it is not known which runtime it is`);
  }
  const needsLauncher = hybridWithV2Controllers(cgroupVersion);
  // crun starts through the launcher: it is what joins the sandbox's cgroups.
  const launcher = ociExecPath();
  const launcherUsable = cgroupVersion === 1 && existsSync(launcher);
  const pick = async (name: 'runc' | 'crun', reason: string): Promise<RuntimeInfo | null> => {
    const p = pref.path ?? which(name);
    if (!p) return null;
    if (name === 'crun' && !launcherUsable && !opts.existing) return null;
    const viaLauncher = name === 'crun' && launcherUsable ? launcher : null;
    try {
      const r = await execa(p, ['--version']);
      const v = /version\s+(\S+)/.exec(r.stdout)?.[1] ?? r.stdout.split('\n')[0];
      return { name, path: p, version: v, reason, launcher: viaLauncher, cgroupsByDsecd: viaLauncher !== null };
    } catch {
      return null;
    }
  };
  if (pref.name !== 'auto') {
    const r = await pick(pref.name, opts.existing ? 'containers of an earlier configuration' : 'configured');
    if (!r) {
      const found = pref.path ?? which(pref.name);
      const why = !found ? `not found (apt-get install ${pref.name})`
        : pref.name === 'crun' && cgroupVersion !== 1 ? 'not used on cgroup v2 hosts: dsec runs crun where dsecd writes the device rules (cgroup v1); use runc'
          : pref.name === 'crun' && !existsSync(launcher) ? `installed, but it starts through ${launcher}, which is not built (make -C native)`
            : `at ${found} did not answer --version`;
      throw unavailable(`OCI runtime ${pref.name} ${why}`);
    }
    return r;
  }
  const c = await pick('crun', needsLauncher ? 'auto: crun (hybrid cgroup host: through dsec-oci-exec)' : 'auto: crun');
  if (c) return c;
  const r = await pick('runc', cgroupVersion === 1 ? 'auto: crun or dsec-oci-exec not installed' : 'auto: cgroup v2 host');
  if (!r) throw unavailable('no OCI runtime found: install crun or runc (apt-get install crun)');
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
    return this.info.cgroupsByDsecd ? ['--root', this.stateDir, '--cgroup-manager=disabled'] : ['--root', this.stateDir];
  }

  /** The binary to spawn and the arguments before the runtime's own: the launcher's when there is one. */
  private get exe(): string {
    return this.info.launcher ?? this.info.path;
  }

  /**
   * Arguments of one invocation: through the launcher, its own options (`pre`) and the
   * runtime's path come first.
   */
  private argv(rest: string[], pre: string[] = []): string[] {
    if (!this.info.launcher) return [...this.base(), ...rest];
    return [...pre, this.info.path, ...this.base(), ...rest];
  }

  /**
   * `run --detach`: creates and starts the container. `extraFd` becomes fd 3 inside
   * (`--preserve-fds 1`); container stdout/stderr go to `logFd`. With a runtime that
   * leaves the cgroup work to dsecd ({@link RuntimeInfo.cgroupsByDsecd}), the launcher
   * creates the sandbox's cgroup in every hierarchy first, with `cgroup.limits` and runc's
   * device rules (CgroupManager.launchPlan, CONTAINER_DEVICE_RULES), joins it and starts
   * the runtime inside; otherwise the runtime makes it from the spec (same limits) and
   * `cgroup` is not used.
   * @returns the init's host pid (from --pid-file).
   * @throws DsecError Internal with the runtime's (or the launcher's) own error text;
   *   as CgroupManager.launchPlan.
   */
  async run(id: string, bundle: string, opts: { pidFile: string; logFile: string; stdioFd: number; extraFd: number; cgroup: RunCgroup }): Promise<number> {
    const pre: string[] = [];
    if (this.info.cgroupsByDsecd) {
      pre.push('--error-log', opts.logFile);
      for (const st of opts.cgroup.manager.launchPlan(id, opts.cgroup.limits, CONTAINER_DEVICE_RULES)) {
        if (st.op === 'mkdir') pre.push('--mkdir', st.path);
        else if (st.op === 'copy') pre.push('--copy', st.from, st.to);
        else pre.push('--write', st.path, st.value);
      }
      for (const f of opts.cgroup.manager.procsFiles(id)) pre.push('--cgroup-procs', f);
    }
    const args = this.argv(['--log', opts.logFile, '--log-format', 'json', 'run', '--detach', '--bundle', bundle,
      '--pid-file', opts.pidFile, '--preserve-fds', '1', id], pre);
    // The container's stdio is the runtime's own (--detach passes it through), so the
    // runtime's stderr must be the log file too: a pipe here would stay open as long as
    // the sandbox lives. Its error text is read back from the logs on failure.
    const r = await spawnNative(this.exe, args, { fds: { 1: opts.stdioFd, 2: opts.stdioFd, 3: opts.extraFd }, timeoutMs: 60_000, maxOutputBytes: 0 })
      .catch((e: Error) => ({ exitCode: -1, signal: null, stderr: e.message, timedOut: false }));
    const res = { code: r.exitCode, stderr: r.timedOut ? 'timed out after 60 s' : r.signal ? `killed by ${r.signal}` : r.stderr };
    if (res.code !== 0) {
      const why = await this.explain(res.stderr, opts.logFile);
      // The cgroup made above goes too (a rollback's deleteForce may fail first for a container that never was).
      if (this.info.cgroupsByDsecd) {
        await opts.cgroup.manager.killAll(id).catch(() => {});
        await opts.cgroup.manager.remove(id).catch(() => {});
      }
      throw internal(`${this.info.name} run ${id} failed: ${why}`);
    }
    const pid = Number((await readFile(opts.pidFile, 'utf8')).trim());
    if (!Number.isInteger(pid) || pid <= 0) throw internal(`${this.info.name} run ${id}: bad pid file ${opts.pidFile}`);
    return pid;
  }

  /** `delete --force`: kills every process and removes runtime state and cgroups. Safe when the container does not exist. */
  async deleteForce(id: string): Promise<void> {
    const r = await spawnNative(this.exe, this.argv(['delete', '--force', id]), { timeoutMs: 60_000 });
    if (r.exitCode !== 0 && !/does not exist|not found|no such file/i.test(`${r.stderr}`)) {
      throw internal(`${this.info.name} delete ${id} failed: ${String(r.stderr).trim()}`);
    }
  }

  /** `kill ID SIGNAL` (to init). Errors are ignored when the container is gone. */
  async kill(id: string, signal = 'KILL'): Promise<void> {
    await spawnNative(this.exe, this.argv(['kill', id, signal]), { timeoutMs: 30_000, maxOutputBytes: 0 });
  }

  /** `state ID`, or null when the runtime does not know the container. */
  async state(id: string): Promise<RuntimeState | null> {
    const r = await spawnNative(this.exe, this.argv(['state', id]), { timeoutMs: 30_000 });
    if (r.exitCode !== 0) return null;
    const j = JSON.parse(String(r.stdout));
    return { id: j.id, status: j.status, pid: j.pid };
  }

  /** Ids of every container in this state dir. */
  async list(): Promise<RuntimeState[]> {
    if (!existsSync(this.stateDir)) return [];
    const r = await spawnNative(this.exe, this.argv(['list', '--format', 'json']), { timeoutMs: 30_000, maxOutputBytes: 64 << 20 });
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

/** The tmpfs crun's state dir is mounted on: a ceiling (tmpfs holds what it stores, ~20 KiB per container). */
const STATE_TMPFS_BYTES = 1 << 30;

/**
 * Mounts a tmpfs (source `dsec-runtime`, mode 0700) at crun's state dir `dir` unless one
 * is mounted there already (a previous dsecd's, whose containers are adopted). crun
 * writes three files per container there (status, config.json, seccomp.bpf); on the
 * state root's ext4, allocating their inodes amid a burst's deletes cost a quarter of
 * crun's CPU per container (3.4 of 13.4 ms in a loop of `crun run`, perf: ext4's
 * find_inode_bit / recently_deleted). Container state does not outlive a reboot, so a
 * tmpfs (crun's own default is /run/crun) loses nothing the containers keep.
 * `dsecd --purge` unmounts it.
 * @returns false when `dir` is a plain directory that holds containers already (their
 *   state stays there; the next start that finds it empty mounts the tmpfs).
 * @throws errno-coded Errors of mkdir/mount.
 */
export function mountStateTmpfs(dir: string): boolean {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  if (native.isMountpoint(dir)) return true;
  // Containers whose state is on disk (a dsecd before this tmpfs) keep it there; the
  // tmpfs comes at the first start that finds the dir empty.
  if (readdirSync(dir).length > 0) return false;
  const c = native.constants();
  native.mount('dsec-runtime', dir, 'tmpfs', c.MS_NOSUID | c.MS_NODEV | c.MS_NOEXEC, `mode=0700,size=${STATE_TMPFS_BYTES}`);
  return true;
}

/**
 * The runtime new containers start with, plus the runtimes of containers an earlier
 * configuration of this root started: a host whose `auto` moves from runc to crun (an
 * upgrade that installs crun) keeps its running sandboxes, each handled by the runtime
 * whose state dir holds it until it is destroyed. Same methods as {@link OciRuntime}.
 */
export class RuntimeSet {
  /**
   * @param primary the configured (or auto-chosen) runtime: every new container.
   * @param earlier runtimes whose state dir under `<root>/runtime/` still holds containers.
   */
  constructor(readonly primary: OciRuntime, readonly earlier: readonly OciRuntime[]) {}

  /**
   * Chooses the primary runtime ({@link detectRuntime}) and adds each other runtime whose
   * state dir `<root>/runtime/<name>` has containers.
   * @returns the set, and one warning per state dir with containers whose runtime is no
   *   longer usable here (those containers can be neither inspected nor stopped by dsecd).
   * @throws DsecError Unavailable as detectRuntime.
   */
  static async open(root: string, pref: { name: 'auto' | 'runc' | 'crun'; path: string | null }, cgroupVersion: 1 | 2): Promise<{ set: RuntimeSet; warnings: string[] }> {
    const info = await detectRuntime(pref, cgroupVersion);
    const primary = new OciRuntime(info, runtimeStateDir(root, info.name));
    const earlier: OciRuntime[] = [];
    const warnings: string[] = [];
    if (info.name === 'crun' && !mountStateTmpfs(primary.stateDir)) {
      warnings.push(`${primary.stateDir} holds containers on disk: crun's state stays there (no tmpfs) until a start finds it empty`);
    }
    for (const name of ['runc', 'crun'] as const) {
      const dir = runtimeStateDir(root, name);
      if (name === info.name || !existsSync(dir) || readdirSync(dir).length === 0) continue;
      try {
        earlier.push(new OciRuntime(await detectRuntime({ name, path: null }, cgroupVersion, { existing: true }), dir));
      } catch (e) {
        warnings.push(`${dir} holds containers of ${name}, which is not usable here (${(e as Error).message}): dsecd cannot stop them`);
      }
    }
    return { set: new RuntimeSet(primary, earlier), warnings };
  }

  /** The primary runtime's description. */
  get info(): RuntimeInfo {
    return this.primary.info;
  }

  /** The runtime whose state dir holds container `id` (runc and crun both keep `<root>/<id>/`), else the primary. */
  of(id: string): OciRuntime {
    return this.earlier.find((r) => existsSync(path.join(r.stateDir, id))) ?? this.primary;
  }

  /** {@link OciRuntime.run} on the primary runtime. */
  run(...a: Parameters<OciRuntime['run']>): Promise<number> {
    return this.primary.run(...a);
  }

  /** {@link OciRuntime.deleteForce} through the runtime that holds `id`. */
  deleteForce(id: string): Promise<void> {
    return this.of(id).deleteForce(id);
  }

  /** {@link OciRuntime.kill} through the runtime that holds `id`. */
  kill(id: string, signal?: string): Promise<void> {
    return this.of(id).kill(id, signal);
  }

  /** {@link OciRuntime.state} through the runtime that holds `id`. */
  state(id: string): Promise<RuntimeState | null> {
    return this.of(id).state(id);
  }

  /** Every container of every runtime in the set. */
  async list(): Promise<RuntimeState[]> {
    return (await Promise.all([this.primary, ...this.earlier].map((r) => r.list()))).flat();
  }
}
