/**
 * What the verbs that act on several targets share (`rm ID...`, `stop ID...`,
 * `pause ID...`, `resume ID...`, `image rm REF...`, `job rm JOB...`): every target is
 * tried (concurrently), one failing does not stop the others, and the outcome is reported
 * per target. (The `--selector` form of the sandbox verbs is one bulk call, reported the
 * same way by cli/util/bulk.ts.)
 *
 * Text: each done target on stdout, one line per line (the target, or the verb's own
 * line: `pause` says what it reclaimed); each failure on stderr as
 * `dsec: VERB TARGET: message (Code)`, then one `hint:` line per distinct hint.
 * `--json`: `{"results": [...]}` on stdout, each result `{KEY, ok: true, VALUE_KEY: ...}`
 * or `{KEY, ok: false, error: {code, message, hint}}`; when any failed, the document also
 * has a top-level `error` (as every failing `--json` run does), and stderr gets the same
 * lines as in text mode. Exit 125 when any failed.
 */
import { DsecApiError } from '../../sdk/index.js';
import type { Ctx } from './context.js';
import { EXIT, UserError, apiErrorHint, type ErrorDoc } from './errors.js';
import { writeJson } from './output.js';

/** How a batch verb names its targets and results. */
export interface BatchSpec {
  /** The verb as typed, for messages and hints: `rm`, `stop`, `image rm`. */
  verb: string;
  /** Name of the target field in a JSON result: `id` or `ref`. */
  key: string;
  /** Name of the value field of a successful JSON result: `sandbox` or `image`. */
  valueKey: string;
  /** Plural noun for the summary error, e.g. `sandboxes`. */
  noun: string;
}

/** A {@link BatchSpec} with custom output of a done target (`pause` prints what it reclaimed). */
export interface BatchFormat<T> {
  /** The text line of a done target (without the newline); default the target itself. */
  line?: (target: string, value: T) => string;
  /** The fields of a done target's JSON result after `{KEY, ok: true}`; default `{VALUE_KEY: value}`. */
  json?: (value: T) => Record<string, unknown>;
}

/**
 * Runs `op` on every target concurrently and reports the outcomes (see the file comment).
 * API errors and user errors (a refusal about that one target) are per-target failures;
 * any other error (a bug) propagates after all targets settle.
 */
export async function runBatch<T>(ctx: Ctx, targets: string[], spec: BatchSpec & BatchFormat<T>, op: (target: string) => Promise<T>): Promise<void> {
  const outcomes = await Promise.all(
    targets.map(async (target): Promise<Outcome<T>> => {
      try {
        return { target, ok: true, value: await op(target) };
      } catch (e) {
        if (e instanceof UserError) return { target, ok: false, error: e, doc: { code: e.code, message: e.message, hint: e.hint ?? null } };
        if (!(e instanceof DsecApiError)) return { target, ok: false, bug: e };
        return { target, ok: false, error: e, doc: { code: e.code, message: e.message, hint: apiErrorHint(e, spec.verb) } };
      }
    }),
  );
  for (const o of outcomes) if (!o.ok && o.doc === undefined) throw o.bug;

  const failed = outcomes.filter((o): o is Failure => !o.ok);
  if (!ctx.json) for (const o of outcomes) if (o.ok) ctx.out((spec.line ? spec.line(o.target, o.value) : o.target) + '\n');
  for (const o of failed) ctx.err(`dsec: ${spec.verb} ${o.target}: ${o.error!.message} (${o.error!.code})\n`);
  for (const hint of new Set(failed.map((o) => o.doc!.hint))) if (hint !== null) ctx.err(`hint: ${hint}\n`);

  if (ctx.json) {
    const done = (o: Success<T>) => ({ [spec.key]: o.target, ok: true, ...(spec.json ? spec.json(o.value) : { [spec.valueKey]: o.value }) });
    const results = outcomes.map((o) => (o.ok ? done(o) : { [spec.key]: o.target, ok: false, error: o.doc }));
    const doc: Record<string, unknown> = { results };
    if (failed.length > 0) {
      doc.error = {
        code: failed[0].doc!.code,
        message: `${spec.verb} failed for ${failed.length} of ${outcomes.length} ${spec.noun}: ${failed.map((o) => o.target).join(', ')}`,
        hint: failed[0].doc!.hint,
      } satisfies ErrorDoc;
    }
    writeJson(ctx.io.stdout, doc);
  }
  if (failed.length > 0) ctx.exitCode = EXIT.failure;
}

/** A target done. */
interface Success<T> {
  target: string;
  ok: true;
  value: T;
}

/** A target that failed: an API error (with its `--json` object), or a bug (rethrown). */
interface Failure {
  target: string;
  ok: false;
  error?: DsecApiError | UserError;
  doc?: ErrorDoc;
  bug?: unknown;
}

type Outcome<T> = Success<T> | Failure;
