/**
 * The kernel-file layer of `daemon/host/cgroups`: parsing `/proc/self/cgroup` and
 * `/proc/self/mountinfo` into a cgroup layout (which hierarchies exist, where they are
 * mounted, where this process's own cgroup is in each), parsing cgroupfs interface
 * files, and the few filesystem primitives (read, poll, rmdir-with-retry, signal) that
 * the v1 and v2 managers share.
 *
 * The parsers are pure functions over text so the unit tests feed them samples; the
 * fs helpers use node:fs/promises only (no shelling out). Nothing here writes outside
 * the paths it is given: the managers only ever pass paths below the instance parent
 * or the daemon's own cgroup.
 */
import { closeSync, openSync, readFileSync, readSync } from 'node:fs';
import { readFile, readdir, rmdir, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { DsecError, failedPrecondition, internal, invalidArgument, notFound } from '../../errors.js';

// ---------------------------------------------------------------------------------
// Names

/** Valid `dsecd` instance names; the instance parent dir is `dsec-<instance>`. */
export const INSTANCE_NAME_RE = /^[a-z0-9][a-z0-9_.-]{0,62}$/;
/** Valid sandbox ids; a sandbox's cgroup dir is named by its id. No `/`, no leading `.`. */
export const SANDBOX_ID_RE = /^[a-z0-9][a-z0-9_-]{0,63}$/;
/** Prefix of the instance parent dir name: `dsec-<instance>`. */
export const INSTANCE_DIR_PREFIX = 'dsec-';

/** Throws `InvalidArgument` unless `name` matches {@link INSTANCE_NAME_RE}. */
export function assertInstanceName(name: string): void {
  if (typeof name !== 'string' || !INSTANCE_NAME_RE.test(name)) {
    throw invalidArgument(`invalid dsecd instance name ${JSON.stringify(name)}: must match ${INSTANCE_NAME_RE.source}`);
  }
}

/** Throws `InvalidArgument` unless `id` matches {@link SANDBOX_ID_RE}. Guards every path join. */
export function assertSandboxId(id: string): void {
  if (typeof id !== 'string' || !SANDBOX_ID_RE.test(id)) {
    throw invalidArgument(`invalid sandbox id ${JSON.stringify(id)}: must match ${SANDBOX_ID_RE.source}`);
  }
}

// ---------------------------------------------------------------------------------
// /proc/self/cgroup

/** One line of `/proc/<pid>/cgroup`: `hierarchy-ID:controller-list:cgroup-path`. */
export interface ProcCgroupLine {
  /** 0 for the cgroup2 (unified) hierarchy, >0 for v1 hierarchies. */
  hierarchyId: number;
  /** v1 controllers bound to the hierarchy, e.g. `['cpu', 'cpuacct']` or `['name=systemd']`; `[]` for cgroup2. */
  controllers: string[];
  /** The process's cgroup in that hierarchy, absolute from the hierarchy root (or the cgroup-namespace root), e.g. `/process_api/e64e…`. */
  path: string;
}

/**
 * Parses the text of `/proc/<pid>/cgroup` (see cgroups(7)). The path keeps any `:` it
 * contains. Empty lines are ignored.
 * @throws DsecError(Internal) on a line without two `:` separators or a non-numeric id.
 */
export function parseProcCgroup(text: string): ProcCgroupLine[] {
  const out: ProcCgroupLine[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '') continue;
    const a = line.indexOf(':');
    const b = a < 0 ? -1 : line.indexOf(':', a + 1);
    const id = Number(line.slice(0, a));
    if (a < 0 || b < 0 || !Number.isInteger(id) || id < 0) {
      throw internal(`malformed /proc/self/cgroup line ${JSON.stringify(line)}`);
    }
    const list = line.slice(a + 1, b);
    out.push({ hierarchyId: id, controllers: list === '' ? [] : list.split(','), path: line.slice(b + 1) });
  }
  return out;
}

// ---------------------------------------------------------------------------------
// /proc/self/mountinfo

/** One line of `/proc/<pid>/mountinfo` (proc(5)); paths have their octal escapes decoded. */
export interface MountInfo {
  mountId: number;
  parentId: number;
  /** `major:minor` of the filesystem. */
  majorMinor: string;
  /** Path inside the filesystem that is mounted here; for cgroupfs the cgroup shown at the mount point, usually `/`. */
  root: string;
  /** Absolute mount point, e.g. `/sys/fs/cgroup/memory`. */
  mountPoint: string;
  /** Per-mount options, e.g. `['rw', 'relatime']`. */
  mountOptions: string[];
  /** Filesystem type: `cgroup` for v1 hierarchies, `cgroup2` for the unified one. */
  fsType: string;
  source: string;
  /** Per-superblock options; for v1 cgroupfs these name the controllers, e.g. `['rw', 'cpu', 'cpuacct']`, `['rw', 'name=systemd']`. */
  superOptions: string[];
}

/** Decodes the `\ooo` octal escapes mountinfo uses for space, tab, newline and backslash. */
export function unescapeMountPath(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}

/**
 * Parses the text of `/proc/<pid>/mountinfo`. Optional fields (`shared:N`, `master:N`)
 * are skipped up to the `-` separator.
 * @throws DsecError(Internal) on a line without the separator or with too few fields.
 */
export function parseMountinfo(text: string): MountInfo[] {
  const out: MountInfo[] = [];
  for (const raw of text.split('\n')) {
    if (raw.trim() === '') continue;
    const f = raw.trim().split(' ');
    const sep = f.indexOf('-', 6);
    if (f.length < 10 || sep < 0 || f.length < sep + 3) {
      throw internal(`malformed /proc/self/mountinfo line ${JSON.stringify(raw)}`);
    }
    out.push({
      mountId: Number(f[0]),
      parentId: Number(f[1]),
      majorMinor: f[2],
      root: unescapeMountPath(f[3]),
      mountPoint: unescapeMountPath(f[4]),
      mountOptions: f[5].split(','),
      fsType: f[sep + 1],
      source: unescapeMountPath(f[sep + 2]),
      superOptions: (f[sep + 3] ?? '').split(','),
    });
  }
  return out;
}

// ---------------------------------------------------------------------------------
// Layout

/** One cgroup hierarchy as this process sees it. */
export interface HierarchyLayout {
  /** 1 for a v1 hierarchy, 2 for the unified (cgroup2) hierarchy. */
  version: 1 | 2;
  /**
   * Keys under which the hierarchy appears in `CgroupManager.parents`: its controllers
   * (`cpu` and `cpuacct` both for a co-mounted `cpu,cpuacct`), the name of a named
   * hierarchy (`systemd` for `name=systemd`), or `unified` for cgroup2.
   */
  keys: string[];
  /** Controllers as listed in /proc/self/cgroup (`[]` for cgroup2). */
  controllers: string[];
  /** Absolute mount point, e.g. `/sys/fs/cgroup/memory`. */
  mountPoint: string;
  /** The process's cgroup path in this hierarchy, from /proc/self/cgroup. */
  ownPath: string;
  /** Absolute directory of the process's own cgroup: mount point + own path (minus the mount's root). */
  ownDir: string;
}

/** Which cgroup version the host runs and its hierarchies. */
export interface CgroupLayout {
  /** 2 when the mount root is itself cgroup2 (pure v2); 1 for legacy and hybrid hosts. */
  version: 1 | 2;
  /** v2: exactly one entry (`unified`). v1: every mounted v1 hierarchy, plus `unified` in hybrid mode. */
  hierarchies: HierarchyLayout[];
}

/** True when `p` is `dir` or below it (both absolute, normalised). */
export function isUnder(p: string, dir: string): boolean {
  const rel = path.relative(dir, p);
  return rel === '' || (!rel.startsWith('..') && !path.isAbsolute(rel));
}

/**
 * Absolute directory of the cgroup `ownPath` inside a cgroupfs mounted at `mountPoint`
 * whose mountinfo root is `mountRootField` (not `/` when only a subtree is bind-mounted,
 * as in some containers).
 * @throws DsecError(FailedPrecondition) when the cgroup is not visible through the mount.
 */
export function ownCgroupDir(mountPoint: string, mountRootField: string, ownPath: string): string {
  // In a cgroup namespace the kernel shows cgroups outside it as `/../..`.
  if (!ownPath.startsWith('/') || ownPath.split('/').includes('..')) {
    throw failedPrecondition(`own cgroup ${JSON.stringify(ownPath)} is outside this cgroup namespace`);
  }
  const own = path.posix.normalize(ownPath);
  let rel = own;
  if (mountRootField !== '/') {
    const root = path.posix.normalize(mountRootField).replace(/\/$/, '');
    if (own !== root && !own.startsWith(`${root}/`)) {
      throw failedPrecondition(`own cgroup ${own} is not visible through the cgroup mount at ${mountPoint} (mount root ${root})`);
    }
    rel = own.slice(root.length) || '/';
  }
  return path.resolve(mountPoint, `.${rel}`);
}

/**
 * Works out the cgroup layout from parsed /proc/self/cgroup and mountinfo.
 *
 * - `mountRoot` itself a `cgroup2` mount (the topmost mount there) → v2.
 * - else every `cgroup` (v1) mount under `mountRoot` whose super options carry the
 *   controllers of a /proc/self/cgroup line → v1; a `cgroup2` mount under `mountRoot`
 *   (hybrid `unified`) is added as a version-2 hierarchy.
 * - else, when `fallbackV2` (the caller found `cgroup.controllers` directly in
 *   `mountRoot`: a test tree shaped like cgroupfs) → v2 rooted at `mountRoot`.
 *
 * @throws DsecError(FailedPrecondition) when no hierarchy is found, or v2 without a `0::` line.
 */
export function resolveLayout(
  lines: ProcCgroupLine[],
  mounts: MountInfo[],
  mountRoot: string,
  opts: { fallbackV2?: boolean } = {},
): CgroupLayout {
  const root = path.resolve(mountRoot);
  const unifiedLine = lines.find((l) => l.hierarchyId === 0 && l.controllers.length === 0);
  const v2At = (mountPoint: string, rootField: string): HierarchyLayout => {
    if (!unifiedLine) throw failedPrecondition('no cgroup2 entry (0::) in /proc/self/cgroup');
    return {
      version: 2, keys: ['unified'], controllers: [], mountPoint, ownPath: unifiedLine.path,
      ownDir: ownCgroupDir(mountPoint, rootField, unifiedLine.path),
    };
  };

  // The last mount listed at a mount point is the one on top.
  const atRoot = mounts.filter((m) => path.resolve(m.mountPoint) === root).at(-1);
  if (atRoot?.fsType === 'cgroup2') return { version: 2, hierarchies: [v2At(root, atRoot.root)] };

  const under = mounts.filter((m) => isUnder(path.resolve(m.mountPoint), root) && path.resolve(m.mountPoint) !== root);
  const hierarchies: HierarchyLayout[] = [];
  const seenMounts = new Set<string>();
  for (const line of lines) {
    if (line.hierarchyId === 0 || line.controllers.length === 0) continue;
    const m = under.find((x) => x.fsType === 'cgroup' && line.controllers.every((c) => x.superOptions.includes(c)));
    if (!m || seenMounts.has(m.mountPoint)) continue;
    seenMounts.add(m.mountPoint);
    hierarchies.push({
      version: 1,
      keys: line.controllers.map((c) => (c.startsWith('name=') ? c.slice('name='.length) : c)),
      controllers: line.controllers,
      mountPoint: m.mountPoint,
      ownPath: line.path,
      ownDir: ownCgroupDir(m.mountPoint, m.root, line.path),
    });
  }
  if (hierarchies.length > 0) {
    const unified = under.find((x) => x.fsType === 'cgroup2');
    if (unified && unifiedLine) hierarchies.push(v2At(unified.mountPoint, unified.root));
    return { version: 1, hierarchies };
  }
  if (opts.fallbackV2) return { version: 2, hierarchies: [v2At(root, '/')] };
  throw failedPrecondition(`no cgroup hierarchy found under ${root}`);
}

// ---------------------------------------------------------------------------------
// cgroupfs files

/**
 * Parses a flat-keyed cgroupfs file (`memory.stat`, `memory.events`, `cpu.stat`,
 * `memory.oom_control`, `cgroup.events`): one `key value` pair a line, values as numbers
 * (non-numeric values are skipped).
 */
export function parseFlatKeyed(text: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of text.split('\n')) {
    const [k, v] = line.trim().split(/\s+/);
    if (!k || v === undefined) continue;
    const n = Number(v);
    if (Number.isFinite(n)) out[k] = n;
  }
  return out;
}

/**
 * Parses a limit file: `max` (v2) or a value ≥ 2^62 (v1 reports "unlimited" as
 * PAGE_COUNTER_MAX × page size, 9223372036854771712) → null; otherwise the number.
 */
export function parseLimit(text: string): number | null {
  const t = text.trim();
  if (t === 'max' || t === '') return null;
  const n = Number(t);
  if (!Number.isFinite(n) || n >= 2 ** 62) return null;
  return n;
}

/** The `code` of a Node system error (`ENOENT`, `EBUSY`, …), or undefined. */
export function errnoOf(e: unknown): string | undefined {
  return typeof e === 'object' && e !== null && 'code' in e ? String((e as { code: unknown }).code) : undefined;
}

/**
 * Turns an fs error on a cgroup file into a DsecError: ENOENT → NotFound, EBUSY →
 * FailedPrecondition, anything else → Internal; `what` names the operation and file.
 */
export function cgroupFsError(e: unknown, what: string): DsecError {
  if (e instanceof DsecError) return e;
  const code = errnoOf(e);
  const msg = `${what}: ${e instanceof Error ? e.message : String(e)}`;
  if (code === 'ENOENT') return notFound(msg, e);
  if (code === 'EBUSY') return failedPrecondition(msg, e);
  return internal(msg, e);
}

/** Reads a (small, kernel-generated) file as text; null when it does not exist (ENOENT/ENOTDIR). Other errors propagate. */
export async function readOptional(file: string): Promise<string | null> {
  // Synchronous on purpose: a cgroupfs file is generated by the kernel on read (tens of
  // microseconds, no disk), while fs.promises.readFile takes four threadpool round trips
  // (open, fstat, read, close) and was most of the cost of the limit-counter sweep.
  try {
    return readFileSync(file, 'utf8');
  } catch (e) {
    const code = errnoOf(e);
    if (code === 'ENOENT' || code === 'ENOTDIR') return null;
    throw e;
  }
}

/** Reads a single-number file (e.g. `memory.current`, in its native unit); null when absent or not a number. */
export async function readNumber(file: string): Promise<number | null> {
  const t = await readOptional(file);
  if (t === null) return null;
  const n = Number(t.trim());
  return Number.isFinite(n) ? n : null;
}

/** Reads a flat-keyed file (see {@link parseFlatKeyed}); `{}` when absent. */
export async function readFlatKeyed(file: string): Promise<Record<string, number>> {
  const t = await readOptional(file);
  return t === null ? {} : parseFlatKeyed(t);
}

/**
 * Counter files read on every exec (memory.oom_control on v1, memory.events on v2), kept
 * open and read with one pread(2) on the calling thread, where {@link readOptional} makes
 * four system calls (open, fstat, read, close; ~21 µs a read, ~5% of dsecd's main thread
 * per exec in a `--cpu-prof` of sequential execs, two reads each). At most
 * {@link MAX_OPEN} files stay open (one fd each; past that a read opens and closes);
 * {@link forget} closes those under a directory when its cgroup is removed. A file whose cgroup was removed and made again
 * reads ENODEV through the old fd: it is reopened once.
 */
export class CounterFiles {
  /** Files kept open at most: 16,384 (a fd each, beside the agent connection's). */
  static readonly MAX_OPEN = 16_384;
  private readonly fds = new Map<string, number>();
  private readonly buf = Buffer.alloc(4096);

  /**
   * Flat-keyed contents of `file` ({@link parseFlatKeyed}); `{}` when it does not exist
   * (ENOENT, ENOTDIR). Contents past 4 KiB are not read (counter files are a few lines).
   * @throws Error (errno-coded) of open/read other than ENOENT.
   */
  read(file: string): Record<string, number> {
    for (let attempt = 0; ; attempt++) {
      let fd = this.fds.get(file);
      let keep = true;
      if (fd === undefined) {
        try {
          fd = openSync(file, 'r');
        } catch (e) {
          const code = errnoOf(e);
          if (code === 'ENOENT' || code === 'ENOTDIR') return {};
          throw e;
        }
        keep = this.fds.size < CounterFiles.MAX_OPEN;
        if (keep) this.fds.set(file, fd);
      }
      try {
        const n = readSync(fd, this.buf, 0, this.buf.length, 0);
        return parseFlatKeyed(this.buf.toString('utf8', 0, n));
      } catch (e) {
        this.close(file, fd);
        if (attempt > 0 || !keep) throw e;
        continue;
      } finally {
        if (!keep) closeSync(fd);
      }
    }
  }

  /** Closes the files kept open under `dir` (a removed sandbox's cgroup). */
  forget(dir: string): void {
    const prefix = dir.endsWith('/') ? dir : `${dir}/`;
    for (const [f, fd] of this.fds) if (f.startsWith(prefix)) this.close(f, fd);
  }

  private close(file: string, fd: number): void {
    if (this.fds.get(file) !== fd) return;
    this.fds.delete(file);
    try {
      closeSync(fd);
    } catch { /* already closed */ }
  }
}

/**
 * Writes `value` to a cgroupfs file in one write(2). The file is opened O_WRONLY|O_CREAT|
 * O_TRUNC: kernfs ignores O_TRUNC and refuses to create, while a test tree gets the file.
 * Raw fs errors propagate (callers map them with {@link cgroupFsError}).
 */
export async function writeCgroupFile(file: string, value: string): Promise<void> {
  await writeFile(file, value);
}

/** True when `p` is an existing directory. */
export async function isDir(p: string): Promise<boolean> {
  try {
    return (await stat(p)).isDirectory();
  } catch {
    return false;
  }
}

/** True when `p` is an existing regular file (cgroupfs interface files are). */
export async function isFile(p: string): Promise<boolean> {
  try {
    return (await stat(p)).isFile();
  } catch {
    return false;
  }
}

/** Names of the subdirectories (child cgroups) of `dir`, sorted; `[]` when `dir` does not exist. */
export async function childDirs(dir: string): Promise<string[]> {
  try {
    const ents = await readdir(dir, { withFileTypes: true });
    return ents.filter((e) => e.isDirectory()).map((e) => e.name).sort();
  } catch (e) {
    const code = errnoOf(e);
    if (code === 'ENOENT' || code === 'ENOTDIR') return [];
    throw e;
  }
}

/** Parses a `cgroup.procs` / `tasks` file: one pid a line. */
export function parsePids(text: string): number[] {
  return text.split('\n').map((l) => l.trim()).filter((l) => /^\d+$/.test(l)).map(Number);
}

/**
 * Pids (thread-group ids) in `dir`'s `cgroup.procs` and in every descendant cgroup's,
 * deduplicated and sorted; `[]` when `dir` is gone.
 */
export async function readPidsRecursive(dir: string): Promise<number[]> {
  const found = new Set<number>();
  const walk = async (d: string): Promise<void> => {
    const t = await readOptional(path.join(d, 'cgroup.procs'));
    if (t !== null) for (const p of parsePids(t)) found.add(p);
    for (const c of await childDirs(d)) await walk(path.join(d, c));
  };
  await walk(dir);
  return [...found].sort((a, b) => a - b);
}

/** Sends `signal` to each pid, ignoring processes that already exited (ESRCH). */
export function signalPids(pids: number[], signal: NodeJS.Signals): void {
  for (const pid of pids) {
    try {
      process.kill(pid, signal);
    } catch (e) {
      if (errnoOf(e) !== 'ESRCH') throw e;
    }
  }
}

/** Resolves after `ms` milliseconds. */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * Calls `check` until it returns true or `timeoutMs` passes: first immediately, then
 * after 1, 2, 4, … ms capped at 20 ms (a freeze normally completes within a couple of
 * ms, and the cap keeps a slow one from costing more than one extra 20 ms step).
 * Resolves true on success, false on timeout; errors from `check` propagate.
 */
export async function pollUntil(check: () => Promise<boolean>, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  let delay = 0;
  for (;;) {
    if (await check()) return true;
    const left = deadline - Date.now();
    if (left <= 0) return false;
    await sleep(Math.min(delay, left));
    delay = Math.min(Math.max(1, delay * 2), 20);
  }
}

/** How long {@link rmdirCgroupTree} retries EBUSY: processes that were just killed take a moment to leave. */
export const RMDIR_BUSY_RETRY_MS = 2000;

/**
 * Removes the cgroup `dir` and its descendant cgroups, deepest first. A cgroup rmdir
 * succeeds although the dir holds interface files; ENOENT counts as done (safe to call
 * twice, safe against a concurrent remover); EBUSY (processes still inside, or a child
 * appearing) is retried until `busyRetryMs` has passed.
 * @throws DsecError(FailedPrecondition) when still busy after the retries; Internal on other errors.
 */
export async function rmdirCgroupTree(dir: string, busyRetryMs = RMDIR_BUSY_RETRY_MS): Promise<void> {
  const deadline = Date.now() + busyRetryMs;
  const removeOne = async (d: string): Promise<void> => {
    for (const c of await childDirs(d)) await removeOne(path.join(d, c));
    let delay = 1;
    for (;;) {
      try {
        await rmdir(d);
        return;
      } catch (e) {
        const code = errnoOf(e);
        if (code === 'ENOENT') return;
        if (code === 'EBUSY' && Date.now() < deadline) {
          // A child may have been created meanwhile: clear children again before retrying.
          for (const c of await childDirs(d)) await removeOne(path.join(d, c));
          await sleep(delay);
          delay = Math.min(delay * 2, 50);
          continue;
        }
        if (code === 'EBUSY') {
          throw failedPrecondition(`cgroup ${d} is still busy after ${busyRetryMs} ms (processes inside?)`, e);
        }
        throw cgroupFsError(e, `rmdir ${d}`);
      }
    }
  };
  await removeOne(dir);
}

/**
 * The I/O scheduler in force on block device `MAJ:MIN` (the bracketed name in
 * `/sys/dev/block/MAJ:MIN/queue/scheduler`, e.g. `none`, `mq-deadline`, `bfq`), or null
 * when the device has no queue directory (a partition: its disk's queue schedules it) or
 * does not exist.
 */
export function deviceScheduler(major: number, minor: number, sysDevBlock = '/sys/dev/block'): string | null {
  try {
    const text = readFileSync(path.join(sysDevBlock, `${major}:${minor}`, 'queue', 'scheduler'), 'utf8');
    return /\[([^\]]+)\]/.exec(text)?.[1] ?? text.trim().split(/\s+/)[0] ?? null;
  } catch {
    return null;
  }
}
