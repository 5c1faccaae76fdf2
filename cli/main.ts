/**
 * The `dsec` CLI: `dsec [--socket PATH | --host URL --token T --ca FILE | --context NAME] [--json] VERB ...`.
 *
 * One file per verb under cli/commands/; this file wires them into commander, routes
 * all output through injectable streams, and turns every failure into an exit code:
 * 0 success; `exec`/`run`/`attach` pass the command's code through (128+N signal, 124 timeout);
 * 125 when dsec itself failed (API error, usage error, missing socket, bug).
 * `--help` anywhere exits 0. A usage error is one line; an API or user error is
 * `dsec: <message>` plus a `hint:` line; only a bug under DSEC_DEBUG=1 shows a stack.
 * With `--json`, every such failure is also written to stdout as one line
 * `{"error": {"code", "message", "hint"}}`.
 */
import { Command, CommanderError } from 'commander';
import * as attach from './commands/attach.js';
import * as commit from './commands/commit.js';
import * as consoleCmd from './commands/console.js';
import * as cp from './commands/cp.js';
import * as create from './commands/create.js';
import * as events from './commands/events.js';
import * as exec from './commands/exec.js';
import * as execsInspect from './commands/execs/inspect.js';
import * as execsKill from './commands/execs/kill.js';
import * as execsLs from './commands/execs/ls.js';
import * as execsRm from './commands/execs/rm.js';
import * as fork from './commands/fork.js';
import * as fleetCa from './commands/fleet/ca.js';
import * as fleetCert from './commands/fleet/cert.js';
import * as tokenCreate from './commands/token/create.js';
import * as contextAdd from './commands/context/add.js';
import * as contextLs from './commands/context/ls.js';
import * as contextRm from './commands/context/rm.js';
import * as contextUse from './commands/context/use.js';
import * as tokenLs from './commands/token/ls.js';
import * as tokenRevoke from './commands/token/revoke.js';
import * as hostInfo from './commands/host/info.js';
import * as hostReload from './commands/host/reload.js';
import * as hostFleet from './commands/host/fleet.js';
import * as imageAlias from './commands/image/alias.js';
import * as hosts from './commands/hosts.js';
import * as imageBootstrap from './commands/image/bootstrap.js';
import * as imageBuild from './commands/image/build.js';
import * as imageCompose from './commands/image/compose.js';
import * as imageImport from './commands/image/import.js';
import * as imageInspect from './commands/image/inspect.js';
import * as imageLs from './commands/image/ls.js';
import * as imagePrune from './commands/image/prune.js';
import * as imageRm from './commands/image/rm.js';
import * as imageTag from './commands/image/tag.js';
import * as images from './commands/images.js';
import * as inspect from './commands/inspect.js';
import * as jobLease from './commands/job/lease.js';
import * as jobLs from './commands/job/ls.js';
import * as jobRenew from './commands/job/renew.js';
import * as jobRm from './commands/job/rm.js';
import * as layerInspect from './commands/layer/inspect.js';
import * as layerLs from './commands/layer/ls.js';
import * as logs from './commands/logs.js';
import * as networkAdd from './commands/network/add.js';
import * as networkPolicies from './commands/network/policies.js';
import * as networkReload from './commands/network/reload.js';
import * as networkRm from './commands/network/rm.js';
import * as networkSet from './commands/network/set.js';
import * as networkShow from './commands/network/show.js';
import * as ls from './commands/ls.js';
import * as pause from './commands/pause.js';
import * as restore from './commands/restore.js';
import * as resume from './commands/resume.js';
import * as rm from './commands/rm.js';
import * as run from './commands/run.js';
import * as call from './commands/call.js';
import * as snapshotCreate from './commands/snapshot/create.js';
import * as snapshotInspect from './commands/snapshot/inspect.js';
import * as snapshotLs from './commands/snapshot/ls.js';
import * as snapshotRm from './commands/snapshot/rm.js';
import * as start from './commands/start.js';
import * as stop from './commands/stop.js';
import * as top from './commands/top.js';
import * as trajExport from './commands/traj/export.js';
import * as trajLs from './commands/traj/ls.js';
import * as trajRm from './commands/traj/rm.js';
import * as trajShow from './commands/traj/show.js';
import * as ttl from './commands/ttl.js';
import * as version from './commands/version.js';
import { clientVersion } from './util/version.js';
import { Ctx } from './util/context.js';
import { EXIT, UserError, reportError, writeJsonError } from './util/errors.js';
import { exitQuietlyOnEpipe, processIO, type CliIO } from './util/io.js';

/** Everything `main` touches outside itself; each field defaults to the real process's. */
export type MainIO = Partial<CliIO>;

/**
 * Runs the CLI once and resolves with the exit code (it never calls `process.exit`).
 * `argv` is in `process.argv` form: `[node, script, ...args]`. Streams, environment and
 * the interrupt hook default to the process's and can be injected (tests run in-process).
 */
export async function main(argv: string[], ioOverrides: MainIO = {}): Promise<number> {
  const io = resolveIO(ioOverrides);
  const program = new Command('dsec');
  const ctx = new Ctx(io, program);
  let usageCommand: Command = program;
  let helpAsError = false;

  program
    .description('control dsec sandboxes through dsecd')
    .option('--socket <path>', 'dsecd socket (default $DSEC_SOCKET, else /run/dsec/dsecd.sock)')
    .option('--host <url>', "dsecd's TCP door, https://HOST:PORT (default $DSEC_HOST, else the current context, else the socket)")
    .option('--token <token>', 'API token for --host (default $DSEC_TOKEN, or the context\'s)')
    .option('--ca <file>', 'CA certificate to trust for --host (default $DSEC_CA, or the context\'s)')
    .option('--context <name>', 'a saved context (`dsec context ls`)')
    .option('--json', 'machine-readable JSON output')
    // Under --json the version is the client half of `dsec --json version`'s object.
    .version(jsonRequested(argv) ? JSON.stringify({ client: { version: clientVersion() } }, null, 2) : clientVersion(), '-V, --version', 'print the client\'s version (`dsec version` asks dsecd for its own too); JSON with --json')
    .exitOverride()
    .showSuggestionAfterError(true);

  version.register(program, ctx);
  const host = program.command('host').description('host commands');
  hostInfo.register(host, ctx);
  hostReload.register(host, ctx);
  hostFleet.register(host, ctx);
  hosts.register(program, ctx);
  create.register(program, ctx);
  ls.register(program, ctx);
  inspect.register(program, ctx);
  exec.register(program, ctx);
  attach.register(program, ctx);
  consoleCmd.register(program, ctx);
  const execs = execsLs.registerGroup(program, ctx);
  for (const verb of [execsLs, execsInspect, execsKill, execsRm]) verb.register(execs, ctx);
  cp.register(program, ctx);
  logs.register(program, ctx);
  top.register(program, ctx);
  run.register(program, ctx);
  call.register(program, ctx);
  stop.register(program, ctx);
  start.register(program, ctx);
  rm.register(program, ctx);
  pause.register(program, ctx);
  resume.register(program, ctx);
  ttl.register(program, ctx);
  const job = program.command('job').description('job leases (a job is the sandboxes labelled job=JOB): lease, renew, ls, rm');
  for (const verb of [jobLease, jobRenew, jobLs, jobRm]) verb.register(job, ctx);
  events.register(program, ctx);
  const network = program.command('network').description("sandbox networks and network policies: show, add, rm, set, policies, reload");
  for (const verb of [networkShow, networkAdd, networkRm, networkSet, networkPolicies, networkReload]) verb.register(network, ctx);
  commit.register(program, ctx);
  const image = program.command('image').description('image commands: ls, inspect, build, import, compose, bootstrap, tag, alias, rm, prune');
  for (const verb of [imageLs, imageInspect, imageBuild, imageImport, imageCompose, imageBootstrap, imageTag, imageAlias, imageRm, imagePrune]) verb.register(image, ctx);
  const layer = program.command('layer').description('layer commands: ls, inspect');
  for (const verb of [layerLs, layerInspect]) verb.register(layer, ctx);
  images.register(program, ctx);
  // `dsec snapshot ID [NAME]` runs the default subcommand `create`: sandbox ids are 16 hex
  // characters, never `ls`, `inspect` or `rm`.
  const snapshot = program.command('snapshot').description('snapshot a sandbox (`dsec snapshot ID [NAME]`), or: ls, inspect, rm');
  for (const verb of [snapshotCreate, snapshotLs, snapshotInspect, snapshotRm]) verb.register(snapshot, ctx);
  restore.register(program, ctx);
  fork.register(program, ctx);
  const token = program.command('token').description('API tokens of the TCP door (admin): create, ls, revoke');
  for (const verb of [tokenCreate, tokenLs, tokenRevoke]) verb.register(token, ctx);
  const context = program.command('context').description('saved dsecd endpoints (TCP door or gateway, token, CA): add, use, ls, rm');
  for (const verb of [contextAdd, contextUse, contextLs, contextRm]) verb.register(context, ctx);
  const fleet = program.command('fleet').description('fleet identity (runs locally): ca, cert');
  for (const verb of [fleetCa, fleetCert]) verb.register(fleet, ctx);
  const traj = program.command('traj').alias('trajectory').description('trajectories (steps recorded by `dsec exec --trajectory`): ls, show, export, rm');
  for (const verb of [trajLs, trajShow, trajExport, trajRm]) verb.register(traj, ctx);

  // Per command, so a usage error knows which command's --help to point at. outputError
  // is silenced (main prints the one line); writeErr only ever receives help shown as an
  // error (a missing subcommand), which main replaces with one line too.
  forEachCommand(program, (cmd) => {
    cmd.configureOutput({
      writeOut: (s) => io.stdout.write(s),
      writeErr: () => {
        usageCommand = cmd;
        helpAsError = true;
      },
      outputError: () => {
        usageCommand = cmd;
      },
      getOutHelpWidth: () => 80,
      getErrHelpWidth: () => 80,
      getOutHasColors: () => false,
      getErrHasColors: () => false,
    });
  });
  program.hook('preAction', (_root, action) => {
    ctx.verb = commandPath(action);
    if (ctx.globals.socket === '') {
      throw new UserError('empty --socket', 'pass --socket PATH, or leave it out to use $DSEC_SOCKET or /run/dsec/dsecd.sock');
    }
  });

  try {
    await program.parseAsync(argv, { from: 'node' });
    return ctx.exitCode;
  } catch (e) {
    // --json may not be parsed yet when a flag before it fails; then look at argv.
    const jsonOut = ctx.json || jsonRequested(argv) ? io.stdout : undefined;
    if (e instanceof CommanderError) return usageError(e, usageCommand, helpAsError, io, jsonOut);
    return reportError(e, io.stderr, ctx.verb || 'dsec', ctx.debug, jsonOut);
  } finally {
    ctx.close();
  }
}

/** The process's I/O with `overrides` applied; process.stdin is only touched if read. */
function resolveIO(overrides: MainIO): CliIO {
  const base = processIO();
  if (!overrides.stdout) exitQuietlyOnEpipe();
  return {
    stdout: overrides.stdout ?? base.stdout,
    stderr: overrides.stderr ?? base.stderr,
    get stdin() {
      return overrides.stdin ?? base.stdin;
    },
    env: overrides.env ?? base.env,
    onInterrupt: overrides.onInterrupt ?? base.onInterrupt,
  };
}

/** True when `--json` appears among dsec's own arguments (before any `--`). */
function jsonRequested(argv: string[]): boolean {
  for (const a of argv.slice(2)) {
    if (a === '--') return false;
    if (a === '--json') return true;
  }
  return false;
}

/**
 * Prints a commander error as one line and returns its exit code: 0 for help that was
 * asked for (`--help`, `help VERB`), else 125. `helpAsError`: commander wanted to show
 * help on stderr because a subcommand was missing. `jsonOut` (stdout under `--json`)
 * also receives `{"error": {...}}`.
 */
function usageError(e: CommanderError, cmd: Command, helpAsError: boolean, io: CliIO, jsonOut?: CliIO['stdout']): number {
  if (e.code === 'commander.helpDisplayed' || e.code === 'commander.version') return EXIT.ok;
  if (e.code === 'commander.help' && !helpAsError) return EXIT.ok;
  const path = commandPath(cmd);
  const help = path ? `dsec ${path} --help` : 'dsec --help';
  let msg: string;
  if (e.code === 'commander.help') {
    const subs = cmd.commands.map((c) => c.name()).filter((n) => n !== 'help');
    msg = `missing command (one of: ${subs.join(', ')})`;
  } else {
    msg = e.message.replace(/^error: /, '').replace(/\s*\n\s*/g, ' ').trim().replace(/\.$/, '');
    if (e.code === 'commander.unknownOption' && (path === 'exec' || path === 'run')) msg += ' (put the command after --, e.g. -- ls -la)';
  }
  io.stderr.write(`dsec: ${msg}; see \`${help}\`\n`);
  if (jsonOut) writeJsonError(jsonOut, { code: 'InvalidArgument', message: msg, hint: `see \`${help}\`` });
  return EXIT.failure;
}

/** Calls `fn` on `cmd` and all its descendants. */
function forEachCommand(cmd: Command, fn: (c: Command) => void): void {
  fn(cmd);
  for (const c of cmd.commands) forEachCommand(c, fn);
}

/** `cmd`'s name path below the root, e.g. `host info`; `''` for the root. */
function commandPath(cmd: Command): string {
  const names: string[] = [];
  for (let c: Command | null = cmd; c && c.parent; c = c.parent) names.unshift(c.name());
  return names.join(' ');
}
