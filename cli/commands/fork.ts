/**
 * `dsec fork SNAPSHOT -n N [overrides]`: creates N sandboxes (1-256) from a snapshot (by
 * id or name) in one call, each with the overrides of `dsec restore`, and prints their
 * ids one per line in creation order (or `{sandboxes}` with --json). A rollout group
 * larger than 256 is several calls. On a terminal, stderr shows a spinner with how many
 * are running so far (cli/util/long.ts).
 */
import type { Command } from 'commander';
import type { Ctx } from '../util/context.js';
import { UserError } from '../util/errors.js';
import { runCreate } from '../util/long.js';
import { writeJson } from '../util/output.js';
import { flag, parsePositiveInt } from '../util/parse.js';
import { addRestoreOptions, restoreRequest, type RestoreFlags } from './restore.js';

/** Most sandboxes one fork call creates (LIMITS.maxForkCount in daemon/api/schema.ts). */
export const MAX_FORK_COUNT = 256;

/** Parses `-n N`: a whole number from 1 to {@link MAX_FORK_COUNT}. */
export function parseForkCount(text: string): number {
  const n = parsePositiveInt(text);
  if (n > MAX_FORK_COUNT) throw new UserError(`fork count ${n} is more than ${MAX_FORK_COUNT}`, `fork at most ${MAX_FORK_COUNT} per call; run \`dsec fork\` several times for a larger group`);
  return n;
}

/** Adds `fork` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent
    .command('fork')
    .description('create N sandboxes from a snapshot and print their ids')
    .argument('<snapshot>', 'snapshot id (snap-...) or name')
    .requiredOption('-n, --count <n>', `how many sandboxes, 1-${MAX_FORK_COUNT}`, flag('-n', parseForkCount));
  return addRestoreOptions(cmd).action(async (ref: string, flags: RestoreFlags & { count: number }) => {
    const { count, ...overrides } = flags;
    const sandboxes = await runCreate(ctx, { label: `forking ${ref} into ${count}`, count, abortOnInterrupt: true }, (o) => ctx.client().fork(ref, { count, ...restoreRequest(overrides) }, o));
    if (!sandboxes) return;
    if (ctx.json) writeJson(ctx.io.stdout, { sandboxes });
    else ctx.out(sandboxes.map((s) => s.id + '\n').join(''));
  });
}
