/**
 * The `--selector S` form of the verbs that act on many sandboxes (`pause`, `resume`,
 * `stop`, `rm`, `ttl`): one POST /v1/sandboxes/bulk, which dsecd applies to every
 * sandbox whose labels match, instead of one call per id. Sandbox ids and `--selector`
 * are alternatives: giving both, or neither, is a user error before any request.
 *
 * dsecd answers with a result per matched sandbox, reported as cli/util/batch.ts reports
 * per-id results:
 * Text: each done sandbox on stdout (its id, or the verb's own line), each failure on
 * stderr as `dsec: VERB ID: message (Code)`, then one `hint:` line per distinct hint.
 * `--json`: `{"results": [...]}` on stdout, each result as dsecd sent it,
 * `{id, ok: true, state, reclaim?}` or `{id, ok: false, error: {code, message, hint}}`
 * (the hint added here); when any failed, also a top-level `error`. Exit 125 when any
 * failed. A selector that matches nothing is not a failure: stderr says so, exit 0.
 */
import type { Command } from 'commander';
import type { BulkInput, BulkResult, ErrorKind } from '../../sdk/index.js';
import type { Ctx } from './context.js';
import { EXIT, UserError, hintFor, type ErrorDoc } from './errors.js';
import { writeJson } from './output.js';
import { flag, parseSelector } from './parse.js';

/** Adds `--selector S` to a verb that otherwise takes sandbox ids. */
export function addSelectorOption(cmd: Command): Command {
  return cmd.option(
    '--selector <sel>',
    'instead of ids: every sandbox whose labels match all terms, k=v, k!=v or k (has key), comma-separated',
    flag('--selector', parseSelector),
  );
}

/** Which sandboxes a verb acts on: the ids given, or those matching a selector. */
export type Targets = { ids: string[] } | { selector: string };

/**
 * The targets of `verb` from its id arguments and `--selector`: exactly one of the two.
 * @throws UserError when both or neither were given
 */
export function targetsOf(verb: string, ids: string[], selector: string | undefined): Targets {
  const hint = `e.g. \`dsec ${verb} ID...\` or \`dsec ${verb} --selector job=a,round=3\``;
  if (selector !== undefined && ids.length > 0) throw new UserError(`give sandbox ids or --selector, not both (got ${ids.length === 1 ? 'an id' : `${ids.length} ids`} and --selector ${selector})`, hint);
  if (selector !== undefined) return { selector };
  if (ids.length === 0) throw new UserError('missing sandbox ids (or --selector)', hint);
  return { ids };
}

/** How a bulk verb reports. */
export interface BulkSpec {
  /** The verb as typed, for messages and hints: `pause`, `rm`. */
  verb: string;
  /** The text line of a done sandbox (without the newline); default its id. */
  line?: (r: BulkResult) => string;
}

/**
 * Sends `req` to POST /v1/sandboxes/bulk and reports the results (see the file comment).
 * An error of the call itself (a bad selector, dsecd unreachable) propagates as usual.
 */
export async function runBulk(ctx: Ctx, req: BulkInput, spec: BulkSpec): Promise<void> {
  const results = await ctx.client().bulk(req);
  const failed = results.filter((r) => !r.ok);
  const docs = new Map<BulkResult, ErrorDoc>();
  for (const r of failed) docs.set(r, errorDoc(r, spec.verb));

  if (results.length === 0) ctx.err(`dsec: no sandbox matches --selector ${req.selector}; nothing to ${spec.verb}\n`);
  if (!ctx.json) for (const r of results) if (r.ok) ctx.out((spec.line ? spec.line(r) : r.id) + '\n');
  for (const r of failed) ctx.err(`dsec: ${spec.verb} ${r.id}: ${docs.get(r)!.message} (${docs.get(r)!.code})\n`);
  for (const hint of new Set(failed.map((r) => docs.get(r)!.hint))) if (hint !== null) ctx.err(`hint: ${hint}\n`);

  if (ctx.json) {
    const doc: Record<string, unknown> = { results: results.map((r) => (r.ok ? r : { ...r, error: docs.get(r) })) };
    if (failed.length > 0) {
      const first = docs.get(failed[0])!;
      doc.error = {
        code: first.code,
        message: `${spec.verb} failed for ${failed.length} of ${results.length} sandboxes matching ${req.selector}: ${failed.map((r) => r.id).join(', ')}`,
        hint: first.hint,
      } satisfies ErrorDoc;
    }
    writeJson(ctx.io.stdout, doc);
  }
  if (failed.length > 0) ctx.exitCode = EXIT.failure;
}

/** The error of a failed result with its hint; a code outside the closed set (a newer dsecd) is reported as sent, hinted as Internal. */
function errorDoc(r: BulkResult, verb: string): ErrorDoc {
  const code = (r.error?.code ?? 'Internal') as ErrorKind;
  const message = r.error?.message ?? `${verb} ${r.id} failed on dsecd (no message)`;
  // status 200: dsecd itself answered (this is its verdict on one sandbox, not a broken connection).
  const hint = hintFor(code, verb, { status: 200, message }) ?? hintFor('Internal', verb);
  return { code, message, hint };
}
