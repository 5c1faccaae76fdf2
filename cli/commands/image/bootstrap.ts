/**
 * `dsec image bootstrap debian [--tag NAME[:TAG]] [--include PKG]...`: builds a Debian
 * bookworm (minbase) base image with debootstrap on dsecd's host; minutes on a cache
 * miss. Progress (debootstrap's lines) on stderr; the new ref (or Image with --json) on
 * stdout.
 */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { runImageOperation } from '../../util/long.js';
import { flag } from '../../util/parse.js';

/** Distributions dsecd can bootstrap. */
export const DISTROS = ['debian'] as const;

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
    .description('build a Debian base image with debootstrap on the dsecd host')
    .argument('<distro>', `distribution: ${DISTROS.join(', ')} (bookworm, minbase)`)
    .option('-t, --tag <name[:tag]>', 'name of the new image (default debian:bookworm)')
    .option('--include <pkg>', 'extra package, repeatable (default python3, git)', flag('--include', collectPackage))
    .action(async (distro: string, flags: { tag?: string; include?: string[] }) => {
      if (!(DISTROS as readonly string[]).includes(distro)) {
        throw new UserError(`cannot bootstrap ${JSON.stringify(distro)}`, `distributions are ${DISTROS.join(', ')}`);
      }
      const client = ctx.client();
      await runImageOperation(ctx, 'bootstrap', (opts) =>
        client.bootstrapImage(
          { distro: 'debian', ...(flags.tag !== undefined ? { image: flags.tag } : {}), ...(flags.include !== undefined ? { include: flags.include } : {}) },
          opts,
        ),
      );
    });
}
