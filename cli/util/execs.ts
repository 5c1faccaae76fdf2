/**
 * Naming exec sessions on the command line: a full exec id, or a unique prefix of one
 * (as the 12-character ids `dsec execs` prints), resolved against the sandbox's sessions.
 */
import type { Ctx } from './context.js';
import { UserError } from './errors.js';

/** Length of a full exec id: 128 random bits in hex (daemon/sandbox/exec-sessions.ts). */
export const EXEC_ID_LENGTH = 32;

/**
 * The full exec id that `given` names in sandbox `sandboxId`: `given` itself when it is
 * full length, else the one session whose id starts with it. No match or several is a
 * {@link UserError}.
 */
export async function resolveExecId(ctx: Ctx, sandboxId: string, given: string): Promise<string> {
  if (!/^[0-9a-f]+$/i.test(given)) throw new UserError(`invalid exec id ${JSON.stringify(given)}`, `exec ids are hex; list them with \`dsec execs ${sandboxId}\``);
  if (given.length >= EXEC_ID_LENGTH) return given.toLowerCase();
  const prefix = given.toLowerCase();
  const matches = (await ctx.client().listExecs(sandboxId)).filter((e) => e.exec_id.startsWith(prefix));
  if (matches.length === 1) return matches[0].exec_id;
  if (matches.length === 0) throw new UserError(`no exec session ${given} in sandbox ${sandboxId}`, `list them with \`dsec execs ${sandboxId}\``, 'NotFound');
  throw new UserError(`exec id prefix ${given} is ambiguous in sandbox ${sandboxId} (${matches.length} sessions)`, 'give more characters of the id');
}
