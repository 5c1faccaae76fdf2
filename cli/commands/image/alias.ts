/**
 * `dsec image alias NAME IMAGE [--backend B]`: makes NAME an E2B template (the
 * `templateID` E2B's SDKs pass to `Sandbox.create`) for IMAGE on backend B (default
 * container); `dsec image alias NAME --rm` removes the alias (removing `base` brings back
 * the built-in e2b-base); `dsec image alias` alone lists the templates. Setting and
 * removing are admin operations (docs/E2B.md).
 */
import type { Command } from 'commander';
import type { Backend, E2bTemplate } from '../../../sdk/index.js';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { makeTable, tableText, writeJson } from '../../util/output.js';

/** Column headers of the template table. */
export const TEMPLATE_COLUMNS = ['TEMPLATE', 'IMAGE', 'BACKEND', 'SOURCE'] as const;

/** The template table: name, image, backend, and whether it is an alias or the built-in default. */
export function renderTemplateTable(templates: E2bTemplate[], opts: { color?: boolean } = {}): string {
  const t = makeTable([...TEMPLATE_COLUMNS], { color: opts.color ?? false });
  for (const x of templates) t.push([x.name, x.image, x.backend, x.builtin ? 'built-in' : 'alias']);
  return tableText(t);
}

const BACKENDS = ['container', 'microvm', 'vm', 'fncall'];

/** Adds `alias` to the `image` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('alias')
    .description('name an image as an E2B template (no args: list the templates)')
    .argument('[name]', 'template name E2B clients pass as templateID, e.g. base')
    .argument('[image]', 'image the template creates sandboxes from, name[:tag]')
    .option('--backend <backend>', 'backend of its sandboxes: container (default), microvm, vm')
    .option('--rm', 'remove the alias NAME')
    .action(async (name: string | undefined, image: string | undefined, o: { backend?: string; rm?: boolean }) => {
      const client = ctx.client();
      if (o.backend !== undefined && !BACKENDS.includes(o.backend)) throw new UserError(`--backend ${o.backend}: one of ${BACKENDS.join(', ')}`, 'e.g. dsec image alias base e2b-base --backend container');
      if (name === undefined) {
        if (o.rm || o.backend) throw new UserError('--rm and --backend need a template NAME', 'dsec image alias NAME IMAGE [--backend B], or dsec image alias NAME --rm');
        const templates = await client.listTemplates();
        if (ctx.json) writeJson(ctx.io.stdout, { templates });
        else ctx.out(renderTemplateTable(templates, { color: ctx.color }));
        return;
      }
      if (o.rm) {
        if (image !== undefined) throw new UserError('--rm takes the template NAME only', `dsec image alias ${name} --rm`);
        const gone = await client.removeTemplate(name);
        if (ctx.json) writeJson(ctx.io.stdout, gone);
        else ctx.out(`${gone.name}\n`);
        return;
      }
      if (image === undefined) throw new UserError(`an IMAGE is needed to make ${name} a template`, `dsec image alias ${name} IMAGE [--backend container]; dsec image alias ${name} --rm removes it`);
      const t = await client.setTemplate(name, image, o.backend as Backend | undefined);
      if (ctx.json) writeJson(ctx.io.stdout, t);
      else ctx.out(`${t.name} -> ${t.image} (${t.backend})\n`);
    });
}
