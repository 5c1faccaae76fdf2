/**
 * What the long image verbs (`image build`, `image import`, `image bootstrap`) share:
 * progress on stderr (see cli/ui/progress.ts), interrupt handling, and printing the
 * resulting image (its ref, or the Image with --json; stdout carries nothing else).
 */
import type { Image, LongOperationOptions } from '../../sdk/index.js';
import { createProgressView } from '../ui/progress.js';
import type { Ctx } from './context.js';
import { writeJson } from './output.js';
import { watchInterrupt } from './interrupt.js';

/**
 * Runs `op` with a progress view on stderr and prints its image. On SIGINT/SIGTERM it
 * stops waiting, says that dsecd may still finish `what` (dsecd does not cancel it) and
 * sets the exit code to 128+N. API errors (including an error line mid-stream) propagate
 * to main, after the status line has been erased.
 */
export async function runImageOperation(ctx: Ctx, what: string, op: (opts: LongOperationOptions) => Promise<Image>): Promise<void> {
  const stderr = ctx.io.stderr;
  const view = createProgressView(stderr, { tty: stderr.isTTY === true && ctx.io.env.TERM !== 'dumb', columns: stderr.columns });
  const intr = watchInterrupt(ctx);
  let image: Image | undefined;
  try {
    image = await op({ onProgress: (p) => view.update(p), signal: intr.signal });
  } catch (e) {
    if (!intr.by) throw e;
  } finally {
    view.done();
    intr.stop();
  }
  if (image === undefined) {
    ctx.err(`dsec: interrupted by ${intr.by}; dsecd may still finish the ${what} (see \`dsec image ls\`)\n`);
    ctx.exitCode = intr.exitCode()!;
    return;
  }
  if (ctx.json) writeJson(ctx.io.stdout, image);
  else {
    ctx.out(image.ref + '\n');
    // What the importer sanitised (stripped leading /, dropped device nodes, ...).
    for (const n of (image as Image & { notes?: string[] }).notes ?? []) ctx.err(`note: ${n}\n`);
  }
}
