/**
 * Host-side helpers of the VM tiers: executables and processes (finding QEMU, waiting for
 * a VMM to be gone, who owns it, the group of /dev/kvm), VM disk copies, Unix sockets,
 * and the byte encodings of guest-op arguments.
 */
import { accessSync, constants as fsConstants, readFileSync, statSync } from 'node:fs';
import { rename, rm } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { execa } from 'execa';
import { internal, unavailable } from '../../errors.js';
import { procStartTime } from '../../host/proc.js';

/** Resolves after `ms` milliseconds. */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** `v` as 4 bytes, big-endian (a guest op's argument). */
export function u32(v: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(v >>> 0, 0);
  return b;
}

/** `v` as 8 bytes, big-endian (a guest op's argument). */
export function u64(v: bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(v, 0);
  return b;
}

/**
 * Copies a VM's writable disk: a reflink (`cp --reflink=always`: the copy shares every
 * block until either side writes) where the filesystem has them (btrfs, XFS), else a
 * sparse copy (`cp --sparse=always`: holes stay holes, only the blocks the guest wrote
 * are copied). Written to `<to>.tmp` and renamed, so `to` is always complete.
 * @throws DsecError Internal with cp's message.
 */
export async function copyDisk(from: string, to: string): Promise<{ reflinked: boolean }> {
  const tmp = `${to}.tmp`;
  await rm(tmp, { force: true });
  let reflinked = true;
  let r = await execa('cp', ['--reflink=always', from, tmp], { reject: false });
  if (r.exitCode !== 0) {
    reflinked = false;
    await rm(tmp, { force: true });
    r = await execa('cp', ['--sparse=always', from, tmp], { reject: false });
  }
  if (r.exitCode !== 0) {
    await rm(tmp, { force: true });
    throw internal(`copying the VM disk ${from} to ${to} failed: ${String(r.stderr).trim() || `cp exit ${r.exitCode}`}`);
  }
  await rename(tmp, to);
  return { reflinked };
}

/** Connects to a Unix socket. @throws DsecError Unavailable. */
export function connectUnix(p: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const c = net.createConnection({ path: p });
    c.once('connect', () => {
      c.removeAllListeners('error');
      c.on('error', () => {});
      resolve(c);
    });
    c.once('error', (e) => reject(unavailable(`cannot connect to ${p}: ${e.message}`, e)));
  });
}

/** The real uid and gid of a process (/proc/<pid>/status), or null when it is gone. */
export function procOwner(pid: number): { uid: number; gid: number } | null {
  try {
    const s = readFileSync(`/proc/${pid}/status`, 'utf8');
    const uid = Number(/^Uid:\s*(\d+)/m.exec(s)?.[1]);
    const gid = Number(/^Gid:\s*(\d+)/m.exec(s)?.[1]);
    return Number.isInteger(uid) && Number.isInteger(gid) ? { uid, gid } : null;
  } catch {
    return null;
  }
}

/** Waits until `pid` no longer exists (or is a zombie), polling every 20 ms, at most `ms`. */
export async function waitGone(pid: number, ms: number): Promise<boolean> {
  const until = Date.now() + ms;
  while (procStartTime(pid) !== null) {
    if (Date.now() >= until) return false;
    await sleep(20);
  }
  return true;
}

/** `name` itself when it contains a '/', else the first executable `PATH` entry of that name; null when there is none. */
export function findExecutable(name: string): string | null {
  const ok = (p: string) => {
    try {
      accessSync(p, fsConstants.X_OK);
      return isFile(p);
    } catch {
      return false;
    }
  };
  if (name.includes('/')) return ok(name) ? path.resolve(name) : null;
  for (const d of (process.env.PATH ?? '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin').split(':')) {
    if (d && ok(path.join(d, name))) return path.join(d, name);
  }
  return null;
}

/** Whether `p` is a regular file (following symlinks). */
export function isFile(p: string): boolean {
  try {
    return statSync(p).isFile();
  } catch {
    return false;
  }
}

/** The group of /dev/kvm when it grants that group read-write access (so an unprivileged VMM in it can use KVM), else null. */
export function kvmGroup(): number | null {
  try {
    const st = statSync('/dev/kvm');
    return st.gid !== 0 && (st.mode & 0o060) === 0o060 ? st.gid : null;
  } catch {
    return null;
  }
}
