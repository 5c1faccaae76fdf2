/**
 * What the long verbs share: progress on stderr (see cli/ui/progress.ts) and interrupt
 * handling. The image verbs (`image build`, `image import`, `image bootstrap`) also
 * print the resulting image (its ref, or the Image with --json; stdout carries nothing
 * else); the creates (`create`, `run`, `restore`, `fork`) get a spinner
 * ({@link runCreate}).
 */
import type { CreateOptions, CreateProgress, Image, LongOperationOptions } from '../../sdk/index.js';
import { createProgressView, startSpinner } from '../ui/progress.js';
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

/** What {@link runCreate} shows and how it treats an interrupt. */
export interface CreateProgressOptions {
  /** What is being made, e.g. `creating a microvm sandbox`; the spinner's label. */
  label: string;
  /** Sandboxes the call makes (a fork's count); default 1. */
  count?: number;
  /**
   * On SIGINT/SIGTERM, stop waiting: the call is aborted, the spinner erased, stderr says
   * which sandbox dsecd goes on making, and the exit code is 128+N. Without it (`run`,
   * which waits for the sandbox so it can destroy it) interrupts are the caller's.
   */
  abortOnInterrupt: boolean;
}

/**
 * The spinner's text for the phases reported so far (`phases`: the last report per
 * sandbox): one sandbox's phase with its short id (`0123456789ab: booting the guest
 * (waiting for its agent)`), or a group's counts (`3/8 running, 5 booting`).
 */
export function describeCreate(phases: Map<string, CreateProgress>, count: number): string {
  if (count <= 1) {
    const last = [...phases.values()].pop();
    return last ? `${last.id.slice(0, 12)}: ${last.message}` : '';
  }
  const by = new Map<string, number>();
  for (const p of phases.values()) by.set(p.phase, (by.get(p.phase) ?? 0) + 1);
  const ready = by.get('ready') ?? 0;
  by.delete('ready');
  const words: Record<string, string> = { rootfs: 'preparing', launch: 'starting', boot: 'booting' };
  const rest = [...by].map(([phase, n]) => `${n} ${words[phase] ?? phase}`);
  const waiting = count - ready - [...by.values()].reduce((a, b) => a + b, 0);
  if (waiting > 0) rest.push(`${waiting} waiting`);
  return [`${ready}/${count} running`, ...rest].join(', ');
}

/**
 * Runs a create (`op` is the SDK call, given the options to pass it) with a spinner on a
 * terminal's stderr: the elapsed time and dsecd's phase, erased before the result is
 * printed. Nothing is shown, and the call is made as before (one answer, no stream),
 * when stderr is not a terminal, TERM is dumb or --json was given. Resolves undefined
 * when an interrupt stopped the wait (`abortOnInterrupt`; the exit code is then set);
 * API errors propagate after the spinner is erased.
 */
export async function runCreate<T>(ctx: Ctx, opts: CreateProgressOptions, op: (o: CreateOptions) => Promise<T>): Promise<T | undefined> {
  const stderr = ctx.io.stderr;
  if (ctx.json || stderr.isTTY !== true || ctx.io.env.TERM === 'dumb') return op({});
  const spinner = startSpinner(stderr, { label: opts.label, columns: stderr.columns });
  const phases = new Map<string, CreateProgress>();
  const intr = opts.abortOnInterrupt ? watchInterrupt(ctx) : undefined;
  try {
    return await op({
      signal: intr?.signal,
      onProgress: (p) => {
        phases.set(p.id, p);
        spinner.update(describeCreate(phases, opts.count ?? 1));
      },
    });
  } catch (e) {
    if (!intr?.by) throw e;
    spinner.done();
    const ids = [...phases.keys()];
    const which = ids.length === 1 ? `sandbox ${ids[0]}` : ids.length > 1 ? `sandboxes ${ids.join(', ')}` : 'the sandbox';
    ctx.err(`dsec: interrupted by ${intr.by}; dsecd goes on making ${which} (\`dsec ls\` shows it${ids.length ? `, \`dsec rm -f ${ids.join(' ')}\` removes it` : ''})\n`);
    ctx.exitCode = intr.exitCode()!;
    return undefined;
  } finally {
    spinner.done();
    intr?.stop();
  }
}
