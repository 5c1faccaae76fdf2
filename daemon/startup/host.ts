/**
 * What dsecd checks and prepares on the host before it touches a sandbox: its state
 * directories and their modes, the API socket, the cgroup parents it was started under,
 * and where its binaries are.
 */
import { chmodSync, chownSync, existsSync, mkdirSync, readFileSync, renameSync, statSync, unlinkSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Logger } from 'pino';
import { failedPrecondition } from '../errors.js';
import { openDb } from '../db/db.js';

/** Longest Unix socket path the kernel accepts (sun_path is 108 bytes with the NUL). */
const MAX_SOCKET_PATH = 107;

/** Repository root (dir with package.json), found from this file in dist/ or in the source tree. */
export function repoRoot(): string {
  let d = path.dirname(fileURLToPath(import.meta.url));
  while (d !== '/' && !existsSync(path.join(d, 'package.json'))) d = path.dirname(d);
  return d;
}

/** The static agent binary built by the install step (`make -C native`); `DSEC_AGENT_BINARY` overrides it. */
export function agentBinaryPath(): string {
  return process.env.DSEC_AGENT_BINARY ?? path.join(repoRoot(), 'native', 'agent', 'dsec-agent');
}

/** The VMM launcher of the VM tiers (`make -C native`): joins the sandbox's cgroup, execs QEMU; `DSEC_VMM_LAUNCHER` overrides it. */
export function vmmLauncherPath(): string {
  return process.env.DSEC_VMM_LAUNCHER ?? path.join(repoRoot(), 'native', 'vmm', 'dsec-vmm-launch');
}

/**
 * Refuses a root whose agent socket paths would not fit a Unix socket address.
 * @throws DsecError FailedPrecondition.
 */
export function checkRootLength(root: string): void {
  if (path.join(root, 'sandboxes', 'x'.repeat(16), 'agent.sock.tmp').length > MAX_SOCKET_PATH) {
    throw failedPrecondition(`root ${root} is too long: agent socket paths under it would exceed ${MAX_SOCKET_PATH} bytes`);
  }
}

/**
 * Makes the state directories with their modes: a sandbox's init (an unprivileged host
 * uid) must traverse the root and sandboxes/ to reach its rootfs (0711, not listable);
 * everything else is root-only (the store holds sandbox env, which may be secrets; blob
 * mounts expose image files). The database file and SQLite's -wal/-shm files are 0600.
 * @throws DsecError FailedPrecondition when a directory above the root is not searchable by others.
 */
export function prepareStateDirs(root: string): void {
  for (const [d, mode] of [['', 0o711], ['sandboxes', 0o711], ['images', 0o700], ['layers', 0o700], ['runtime', 0o700]] as const) {
    mkdirSync(path.join(root, d), { recursive: true, mode });
    chmodSync(path.join(root, d), mode);
  }
  // SQLite creates the -wal and -shm files with the database file's mode.
  const dbFile = path.join(root, 'dsec.db');
  if (!existsSync(dbFile)) writeFileSync(dbFile, '', { mode: 0o600 });
  chmodSync(dbFile, 0o600);
  for (const f of [`${dbFile}-wal`, `${dbFile}-shm`]) if (existsSync(f)) chmodSync(f, 0o600);
  assertTraversable(root);
}

/**
 * The runtime sets up a sandbox's rootfs from inside its user namespace, as the
 * sandbox's (unprivileged) host uid, so every directory above a sandbox's rootfs must
 * be searchable by others (mode o+x).
 * @throws DsecError FailedPrecondition naming the first directory that is not.
 */
function assertTraversable(dir: string): void {
  for (let d = path.resolve(dir); ; d = path.dirname(d)) {
    const st = statSync(d);
    if ((st.mode & 0o001) === 0) {
      throw failedPrecondition(`${d} (mode ${(st.mode & 0o777).toString(8)}) is not searchable by other users; sandboxes under ${dir} could not reach their rootfs. chmod o+x ${d} or choose another --root`);
    }
    if (d === '/') return;
  }
}

/**
 * The instance parents (hierarchy key → absolute cgroup dir) recorded in
 * `<root>/cgroup-parents.json` by the last start, or null when there is no such file or
 * it does not parse (a first start).
 */
export function recordedCgroupParents(root: string): Record<string, string> | null {
  try {
    const v: unknown = JSON.parse(readFileSync(path.join(root, 'cgroup-parents.json'), 'utf8'));
    return v && typeof v === 'object' && !Array.isArray(v) ? v as Record<string, string> : null;
  } catch {
    return null;
  }
}

/**
 * Sandboxes of an instance live in cgroups below the cgroup dsecd ran in when it
 * created them (runc resolves the relative cgroupsPath against its own cgroup). If
 * dsecd is later started from a different cgroup (another login session rather than
 * its systemd service), it would not find them. The parents are recorded in
 * `<root>/cgroup-parents.json`; a start from elsewhere is refused while sandboxes exist
 * (`dsecd --purge` does not check: it finds and joins the cgroups, host/cgroups locateInstanceParents).
 * @throws DsecError FailedPrecondition naming the hierarchy whose parent moved.
 */
export function checkCgroupParents(root: string, parents: Record<string, string>): void {
  const file = path.join(root, 'cgroup-parents.json');
  const dbFile = path.join(root, 'dsec.db');
  const recorded = recordedCgroupParents(root);
  if (recorded) {
    const moved = Object.keys(parents).filter((k) => recorded![k] !== undefined && recorded![k] !== parents[k]);
    if (moved.length && existsSync(dbFile)) {
      const db = openDb(dbFile);
      const n = (db.prepare('SELECT COUNT(*) n FROM sandboxes').get() as { n: number }).n;
      db.close();
      if (n > 0) {
        const k = moved[0];
        throw failedPrecondition(`dsecd was started from another cgroup: its ${k} parent would be ${parents[k]}, but this instance's ${n} sandbox(es) live under ${recorded[k]}. Start dsecd the way it was started before (e.g. systemctl start dsecd), or remove the sandboxes with dsecd --purge (which finds them from any cgroup)`);
      }
    }
  }
  // Temp file and rename: a start killed mid-write must not leave a cut-off record.
  const tmp = `${file}.tmp${process.pid}`;
  writeFileSync(tmp, JSON.stringify(parents, null, 1));
  renameSync(tmp, file);
}

/**
 * Makes the socket's directory and removes a stale socket file.
 * @throws DsecError FailedPrecondition when another live daemon answers there.
 */
export async function claimSocket(socket: string): Promise<void> {
  mkdirSync(path.dirname(socket), { recursive: true, mode: 0o755 });
  if (!existsSync(socket)) return;
  const alive = await new Promise<boolean>((resolve) => {
    const c = net.connect(socket);
    c.once('connect', () => { c.destroy(); resolve(true); });
    c.once('error', () => resolve(false));
  });
  if (alive) throw failedPrecondition(`another dsecd is serving ${socket}; stop it or pass --socket`);
  unlinkSync(socket);
}

/** Gives the socket mode 0660 and group `dsec` when that group exists (a failure to set the group is logged). */
export function secureSocket(socket: string, log: Logger): void {
  chmodSync(socket, 0o660);
  try {
    const line = readFileSync('/etc/group', 'utf8').split('\n').find((l) => l.startsWith('dsec:'));
    if (line) chownSync(socket, 0, Number(line.split(':')[2]));
  } catch (e) {
    log.warn({ err: e }, 'could not set socket group');
  }
}
