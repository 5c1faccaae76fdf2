/**
 * `dsec restore SNAPSHOT [overrides]`: creates a sandbox from a snapshot (by id or name)
 * and prints its id (or the Sandbox with --json). Every setting defaults to the snapshot's
 * source sandbox; the overrides (`--label`, `--env`, `--cpus`, `--memory`, `--pids`, `--disk`,
 * `--ttl`, `--priority`, `--idle-timeout`) take the values `dsec create` takes, parsed by
 * the same parsers, and the network (`--network`, `--allow`, `--deny`, `--network-policy`),
 * seccomp (`--seccomp-allow`, `--seccomp-deny`) and filesystem (`--writable`, `--readonly`,
 * `--no-readonly`, `--landlock`, `--no-landlock`) flags. `--label` replaces the source's
 * labels, `--env` is merged over its env. On a terminal, stderr shows the progress as
 * `dsec create` does.
 * Also exports the overrides and their translation, which `dsec fork` shares.
 */
import type { Command } from 'commander';
import type { RestoreInput } from '../../sdk/index.js';
import type { Ctx } from '../util/context.js';
import { runCreate } from '../util/long.js';
import { writeJson } from '../util/output.js';
import { collectEnv, collectLabel, flag, parseCpus, parsePositiveInt, parseSize, parseWholeSeconds } from '../util/parse.js';
import { PRIORITIES, createRequest, parsePriority, parseTtl, type CreateFlags } from './create.js';
import { addNetworkOptions } from '../util/network.js';
import { addFilesystemOptions, collectSyscall } from '../util/security.js';

/** Parsed overrides of `restore` and `fork`: the create flags without `--backend` and `--image` (a snapshot fixes both). */
export type RestoreFlags = Omit<CreateFlags, 'backend' | 'image'>;

/**
 * Adds the overrides of a restore or fork (`--label`, `--env`, `--cpus`, `--memory`,
 * `--pids`, `--disk`, `--ttl`, `--priority`, `--idle-timeout`) to `cmd`, with the parsers of
 * `dsec create`.
 */
export function addRestoreOptions(cmd: Command): Command {
  const c = addNetworkOptions(cmd)
    .option('--seccomp-allow <syscall>', 'lift the default seccomp profile\'s denial of this syscall, repeatable (default: none; a snapshot keeps no override)', flag('--seccomp-allow', collectSyscall))
    .option('--seccomp-deny <syscall>', 'also deny this syscall (EPERM), repeatable', flag('--seccomp-deny', collectSyscall))
    .option('--label <k=v>', "label, repeatable (each key once); replaces the snapshot's labels", flag('--label', collectLabel))
    .option('--env <K=V>', "environment for every exec, repeatable (each name once); merged over the snapshot's", flag('--env', collectEnv))
    .option('--cpus <n>', "CPU limit in cores, fractions allowed (default: the snapshot's source)", flag('--cpus', parseCpus))
    .option('--memory <size>', "memory limit: bytes or K/M/G (binary), e.g. 512M (default: the snapshot's source)", flag('--memory', parseSize))
    .option('--pids <n>', "maximum number of processes (default: the snapshot's source)", flag('--pids', parsePositiveInt))
    .option('--disk <size>', "quota on the writable layer: bytes or K/M/G (binary), e.g. 2G (default: the snapshot's source)", flag('--disk', parseSize))
    .option('--ttl <dur>', 'destroy the sandbox this long after creation; a number with a unit, s, m, h or d (e.g. 90s, 10m; rounded up to whole seconds)', flag('--ttl', parseTtl))
    .option('--priority <class>', `scheduling class: ${PRIORITIES.join(' or ')} (default: the snapshot's source)`, flag('--priority', parsePriority))
    .option('--idle-timeout <dur>', 'pause the sandbox after this long without an exec (e.g. 5m; rounded up to whole seconds)', flag('--idle-timeout', (t: string) => parseWholeSeconds(t, '--idle-timeout')));
  return addFilesystemOptions(c, 'the new sandbox(es), field by field over the snapshot\'s');
}

/** The restore request for parsed overrides; unset flags are left to the snapshot's defaults. */
export function restoreRequest(f: RestoreFlags): RestoreInput {
  const { backend: _b, image: _i, ...req } = createRequest(f);
  return req;
}

/** Adds `restore` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent
    .command('restore')
    .description('create a sandbox from a snapshot and print its id')
    .argument('<snapshot>', 'snapshot id (snap-...) or name');
  return addRestoreOptions(cmd).action(async (ref: string, flags: RestoreFlags) => {
    const sandbox = await runCreate(ctx, { label: `restoring ${ref}`, abortOnInterrupt: true }, (o) => ctx.client().restore(ref, restoreRequest(flags), o));
    if (!sandbox) return;
    if (ctx.json) writeJson(ctx.io.stdout, sandbox);
    else ctx.out(sandbox.id + '\n');
  });
}
