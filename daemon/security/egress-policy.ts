/**
 * Named network policies: JSON data files, one policy per file, named after the file
 * (`block-package-proxies.json` is policy `block-package-proxies`). They come from two
 * directories, later ones overriding earlier ones by name:
 *   1. the examples shipped with dsec (daemon/security/profiles/network/), and
 *   2. the operator's directory (`[network] policy_dir`, default /etc/dsec/network-policies).
 *
 * A policy of the operator's directory with the name of a shipped one shadows it; every
 * load reports such shadowing ({@link PolicyShadow}), so an operator who meant to add a
 * policy learns that a shipped one is no longer in force.
 *
 * Every file is validated (zod) when it is loaded; an error names the file and the field.
 * A valid policy may still hold allow rules that can never take effect (inside a
 * destination every sandbox is denied, covered by its own deny rules, or in an `open`
 * policy): every load reports those as warnings ({@link PolicyWarning}); they do not
 * refuse the file.
 * A reload is all or nothing: if any file is malformed (or a policy still in use by a
 * sandbox disappeared), the reload is refused with every problem listed, and the set
 * loaded before stays in force. At start, a malformed file is skipped and logged, since
 * there is no previous version to keep.
 *
 * File shape:
 *   { "description": "...", "mode": "allow" | "open",
 *     "allow": [EgressRule...], "deny": [EgressRule...] }
 */
import { closeSync, constants as fsc, existsSync, fstatSync, openSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import { invalidArgument } from '../errors.js';
import { EgressRuleSchema, PolicyNameSchema, policyWarnings, type AlwaysDenied, type NetworkPolicy } from './egress.js';

/** Directory of the policies shipped with dsec: `daemon/security/profiles/network` under the package root (the checkout, or the installed release: scripts/install-release.sh), whether this runs from source or from dist/. */
export function shippedPolicyDir(): string {
  let d = path.dirname(fileURLToPath(import.meta.url));
  while (d !== '/' && !existsSync(path.join(d, 'package.json'))) d = path.dirname(d);
  return path.join(d, 'daemon', 'security', 'profiles', 'network');
}

/** Schema of one policy file. Unknown fields are refused, so a typo never silently allows or denies nothing. */
export const PolicyFile = z
  .object({
    description: z.string().max(4096).optional(),
    mode: z.enum(['allow', 'open']).describe('The mode of a sandbox that names this policy and no mode of its own.'),
    allow: z.array(EgressRuleSchema).max(4096).optional(),
    deny: z.array(EgressRuleSchema).max(4096).optional(),
  })
  .strict();

/** One file that could not be loaded, and why (field path and message). */
export interface PolicyProblem {
  file: string;
  message: string;
}

/**
 * Parses one policy file's text.
 * @returns the policy, or the problem naming the file and the first bad fields.
 */
export function parsePolicyFile(file: string, text: string): NetworkPolicy | PolicyProblem {
  const name = path.basename(file, '.json');
  const n = PolicyNameSchema.safeParse(name);
  if (!n.success) return { file, message: `file name: ${n.error.issues[0].message}` };
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    return { file, message: `not JSON: ${(e as Error).message}` };
  }
  const r = PolicyFile.safeParse(raw);
  if (!r.success) {
    return { file, message: r.error.issues.map((i) => `${i.path.length ? i.path.join('.') : '(top)'}: ${i.code === 'unrecognized_keys' ? `unknown field ${i.keys.join(', ')}` : i.message}`).join('; ') };
  }
  return { name, mode: r.data.mode, allow: r.data.allow ?? [], deny: r.data.deny ?? [], ...(r.data.description ? { description: r.data.description } : {}) };
}

/** A policy file that hides one of the same name from an earlier directory (a shipped example). */
export interface PolicyShadow {
  name: string;
  /** The file in force. */
  file: string;
  /** The file it hides. */
  shadows: string;
}

/** An allow rule of a loaded policy that can never take effect ({@link policyWarnings}). */
export interface PolicyWarning {
  policy: string;
  file: string;
  message: string;
}

/** Reads every `*.json` of the directories (missing directories are empty), later directories overriding by name (each override listed in `shadowed`). */
export function readPolicyDirs(dirs: readonly string[]): { policies: Map<string, NetworkPolicy & { file: string }>; problems: PolicyProblem[]; shadowed: PolicyShadow[] } {
  const policies = new Map<string, NetworkPolicy & { file: string }>();
  const problems: PolicyProblem[] = [];
  const shadowed: PolicyShadow[] = [];
  for (const dir of dirs) {
    let names: string[];
    try {
      names = readdirSync(dir).filter((f) => f.endsWith('.json')).sort();
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') continue;
      problems.push({ file: dir, message: `cannot read directory: ${(e as Error).message}` });
      continue;
    }
    for (const f of names) {
      const file = path.join(dir, f);
      // Policy files are regular files of the directory itself: a symbolic link is
      // refused unread (O_NOFOLLOW: ELOOP), so a link to a file elsewhere (a secret)
      // cannot be read and quoted back in a parse error.
      let text: string;
      let fd = -1;
      try {
        fd = openSync(file, fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK);
        if (!fstatSync(fd).isFile()) {
          problems.push({ file, message: 'not a regular file; policy files must be regular files in the policy directory' });
          continue;
        }
        text = readFileSync(fd, 'utf8');
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        problems.push({ file, message: code === 'ELOOP' ? 'a symbolic link; policy files must be regular files in the policy directory (links are not followed)' : `cannot read: ${(e as Error).message}` });
        continue;
      } finally {
        if (fd >= 0) closeSync(fd);
      }
      const p = parsePolicyFile(file, text);
      if ('message' in p) problems.push(p);
      else {
        const before = policies.get(p.name);
        if (before) shadowed.push({ name: p.name, file, shadows: before.file });
        policies.set(p.name, { ...p, file });
      }
    }
  }
  return { policies, problems, shadowed };
}

/** Warnings of every policy of a set, by policy name order. */
export function setWarnings(policies: Iterable<NetworkPolicy & { file: string }>, alwaysDenied: readonly AlwaysDenied[]): PolicyWarning[] {
  const out: PolicyWarning[] = [];
  for (const p of [...policies].sort((a, b) => a.name.localeCompare(b.name))) {
    for (const message of policyWarnings(p, alwaysDenied)) out.push({ policy: p.name, file: p.file, message });
  }
  return out;
}

/** What a load reports besides the policies: shadowed shipped policies and allow rules that never take effect. */
export interface PolicyLoadReport {
  shadowed: PolicyShadow[];
  warnings: PolicyWarning[];
}

/** The loaded policies of one dsecd; see the module comment for reload semantics. */
export class PolicySet {
  private current = new Map<string, NetworkPolicy & { file: string }>();
  private currentReport: PolicyLoadReport = { shadowed: [], warnings: [] };

  /**
   * @param dirs directories read in order (shipped examples first, then the operator's).
   * @param alwaysDenied destinations every sandbox is denied whatever its rules, for the
   *   warnings (daemon/net/decisions.ts `builtinDeny`); none when omitted.
   */
  constructor(private readonly dirs: readonly string[], private readonly alwaysDenied: () => readonly AlwaysDenied[] = () => []) {}

  /**
   * First load at start: malformed files are skipped.
   * @returns the problems found (for the log); shadowing and warnings are in {@link report}.
   */
  loadInitial(): PolicyProblem[] {
    const r = readPolicyDirs(this.dirs);
    this.current = r.policies;
    this.currentReport = { shadowed: r.shadowed, warnings: setWarnings(r.policies.values(), this.alwaysDenied()) };
    return r.problems;
  }

  /** Shadowed shipped policies and allow rules that never take effect, of the set in force. */
  report(): PolicyLoadReport {
    return this.currentReport;
  }

  /**
   * Reloads every directory, all or nothing.
   * @param inUse names of policies live sandboxes use: such a policy must not disappear.
   * @returns the names whose content changed, appeared or disappeared, and the new set's
   *   {@link report} (every shadowing and warning in force, not only new ones).
   * @throws DsecError InvalidArgument listing every problem; the previous set stays in force.
   */
  reload(inUse: ReadonlySet<string>): { changed: string[]; loaded: string[] } & PolicyLoadReport {
    const r = readPolicyDirs(this.dirs);
    const problems = [...r.problems];
    for (const name of inUse) {
      if (!this.current.has(name) || r.policies.has(name)) continue;
      const file = this.current.get(name)!.file;
      // A file with a problem of its own is there but invalid (its problem is listed); only a missing one is gone.
      if (problems.some((p) => p.file === file)) problems.push({ file, message: `policy ${name} is in use by a sandbox and its file is invalid (see above); fix it, the version loaded before stays in force` });
      else problems.push({ file, message: `policy ${name} is in use by a sandbox but its file is gone; restore it or change those sandboxes' network first` });
    }
    if (problems.length) {
      throw invalidArgument(`network policy reload refused, the policies loaded before stay in force: ${problems.map((p) => `${p.file}: ${p.message}`).join('; ')}`);
    }
    const changed: string[] = [];
    const names = new Set([...this.current.keys(), ...r.policies.keys()]);
    for (const n of names) {
      const a = this.current.get(n), b = r.policies.get(n);
      if (JSON.stringify(a ?? null) !== JSON.stringify(b ?? null)) changed.push(n);
    }
    this.current = r.policies;
    this.currentReport = { shadowed: r.shadowed, warnings: setWarnings(r.policies.values(), this.alwaysDenied()) };
    return { changed: changed.sort(), loaded: [...r.policies.keys()].sort(), ...this.currentReport };
  }

  /** The loaded policy of that name, or undefined. */
  get(name: string): (NetworkPolicy & { file: string }) | undefined {
    return this.current.get(name);
  }

  /**
   * The loaded policy of that name.
   * @throws DsecError InvalidArgument naming the known policies and where they come from.
   */
  require(name: string): NetworkPolicy & { file: string } {
    const p = this.current.get(name);
    if (!p) {
      const known = [...this.current.keys()].sort();
      throw invalidArgument(`unknown network policy ${JSON.stringify(name)}; loaded: ${known.length ? known.join(', ') : 'none'} (JSON files in ${this.dirs.join(', ')}; reload with \`dsec network reload\` after adding one)`);
    }
    return p;
  }

  /** Every loaded policy, by name. */
  all(): (NetworkPolicy & { file: string })[] {
    return [...this.current.values()].sort((a, b) => a.name.localeCompare(b.name));
  }
}
