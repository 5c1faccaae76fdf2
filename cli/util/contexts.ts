/**
 * Named contexts of the CLI (`dsec context add|use|ls|rm`, as kubectl and docker have):
 * which dsecd to talk to, kept in `contexts.json` under `$DSEC_CONFIG_DIR`, else
 * `$XDG_CONFIG_HOME/dsec`, else `~/.config/dsec` (the file is 0600: it holds tokens).
 *
 *   {"current": "lab" | null, "contexts": {"lab": {"host": "https://h:8443", "token": "e2b_...", "ca": "/abs/ca.crt"}}}
 */
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { UserError } from './errors.js';

/** One context: a dsecd's TCP door (or a gateway), its token and the CA file to trust. */
export interface CliContext {
  /** `https://HOST:PORT`. */
  host: string;
  /** API token, or absent (then `--token`/`DSEC_TOKEN` must give one). */
  token?: string;
  /** Absolute path of a PEM CA file, or absent (the system's CAs). */
  ca?: string;
}

/** The contexts file. */
export interface ContextsFile {
  /** The context used when no `--host`, `--socket`, `--context` or DSEC_HOST says otherwise; null: the local socket. */
  current: string | null;
  contexts: Record<string, CliContext>;
}

/** Context names: 1-63 of letters, digits, `.`, `_`, `-`. */
export const CONTEXT_NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

/** Path of the contexts file for an environment. */
export function contextsPath(env: Record<string, string | undefined>): string {
  const dir = env.DSEC_CONFIG_DIR || (env.XDG_CONFIG_HOME ? path.join(env.XDG_CONFIG_HOME, 'dsec') : path.join(env.HOME || os.homedir(), '.config', 'dsec'));
  return path.join(dir, 'contexts.json');
}

/** Reads the contexts file (an empty one when it does not exist). @throws UserError for a file that is not a contexts file. */
export function readContexts(env: Record<string, string | undefined>): ContextsFile {
  const file = contextsPath(env);
  if (!existsSync(file)) return { current: null, contexts: {} };
  try {
    const v = JSON.parse(readFileSync(file, 'utf8')) as ContextsFile;
    if (typeof v !== 'object' || v === null || typeof v.contexts !== 'object' || v.contexts === null) throw new Error('no "contexts" object');
    return { current: typeof v.current === 'string' ? v.current : null, contexts: v.contexts };
  } catch (e) {
    throw new UserError(`${file} is not a dsec contexts file: ${(e as Error).message}`, 'fix or remove it');
  }
}

/** Writes the contexts file (0600, through a rename). */
export function writeContexts(env: Record<string, string | undefined>, c: ContextsFile): void {
  const file = contextsPath(env);
  mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
  const tmp = `${file}.tmp-${process.pid}`;
  writeFileSync(tmp, JSON.stringify(c, null, 2) + '\n', { mode: 0o600 });
  chmodSync(tmp, 0o600);
  renameSync(tmp, file);
}
