/**
 * Cgroups behind one interface (DESIGN.md §3 "Platform detected once").
 *
 * This module is the only code in dsec that reads or writes `/sys/fs/cgroup`.
 * {@link detectCgroups} runs once at daemon start, decides between cgroup v1 (legacy and
 * hybrid hosts, like the development machine) and v2 (production hosts), and returns a
 * {@link CgroupManager} for one `dsecd` instance.
 *
 * Layout. Every instance owns one parent cgroup per hierarchy,
 * `<hierarchy mount>/<dsecd's own cgroup>/dsec-<instance>`, and every container sandbox
 * gets `<parent>/<sandbox id>`. runc (cgroupfs driver) is handed the relative
 * `cgroupsPath` `dsec-<instance>/<id>` ({@link CgroupManager.runtimePath}) and resolves it
 * against its own cgroup, which it inherits from dsecd, so runc and this module agree on
 * the directory without passing absolute paths around. runc creates the sandbox cgroup
 * and applies the OCI limits; this module creates/removes the instance parents, reads
 * stats, freezes/thaws, kills and removes sandbox cgroups. Instances never look outside
 * their own `dsec-<instance>` dirs, so several dsecd instances run side by side.
 */
import { constants as fsc } from 'node:fs';
import { open, readFile } from 'node:fs/promises';
import path from 'node:path';
import { INSTANCE_DIR_PREFIX, assertInstanceName, cgroupFsError, childDirs, errnoOf, isDir, isFile, parseMountinfo, parseProcCgroup, resolveLayout } from './procfs.js';
import { CgroupV1Manager } from './v1.js';
import { CgroupV2Manager, DAEMON_LEAF } from './v2.js';
import type { CgroupManager } from './types.js';

export { CgroupV1Manager } from './v1.js';
export { CgroupV2Manager, DAEMON_LEAF, V2_CONTROLLERS } from './v2.js';
export { INSTANCE_NAME_RE, SANDBOX_ID_RE } from './procfs.js';
export * from './io.js';
export type { CgroupLaunchStep, CgroupLimits, CgroupManager, CgroupStats } from './types.js';

/** Where cgroupfs is mounted on a normal Linux host. */
export const DEFAULT_MOUNT_ROOT = '/sys/fs/cgroup';

/** Options of {@link detectCgroups}. The text options exist so tests can feed samples. */
export interface DetectOptions {
  /** dsecd instance name, `^[a-z0-9][a-z0-9_.-]{0,62}$`. */
  instance: string;
  /** Where cgroupfs is mounted; default `/sys/fs/cgroup`. A test passes a temp dir shaped like cgroupfs. */
  mountRoot?: string;
  /** Text of /proc/self/cgroup; default: read it. */
  procSelfCgroup?: string;
  /** Text of /proc/self/mountinfo; default: read it. */
  mountinfo?: string;
}

/**
 * Detects the host's cgroup version and layout and returns the manager for
 * `opts.instance`. v2 when `mountRoot` is itself a cgroup2 mount, or (test trees) when
 * `mountRoot` holds `cgroup.controllers` and no v1 hierarchy is mounted under it;
 * otherwise v1 with every `cgroup` hierarchy mounted under `mountRoot` (including
 * `name=systemd`) plus the hybrid `unified` cgroup2 mount. Reads only /proc/self/*
 * and `<mountRoot>/cgroup.controllers`; creates nothing (call `init()` for that).
 * @throws DsecError(InvalidArgument) for a bad instance name; FailedPrecondition when no
 * cgroup hierarchy is found or the own cgroup is not visible; Internal for malformed proc files.
 */
export async function detectCgroups(opts: DetectOptions): Promise<CgroupManager> {
  assertInstanceName(opts.instance);
  const mountRoot = path.resolve(opts.mountRoot ?? DEFAULT_MOUNT_ROOT);
  const procText = opts.procSelfCgroup ?? (await readFile('/proc/self/cgroup', 'utf8'));
  const mountText = opts.mountinfo ?? (await readFile('/proc/self/mountinfo', 'utf8'));
  const layout = resolveLayout(parseProcCgroup(procText), parseMountinfo(mountText), mountRoot, {
    fallbackV2: await isFile(path.join(mountRoot, 'cgroup.controllers')),
  });
  return layout.version === 2
    ? new CgroupV2Manager(opts.instance, layout.hierarchies[0])
    : new CgroupV1Manager(opts.instance, layout.hierarchies);
}

/** How deep below a hierarchy's mount point {@link locateInstanceParents} looks: 8 levels. */
const LOCATE_DEPTH = 8;

/**
 * Where the cgroups of `current`'s instance are, per hierarchy key: the parent recorded
 * in `<root>/cgroup-parents.json` (`recorded`) when it is a valid instance parent
 * ({@link isInstanceParent}) that exists; otherwise the `dsec-<instance>` directory found
 * below the hierarchy's mount point (breadth first, {@link LOCATE_DEPTH} levels, not
 * descending into other `dsec-*` directories), the one with the most sandbox cgroups
 * when there are several, `current`'s own parent on a tie. Keys where none exists are
 * left out. `dsecd --purge` uses it so that a purge finds the sandboxes whatever cgroup
 * it was started from, also when the record is missing, cut short or names cgroups
 * that are gone.
 * @throws Error (errno-coded) of a directory read other than ENOENT/ENOTDIR.
 */
export async function locateInstanceParents(recorded: Record<string, string> | null, current: CgroupManager): Promise<Record<string, string>> {
  const name = `${INSTANCE_DIR_PREFIX}${current.instance}`;
  const out: Record<string, string> = {};
  const searched = new Map<string, string | null>();
  for (const [k, mount] of Object.entries(current.mountPoints)) {
    const r = recorded?.[k];
    if (typeof r === 'string' && isInstanceParent(r, mount, current.instance) && await isDir(r)) {
      out[k] = r;
      continue;
    }
    if (!searched.has(mount)) {
      const found: string[] = [];
      let level = [mount];
      for (let depth = 0; depth < LOCATE_DEPTH && level.length > 0; depth++) {
        const next: string[] = [];
        for (const dir of level) {
          for (const c of await childDirs(dir)) {
            if (c === name) found.push(path.join(dir, c));
            else if (!c.startsWith(INSTANCE_DIR_PREFIX)) next.push(path.join(dir, c));
          }
        }
        level = next;
      }
      const counted = await Promise.all(found.map(async (d) => ({ d, n: (await childDirs(d)).length })));
      counted.sort((a, b) => b.n - a.n || Number(b.d === current.parents[k]) - Number(a.d === current.parents[k]));
      searched.set(mount, counted[0]?.d ?? null);
    }
    const hit = searched.get(mount);
    if (hit) out[k] = hit;
  }
  return out;
}

/**
 * Whether `dir` can be an instance parent of `instance` in the hierarchy mounted at
 * `mount`: an absolute, normalized path strictly below `mount` whose last component is
 * `dsec-<instance>`. A record that says otherwise (edited, or another tool's) is not
 * followed.
 */
export function isInstanceParent(dir: string, mount: string, instance: string): boolean {
  return path.isAbsolute(dir) && path.normalize(dir) === dir && dir.startsWith(`${mount}/`)
    && path.basename(dir) === `${INSTANCE_DIR_PREFIX}${instance}`;
}

/**
 * Moves this process into the cgroups that the instance parents `parents` hang from
 * (from {@link locateInstanceParents}), so that a manager detected afterwards
 * ({@link detectCgroups}) has exactly those parents. `dsecd --purge` does this when it
 * runs from another cgroup than the dsecd that made the sandboxes (an ssh session's,
 * while the service ran under systemd; every command of some job runners runs in a
 * memory cgroup of its own), where a start is refused (startup/host.ts
 * checkCgroupParents): a purge that refused left the sandboxes' cgroups behind. For each
 * hierarchy key whose parent differs from `current.parents`, the process joins the
 * parent's parent directory, the cgroup dsecd ran in; on v2 its `dsecd` leaf when that
 * exists (a v2 cgroup with children holds no processes). Parents that are not valid
 * ({@link isInstanceParent}) are skipped, and cgroup.procs is opened without O_CREAT, so
 * nothing but a cgroup is ever written; a cgroup that is gone is skipped.
 * @returns the hierarchy keys whose cgroup this process joined (empty: nothing moved).
 * @throws DsecError from a failed write to cgroup.procs other than ENOENT (e.g.
 * Internal for EACCES without root).
 */
export async function joinRecordedCgroups(parents: Record<string, string>, current: CgroupManager): Promise<string[]> {
  const joined: string[] = [];
  const done = new Set<string>();
  for (const [k, parent] of Object.entries(parents)) {
    const mount = current.mountPoints[k];
    if (mount === undefined || current.parents[k] === parent || !isInstanceParent(parent, mount, current.instance)) continue;
    let dir = path.dirname(parent);
    if (current.version === 2 && await isDir(path.join(dir, DAEMON_LEAF))) dir = path.join(dir, DAEMON_LEAF);
    if (!done.has(dir)) {
      try {
        const fh = await open(path.join(dir, 'cgroup.procs'), fsc.O_WRONLY);
        try {
          await fh.write(String(process.pid));
        } finally {
          await fh.close();
        }
      } catch (e) {
        if (errnoOf(e) === 'ENOENT') continue;
        throw cgroupFsError(e, `join ${dir}`);
      }
      done.add(dir);
    }
    joined.push(k);
  }
  return joined;
}
