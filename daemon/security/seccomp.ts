/**
 * The seccomp filter of every container sandbox: a default profile kept as data
 * (`profiles/seccomp-default.json`, OCI runtime-spec `linux.seccomp` shape plus `comment`
 * keys), validated at load, merged with per-image and per-sandbox overrides, and handed to
 * runc (which compiles it with libseccomp and installs it on the container's init, the
 * agent, just before it execs; every process of the sandbox inherits it).
 *
 * Approach: **allow by default, deny a named list** with EPERM (SCMP_ACT_ERRNO, errnoRet 1).
 * Docker's profile is an allowlist (~350 names, unknown ones fail with EPERM/ENOSYS); it
 * is stronger against syscalls added by future kernels, but it has to track every new
 * syscall sandboxes legitimately need (and RL tasks run arbitrary toolchains), and most
 * of what it removes is already refused here by the missing capabilities (CAP_SYS_ADMIN,
 * CAP_SYS_MODULE, CAP_SYS_TIME, ...) and the user namespace. What capabilities do *not*
 * stop is what this list is about: syscalls any uid may call that are large kernel attack
 * surfaces (bpf, userfaultfd, perf_event_open, io_uring, keyrings, nested user namespaces)
 * and ioctls that need only write access to a file (XFS_IOC_SWAPEXT and its relatives).
 * A denylist is also short enough to review line by line in the data file.
 *
 * Decisions recorded here (each rule carries its reason in the data file):
 * - **Architectures**: x86_64, i386 and x32 are all listed, so 32-bit programs run and get
 *   the same denials: libseccomp resolves every name once per ABI (mount is 165 on x86_64,
 *   21 on i386, 165|0x40000000 on x32), so a 32-bit ABI is no way around a rule. An
 *   ioctl number that differs on i386 (XFS_IOC_SWAPEXT_32: the compat struct is 164
 *   bytes, not 192) is listed separately; every ioctl rule applies on every ABI.
 * - **ioctl commands are compared on their low 32 bits** (SCMP_CMP_MASKED_EQ with mask
 *   0xffffffff): the kernel's ioctl takes `unsigned int cmd`, so a caller setting the
 *   upper 32 bits of the register reaches the same command while an exact 64-bit compare
 *   would miss it (the bypass of CVE-2019-10063 / CVE-2017-5226 TIOCSTI filters).
 * - **Allowed on purpose**: FICLONE/FICLONERANGE/FIDEDUPERANGE (reflinks need write
 *   access to the destination and share extents without moving them; coreutils cp uses
 *   FICLONE by default), FS_IOC_SETFLAGS (the dangerous flags, immutable and append-only,
 *   need CAP_LINUX_IMMUTABLE, which no sandbox has), vmsplice, adjtimex and clock_adjtime
 *   (reads use them; writes need CAP_SYS_TIME).
 * - **ptrace, process_vm_readv/writev, pidfd_getfd are denied** although the sandbox's pid
 *   namespace, the non-dumpable agent and the missing CAP_SYS_PTRACE already keep them
 *   from reaching anything outside: a task's grader may run in the same sandbox, at the
 *   same uid, and must not have its memory read. An image that needs gdb or strace gets
 *   `allow: ["ptrace"]`.
 * - **Socket families** are checked on socket's argument 0: AF_VSOCK and every family
 *   from 39 up (SCMP_CMP_GE on all 64 bits, so high bits cannot hide one), and a list of
 *   unused, module-loaded families (MASKED_EQ on the low 32 bits: the kernel reads an
 *   int). vsock is not per network namespace, and the eBPF sock_create hook sees only
 *   inet sockets. On i386 libseccomp turns these rules into socketcall(SYS_SOCKET)
 *   without the family (its arguments are in memory), which denies socket() through
 *   socketcall outright; the direct i386 socket syscall gets the family checks.
 * - **Nested user namespaces** (unshare/clone with CLONE_NEWUSER) and setns are denied;
 *   clone3 returns ENOSYS (its flags are in memory, which seccomp cannot read), so libc
 *   falls back to clone, whose flags are checked.
 *
 * fncall workers: the worker's agent itself must mount (mount, mount_setattr) to set up
 * each isolated call, and unmount (umount2) what a call host (native/agent/callhost.h)
 * mounted for the call before, and runc's filter applies to the agent. So a worker's filter leaves
 * exactly {@link WORKER_AGENT_SYSCALLS} allowed, and the agent (`--worker`) installs a
 * second, fixed filter denying them with EPERM in every process it starts, before the
 * command's execve (native/agent/confine.c, worker_filter_install). Filters stack and the
 * strictest verdict wins, so every command of a worker runs under exactly the default
 * profile (`Seccomp_filters: 2` in its /proc/self/status).
 *
 * Denial counting: with a monitor (native/seccomp-monitor, daemon/security/seccomp-monitor.ts)
 * the EPERM rules become SCMP_ACT_NOTIFY rules whose listener is the monitor, which
 * answers every notification with EPERM and counts it for the sandbox named in
 * `listenerMetadata` ({@link SeccompInput.notify}). The verdict is unchanged; clone3's
 * ENOSYS stays a plain ERRNO rule (it is a compatibility answer, not a denial).
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';

/** errno values used by the profile. */
export const EPERM = 1;
export const ENOSYS = 38;

/** Syscalls a worker's agent needs for isolated execs; re-denied by the agent's own filter for every command. */
export const WORKER_AGENT_SYSCALLS = ['mount', 'mount_setattr', 'umount2'] as const;

/** _IOC of include/uapi/asm-generic/ioctl.h (x86): dir<<30 | size<<16 | type<<8 | nr. */
export function ioc(dir: 'none' | 'r' | 'w' | 'rw', type: string | number, nr: number, size: number): number {
  const d = { none: 0, w: 1, r: 2, rw: 3 }[dir];
  const t = typeof type === 'string' ? type.charCodeAt(0) : type;
  return ((d << 30) >>> 0) + (size << 16) + (t << 8) + nr;
}

const SYSCALL_NAME = /^[a-z_][a-z0-9_]*$/;

let known: Set<string> | null | undefined;

/**
 * Every syscall name of the x86 ABIs dsec filters (x86_64 and i386; x32 uses the x86_64
 * names), from the table built with the seccomp monitor out of the kernel headers
 * (native/seccomp-monitor/syscalls.json). Null when the table is not built: names are
 * then only checked for their form.
 */
export function knownSyscalls(): Set<string> | null {
  if (known === undefined) {
    known = null;
    for (const u of [new URL('../../native/seccomp-monitor/syscalls.json', import.meta.url), new URL('../../../native/seccomp-monitor/syscalls.json', import.meta.url)]) {
      try {
        const t = JSON.parse(readFileSync(fileURLToPath(u), 'utf8')) as { x86_64: Record<string, string>; i386: Record<string, string> };
        known = new Set([...Object.values(t.x86_64), ...Object.values(t.i386)]);
        break;
      } catch { /* next */ }
    }
  }
  return known;
}

let x86_64Numbers: Map<string, number> | null | undefined;

/**
 * x86-64 syscall numbers by name, from the same table as {@link knownSyscalls}
 * (native/seccomp-monitor/syscalls.json, built from the kernel headers' unistd_64.h):
 * what a microVM guest's filter is built from (daemon/drivers/microvm/confine.ts).
 * Null when the table is not built.
 */
export function syscallNumbersX86_64(): Map<string, number> | null {
  if (x86_64Numbers === undefined) {
    x86_64Numbers = null;
    for (const u of [new URL('../../native/seccomp-monitor/syscalls.json', import.meta.url), new URL('../../../native/seccomp-monitor/syscalls.json', import.meta.url)]) {
      try {
        const t = JSON.parse(readFileSync(fileURLToPath(u), 'utf8')) as { x86_64: Record<string, string> };
        x86_64Numbers = new Map(Object.entries(t.x86_64).map(([nr, name]) => [name, Number(nr)]));
        break;
      } catch { /* next */ }
    }
  }
  return x86_64Numbers;
}

/**
 * A syscall name: its form, and that some x86 ABI has it. A misspelt name would make a
 * denial silently vanish (libseccomp skips names it cannot resolve), so it is refused.
 */
const SyscallName = z.string().regex(SYSCALL_NAME, 'a syscall name such as "io_uring_setup"')
  .superRefine((n, ctx) => {
    if (!(knownSyscalls()?.has(n) ?? true)) ctx.addIssue({ code: 'custom', message: `unknown syscall ${JSON.stringify(n)} (no x86_64 or i386 syscall has that name)` });
  });

const Op = z.enum(['SCMP_CMP_NE', 'SCMP_CMP_LT', 'SCMP_CMP_LE', 'SCMP_CMP_EQ', 'SCMP_CMP_GE', 'SCMP_CMP_GT', 'SCMP_CMP_MASKED_EQ']);
const Action = z.enum(['SCMP_ACT_KILL', 'SCMP_ACT_KILL_PROCESS', 'SCMP_ACT_KILL_THREAD', 'SCMP_ACT_TRAP', 'SCMP_ACT_ERRNO', 'SCMP_ACT_TRACE', 'SCMP_ACT_ALLOW', 'SCMP_ACT_LOG']);
/** Actions of the filter handed to runc: the profile's, plus NOTIFY for counted denials. */
export type OciAction = z.infer<typeof Action> | 'SCMP_ACT_NOTIFY';
const Arg = z.object({
  index: z.number().int().min(0).max(5),
  value: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
  valueTwo: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).optional(),
  op: Op,
}).strict();
const Rule = z.object({
  names: z.array(SyscallName).min(1),
  action: Action,
  errnoRet: z.number().int().min(1).max(4095).optional(),
  args: z.array(Arg).optional(),
  comment: z.string().optional(),
}).strict();

/** The profile data file: OCI `linux.seccomp` plus `comment` keys. */
export const SeccompProfileSchema = z.object({
  comment: z.string().optional(),
  // dsec's model is "allow by default, deny a reviewed list": a profile that kills or
  // fails every other call would stop runc's init and the agent before any sandbox runs.
  defaultAction: z.enum(['SCMP_ACT_ALLOW', 'SCMP_ACT_LOG'], { message: 'defaultAction must be SCMP_ACT_ALLOW (or SCMP_ACT_LOG): dsec profiles allow by default and deny a list; a default that denies would stop runc\'s init and the agent' }),
  // Required, as in OCI: a filter covers only the ABIs listed, and a syscall made through an
  // ABI left out (i386's int 0x80, x32) is not filtered at all.
  architectures: z.array(z.enum(['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86', 'SCMP_ARCH_X32']), {
    error: (iss) => (iss.input === undefined ? 'architectures is required: the ABIs the filter covers, normally ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"] (an ABI left out is not filtered at all)' : undefined),
  }).min(1),
  syscalls: z.array(Rule),
}).strict();
export type SeccompProfile = z.infer<typeof SeccompProfileSchema>;
export type SeccompRule = z.infer<typeof Rule>;

/**
 * Syscalls an override may not deny: what runc's init (between installing the filter and
 * exec'ing the agent: the Go runtime's futex, signals, memory) and the agent (exec of
 * every command, its epoll loop over pipes and its socket, reaping children) cannot run
 * without. Denying one would make every start fail with an opaque runtime error; the
 * sandbox could not run anything. Not exhaustive (a sandbox that denies `openat` breaks
 * its own programs, which is its business), but it covers the calls that break the
 * sandbox itself rather than what runs in it.
 */
export const RUNTIME_SYSCALLS: ReadonlySet<string> = new Set([
  'execve', 'execveat', 'exit', 'exit_group', 'rt_sigreturn', 'rt_sigaction', 'rt_sigprocmask', 'sigaltstack', 'futex',
  'mmap', 'munmap', 'mprotect', 'brk', 'read', 'write', 'close', 'clone', 'wait4', 'waitid',
  'epoll_create1', 'epoll_ctl', 'epoll_wait', 'epoll_pwait', 'recvmsg', 'sendmsg', 'fcntl', 'dup2', 'dup3', 'pipe2',
]);

/**
 * Per-image or per-sandbox change to the default profile. `allow`: drop every denial of
 * these syscalls (all rules naming them, including argument-conditioned ones: allowing
 * `ioctl` lifts every ioctl denial). `deny`: add an unconditional EPERM denial; names in
 * {@link RUNTIME_SYSCALLS} are refused (InvalidArgument at the API).
 */
export const SeccompOverrideSchema = z.object({
  allow: z.array(SyscallName).max(512).optional(),
  deny: z.array(SyscallName.superRefine((n, ctx) => {
    if (RUNTIME_SYSCALLS.has(n)) ctx.addIssue({ code: 'custom', message: `${n} cannot be denied: runc's init and the sandbox agent need it (the sandbox could not start or run anything)` });
  })).max(512).optional(),
}).strict();
export type SeccompOverride = z.infer<typeof SeccompOverrideSchema>;

/** The OCI `linux.seccomp` object as runc 1.1 reads it. */
export interface OciSeccomp {
  defaultAction: string;
  architectures: string[];
  /** Unix socket runc hands the notify fd to (set when any rule is SCMP_ACT_NOTIFY). */
  listenerPath?: string;
  /** Opaque string passed to the listener with the fd: the sandbox id. */
  listenerMetadata?: string;
  syscalls: Array<{ names: string[]; action: string; errnoRet?: number; args?: Array<{ index: number; value: number; valueTwo?: number; op: string }> }>;
}

/** Error of a malformed profile: names the file and the first problems. */
export class SeccompProfileError extends Error {}

/** Parses and validates profile text; throws {@link SeccompProfileError} naming `source`. */
export function parseProfile(text: string, source: string): SeccompProfile {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new SeccompProfileError(`seccomp profile ${source}: not JSON: ${(e as Error).message}`);
  }
  const r = SeccompProfileSchema.safeParse(json);
  if (!r.success) {
    const issues = r.error.issues.slice(0, 3).map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ');
    throw new SeccompProfileError(`seccomp profile ${source}: ${issues}`);
  }
  for (const [n, rule] of r.data.syscalls.entries()) {
    if (rule.action === 'SCMP_ACT_ERRNO' && rule.errnoRet === undefined)
      throw new SeccompProfileError(`seccomp profile ${source}: syscalls.${n}: SCMP_ACT_ERRNO needs errnoRet (runc's default would be EPERM only by accident)`);
  }
  return r.data;
}

/**
 * Where the data file is: next to this module when running from source (vitest), and
 * under the package root when running from dist/ (tsc does not copy data files): the
 * checkout's daemon/security/profiles/, or the installed release's copy of it
 * (scripts/install-release.sh).
 */
export function defaultProfilePath(): string {
  const candidates = [
    new URL('./profiles/seccomp-default.json', import.meta.url),
    new URL('../../../daemon/security/profiles/seccomp-default.json', import.meta.url),
  ].map((u) => fileURLToPath(u));
  for (const p of candidates) {
    try {
      readFileSync(p, { flag: 'r' });
      return p;
    } catch {
      /* next */
    }
  }
  return candidates[0];
}

let cached: SeccompProfile | null = null;

/** Loads (once) and validates the default profile. Throws if it is missing or malformed. */
export function defaultProfile(): SeccompProfile {
  if (!cached) {
    const p = defaultProfilePath();
    cached = parseProfile(readFileSync(p, 'utf8'), p);
  }
  return cached;
}

/**
 * Marks the rules an override's `deny` adds. They stay plain EPERM rules even when
 * denials are counted: runc's init runs between installing the filter and exec'ing the
 * agent, and a notified call there (an override may deny anything, e.g. getpid, which
 * the Go runtime of runc init makes) would wait for a listener that only gets the fd
 * after that init has gone on: a deadlock. The profile's own list was reviewed against
 * what runc init calls after seccomp setup (none of it), so it is safe to notify.
 */
const OVERRIDE_DENY = 'override';

function applyOverride(rules: SeccompRule[], o: SeccompOverride | undefined): SeccompRule[] {
  if (!o) return rules;
  const allow = new Set(o.allow ?? []);
  let out = rules
    .map((r) => (r.action === 'SCMP_ACT_ALLOW' ? r : { ...r, names: r.names.filter((n) => !allow.has(n)) }))
    .filter((r) => r.names.length > 0);
  const deny = [...new Set(o.deny ?? [])];
  if (deny.length) out = [...out, { names: deny, action: 'SCMP_ACT_ERRNO', errnoRet: EPERM, comment: OVERRIDE_DENY }];
  return out;
}

/** Inputs of {@link buildSeccomp}. */
export interface SeccompInput {
  /** The profile; default {@link defaultProfile}(). */
  profile?: SeccompProfile;
  /** Override of the sandbox's image (applied first). */
  image?: SeccompOverride;
  /** Override of the sandbox itself (applied last: it can undo the image's). */
  sandbox?: SeccompOverride;
  /** An fncall worker: leave {@link WORKER_AGENT_SYSCALLS} to the agent's own filter. */
  worker?: boolean;
  /**
   * Count denials through the seccomp monitor: every SCMP_ACT_ERRNO rule of the profile
   * with errnoRet EPERM (not those an override's `deny` adds) becomes SCMP_ACT_NOTIFY, answered EPERM by the monitor listening on
   * `listenerPath`, which attributes it to `metadata` (the sandbox id, `[0-9a-z-]{1,64}`).
   * Default: none (plain EPERM rules, nothing counted).
   */
  notify?: { listenerPath: string; metadata: string };
}

/**
 * The `linux.seccomp` object for a sandbox: profile, then the image's override, then the
 * sandbox's; `comment` keys stripped; rules emptied by `allow` dropped. Pure given the profile.
 */
export function buildSeccomp(i: SeccompInput = {}): OciSeccomp {
  const p = i.profile ?? defaultProfile();
  let rules = applyOverride(p.syscalls, i.image);
  rules = applyOverride(rules, i.sandbox);
  if (i.worker) rules = applyOverride(rules, { allow: [...WORKER_AGENT_SYSCALLS] });
  const counted = (r: SeccompRule) => !!i.notify && r.action === 'SCMP_ACT_ERRNO' && r.errnoRet === EPERM && r.comment !== OVERRIDE_DENY;
  const out: OciSeccomp = {
    defaultAction: p.defaultAction,
    architectures: [...p.architectures],
    syscalls: rules.map((rule) => {
      const { comment: _c, ...r } = rule;
      const o = { ...r, names: [...r.names], ...(r.args ? { args: r.args.map((a) => ({ ...a })) } : {}) };
      if (!counted(rule)) return o;
      const { errnoRet: _e, ...rest } = o;
      return { ...rest, action: 'SCMP_ACT_NOTIFY' };
    }),
  };
  if (i.notify && out.syscalls.some((r) => r.action === 'SCMP_ACT_NOTIFY')) {
    if (!/^[0-9a-z-]{1,64}$/.test(i.notify.metadata)) throw new Error(`seccomp notify metadata ${JSON.stringify(i.notify.metadata)} is not a sandbox id`);
    out.listenerPath = i.notify.listenerPath;
    out.listenerMetadata = i.notify.metadata;
  }
  return out;
}

/**
 * Replaces the cached default profile with the one in `path` after validating it. On any
 * error the profile in force stays as it was and the error is thrown, naming the file
 * and the field ({@link SeccompProfileError}). Sandboxes get the profile at their next
 * create or start; running ones keep the filter the kernel already has.
 */
export function reloadProfile(path: string = defaultProfilePath()): SeccompProfile {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new SeccompProfileError(`seccomp profile ${path}: ${(e as Error).message}`);
  }
  const next = parseProfile(text, path);
  cached = next;
  loadedFrom = { file: path, sha256: createHash('sha256').update(text).digest('hex') };
  return next;
}

let loadedFrom: { file: string; sha256: string } | null = null;

/**
 * Syscalls a profile should deny unconditionally for dsec's isolation claims to hold
 * (docs/SECURITY.md): kernel attack surface any uid reaches (bpf, userfaultfd,
 * perf_event_open, io_uring, keyrings), the mount family, kernel replacement and
 * modules, file handles, and reading other processes. A profile may lack some (an
 * operator's choice: e.g. allowing ptrace for debuggers): it is loaded, with a warning
 * naming what is missing ({@link profileInfo}).
 */
export const CORE_DENIALS = [
  'bpf', 'mount', 'umount2', 'move_mount', 'open_tree', 'fsopen', 'fsmount', 'fspick', 'pivot_root',
  'kexec_load', 'kexec_file_load', 'init_module', 'finit_module', 'delete_module',
  'keyctl', 'add_key', 'request_key', 'open_by_handle_at', 'userfaultfd', 'perf_event_open',
  'io_uring_setup', 'ptrace', 'process_vm_readv', 'process_vm_writev', 'setns',
] as const;

/** The {@link CORE_DENIALS} names `p` does not deny unconditionally (no rule without args whose action is not ALLOW/LOG). */
export function missingCoreDenials(p: SeccompProfile): string[] {
  const denied = new Set(p.syscalls.filter((r) => r.action !== 'SCMP_ACT_ALLOW' && r.action !== 'SCMP_ACT_LOG' && !r.args?.length).flatMap((r) => r.names));
  return CORE_DENIALS.filter((n) => !denied.has(n));
}

/** What {@link profileInfo} reports. */
export interface ProfileInfo {
  /** The data file the profile in force was loaded from. */
  file: string;
  /** sha256 of its text as loaded, hex. */
  sha256: string;
  /** Distinct syscall names denied by some rule (unconditionally or by argument). */
  denied: number;
  /** {@link CORE_DENIALS} names the profile does not deny unconditionally; empty for the shipped default. */
  missing_core: string[];
  /** Human-readable warnings (one when `missing_core` is not empty). */
  warnings: string[];
}

/**
 * The profile in force: its file, the sha256 of its text, how many syscall names it
 * denies and which core denials it lacks (loads the default one if none was loaded yet).
 */
export function profileInfo(): ProfileInfo {
  const p = defaultProfile();
  const sha256 = profileSha256();
  const file = loadedFrom?.file ?? defaultProfilePath();
  const denied = new Set(p.syscalls.filter((r) => r.action !== 'SCMP_ACT_ALLOW' && r.action !== 'SCMP_ACT_LOG').flatMap((r) => r.names)).size;
  const missing = missingCoreDenials(p);
  const warnings = missing.length
    ? [`seccomp profile ${file} does not deny ${missing.length} of the ${CORE_DENIALS.length} core syscalls: ${missing.join(', ')}; sandboxes can call them`]
    : [];
  return { file, sha256, denied, missing_core: missing, warnings };
}

/**
 * The sha256 (hex) of the default profile's file as loaded (read and hashed once, then at
 * each {@link reloadProfile}): what a warm-pool shell's key carries, so a shell made under
 * another profile is never claimed. Cheap per call, unlike {@link profileInfo}, which
 * counts the profile's rules.
 * @throws Error when the profile file cannot be read on first use.
 */
export function profileSha256(): string {
  if (!loadedFrom) {
    const f = defaultProfilePath();
    loadedFrom = { file: f, sha256: createHash('sha256').update(readFileSync(f)).digest('hex') };
  }
  return loadedFrom.sha256;
}

/** Every syscall name the profile denies unconditionally (for reports and tests). */
export function deniedNames(s: OciSeccomp): string[] {
  return s.syscalls.filter((r) => r.action !== 'SCMP_ACT_ALLOW' && !r.args?.length).flatMap((r) => r.names);
}
