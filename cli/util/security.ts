/**
 * The security flags shared by `dsec create`/`run` (the sandbox's own options) and by
 * `dsec image build|import|compose` and `dsec commit` (an image's security defaults,
 * docs/IMAGES.md "Security defaults"):
 *
 *   --writable PATH        keep PATH writable (repeatable): an exception below a read-only
 *                          path, or a directory the image lacks, which dsecd creates
 *   --readonly PATH        the read-only paths (repeatable; replaces the default list
 *                          /bin /sbin /usr /lib* /etc; `*` in the last component; `/` = all)
 *   --no-readonly          no read-only paths (readonly_paths [])
 *   --landlock, --no-landlock
 *   --seccomp-allow NAME, --seccomp-deny NAME   (image commands; create has its own)
 *
 * A flag left out leaves the field out, so it falls through to the image, then dsecd's
 * config (daemon/security/filesystem.ts). Paths are checked here only for being
 * absolute; dsecd validates the rest and names the bad entry.
 */
import type { Command } from 'commander';
import type { CreateSandboxInput, ImageConfig } from '../../sdk/index.js';
import { UserError } from './errors.js';
import { flag } from './parse.js';

/** The `filesystem` object of a create request. */
type FilesystemSpec = NonNullable<CreateSandboxInput['filesystem']>;

/** Parsed filesystem flags, as commander hands them to an action. */
export interface FilesystemFlags {
  /** `--writable`, accumulated. */
  writable?: string[];
  /** `--readonly`, accumulated; false for `--no-readonly`. */
  readonly?: string[] | false;
  /** `--landlock` (true) or `--no-landlock` (false). */
  landlock?: boolean;
}

/** Parsed image security flags: the filesystem ones and the seccomp ones. */
export interface ImageSecurityFlags extends FilesystemFlags {
  /** `--seccomp-allow`, accumulated. */
  seccompAllow?: string[];
  /** `--seccomp-deny`, accumulated. */
  seccompDeny?: string[];
}

/** Commander collector of repeatable absolute paths. */
function collectPath(text: string, prev: string[] | false | undefined): string[] {
  if (!text.startsWith('/')) throw new UserError(`${JSON.stringify(text)} is not an absolute path`, 'paths are inside the sandbox, e.g. /work or /usr/local');
  return [...(Array.isArray(prev) ? prev : []), text];
}

/** Commander collector for repeatable syscall names (`--seccomp-allow ptrace`). */
export function collectSyscall(text: string, prev: string[] | undefined): string[] {
  if (!/^[a-z_][a-z0-9_]*$/.test(text)) throw new UserError(`${JSON.stringify(text)} is not a syscall name`, 'names are lowercase, e.g. ptrace or io_uring_setup');
  return [...(prev ?? []), text];
}

/**
 * Adds `--writable`, `--readonly`, `--no-readonly`, `--landlock`, `--no-landlock` to `cmd`.
 * `where` names in the help what they apply to ("the sandbox", "the image's sandboxes").
 */
export function addFilesystemOptions(cmd: Command, where: string): Command {
  return cmd
    .option('--writable <path>', `keep this path writable in ${where}, repeatable: an exception below a read-only path (e.g. /usr/local) or a directory the image lacks (e.g. /work), created by dsecd`, flag('--writable', collectPath))
    .option('--readonly <path>', `make this path read-only even to root in ${where}, repeatable; replaces the default list /bin /sbin /usr /lib* /etc (a * in the last component is a glob; / makes everything read-only except --writable paths)`, flag('--readonly', collectPath))
    .option('--no-readonly', 'no read-only system paths (readonly_paths [])')
    .option('--landlock', 'restrict file access with Landlock (the default where the kernel has it)')
    .option('--no-landlock', 'do not restrict file access with Landlock');
}

/** Adds the filesystem options and `--seccomp-allow`, `--seccomp-deny` (an image's security defaults). */
export function addImageSecurityOptions(cmd: Command): Command {
  return addFilesystemOptions(cmd, "the image's sandboxes")
    .option('--seccomp-allow <syscall>', "lift the default seccomp profile's denial of this syscall for sandboxes of the image (e.g. ptrace), repeatable", flag('--seccomp-allow', collectSyscall))
    .option('--seccomp-deny <syscall>', 'also deny this syscall (EPERM) in sandboxes of the image, repeatable', flag('--seccomp-deny', collectSyscall));
}

/** The `filesystem` object for the flags, or undefined when none was given. */
export function filesystemOf(f: FilesystemFlags): FilesystemSpec | undefined {
  const out: FilesystemSpec = {};
  if (f.writable !== undefined) out.writable_paths = f.writable;
  if (f.readonly !== undefined) out.readonly_paths = f.readonly === false ? [] : f.readonly;
  if (f.landlock !== undefined) out.landlock = f.landlock;
  return Object.keys(out).length > 0 ? out : undefined;
}

/** An image's `security` object for the flags, or undefined when none was given. */
export function imageSecurityOf(f: ImageSecurityFlags): NonNullable<ImageConfig['security']> | undefined {
  const out: NonNullable<ImageConfig['security']> = { ...(filesystemOf(f) ?? {}) };
  if (f.seccompAllow !== undefined || f.seccompDeny !== undefined) {
    out.seccomp = { ...(f.seccompAllow ? { allow: f.seccompAllow } : {}), ...(f.seccompDeny ? { deny: f.seccompDeny } : {}) };
  }
  return Object.keys(out).length > 0 ? out : undefined;
}
