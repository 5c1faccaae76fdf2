/**
 * The AppArmor profile of every container sandbox: one profile per sandbox, named
 * `dsec-<instance>-<sandbox id>`, rendered from a template kept as data
 * (`profiles/apparmor.template`, each rule with its reason), written to
 * `<root>/sandboxes/<id>/apparmor.profile`, compiled with apparmor_parser, and — only
 * where the kernel has AppArmor — loaded and named in the OCI spec
 * (`process.apparmorProfile`), which runc applies when it execs the agent.
 *
 * Gating (the contract of this module):
 * - {@link compileProfile} always passes `-Q` (--skip-kernel-load) and `-K`
 *   (--skip-cache): it parses and compiles the policy and writes the result to /dev/null;
 *   nothing reaches the kernel or the cache. Safe on any host, safe to call twice.
 * - {@link loadProfile} and {@link unloadProfile} are the only calls without `-Q`; both
 *   refuse (FailedPrecondition) unless {@link kernelHasAppArmor}() is true. On a kernel
 *   without AppArmor (this development host) they never run apparmor_parser, and the
 *   spec must not name a profile: runc would fail to apply it.
 * - {@link prepareSandboxProfile} is what the container driver calls, and only when the
 *   kernel has AppArmor; it returns the name to put in the spec.
 *
 * Inputs are validated before substitution: names match {@link NAME_RE} (the instance
 * name rule of daemon/config.ts, which covers sandbox ids such as `3f9c…` and
 * `fork-3f9c…`) and paths are absolute with no characters AppArmor treats as syntax
 * (spaces, quotes, globbing, braces, commas, `#`), so no input can add or change a rule.
 */
import { existsSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { failedPrecondition } from '../errors.js';

/** securityfs directory that exists exactly when the running kernel has AppArmor enabled. */
export const APPARMOR_SECURITYFS = '/sys/kernel/security/apparmor';

/** Debian's path of the parser (package `apparmor`); found on PATH otherwise. */
export const APPARMOR_PARSER = 'apparmor_parser';

/** Profile name prefix; the full name is `dsec-<instance>-<sandbox id>`. */
export const PROFILE_PREFIX = 'dsec';

/** File of a sandbox's rendered profile, inside its sandbox directory. */
export const PROFILE_FILE = 'apparmor.profile';

/** Instance names and sandbox ids: lowercase alphanumerics, `_`, `.`, `-`; 1–63 characters, not starting with punctuation. */
export const NAME_RE = /^[a-z0-9][a-z0-9_.-]{0,62}$/;

/** Absolute path without AppArmor syntax characters and without `.`/`..` segments. */
const PATH_RE = /^(\/[A-Za-z0-9_+@:=%~-][A-Za-z0-9_.+@:=%~-]*)+$/;

/** Placeholders of the template; every one must be substituted. */
const PLACEHOLDER = /\{\{([a-z_]+)\}\}/g;

/** A template or rendered profile that is malformed, or a compile that failed; the message says which file and why. */
export class AppArmorProfileError extends Error {}

/** True when the running kernel has AppArmor (its securityfs directory exists). Detected, never assumed. */
export function kernelHasAppArmor(securityfs: string = APPARMOR_SECURITYFS): boolean {
  return existsSync(securityfs);
}

/** The profile name of a sandbox. @throws AppArmorProfileError on an invalid instance name or id. */
export function profileName(instance: string, sandboxId: string): string {
  if (!NAME_RE.test(instance)) throw new AppArmorProfileError(`apparmor: invalid instance name ${JSON.stringify(instance)}: expected ${NAME_RE}`);
  if (!NAME_RE.test(sandboxId)) throw new AppArmorProfileError(`apparmor: invalid sandbox id ${JSON.stringify(sandboxId)}: expected ${NAME_RE}`);
  return `${PROFILE_PREFIX}-${instance}-${sandboxId}`;
}

function checkPath(what: string, p: string): string {
  const n = p.length > 1 ? p.replace(/\/+$/, '') : p;
  if (!PATH_RE.test(n) || n.split('/').some((s) => s === '.' || s === '..'))
    throw new AppArmorProfileError(`apparmor: ${what} ${JSON.stringify(p)} cannot be named in a profile: expected an absolute path of [A-Za-z0-9_.+@:=%~-] segments`);
  return n;
}

/**
 * Where the template is: next to this module when running from source (vitest), and
 * under the package root when running from dist/ (tsc does not copy data files): the
 * checkout's, or the installed release's (scripts/install-release.sh).
 */
export function defaultTemplatePath(): string {
  const candidates = [
    new URL('./profiles/apparmor.template', import.meta.url),
    new URL('../../../daemon/security/profiles/apparmor.template', import.meta.url),
  ].map((u) => fileURLToPath(u));
  return candidates.find((p) => existsSync(p)) ?? candidates[0];
}

/** Reads the template. @throws if it is missing. */
export async function readTemplate(file: string = defaultTemplatePath()): Promise<string> {
  return readFile(file, 'utf8');
}

/** Inputs of {@link renderProfile}. */
export interface ProfileInput {
  /** dsecd's instance name (daemon/config.ts). */
  instance: string;
  /** Sandbox id. */
  sandboxId: string;
  /** dsecd's state directory: denied inside the sandbox. */
  stateRoot: string;
  /** Directory of the API socket: denied inside the sandbox. */
  socketDir: string;
  /** An fncall worker: its agent may mount (see the template). Default false. */
  worker?: boolean;
  /** Template text; default: the data file. */
  template: string;
}

/**
 * Applies the `#@if worker` / `#@else` / `#@end` blocks. Blocks do not nest.
 * @throws AppArmorProfileError on an unknown condition or unbalanced markers.
 */
function applyConditionals(text: string, flags: Record<string, boolean>): string {
  const out: string[] = [];
  let state: null | { keep: boolean; inElse: boolean; line: number } = null;
  for (const [i, line] of text.split('\n').entries()) {
    const m = /^\s*#@(if|else|end)\b\s*(\S*)\s*$/.exec(line);
    if (!m) {
      if (!state || state.keep !== state.inElse) out.push(line);
      continue;
    }
    const [, kw, arg] = m;
    if (kw === 'if') {
      if (state) throw new AppArmorProfileError(`apparmor template line ${i + 1}: nested #@if`);
      if (!(arg in flags)) throw new AppArmorProfileError(`apparmor template line ${i + 1}: unknown condition ${JSON.stringify(arg)}`);
      state = { keep: flags[arg], inElse: false, line: i + 1 };
    } else if (kw === 'else') {
      if (!state || state.inElse) throw new AppArmorProfileError(`apparmor template line ${i + 1}: #@else without #@if`);
      state.inElse = true;
    } else {
      if (!state) throw new AppArmorProfileError(`apparmor template line ${i + 1}: #@end without #@if`);
      state = null;
    }
  }
  if (state) throw new AppArmorProfileError(`apparmor template line ${state.line}: #@if without #@end`);
  return out.join('\n');
}

/**
 * The profile text of one sandbox. Pure.
 * @throws AppArmorProfileError on an invalid input or a template with unknown placeholders.
 */
export function renderProfile(i: ProfileInput): string {
  const values: Record<string, string> = {
    profile_name: profileName(i.instance, i.sandboxId),
    state_root: checkPath('state root', i.stateRoot),
    socket_dir: checkPath('socket directory', i.socketDir),
  };
  const text = applyConditionals(i.template, { worker: !!i.worker });
  return text.replace(PLACEHOLDER, (_m, key: string) => {
    const v = values[key];
    if (v === undefined) throw new AppArmorProfileError(`apparmor template: unknown placeholder {{${key}}}`);
    return v;
  });
}

/** Path of a sandbox's profile file: `<root>/sandboxes/<id>/apparmor.profile`. */
export function profilePath(root: string, sandboxId: string): string {
  if (!NAME_RE.test(sandboxId)) throw new AppArmorProfileError(`apparmor: invalid sandbox id ${JSON.stringify(sandboxId)}: expected ${NAME_RE}`);
  return path.join(root, 'sandboxes', sandboxId, PROFILE_FILE);
}

/** Writes profile text (mode 0600; the directory is created if missing). Returns the path. Safe to call twice. */
export async function writeProfile(file: string, text: string): Promise<string> {
  await mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
  await writeFile(file, text, { mode: 0o600 });
  return file;
}

/** apparmor_parser's own noise on a kernel without AppArmor, dropped from error messages. */
const NOISE = /^Cache read\/write disabled: interface file missing\..*$/gm;

function parserError(what: string, file: string, r: { exitCode?: number; stderr?: unknown; stdout?: unknown; message?: string }): AppArmorProfileError {
  const text = `${String(r.stderr ?? '')}\n${String(r.stdout ?? '')}`.replace(NOISE, '').trim() || r.message || `exit code ${r.exitCode}`;
  return new AppArmorProfileError(`apparmor_parser failed to ${what} ${file}: ${text}`);
}

/** Options of the parser calls. */
export interface ParserOptions {
  /** Parser binary; default {@link APPARMOR_PARSER}. */
  parser?: string;
}

/** The argument list of {@link compileProfile}: parse and compile only (exported for tests). */
export function compileArgs(file: string): string[] {
  return ['-Q', '-K', '-q', '-o', '/dev/null', file];
}

/**
 * Parses and compiles a profile without loading it (`-Q`, --skip-kernel-load) and without
 * reading or writing the cache (`-K`); the binary policy goes to /dev/null. Works on any
 * host, with or without AppArmor in the kernel. Safe to call twice.
 * @throws AppArmorProfileError with the parser's message when the profile does not compile
 *   or the parser is missing.
 */
export async function compileProfile(file: string, o: ParserOptions = {}): Promise<void> {
  const r = await execa(o.parser ?? APPARMOR_PARSER, compileArgs(file), { reject: false, stdin: 'ignore' });
  if (r.failed) throw parserError('compile', file, r);
}

function requireAppArmor(what: string, securityfs?: string): void {
  if (!kernelHasAppArmor(securityfs))
    throw failedPrecondition(`cannot ${what} an AppArmor profile: the kernel has no AppArmor (${securityfs ?? APPARMOR_SECURITYFS} is missing)`);
}

/**
 * Loads (or replaces) a compiled profile into the kernel: `apparmor_parser -r -K`.
 * Only where the kernel has AppArmor. Safe to call twice (replace).
 * @throws DsecError FailedPrecondition when the kernel has no AppArmor; AppArmorProfileError when the parser fails.
 */
export async function loadProfile(file: string, o: ParserOptions & { securityfs?: string } = {}): Promise<void> {
  requireAppArmor('load', o.securityfs);
  const r = await execa(o.parser ?? APPARMOR_PARSER, ['-r', '-K', '-q', file], { reject: false, stdin: 'ignore' });
  if (r.failed) throw parserError('load', file, r);
}

/**
 * Removes a sandbox's profile from the kernel: `apparmor_parser -R`. Only where the kernel
 * has AppArmor; a profile that is not loaded is not an error. Safe to call twice.
 */
export async function unloadProfile(file: string, o: ParserOptions & { securityfs?: string } = {}): Promise<void> {
  requireAppArmor('unload', o.securityfs);
  if (!existsSync(file)) return;
  const r = await execa(o.parser ?? APPARMOR_PARSER, ['-R', '-K', '-q', file], { reject: false, stdin: 'ignore' });
  if (r.failed && !/not found|does not exist/i.test(String(r.stderr))) throw parserError('unload', file, r);
}

/** Inputs of {@link prepareSandboxProfile}. */
export interface SandboxProfileInput extends Omit<ProfileInput, 'template' | 'stateRoot'> {
  /** Instance root (`<root>/sandboxes/<id>/` holds the profile; the root itself is denied). */
  root: string;
  /** Template text; default: the data file. */
  template?: string;
  parser?: string;
  /** Override of {@link APPARMOR_SECURITYFS} (tests). */
  securityfs?: string;
}

/**
 * Renders, writes and compiles a sandbox's profile, then loads it: the whole attach path.
 * Returns the name to set as the spec's `process.apparmorProfile`. Only for kernels with
 * AppArmor: it refuses before writing anything otherwise.
 * @throws DsecError FailedPrecondition without AppArmor; AppArmorProfileError on a bad input, template or compile.
 */
export async function prepareSandboxProfile(i: SandboxProfileInput): Promise<{ name: string; file: string }> {
  requireAppArmor('attach', i.securityfs);
  const text = renderProfile({ ...i, stateRoot: i.root, template: i.template ?? (await readTemplate()) });
  const file = await writeProfile(profilePath(i.root, i.sandboxId), text);
  await compileProfile(file, { parser: i.parser });
  await loadProfile(file, { parser: i.parser, securityfs: i.securityfs });
  return { name: profileName(i.instance, i.sandboxId), file };
}
