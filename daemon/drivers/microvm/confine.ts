/**
 * The confinement of a microVM guest's commands (docs/SECURITY.md "The microvm tier:
 * inside the guest"): the container tier's in-sandbox defences, computed by dsecd and
 * applied by the guest agent (native/agent/confine.c, "guest confinement").
 *
 * At every boot, after the agent's HELLO and before any command can run (the guest agent
 * runs with `--guest-confine` and refuses execs until this arrives), dsecd:
 *   1. plans the filesystem exactly as for a container ({@link planFilesystem} of
 *      daemon/security/filesystem.ts), over the guest's composed root read through the
 *      agent's file operations ({@link planGuestFilesystem});
 *   2. resolves the seccomp profile with the image's and the sandbox's overrides
 *      ({@link buildSeccomp}) to x86-64 syscall numbers
 *      (native/seccomp-monitor/syscalls.json) — {@link guestSeccompRules};
 *   3. sends both, with the capability set ({@link DEFAULT_CAPS}: Docker's) and the
 *      Landlock switch, as the vmux op CONFINE ({@link confinePayload}).
 * The agent (guest PID 1, root with every capability, which it keeps) makes the planned
 * directories and binds and makes the root mount read-only, then confines every process
 * it starts in its forked child: Landlock on the writable places (when the guest kernel
 * has it), the bounding/effective/permitted/inheritable sets reduced to the capability
 * mask (ambient cleared), no_new_privs, and a seccomp filter of the rules.
 *
 * The result is recorded in `<sandbox dir>/guest-confinement.json`
 * ({@link GuestConfinement}), written only after the agent applied it, removed before
 * every boot: what `dsec inspect` reports is what the running guest has.
 */
import { readFileSync } from 'node:fs';
import type { AgentClient } from '../../agent/client.js';
import { AgentFileError } from '../../agent/client.js';
import { failedPrecondition, internal } from '../../errors.js';
import { planFilesystem, type FilesystemPlan, type TreeView } from '../../security/filesystem.js';
import { buildSeccomp, syscallNumbersX86_64, type OciSeccomp } from '../../security/seccomp.js';
import { DEFAULT_CAPS } from '../container/spec.js';
import type { ResolvedFilesystem } from '../../model/filesystem.js';
import type { SeccompOverride } from '../../model/image.js';

/**
 * Capability numbers (include/uapi/linux/capability.h), for the names dsec uses.
 * The mask sent to the guest is the OR of `1 << n` over {@link DEFAULT_CAPS}.
 */
export const CAP_NUMBERS: Readonly<Record<string, number>> = Object.freeze({
  CAP_CHOWN: 0, CAP_DAC_OVERRIDE: 1, CAP_DAC_READ_SEARCH: 2, CAP_FOWNER: 3, CAP_FSETID: 4, CAP_KILL: 5, CAP_SETGID: 6, CAP_SETUID: 7,
  CAP_SETPCAP: 8, CAP_LINUX_IMMUTABLE: 9, CAP_NET_BIND_SERVICE: 10, CAP_NET_BROADCAST: 11, CAP_NET_ADMIN: 12, CAP_NET_RAW: 13,
  CAP_IPC_LOCK: 14, CAP_IPC_OWNER: 15, CAP_SYS_MODULE: 16, CAP_SYS_RAWIO: 17, CAP_SYS_CHROOT: 18, CAP_SYS_PTRACE: 19, CAP_SYS_PACCT: 20,
  CAP_SYS_ADMIN: 21, CAP_SYS_BOOT: 22, CAP_SYS_NICE: 23, CAP_SYS_RESOURCE: 24, CAP_SYS_TIME: 25, CAP_SYS_TTY_CONFIG: 26, CAP_MKNOD: 27,
  CAP_LEASE: 28, CAP_AUDIT_WRITE: 29, CAP_AUDIT_CONTROL: 30, CAP_SETFCAP: 31, CAP_MAC_OVERRIDE: 32, CAP_MAC_ADMIN: 33, CAP_SYSLOG: 34,
  CAP_WAKE_ALARM: 35, CAP_BLOCK_SUSPEND: 36, CAP_AUDIT_READ: 37, CAP_PERFMON: 38, CAP_BPF: 39, CAP_CHECKPOINT_RESTORE: 40,
});

/** The capability mask of `names` (bit n: capability n). @throws Error for an unknown name. */
export function capMask(names: readonly string[]): bigint {
  let m = 0n;
  for (const n of names) {
    const b = CAP_NUMBERS[n];
    if (b === undefined) throw new Error(`unknown capability ${n}`);
    m |= 1n << BigInt(b);
  }
  return m;
}

/** One seccomp rule for the guest: x86-64 syscall `nr` fails with `errno`, always or when `(arg[argIndex] & mask) == datum` on the low 32 bits. */
export interface GuestSeccompRule {
  nr: number;
  name: string;
  errno: number;
  /**
   * The condition: `(arg & mask) == datum` on the low 32 bits, or with `ge` the whole
   * 64-bit argument `>= datum` (SCMP_CMP_GE: the socket family rule; mask unused).
   */
  arg?: { index: number; mask: number; datum: number; ge?: boolean };
}

/**
 * The profile's rules (with the image's and the sandbox's overrides) as x86-64 numbers.
 * Names the x86-64 table lacks (i386-only calls: vm86, stime, ...) are left out: the
 * guest filter kills every non-x86-64 syscall ABI anyway. Argument conditions must be
 * one SCMP_CMP_MASKED_EQ (or SCMP_CMP_EQ) on a value of at most 32 bits, or one
 * SCMP_CMP_GE of the whole 64-bit argument, which is what the shipped profile has
 * (clone/unshare flags, ioctl commands on their low 32 bits, socket families).
 * @throws DsecError FailedPrecondition when the syscall table is not built (make -C
 *   native) or a rule cannot be expressed in the guest's filter.
 */
export function guestSeccompRules(image: SeccompOverride | undefined, sandbox: SeccompOverride | undefined): { rules: GuestSeccompRule[]; oci: OciSeccomp } {
  const table = syscallNumbersX86_64();
  if (!table) throw failedPrecondition('the x86-64 syscall table native/seccomp-monitor/syscalls.json is not built (run make -C native): the guest\'s seccomp filter cannot be made');
  const oci = buildSeccomp({ image, sandbox });
  if (oci.defaultAction !== 'SCMP_ACT_ALLOW' && oci.defaultAction !== 'SCMP_ACT_LOG') throw failedPrecondition(`seccomp profile default action ${oci.defaultAction}: the guest's filter supports an allow-by-default profile only`);
  const rules: GuestSeccompRule[] = [];
  for (const r of oci.syscalls) {
    if (r.action === 'SCMP_ACT_ALLOW' || r.action === 'SCMP_ACT_LOG') continue;
    if (r.action !== 'SCMP_ACT_ERRNO') throw failedPrecondition(`seccomp rule for ${r.names.join(',')}: action ${r.action} is not supported in a microVM guest (only SCMP_ACT_ERRNO)`);
    const errno = r.errnoRet ?? 1;
    let arg: GuestSeccompRule['arg'];
    if (r.args?.length) {
      const a = r.args[0];
      const ok = r.args.length === 1 && a.index <= 5 && (
        (a.op === 'SCMP_CMP_MASKED_EQ' && a.value <= 0xffffffff && (a.valueTwo ?? 0) <= 0xffffffff)
        || ((a.op === 'SCMP_CMP_EQ' || a.op === 'SCMP_CMP_GE') && a.value <= 0xffffffff));
      if (!ok) throw failedPrecondition(`seccomp rule for ${r.names.join(',')}: argument condition ${JSON.stringify(r.args)} is not supported in a microVM guest (one MASKED_EQ/EQ on 32 bits, or GE on a 32-bit value)`);
      arg = a.op === 'SCMP_CMP_EQ' ? { index: a.index, mask: 0xffffffff, datum: a.value }
        : a.op === 'SCMP_CMP_GE' ? { index: a.index, mask: 0xffffffff, datum: a.value, ge: true }
        : { index: a.index, mask: a.value, datum: a.valueTwo ?? 0 };
    }
    for (const name of r.names) {
      const nr = table.get(name);
      if (nr === undefined) continue;
      rules.push({ nr, name, errno, ...(arg ? { arg } : {}) });
    }
  }
  return { rules, oci };
}

/** Thrown inside {@link planGuestFilesystem}'s tree view for a fact not fetched yet. */
class NeedFact extends Error {
  constructor(readonly what: 'kind' | 'list', readonly p: string) {
    super(`${what} ${p}`);
  }
}

/** Most agent round trips one plan may take: 4096 (each fetches one stat or one directory listing). */
const MAX_FETCHES = 4096;

/**
 * {@link planFilesystem} over the guest's root, read through the agent's file
 * operations (lstat and list, as root in the guest). The planner is synchronous, so it
 * runs over a cache and is re-run after fetching each fact it lacked; directory listings
 * also fill in their entries' kinds.
 * @throws DsecError FailedPrecondition as planFilesystem, or for a path with a newline
 *   (it could not be sent as one directive); the agent's errors.
 */
export async function planGuestFilesystem(fs: ResolvedFilesystem, client: AgentClient): Promise<FilesystemPlan> {
  type Kind = ReturnType<TreeView['kind']>;
  const kinds = new Map<string, Kind>();
  const links = new Map<string, string>();
  const lists = new Map<string, string[]>();
  const kindOf = (t: string): Kind => (t === 'dir' ? 'dir' : t === 'symlink' ? 'symlink' : 'other');
  const tree: TreeView = {
    kind(p) {
      const k = kinds.get(p);
      if (k === undefined) throw new NeedFact('kind', p);
      return k;
    },
    readlink(p) {
      const t = links.get(p);
      if (t === undefined) throw new NeedFact('kind', p);
      return t;
    },
    list(p) {
      const l = lists.get(p);
      if (l === undefined) throw new NeedFact('list', p);
      return l;
    },
  };
  const child = (dir: string, name: string) => (dir === '/' ? `/${name}` : `${dir}/${name}`);
  for (let i = 0; i < MAX_FETCHES; i++) {
    let need: NeedFact;
    try {
      return planFilesystem(fs, tree);
    } catch (e) {
      if (!(e instanceof NeedFact)) throw e;
      need = e;
    }
    if (need.what === 'list') {
      const entries = await client.list(need.p);
      lists.set(need.p, entries.map((e) => e.name));
      for (const e of entries) {
        const p = child(need.p, e.name);
        kinds.set(p, kindOf(e.type));
        if (e.type === 'symlink' && e.target !== undefined) links.set(p, e.target);
      }
    } else {
      try {
        const st = await client.stat(need.p, { nofollow: true });
        kinds.set(need.p, kindOf(st.type));
        if (st.type === 'symlink') links.set(need.p, st.target ?? '');
      } catch (e) {
        // ENOENT, ENOTDIR: the planner's 'missing'.
        if (e instanceof AgentFileError && (e.errno === 2 || e.errno === 20)) kinds.set(need.p, 'missing');
        else throw e;
      }
    }
  }
  throw internal(`planning the guest's filesystem took more than ${MAX_FETCHES} agent round trips`);
}

/**
 * Runtime paths of the guest made read-only binds for every command (after the image's
 * plan): /proc/sys, /proc/sysrq-trigger and /sys, as runc's readonlyPaths do for a
 * container. The guest agent itself does not write them.
 */
export const GUEST_READONLY_RUNTIME: readonly string[] = ['/proc/sys', '/proc/sysrq-trigger', '/sys'];

/** What was sent to a guest and what it answered: `<sandbox dir>/guest-confinement.json`. */
export interface GuestConfinement {
  /** The filesystem plan the agent applied (mount order). */
  plan: FilesystemPlan;
  /** Capabilities every command keeps (names, {@link DEFAULT_CAPS}). */
  caps: string[];
  /** The mask as 16 hex digits, as /proc/<pid>/status CapEff shows it. */
  capMaskHex: string;
  /** Syscall names denied (x86-64), unconditionally or by argument. */
  seccomp: { rules: number; denied: string[]; conditional: string[] };
  /** Landlock: asked for (filesystem.landlock), and the guest kernel's ABI the commands got (0: none). */
  landlock: { asked: boolean; abi: number };
}

/**
 * The CONFINE op's argument: the directive lines the agent parses (native/agent/confine.c
 * guest_confine: mkdir, bind, rootro, caps, rule, landlock, writable).
 * @throws DsecError FailedPrecondition for a path containing a newline.
 */
export function confinePayload(plan: FilesystemPlan, caps: bigint, rules: readonly GuestSeccompRule[], landlock: boolean): Buffer {
  const lines: string[] = [];
  const safe = (p: string) => {
    if (/[\n\0]/.test(p)) throw failedPrecondition(`path ${JSON.stringify(p)} has a newline: it cannot be confined in a microVM guest`);
    return p;
  };
  for (const p of plan.create) lines.push(`mkdir ${safe(p)}`);
  for (const b of plan.binds) lines.push(`bind ${safe(b.path)} ${b.readonly ? 'ro' : 'rw'}`);
  if (plan.readonlyRoot) lines.push('rootro');
  // The kernel's own trees, read-only to commands as runc's readonlyPaths make them in a
  // container: guest sysctls, sysfs (device unbinding, ...), sysrq.
  for (const p of GUEST_READONLY_RUNTIME) lines.push(`bind ${p} ro`);
  lines.push(`caps ${caps.toString(10)}`);
  for (const r of rules) lines.push(r.arg ? `rule ${r.nr} ${r.errno} ${r.arg.index} ${r.arg.mask >>> 0} ${r.arg.datum >>> 0}${r.arg.ge ? ' 1' : ''}` : `rule ${r.nr} ${r.errno}`);
  lines.push(`landlock ${landlock ? 1 : 0}`);
  for (const w of plan.writable) lines.push(`writable ${safe(w)}`);
  return Buffer.from(`${lines.join('\n')}\n`);
}

/** Inputs of {@link buildGuestConfinement}. */
export interface GuestConfinementInput {
  fs: ResolvedFilesystem;
  imageSeccomp?: SeccompOverride;
  sandboxSeccomp?: SeccompOverride;
}

/**
 * Plans everything for one boot: the payload to send and the record to keep.
 * @throws DsecError as {@link planGuestFilesystem} and {@link guestSeccompRules}.
 */
export async function buildGuestConfinement(i: GuestConfinementInput, client: AgentClient): Promise<{ payload: Buffer; record: (landlockAbi: number) => GuestConfinement }> {
  const plan = await planGuestFilesystem(i.fs, client);
  const { rules } = guestSeccompRules(i.imageSeccomp, i.sandboxSeccomp);
  const caps = [...DEFAULT_CAPS];
  const mask = capMask(caps);
  return {
    payload: confinePayload(plan, mask, rules, i.fs.landlock),
    record: (abi) => ({
      plan, caps, capMaskHex: mask.toString(16).padStart(16, '0'),
      seccomp: {
        rules: rules.length,
        denied: [...new Set(rules.filter((r) => !r.arg).map((r) => r.name))],
        conditional: [...new Set(rules.filter((r) => r.arg).map((r) => r.name))],
      },
      landlock: { asked: i.fs.landlock, abi },
    }),
  };
}

/** The record of the running boot, or null (none yet, or unreadable). */
export function readGuestConfinement(file: string): GuestConfinement | null {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as GuestConfinement;
  } catch {
    return null;
  }
}
