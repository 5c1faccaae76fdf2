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
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { assertInstanceName, cgroupFsError, errnoOf, isDir, isFile, parseMountinfo, parseProcCgroup, resolveLayout } from './procfs.js';
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

/**
 * Moves this process into the cgroups that an instance's recorded parents hang from, so
 * that a manager detected afterwards ({@link detectCgroups}) has exactly those parents.
 * `dsecd --purge` does this when it runs from another cgroup than the dsecd that made the
 * sandboxes (an ssh session's, while the service ran under systemd; every command of
 * some job runners runs in a memory cgroup of its own), where a start is refused
 * (startup/host.ts checkCgroupParents): a purge that refused left the sandboxes' cgroups
 * behind. For each hierarchy key whose recorded parent differs from `current.parents`,
 * the process joins the recorded parent's parent directory, the cgroup dsecd ran in; on
 * v2 its `dsecd` leaf when that exists (a v2 cgroup with children holds no processes).
 * A recorded cgroup that is gone is skipped: the parent below it is gone too.
 * @param recorded hierarchy key → absolute instance parent, as startup/host.ts
 * recordedCgroupParents returns it.
 * @returns the hierarchy keys whose cgroup this process joined (empty: nothing moved).
 * @throws DsecError from a failed write to cgroup.procs other than ENOENT (e.g.
 * Internal for EACCES without root).
 */
export async function joinRecordedCgroups(recorded: Record<string, string>, current: CgroupManager): Promise<string[]> {
  const joined: string[] = [];
  const done = new Set<string>();
  for (const [k, parent] of Object.entries(recorded)) {
    if (current.parents[k] === undefined || current.parents[k] === parent || typeof parent !== 'string') continue;
    let dir = path.dirname(parent);
    if (current.version === 2 && await isDir(path.join(dir, DAEMON_LEAF))) dir = path.join(dir, DAEMON_LEAF);
    if (done.has(dir)) {
      joined.push(k);
      continue;
    }
    try {
      await writeFile(path.join(dir, 'cgroup.procs'), String(process.pid));
    } catch (e) {
      if (errnoOf(e) === 'ENOENT') continue;
      throw cgroupFsError(e, `join ${dir}`);
    }
    done.add(dir);
    joined.push(k);
  }
  return joined;
}
