/**
 * `dsec traj export ID [-o FILE]`: every step of a trajectory with its request and
 * recorded output, one TrajectoryRecord per line (JSONL, in step order), on stdout or into
 * FILE; streamed, never held whole. The output is JSON already, so --json changes stdout
 * only with -o: `{trajectory, file, steps}` instead of the note
 * `exported N steps of ID to FILE` on stderr.
 *
 * FILE is written through a temporary file next to it and renamed when the export is
 * whole, so a failed or interrupted export never leaves a cut FILE behind (an existing
 * FILE is replaced only then). On SIGINT/SIGTERM the export stops and dsec exits 128+N.
 */
import { once } from 'node:events';
import { createWriteStream } from 'node:fs';
import { rename, rm } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import type { OutStream } from '../../util/io.js';
import { writeJson } from '../../util/output.js';
import { watchInterrupt } from '../../util/interrupt.js';

/** Adds `export` to the `traj` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('export')
    .description('write the steps of a trajectory, with their output, as JSON lines')
    .argument('<id>', 'trajectory id')
    .option('-o, --output <file>', 'write to this file instead of stdout (- for stdout)')
    .action(async (id: string, opts: { output?: string }) => {
      const file = opts.output === undefined || opts.output === '-' ? undefined : opts.output;
      if (file === '') throw new UserError('empty --output', 'name a file, e.g. -o traj.jsonl, or leave -o out for stdout');
      const intr = watchInterrupt(ctx);
      try {
        if (file === undefined) {
          const n = await exportTo(ctx, id, intr.signal, (line) => writeOut(ctx.io.stdout, line));
          if (intr.by) ctx.err(`dsec: interrupted by ${intr.by} after ${count(n)}; the export is incomplete\n`);
        } else {
          await exportToFile(ctx, id, file, intr.signal, () => intr.by);
        }
      } finally {
        intr.stop();
      }
      if (intr.by) ctx.exitCode = intr.exitCode()!;
    });
}

/** Streams the records of `id` to `write`, one JSON line each; returns how many. Stops early when `signal` aborts. */
async function exportTo(ctx: Ctx, id: string, signal: AbortSignal, write: (line: string) => Promise<void>): Promise<number> {
  let n = 0;
  for await (const record of ctx.client().exportTrajectory(id, { signal })) {
    await write(JSON.stringify(record) + '\n');
    n++;
  }
  return n;
}

/** The export into `file`, through a temporary file renamed into place once whole. */
async function exportToFile(ctx: Ctx, id: string, file: string, signal: AbortSignal, interrupted: () => NodeJS.Signals | undefined): Promise<void> {
  const tmp = join(dirname(file), `.${basename(file)}.dsec-${process.pid}-${Math.random().toString(36).slice(2, 8)}`);
  const ws = createWriteStream(tmp, { flags: 'wx' });
  // Kept, so an error between writes is neither lost nor an unhandled 'error' event.
  let failure: Error | undefined;
  ws.on('error', (e) => {
    failure ??= e;
  });
  const settled = async (event: string) => {
    if (failure) throw failure;
    await once(ws, event);
  };
  let renamed = false;
  try {
    await fileOp(settled('open'), file);
    const n = await exportTo(ctx, id, signal, (line) => fileOp(ws.write(line) ? Promise.resolve() : settled('drain'), file));
    ws.end();
    await fileOp(settled('finish'), file);
    const sig = interrupted();
    if (sig) {
      ctx.err(`dsec: interrupted by ${sig} after ${count(n)}; ${file} was not written\n`);
      return;
    }
    await fileOp(rename(tmp, file), file);
    renamed = true;
    if (ctx.json) writeJson(ctx.io.stdout, { trajectory: id, file, steps: n });
    else ctx.err(`exported ${count(n)} of ${id} to ${file}\n`);
  } finally {
    if (!renamed) {
      ws.destroy();
      await rm(tmp, { force: true });
    }
  }
}

/** Writes `line` to our stdout, waiting for `drain` when it is full (a slow pipe). */
async function writeOut(out: OutStream, line: string): Promise<void> {
  if (out.write(line) !== false || typeof out.on !== 'function') return;
  await new Promise<void>((resolve) => {
    const onDrain = () => {
      out.off?.('drain', onDrain);
      resolve();
    };
    out.on!('drain', onDrain);
  });
}

/** Turns a failure of the local file into a user error naming it. */
async function fileOp<T>(p: Promise<T>, file: string): Promise<T> {
  try {
    return await p;
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    if (typeof err?.code !== 'string' || !err.syscall) throw e;
    const what: Record<string, string> = {
      ENOENT: 'no such directory',
      EACCES: 'permission denied',
      EPERM: 'operation not permitted',
      ENOTDIR: 'not a directory',
      EISDIR: 'is a directory',
      ENOSPC: 'no space left on device',
      EROFS: 'read-only file system',
    };
    throw new UserError(`--output ${file}: ${what[err.code] ?? err.message}`, err.code === 'ENOENT' ? 'check that the directory exists' : 'pick a file you can write');
  }
}

/** `1 step`, `3 steps`. */
function count(n: number): string {
  return `${n} step${n === 1 ? '' : 's'}`;
}
