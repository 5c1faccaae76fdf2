/**
 * `dsec cp [--user U] SRC DST`: copies a file or a directory tree into or out of a
 * sandbox, streaming (memory stays flat whatever the size), with `docker cp` semantics:
 *
 * - `dsec cp FILE ID:/p`: /p an existing directory → /p/FILE; else the file becomes /p
 *   (missing parents are created). The mode bits are kept.
 * - `dsec cp DIR ID:/p`: /p an existing directory → /p/DIR; /p missing → DIR becomes /p
 *   (its parent must exist); `DIR/.` copies DIR's contents instead of DIR itself.
 * - `dsec cp LINK ID:/p`: a symlink named as the source is copied as a symlink (its target
 *   text unchanged), like the symlinks inside a copied directory; `-L` copies what it
 *   points to instead.
 * - `dsec cp ID:/p LOCAL`: a file goes to LOCAL (or into it, when it is a directory); a
 *   directory goes into LOCAL when it exists (LOCAL/p), else becomes LOCAL; a symlink is
 *   copied as a symlink (`-L`: what it points to). Local files are owned by us and keep
 *   only their permission bits (no setuid/setgid from a sandbox); devices and FIFOs are
 *   skipped. Nothing made here resolves outside the destination, however the sandbox
 *   shaped its links (cli/util/extract.ts): a symlink or hard link that would is refused
 *   with a warning naming it, the rest is copied, and the command then fails. So does
 *   an entry that could not be written (a local ENOSPC or EACCES, a corrupt header):
 *   an error line names it, the rest is tried, and the copy is reported incomplete. An
 *   archive dsecd breaks off midway (it could not read something below /p after it
 *   started answering) fails with what arrived left in place.
 * - `-` as the local side is a tar stream: `dsec cp - ID:/dir` extracts stdin into /dir;
 *   `dsec cp ID:/p -` writes the tar of /p (members named `p/...`) to stdout.
 *
 * Progress (bytes copied) goes to stderr while it is a terminal, then a one-line summary.
 * `--json` prints `{source, destination, bytes}` (not with `-` as the destination).
 * SIGINT/SIGTERM stop the copy (exit 128+N); a partly written local file is removed.
 */
import { createReadStream, createWriteStream } from 'node:fs';
import { chmod, lstat, mkdir, readdir, readlink, realpath, stat, unlink } from 'node:fs/promises';
import path from 'node:path';
import { Readable, pipeline } from 'node:stream';
import { pipeline as pipelineAsync } from 'node:stream/promises';
import type { Command } from 'commander';
import { create as createTar } from 'tar';
import tarStream from 'tar-stream';
import { DsecApiError, type FileStat } from '../../sdk/index.js';
import { formatCopied } from '../ui/cp.js';
import type { Ctx } from '../util/context.js';
import { baseName, byteCounter, createByteProgress, parentDir, parseCpArgs, wantsContents, type ByteProgress, type CpPlan } from '../util/cp.js';
import { extractArchive, makeSymlinks } from '../util/extract.js';
import { EXIT, UserError } from '../util/errors.js';
import { signalNumber } from '../util/exec.js';
import type { OutStream } from '../util/io.js';
import { printable, writeJson } from '../util/output.js';

/** Options of `cp`. */
interface CpOptions {
  user?: string;
  quiet?: boolean;
  followLink?: boolean;
}

/** What one copy needs besides its plan. */
interface CopyEnv {
  ctx: Ctx;
  user?: string;
  /** `-L`: a symlink named as the source is followed. */
  follow: boolean;
  signal: AbortSignal;
  /** Progress of this copy; set once the size (if any) is known. */
  progress(what: string, size?: number): ByteProgress;
  /** Set when a local file was created, so an interrupted or failed copy removes it. */
  partial?: string;
  /** Members of a copy out that were refused (each `MEMBER: why`), reported after the copy. */
  refused: string[];
  /** Members of a copy out that could not be written as they are (each `MEMBER (why)`): the copy failed. */
  failed: string[];
}

/** Most skipped or refused members named one by one; the rest are counted. */
const MAX_LISTED = 20;

/** Adds `cp` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('cp')
    .description('copy files or directories between a sandbox and here (like docker cp)')
    .argument('<src>', 'LOCAL_PATH, ID:/PATH, or - (a tar stream on stdin)')
    .argument('<dst>', 'LOCAL_PATH, ID:/PATH, or - (a tar stream to stdout)')
    .option('--user <user>', 'read and write as this user inside the sandbox (name or uid[:gid])')
    .option('-L, --follow-link', 'when SRC is a symlink, copy what it points to (default: the symlink itself)')
    .option('-q, --quiet', 'no progress line or summary on stderr')
    .addHelpText(
      'after',
      '\nOne side is ID:/PATH (absolute). A directory is copied into an existing destination\n' +
        'directory, or becomes the destination when that does not exist; SRC/. copies the\n' +
        'contents. A symlink is copied as a symlink (-L: what it points to); one copied out\n' +
        'that would resolve outside the destination is refused. `-` is a tar stream. A local\n' +
        'path with a colon is written ./a:b.\n\n' +
        'Examples:\n  dsec cp ./data ID:/work\n  dsec cp ID:/work/out.log .\n  dsec cp -L ./current ID:/work\n  tar c src | dsec cp - ID:/work\n  dsec cp ID:/etc - | tar t',
    )
    .action(async (srcText: string, dstText: string, opts: CpOptions) => {
      const plan = parseCpArgs(srcText, dstText);
      if (ctx.json && plan.direction === 'out' && plan.dst.kind === 'stdio') {
        throw new UserError('--json cannot be combined with - as the destination (stdout carries the tar stream)');
      }
      const abort = new AbortController();
      let interrupted: NodeJS.Signals | undefined;
      const unregister = ctx.io.onInterrupt((sig) => {
        interrupted ??= sig;
        abort.abort();
      });
      const showProgress = !opts.quiet && ctx.io.stderr.isTTY === true;
      let progress: ByteProgress | undefined;
      const env: CopyEnv = {
        ctx,
        user: opts.user,
        follow: opts.followLink === true,
        signal: abort.signal,
        refused: [],
        failed: [],
        progress: (what, size) => (progress = createByteProgress(ctx.io.stderr, showProgress, what, size)),
      };
      let bytes: number;
      try {
        bytes = plan.direction === 'in' ? await copyIn(env, plan) : await copyOut(env, plan);
        env.partial = undefined;
      } catch (e) {
        if (interrupted) bytes = -1;
        else throw localError(e);
      } finally {
        progress?.done();
        unregister();
        if (env.partial) await unlink(env.partial).catch(() => {});
      }
      if (interrupted) {
        ctx.err(`dsec: interrupted by ${interrupted}; the copy is incomplete\n`);
        ctx.exitCode = EXIT.signalBase + (signalNumber(interrupted) ?? 2);
        return;
      }
      for (const r of env.refused.slice(0, MAX_LISTED)) ctx.err(`dsec: warning: refused ${printable(r)}\n`);
      if (env.refused.length > MAX_LISTED) ctx.err(`dsec: warning: refused ${env.refused.length - MAX_LISTED} more\n`);
      for (const f of env.failed.slice(0, MAX_LISTED)) ctx.err(`dsec: error: could not copy ${printable(f)}\n`);
      if (env.failed.length > MAX_LISTED) ctx.err(`dsec: error: could not copy ${env.failed.length - MAX_LISTED} more\n`);
      if (env.failed.length) {
        throw new UserError(
          `${env.failed.length} ${env.failed.length === 1 ? 'entry' : 'entries'} could not be copied (above); ${dstText} is incomplete`,
          'a local write failed (no space left, no permission), or the archive was corrupt; fix that and copy again',
        );
      }
      if (env.refused.length) {
        throw new UserError(
          `${env.refused.length} ${env.refused.length === 1 ? 'entry was' : 'entries were'} refused (above); the rest was copied to ${dstText}`,
          'a link is made here only when it resolves inside the destination; `dsec cp -L ID:/path/to/link LOCAL` copies what a link points to',
          'FailedPrecondition',
        );
      }
      if (ctx.json) writeJson(ctx.io.stdout, { source: srcText, destination: dstText, bytes });
      else if (showProgress) ctx.err(formatCopied(bytes, dstText) + '\n');
    });
}

/** Local → sandbox. Returns the bytes sent (file contents, or the tar stream's size). */
async function copyIn(env: CopyEnv, plan: Extract<CpPlan, { direction: 'in' }>): Promise<number> {
  const client = env.ctx.client();
  const { id, path: dst } = plan.dst;
  const target = await statRemote(env, id, dst);
  const opts = { user: env.user, signal: env.signal };

  if (plan.src.kind === 'stdio') {
    if (!target || target.type !== 'dir') throw new UserError(`${id}:${dst} is not an existing directory`, 'a tar stream from stdin is extracted into a directory: create it first');
    const p = env.progress(`stdin to ${id}:${dst}`);
    const counter = byteCounter((n) => p.update(n));
    const stdin = env.ctx.io.stdin;
    await client.putArchive(id, dst, pipeline(stdin instanceof Readable ? stdin : Readable.from(stdin), counter, () => {}), opts);
    return counter.bytes();
  }

  const src = plan.src.path;
  const st = env.follow ? await localStat(src) : await localOp(src, () => lstat(src));
  if (st.isSymbolicLink()) {
    // The link itself, as a one-entry archive: the symlinks inside a copied directory
    // travel the same way. Its parent must exist, as for a directory.
    let into: string;
    let name: string;
    if (target?.type === 'dir' || dst.endsWith('/')) {
      into = dst;
      name = path.basename(src);
    } else {
      into = parentDir(dst);
      name = baseName(dst);
    }
    const linkTarget = await localOp(src, () => readlink(src));
    const pack = tarStream.pack();
    pack.entry({ name, type: 'symlink', linkname: linkTarget, mode: 0o777 });
    pack.finalize();
    const chunks: Buffer[] = [];
    for await (const c of pack) chunks.push(c as Buffer);
    env.progress(`${src} to ${id}:${path.posix.join(into, name)}`);
    await client.putArchive(id, into, Buffer.concat(chunks), opts);
    return 0;
  }
  if (st.isDirectory()) {
    const contents = wantsContents(src);
    let into: string;
    let prefix: string | undefined;
    let names: string[];
    if (target && target.type !== 'dir') throw new UserError(`cannot copy directory ${src} onto ${id}:${dst}, which is not a directory`);
    if (target) {
      into = dst;
      prefix = contents ? undefined : path.basename(path.resolve(src));
    } else {
      if (dst.endsWith('/')) throw new UserError(`directory ${id}:${dst} does not exist`, 'create it first, or drop the trailing / to copy the directory under that name');
      into = parentDir(dst);
      prefix = baseName(dst);
    }
    if (prefix !== undefined) names = ['.'];
    else {
      names = await readdir(src);
      if (names.length === 0) return 0;
    }
    const p = env.progress(`${src} to ${id}:${dst}`);
    const counter = byteCounter((n) => p.update(n));
    // node-tar lstats `cwd/.` as the normalised `cwd`: with SRC a symlink to a directory
    // (-L, or SRC/) that is the link, sent as a link. The real directory is archived
    // instead, under SRC's name; the links inside it stay links.
    const cwd = await localOp(src, () => realpath(src));
    // portable: no host uids, gids or user names inside the sandbox (dsecd decides ownership).
    const tarStream = createTar({ cwd, prefix, portable: true }, names) as unknown as NodeJS.ReadableStream;
    await client.putArchive(id, into, pipeline(tarStream, counter, () => {}), opts);
    return counter.bytes();
  }
  if (!st.isFile()) throw new UserError(`${src} is neither a file nor a directory`);
  const file = target?.type === 'dir' || dst.endsWith('/') ? path.posix.join(dst, path.basename(src)) : dst;
  const p = env.progress(`${src} to ${id}:${file}`, st.size);
  const counter = byteCounter((n) => p.update(n));
  await client.writeFile(id, file, pipeline(createReadStream(src), counter, () => {}), { ...opts, mode: st.mode & 0o7777, parents: true });
  return counter.bytes();
}

/** Sandbox → local. Returns the bytes received. */
async function copyOut(env: CopyEnv, plan: Extract<CpPlan, { direction: 'out' }>): Promise<number> {
  const client = env.ctx.client();
  const { id } = plan.src;
  const contents = wantsContents(plan.src.path);
  const src = contents ? plan.src.path.slice(0, -1) || '/' : plan.src.path;
  const st = await client.statFile(id, src, { user: env.user, signal: env.signal, nofollow: !env.follow });
  const opts = { user: env.user, signal: env.signal };

  if (plan.dst.kind === 'stdio') {
    const p = env.progress(`${id}:${src} to stdout`);
    const counter = byteCounter((n) => p.update(n));
    const res = await client.getArchive(id, src, opts);
    let broke = false;
    res.on('error', () => { broke = true; });
    try {
      await writeAll(pipeline(res, counter, () => {}), env.ctx.io.stdout);
    } catch (e) {
      if (broke && !env.signal.aborted) throw brokeOff(id, src, 'stdout');
      throw e;
    }
    return counter.bytes();
  }

  const dst = plan.dst.path;
  const local = await localStatOrNull(dst);
  if (st.type === 'dir') {
    let strip: number;
    if (local?.isDirectory()) strip = contents ? 1 : 0;
    else if (local) throw new UserError(`cannot copy directory ${id}:${src} onto ${dst}, which is not a directory`);
    else {
      await localOp(dst, () => mkdir(dst));
      strip = 1;
    }
    const p = env.progress(`${id}:${src} to ${dst}`);
    const counter = byteCounter((n) => p.update(n));
    const skipped: string[] = [];
    const res = await client.getArchive(id, src, { ...opts, follow: env.follow });
    let broke = false;
    res.on('error', (e) => {
      broke = true;
      counter.destroy(e);
    });
    try {
      await extractArchive(res.pipe(counter), {
        dest: dst,
        strip,
        // The archive's members are named from src's base name; with strip 1 that name is gone.
        origin: { sandboxDir: path.posix.normalize(src), localDir: strip === 1 ? '' : baseName(src) },
        onSkip: (member, why) => skipped.push(member ? `${member} (${why})` : why),
        onFail: (member, why) => env.failed.push(member ? `${member} (${why})` : why),
        onRefuse: (member, why) => env.refused.push(`${member}: ${why}`),
      });
    } catch (e) {
      res.destroy();
      if (broke && !env.signal.aborted) throw brokeOff(id, src, dst);
      throw e;
    }
    for (const s of skipped.slice(0, MAX_LISTED)) env.ctx.err(`dsec: warning: skipped ${printable(s)}\n`);
    if (skipped.length > MAX_LISTED) env.ctx.err(`dsec: warning: skipped ${skipped.length - MAX_LISTED} more\n`);
    return counter.bytes();
  }
  const file = local?.isDirectory() ? path.join(dst, baseName(src)) : dst;
  if (!local && dst.endsWith('/')) throw new UserError(`directory ${dst} does not exist`, 'create it first, or drop the trailing /');
  if (st.type === 'symlink') {
    if (st.target === undefined) throw new UserError(`dsecd did not say where symlink ${id}:${src} points`);
    // The directory that receives the link is its destination: the link must resolve
    // inside it, an absolute target inside the sandbox directory it came from counting
    // as the same place here.
    const why: string[] = [];
    const made = makeSymlinks(path.dirname(file), [{ rel: path.basename(file), target: st.target, member: `${id}:${src}` }], (_m, w) => why.push(w), { sandboxDir: parentDir(src), localDir: '' });
    if (made.length === 0) {
      throw new UserError(`refused ${id}:${src}: ${printable(why.join('; '))} (here the destination is ${path.dirname(file)}, the directory that receives the link)`, 'a link is made here only when it resolves inside the directory that receives it; -L copies what it points to', 'FailedPrecondition');
    }
    return 0;
  }
  if (st.type !== 'file') throw new UserError(`${id}:${src} is a special file (${st.type}); only files, directories and symlinks are copied`);
  const p = env.progress(`${id}:${src} to ${file}`, st.size);
  const counter = byteCounter((n) => p.update(n));
  const res = await client.readFile(id, src, opts);
  let broke = false;
  res.on('error', () => { broke = true; });
  const existed = (await localStatOrNull(file)) !== null;
  const out = createWriteStream(file, { mode: st.mode & 0o777 });
  if (!existed) env.partial = file;
  try {
    await pipelineAsync(res, counter, out);
  } catch (e) {
    if (broke && !env.signal.aborted) throw brokeOff(id, src, file, 'read');
    throw e;
  }
  // An existing file keeps its mode unless we can set the sandbox's (permission bits only).
  await chmod(file, st.mode & 0o777).catch(() => {});
  return counter.bytes();
}

/**
 * The error of an archive (or a file read) dsecd broke off midway (its response ended
 * without the rest): the walk or read inside the sandbox failed after the answer had
 * begun, too late for an error response. dsecd's log has the reason ("archive stream
 * failed").
 */
function brokeOff(id: string, src: string, dst: string, what: 'archive' | 'read' = 'archive'): UserError {
  return new UserError(
    what === 'archive'
      ? `dsecd broke off the archive of ${id}:${src} midway; what arrived before is in ${dst}, the rest is missing`
      : `dsecd broke off the read of ${id}:${src} midway; nothing was kept at ${dst}`,
    `dsecd could not read ${what === 'archive' ? 'something below it' : 'it'}: a file --user may not read, a path longer than 4096 bytes, a file removed meanwhile, or the sandbox stopped; dsecd's log says which${what === 'archive' ? ' ("archive stream failed")' : ''}`,
    'FailedPrecondition',
  );
}

/** The stat of `p` in the sandbox, or null when nothing is there. */
async function statRemote(env: CopyEnv, id: string, p: string): Promise<FileStat | null> {
  try {
    return await env.ctx.client().statFile(id, p, { user: env.user, signal: env.signal });
  } catch (e) {
    if (e instanceof DsecApiError && e.code === 'NotFound' && !/sandbox/i.test(e.message)) return null;
    throw e;
  }
}

/** stat of a local source (following a symlink), with a user error when missing or unreadable. */
async function localStat(p: string) {
  return localOp(p, () => stat(p));
}

/** stat of a local destination (following a symlink), or null when nothing is there. */
async function localStatOrNull(p: string) {
  try {
    return await stat(p);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw localError(e, p);
  }
}

/** Runs a local file operation on `p`, turning its errno failures into user errors. */
async function localOp<T>(p: string, op: () => Promise<T>): Promise<T> {
  try {
    return await op();
  } catch (e) {
    throw localError(e, p);
  }
}

/** A local file-system failure as a {@link UserError} naming the path; anything else unchanged. */
function localError(e: unknown, p?: string): unknown {
  const err = e as NodeJS.ErrnoException;
  if (e instanceof UserError || e instanceof DsecApiError || !err || typeof err.code !== 'string' || !err.syscall) return e;
  const where = p ?? err.path ?? '';
  const what: Record<string, string> = {
    ENOENT: 'no such file or directory',
    EACCES: 'permission denied',
    EPERM: 'operation not permitted',
    ENOTDIR: 'not a directory',
    EISDIR: 'is a directory',
    EEXIST: 'already exists',
    ENOSPC: 'no space left on device',
    EROFS: 'read-only file system',
  };
  return new UserError(`${where}: ${what[err.code] ?? err.message}`, err.code === 'ENOENT' ? 'check the local path' : undefined);
}

/** Writes every chunk of `src` to `out`, waiting for `drain` when it is full. */
async function writeAll(src: Readable, out: OutStream): Promise<void> {
  for await (const chunk of src) {
    if (out.write(chunk as Buffer) === false && typeof out.on === 'function') {
      await new Promise<void>((resolve) => {
        const onDrain = () => {
          out.off?.('drain', onDrain);
          resolve();
        };
        out.on!('drain', onDrain);
      });
    }
  }
}
