/**
 * A sandbox's quota lifted for the moment its overlay is mounted, and put back, crash
 * safe. Why: overlayfs creates and cleans its work dir (`work/work`) at every mount, and
 * on a layer at its quota that fails with EDQUOT, so the overlay comes up read-only: a
 * sandbox that filled its disk could never start again to delete a file. With the limit
 * lifted for those few milliseconds the mount is read-write; once it is back the layer is
 * over or at its quota again, so writes still fail with EDQUOT, and deleting frees room.
 *
 * Each lift is recorded in `<root>/storage/lifted/<id>.json` (fsynced) before it is made
 * and removed once the limit is back, so a dsecd that dies in between leaves the record
 * and the next start puts the limit back ({@link restoreLifted}) before any sandbox runs.
 */
import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, readFileSync, readdirSync, renameSync, rmSync, writeSync } from 'node:fs';
import path from 'node:path';
import type { Logger } from 'pino';
import { internal } from '../errors.js';
import type { StoreEntries } from './layout.js';

/** `<root>/storage/lifted/<id>.json`: the quota of sandbox `id` is lifted while its overlay is mounted. */
interface LiftedQuota {
  version: 1;
  /** The sandbox (also the file's name). */
  id: string;
  /** The limit in force before the lift, bytes: btrfs max-referenced or XFS block hard limit. */
  limitBytes: number;
  /** When it was lifted, ms since the epoch (for the operator reading the file). */
  liftedAt: number;
}

/** The lifted-quota record in `file`, or null when there is none or it is unreadable. */
function readLifted(file: string): LiftedQuota | null {
  try {
    const l = JSON.parse(readFileSync(file, 'utf8')) as LiftedQuota;
    return typeof l.id === 'string' && Number.isSafeInteger(l.limitBytes) && l.limitBytes > 0 ? l : null;
  } catch {
    return null;
  }
}

/**
 * Writes `data` to `<dir>/<name>` so that it survives a crash of dsecd or of the host
 * once this returns: temp file, fsync, rename, fsync of the directory (mode 0600, `dir`
 * made 0700 when missing).
 */
function writeDurably(dir: string, name: string, data: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const f = path.join(dir, name);
  const fd = openSync(`${f}.tmp`, 'w', 0o600);
  try {
    writeSync(fd, data);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(`${f}.tmp`, f);
  const dfd = openSync(dir, 'r');
  try {
    fsyncSync(dfd);
  } finally {
    closeSync(dfd);
  }
}

/** True while sandbox `id`'s quota is lifted (a record in `liftedDir`). */
export function isLifted(liftedDir: string, id: string): boolean {
  return existsSync(path.join(liftedDir, `${id}.json`));
}

/** Drops the lift record of sandbox `id` (its entry is gone). */
export function forgetLifted(liftedDir: string, id: string): void {
  rmSync(path.join(liftedDir, `${id}.json`), { force: true });
}

/**
 * Puts back every quota a previous dsecd lifted and did not restore (it died inside
 * {@link withQuotaLifted}); call before any sandbox is adopted or started. A record whose
 * entry is gone is dropped. A limit the kernel refuses to set is logged and its record
 * kept: the sandbox's next start retries it and fails while it cannot, so no sandbox runs
 * with its quota lifted.
 */
export function restoreLifted(liftedDir: string, entries: StoreEntries, log: Logger): void {
  let names: string[];
  try {
    names = readdirSync(liftedDir);
  } catch {
    return; // none yet
  }
  for (const name of names) {
    const file = path.join(liftedDir, name);
    // A record never renamed into place: its lift was never made.
    if (name.endsWith('.tmp')) {
      rmSync(file, { force: true });
      continue;
    }
    const l = readLifted(file);
    if (!l) {
      log.error({ file }, 'unreadable record of a lifted sandbox quota: set the limit of that sandbox by hand, then delete the file');
      continue;
    }
    if (!entries.has(l.id)) {
      rmSync(file, { force: true });
      continue;
    }
    try {
      entries.setLimit(l.id, l.limitBytes);
    } catch (e) {
      log.error({ err: e, id: l.id, limitBytes: l.limitBytes }, 'putting back a sandbox quota left lifted by an interrupted start failed; its next start retries');
      continue;
    }
    rmSync(file, { force: true });
    log.warn({ id: l.id, limitBytes: l.limitBytes }, 'put back a sandbox quota left lifted by an interrupted start');
  }
}

/**
 * Runs `mount` (the overlay mount of sandbox `id`, whose entry is in `entries`) with the
 * entry's quota lifted, and puts the limit back before returning. Nothing of the sandbox
 * runs during the window (it is not started yet), so nothing else can write past the quota.
 * The limit is read from the kernel and recorded before it is lifted; a record already
 * there (its restore failed) is the limit to put back. Without a limit on the entry
 * `mount` just runs. `mount`'s own error is rethrown after the limit is back.
 * @throws DsecError Internal when the limit cannot be put back (the record stays, so the
 *   next start of dsecd or of the sandbox retries); the caller must then not start the
 *   sandbox.
 */
export async function withQuotaLifted<T>(liftedDir: string, entries: StoreEntries, id: string, log: Logger, mount: () => Promise<T>): Promise<T> {
  const file = path.join(liftedDir, `${id}.json`);
  const pending = readLifted(file);
  const limit = pending?.limitBytes ?? entries.limitOf(id);
  if (limit === null) return mount();
  if (!pending) {
    const l: LiftedQuota = { version: 1, id, limitBytes: limit, liftedAt: Date.now() };
    writeDurably(liftedDir, `${id}.json`, JSON.stringify(l));
  }
  entries.setLimit(id, 0);
  let result!: T;
  let failure: { e: unknown } | null = null;
  try {
    result = await mount();
  } catch (e) {
    failure = { e };
  }
  try {
    entries.setLimit(id, limit);
  } catch (e) {
    if (failure) log.warn({ err: failure.e, id }, 'the overlay mount failed while the quota was lifted');
    throw internal(`putting back the ${limit}-byte quota of sandbox ${id} after mounting its overlay failed (${(e as Error).message}); the sandbox is not started, and the next start of dsecd or of the sandbox puts it back (${file})`, e);
  }
  rmSync(file, { force: true });
  if (failure) throw failure.e;
  return result;
}
