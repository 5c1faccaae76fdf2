/**
 * `dsec console ID [--tail LINES] [--log]`: attaches to the serial console of a vm
 * sandbox (its kernel, its init, a login prompt or shell on ttyS0). `--tail N` first
 * replays the last N lines of the console log, counted as `tail -n` and
 * `docker logs --tail` count them (default 0 with a terminal, 50 without).
 *
 * - With a terminal: raw mode (every key, ^C too, goes to the VM); Ctrl-P Ctrl-Q detaches
 *   (docker's sequence, as in `dsec attach`); the terminal is restored on every way out.
 * - Without one (a pipe): streams our stdin to the console and the console to our stdout;
 *   once our stdin ends, dsec detaches when the console has been quiet for `--linger`
 *   (default 1 s; the VM's answer to the last input still comes through); ^C or SIGTERM
 *   detaches at once.
 * - Ends with exit 0 when we detach, and when the console closes (the VM stopped: the
 *   reason is printed on stderr).
 * - `--log` prints the console log dsecd kept (bounded by `[vm] console_log_bytes`) and exits.
 *
 * `--json` is refused: the console's bytes are the output. Only vm sandboxes have a serial
 * console; others get dsecd's FailedPrecondition with the hint to use `dsec exec -it`.
 */
import type { Command } from 'commander';
import type { Ctx } from '../util/context.js';
import { EXIT, UserError } from '../util/errors.js';
import { flag } from '../util/parse.js';
import { DetachKeys, enterRawMode } from '../util/terminal.js';

/** Most lines `--tail` replays (the API's limit, MAX_TAIL_LINES in daemon/api/routes/console.ts). */
const MAX_TAIL_LINES = 100_000;

/** Lines replayed without a terminal when `--tail` is not given: enough to see where the console is. */
const PIPE_TAIL_LINES = 50;

/** Parses `--tail`: a whole number of lines, 0 to 100000. */
function parseTail(text: string): number {
  const n = /^\d+$/.test(text.trim()) ? Number(text.trim()) : NaN;
  if (!Number.isSafeInteger(n) || n > MAX_TAIL_LINES) throw new UserError(`invalid --tail ${JSON.stringify(text)}`, `a number of lines from 0 to ${MAX_TAIL_LINES}`);
  return n;
}

/** Parses `--linger`: a whole number of ms, 0 to 1 h. */
function parseLinger(text: string): number {
  const n = /^\d+$/.test(text.trim()) ? Number(text.trim()) : NaN;
  if (!Number.isSafeInteger(n) || n > 3_600_000) throw new UserError(`invalid --linger ${JSON.stringify(text)}`, 'a number of ms from 0 to 3600000');
  return n;
}

/** Adds `console` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('console')
    .description("attach to a vm sandbox's serial console; Ctrl-P Ctrl-Q detaches")
    .argument('<id>', 'sandbox id (backend vm)')
    .option('--tail <lines>', `replay the last LINES lines of the console log first (default 0 with a terminal, ${PIPE_TAIL_LINES} without)`, flag('--tail', parseTail))
    .option('--log', 'print the console log dsecd kept and exit')
    .option('--linger <ms>', 'without a terminal: after our stdin ends, detach once the console was quiet this long (ms, default 1000)', flag('--linger', parseLinger))
    .addHelpText('after', '\nDetach: Ctrl-P Ctrl-Q with a terminal; ^C otherwise. The VM keeps running either way.\nExamples:\n  dsec console ID\n  dsec console --tail 20 ID\n  echo "uname -a" | dsec console ID\n  dsec console --log ID')
    .action(async (id: string, opts: { tail?: number; log?: boolean; linger?: number }) => {
      if (ctx.json) throw new UserError('--json cannot be combined with console (the console\'s bytes are the output)', `read the log with \`dsec console --log ${id}\`, or drop --json`);
      const client = ctx.client();
      if (opts.log) {
        ctx.io.stdout.write(await client.consoleLog(id));
        return;
      }
      const { stdin, stdout } = ctx.io;
      const tty = stdin.isTTY === true;
      const att = client.attachConsole(id, { tailLines: opts.tail ?? (tty ? 0 : PIPE_TAIL_LINES) });
      const cleanups: (() => void)[] = [];
      let detached = false;
      let interrupted: NodeJS.Signals | undefined;
      let lastOutput = Date.now();
      att.on('stdout', (b) => {
        lastOutput = Date.now();
        if (stdout.write(b) === false && typeof stdout.on === 'function') {
          att.pause();
          const onDrain = () => {
            stdout.off?.('drain', onDrain);
            att.resume();
          };
          stdout.on('drain', onDrain);
        }
      });
      try {
        await att.opened;
        // Registered before raw mode: entering it runs `stty` synchronously, and a SIGTERM
        // before a handler exists would take the default action and leave the terminal raw.
        cleanups.push(ctx.io.onInterrupt((sig) => {
          interrupted ??= sig;
          att.close();
        }));
        if (tty) {
          cleanups.push(enterRawMode(stdin));
          ctx.err('dsec: attached to the serial console of ' + id + ' (Ctrl-P Ctrl-Q detaches)\r\n');
        }
        const keys = tty ? new DetachKeys() : null;
        const onData = (chunk: string | Uint8Array) => {
          let bytes: Buffer = typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : Buffer.from(chunk);
          if (keys) {
            const r = keys.feed(bytes);
            bytes = r.forward;
            if (bytes.length) att.write(bytes);
            if (r.detach) {
              detached = true;
              att.close();
            }
            return;
          }
          if (bytes.length && !att.write(bytes)) {
            stdin.pause?.();
            att.once('drain', () => stdin.resume?.());
          }
        };
        const linger = opts.linger ?? 1000;
        const onEnd = () => {
          if (tty) return;
          const t = setInterval(() => {
            if (Date.now() - lastOutput >= linger) {
              clearInterval(t);
              att.close();
            }
          }, Math.max(20, Math.min(200, linger)));
          cleanups.push(() => clearInterval(t));
        };
        if (typeof stdin.on === 'function') {
          stdin.on('data', onData);
          stdin.on('end', onEnd);
          stdin.on('error', () => {});
          stdin.resume?.();
          cleanups.push(() => {
            stdin.off?.('data', onData);
            stdin.off?.('end', onEnd);
            stdin.pause?.();
          });
        }
        const end = await att.done;
        if (end) {
          ctx.err(`${tty ? '\r\n' : ''}dsec: console of ${id} closed: ${end.reason}\n`);
        } else if (detached) {
          ctx.err(`\r\ndsec: detached from the console of ${id}; the VM keeps running (re-attach with \`dsec console ${id}\`)\n`);
        } else if (interrupted) {
          ctx.err(`${tty ? '\r\n' : ''}dsec: detached (${interrupted}); the VM keeps running\n`);
        }
        ctx.exitCode = EXIT.ok;
      } finally {
        for (const c of cleanups.reverse()) c();
        att.close();
      }
    });
}
