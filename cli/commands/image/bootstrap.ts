/**
 * `dsec image bootstrap debian|judge [--tag NAME[:TAG]] [--include PKG]...`: builds on
 * dsecd's host either the Debian bookworm (minbase) base image with debootstrap, or the
 * judge image: that base (bootstrapped first when missing) plus a toolkit layer with gcc,
 * g++ and libc6-dev. Minutes on a cache miss, seconds from dsecd's cache. Progress
 * (debootstrap's and apt's lines) on stderr; the new ref (or Image with --json) on stdout.
 */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { runImageOperation } from '../../util/long.js';
import { flag } from '../../util/parse.js';

/** What dsecd can bootstrap: a distribution, or a toolkit image on top of one (see the API's `toolkit`). */
export const TARGETS = ['debian', 'judge'] as const;
/** Toolkit targets: `<name>` is sent as `{distro: 'debian', toolkit: <name>}`. */
const TOOLKITS: readonly string[] = ['judge'];

/** Debian package names, as the API accepts them. */
const PACKAGE = /^[a-z0-9][a-z0-9+.-]*$/;

/** Commander collector for repeatable `--include`: validates one package name and appends it. */
function collectPackage(text: string, prev: string[] | undefined): string[] {
  if (!PACKAGE.test(text)) throw new UserError(`invalid package name ${JSON.stringify(text)}`, 'package names are lowercase letters, digits and + . -, e.g. python3');
  return [...(prev ?? []), text];
}

/** Adds `bootstrap` to the `image` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('bootstrap')
    .description('build the Debian base image (debootstrap) or the judge image (base + gcc/g++ layer) on the dsecd host')
    .argument('<target>', `debian (bookworm, minbase + python3, git) or judge (debian:bookworm + gcc, g++, libc6-dev as a second layer)`)
    .option('-t, --tag <name[:tag]>', 'name of the new image (default debian:bookworm, judge:bookworm)')
    .option('--include <pkg>', 'extra package of the layer being built, repeatable (debian: default python3, git)', flag('--include', collectPackage))
    .action(async (target: string, flags: { tag?: string; include?: string[] }) => {
      if (!(TARGETS as readonly string[]).includes(target)) {
        throw new UserError(`cannot bootstrap ${JSON.stringify(target)}`, `targets are ${TARGETS.join(', ')}`);
      }
      const client = ctx.client();
      await runImageOperation(ctx, 'bootstrap', (opts) =>
        client.bootstrapImage(
          {
            distro: 'debian',
            ...(TOOLKITS.includes(target) ? { toolkit: target as 'judge' } : {}),
            ...(flags.tag !== undefined ? { image: flags.tag } : {}),
            ...(flags.include !== undefined ? { include: flags.include } : {}),
          },
          opts,
        ),
      );
    });
}
