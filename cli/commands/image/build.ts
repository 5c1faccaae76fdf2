/**
 * `dsec image build DIR --tag NAME[:TAG] [--base IMAGE] [--env K=V]... [--cwd DIR]
 * [--user U] [--cmd ...] [security flags]`: packs the directory tree DIR as one EROFS layer (on top of
 * --base's layers) and names the image. DIR is resolved to an absolute path here and read
 * by dsecd on its own host. The security flags (cli/util/security.ts: --writable,
 * --readonly, --no-readonly, --landlock, --no-landlock, --seccomp-allow, --seccomp-deny)
 * set the image's security defaults, merged field by field over --base's. Progress on
 * stderr; the new ref (or Image with --json) on stdout.
 */
import { stat } from 'node:fs/promises';
import { resolve } from 'node:path';
import type { Command } from 'commander';
import type { DsecClient, ImageConfig } from '../../../sdk/index.js';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { runImageOperation } from '../../util/long.js';
import { collectEnv, flag } from '../../util/parse.js';
import { addImageSecurityOptions, imageSecurityOf, type ImageSecurityFlags } from '../../util/security.js';

/**
 * Environment of an image built without --base: the PATH of dsecd's scratch config
 * (SCRATCH_CONFIG in daemon/api/routes/images.ts). --env is merged over it, because the
 * API replaces the whole env list and an image without PATH cannot run `sh`.
 */
export const SCRATCH_ENV = ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'];

/** Parsed build flags. */
export interface BuildFlags extends ImageSecurityFlags {
  /** `--tag`, the new image's name[:tag]. */
  tag: string;
  /** `--base`. */
  base?: string;
  /** `--env`, accumulated. */
  env?: Record<string, string>;
  /** `--cwd`. */
  cwd?: string;
  /** `--user`. */
  user?: string;
  /** `--cmd`, the words as given. */
  cmd?: string[];
}

/** Parses `--cwd`: an absolute path. */
function parseAbsolute(text: string): string {
  if (!text.startsWith('/')) throw new UserError(`working directory ${JSON.stringify(text)} is not absolute`, 'write an absolute path inside the image, e.g. --cwd /work');
  return text;
}

/**
 * The default command from `--cmd`'s words: the words themselves, or, when there is one
 * word that starts with `[`, that word read as a JSON array of strings (for commands
 * with words that look like options, e.g. `--cmd '["python3","-m","http.server"]'`).
 */
export function parseCmd(words: string[]): string[] {
  if (words.length !== 1 || !words[0].trimStart().startsWith('[')) return words;
  let v: unknown;
  try {
    v = JSON.parse(words[0]);
  } catch {
    throw new UserError(`--cmd: ${JSON.stringify(words[0])} is not a JSON array`, 'write --cmd word... or --cmd \'["word","--flag"]\'');
  }
  if (!Array.isArray(v) || v.length === 0 || !v.every((w) => typeof w === 'string')) {
    throw new UserError('--cmd: the JSON form must be a non-empty array of strings', 'e.g. --cmd \'["python3","-m","http.server"]\'');
  }
  return v as string[];
}

/** `KEY=value` entries of `base` with `add` merged over them: a key keeps its place, new keys go last. */
export function mergeEnv(base: string[], add: Record<string, string>): string[] {
  const out = [...base];
  const index = new Map<string, number>();
  out.forEach((e, i) => index.set(e.includes('=') ? e.slice(0, e.indexOf('=')) : e, i));
  for (const [k, v] of Object.entries(add)) {
    const i = index.get(k);
    if (i === undefined) out.push(`${k}=${v}`);
    else out[i] = `${k}=${v}`;
  }
  return out;
}

/** The config overrides for the flags; undefined when none was given. */
async function configOf(client: DsecClient, f: BuildFlags): Promise<Partial<ImageConfig> | undefined> {
  const config: Partial<ImageConfig> = {};
  if (f.env !== undefined) {
    const base = f.base !== undefined ? (await client.getImage(f.base)).config.env : SCRATCH_ENV;
    config.env = mergeEnv(base, f.env);
  }
  if (f.cwd !== undefined) config.cwd = f.cwd;
  if (f.user !== undefined) config.user = f.user;
  if (f.cmd !== undefined) config.cmd = parseCmd(f.cmd);
  const security = imageSecurityOf(f);
  if (security) config.security = security;
  return Object.keys(config).length > 0 ? config : undefined;
}

/** Adds `build` to the `image` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return addImageSecurityOptions(parent
    .command('build')
    .description('build an image from a directory tree (read by dsecd on its host)')
    .argument('<dir>', 'directory tree to pack as one layer (its path is read by dsecd, on the daemon host)')
    .requiredOption('-t, --tag <name[:tag]>', 'name of the new image')
    .option('--base <image>', 'put the layer on top of this image and start from its config')
    .option('--env <K=V>', "image environment, repeatable; merged over the base image's", flag('--env', collectEnv))
    .option('--cwd <dir>', 'working directory of execs (absolute)', flag('--cwd', parseAbsolute))
    .option('--user <user>', 'default user, name or uid[:gid]')
    .option('--cmd <word...>', 'default command: the words up to the next option, or one JSON array'))
    .addHelpText(
      'after',
      '\nDIR is resolved to an absolute path here and read by dsecd on its own host (the\n' +
        'machine of the socket), with dsecd\'s permissions.\n' +
        'To import a tar or OCI archive use `dsec image import`.\n',
    )
    .action(async (dir: string, flags: BuildFlags) => {
      const path = resolve(dir);
      const st = await stat(path).catch(() => undefined);
      // Missing here may still exist where dsecd looks; only a visible non-directory is refused.
      if (st && !st.isDirectory()) {
        throw new UserError(`${path} is not a directory`, 'to import a tar or OCI archive use `dsec image import PATH --tag NAME`');
      }
      const client = ctx.client();
      const config = await configOf(client, flags);
      await runImageOperation(ctx, 'build', (opts) =>
        client.importImage({ type: 'dir', path, image: flags.tag, ...(flags.base !== undefined ? { base: flags.base } : {}), ...(config ? { config } : {}) }, opts),
      );
    });
}
