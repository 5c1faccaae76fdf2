/**
 * The BUILDER identity: the host uid/gid range under which dsecd runs every step that
 * reads or writes a tree from an untrusted source (docs/SECURITY.md "Builder and runtime
 * identities"):
 *
 *   - extracting image tars (a user's rootfs tar, each layer of an OCI or docker archive,
 *     the archive itself) into a staging dir;
 *   - copying a sandbox's writable layer for commit and snapshot (the ownership shift
 *     from the sandbox's range to image ids is done by the kernel, through an idmapped
 *     view), and stripping it;
 *   - mkfs.erofs, for every layer dsecd builds (imports, `image build DIR`, commits,
 *     snapshots, bootstrapped and toolkit images).
 *
 * A builder process is uid 0 of its own user namespace whose ids 0..65535 are host ids
 * `slotBase..slotBase+65535` (native/builder/dsec-builder.c), in its own pid, network and
 * IPC namespaces. It is root over the tree it builds (in-image owners, modes, setuid bits
 * and file capabilities come out exact) and an unprivileged stranger to everything else:
 * a tar entry that tries to reach a host file through a symlink, a hard link or an
 * absolute path meets EACCES/EPERM from the kernel even if dsec's own sanitisation had a
 * hole. Inputs it may not open by path (a root-only tar, a sandbox's upper dir, a
 * root-made tree) are passed as file descriptors opened by root: never by loosening
 * permissions.
 *
 * Root keeps: opening inputs, deciding overlay opaque markers (trusted.* xattrs are out of
 * the builder's reach: it gets the list, native/builder/mkfs-shim.c), checking and
 * publishing the finished blob into the store (hash, owner root, mode 0444, rename), all
 * mounts, debootstrap and apt for `image bootstrap` (they need real root: mknod of device
 * nodes, mounts of /proc, /dev and bind mounts in a chroot), and writing manifests.
 *
 * The range is split into slots of {@link BUILDER_SLOT_IDS} ids; each job (one import,
 * one commit, ...) holds one slot for its whole duration, so concurrent jobs never share
 * a uid and cannot reach each other's staging trees (e.g. through /proc/<pid>/cwd). Jobs
 * beyond the number of slots wait, first come first served. A job's staging dir is
 * `<workDir>/<pid>-<hex>` (dsecd: `<root>/builder/`), mode 0700 and owned by the slot's
 * uid, below a root-owned 0711 dir: the builder can reach its own dir by its absolute path
 * (tools call getcwd and realpath) but cannot list or enter any other. The builder range must
 * overlap no sandbox uid pool and no other instance's builder range: the builder never
 * runs sandbox code, and no sandbox is ever the builder (daemon/host/instances.ts refuses
 * overlaps between live instances; {@link checkBuilderRange} within one instance).
 */
import { closeSync, constants as fsc, fchmodSync, fchownSync, fstatSync, openSync, statSync, writeSync, unlinkSync } from 'node:fs';
import { chown, chmod, mkdir, readdir, rm } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { execa, type Options } from 'execa';
import { DsecError, failedPrecondition, internal, invalidArgument, type ErrorKind, ERROR_KINDS } from '../errors.js';
import * as native from './native.js';

/**
 * Host ids per builder slot: 65,536, the in-image id space (uids and gids 0..65535), the
 * same size as a sandbox's range, so every owner an image can have maps into the slot.
 */
export const BUILDER_SLOT_IDS = 65536;

/**
 * Default builder range: 16 slots (1 Mi ids) right below the default sandbox uid pool
 * (which starts at 2^31, daemon/config.ts), i.e. host ids [2^31 - 2^20, 2^31). Chosen to
 * lie outside that pool, outside the integration-test pools and test builder ranges
 * (test/integration/harness.ts: those end at 2^31 - 2^23), and far above the subordinate
 * id ranges distributions hand out to users (/etc/subuid starts at 100000).
 */
export const DEFAULT_BUILDER_RANGE: Readonly<IdRange> = Object.freeze({ base: 2 ** 31 - 2 ** 20, size: 2 ** 20 });

/** Largest valid uid/gid + 1: ids are 32 bits and (uid_t)-1 is reserved. */
const ID_LIMIT = 2 ** 32 - 1;

/** A half-open range of host ids [base, base + size). */
export interface IdRange {
  base: number;
  size: number;
}

/** True when the two ranges share at least one id. */
export function rangesOverlap(a: IdRange, b: IdRange): boolean {
  return a.base < b.base + b.size && b.base < a.base + a.size;
}

/**
 * Checks a builder range against the instance's own sandbox uid pool:
 * base at least 65,536 (never host root or the system's own users), size a positive
 * multiple of {@link BUILDER_SLOT_IDS}, the range below 2^32-1, and disjoint from the pool.
 * Returns the number of slots.
 * @throws DsecError InvalidArgument naming the rule broken and the two ranges.
 */
export function checkBuilderRange(builder: IdRange, pool: IdRange): number {
  const show = (r: IdRange) => `[${r.base}, ${r.base + r.size})`;
  if (!Number.isSafeInteger(builder.base) || builder.base < 65536) {
    throw invalidArgument(`builder range ${show(builder)}: base must be at least 65536 (host uid 0 and the system's own users are never the builder)`);
  }
  if (!Number.isSafeInteger(builder.size) || builder.size < BUILDER_SLOT_IDS || builder.size % BUILDER_SLOT_IDS !== 0) {
    throw invalidArgument(`builder range ${show(builder)}: size must be a positive multiple of ${BUILDER_SLOT_IDS} (one slot per concurrent build)`);
  }
  if (builder.base + builder.size > ID_LIMIT) throw invalidArgument(`builder range ${show(builder)}: must end below 2^32-1 (4294967295), the largest valid uid`);
  if (rangesOverlap(builder, pool)) {
    throw invalidArgument(`builder range ${show(builder)} overlaps the sandbox uid pool ${show(pool)}: the builder must never share an id with a sandbox; set [builder] base outside the pool`);
  }
  return builder.size / BUILDER_SLOT_IDS;
}

/** Where the builder's tools live (built by `make -C native`). */
export interface BuilderTools {
  /** native/builder/dsec-builder: runs a command as a slot's uid 0. */
  runner: string;
  /** native/builder/libdsec-mkfs.so: preloaded into mkfs.erofs. */
  mkfsShim: string;
  /** dist/daemon/image/builder-worker.js: the Node side of extraction and commit preparation. */
  worker: string;
  /** The node binary (this process's). */
  node: string;
}

/** The tools of this checkout or install: `<repo>/native/builder/*` and the compiled worker. */
export function defaultBuilderTools(): BuilderTools {
  const repo = native.repoRoot();
  return {
    runner: join(repo, 'native', 'builder', 'dsec-builder'),
    mkfsShim: join(repo, 'native', 'builder', 'libdsec-mkfs.so'),
    worker: join(repo, 'dist', 'daemon', 'image', 'builder-worker.js'),
    node: process.execPath,
  };
}

/** Options of {@link Builder}. */
export interface BuilderOptions {
  /** The host id range; checked with {@link checkBuilderRange} by the config. */
  range: IdRange;
  /**
   * Parent of the jobs' staging dirs (dsecd: `<root>/builder`). Made root-owned 0711 by
   * {@link Builder.init}; every directory above it must be searchable by others (o+x).
   */
  workDir: string;
  /** Tool paths; default {@link defaultBuilderTools}. */
  tools?: BuilderTools;
}

/** Options of {@link BuilderJob.run}. */
export interface BuilderRunOptions {
  /** Open fds passed as the command's fds 3, 4, ... (the caller keeps and closes them). */
  fds?: number[];
  /** The command's whole environment besides PATH (nothing of dsecd's leaks in). */
  env?: Record<string, string>;
  /** Bytes written to the command's stdin (default: stdin is /dev/null). */
  input?: string | Buffer;
  /** Called with each line of stdout as it arrives (stdout is then not kept). */
  onLine?(line: string): void;
  /** Kills the whole build (every process of its pid namespace) when aborted. */
  signal?: AbortSignal;
}

/** What {@link BuilderJob.run} returns. */
export interface BuilderRunResult {
  exitCode: number;
  /** stdout (empty when `onLine` took it). */
  stdout: string;
  /** stderr, as written. */
  stderr: string;
}

/** Exit status of dsec-builder when it failed itself (its message starts with "dsec-builder:"). */
const RUNNER_FAILED = 125;

/**
 * The builder identity of one dsecd instance: a pool of slots (see the module comment).
 * Safe for concurrent use; jobs beyond the slot count wait in order.
 */
export class Builder {
  /** The host id range. */
  readonly range: IdRange;
  /** Tool paths. */
  readonly tools: BuilderTools;
  /** Parent of the staging dirs. */
  readonly workDir: string;
  private readonly free: number[];
  private readonly waiting: Array<(slot: number) => void> = [];

  /** Does no I/O; {@link probe} checks the tools and the kernel. */
  constructor(opts: BuilderOptions) {
    this.range = { ...opts.range };
    this.tools = opts.tools ?? defaultBuilderTools();
    this.workDir = resolve(opts.workDir);
    const slots = Math.floor(this.range.size / BUILDER_SLOT_IDS);
    if (slots < 1) throw invalidArgument(`builder range of ${this.range.size} ids holds no slot of ${BUILDER_SLOT_IDS}`);
    this.free = Array.from({ length: slots }, (_, i) => i);
  }

  /** Number of slots (concurrent jobs). */
  get slots(): number {
    return Math.floor(this.range.size / BUILDER_SLOT_IDS);
  }

  /** First host uid (= gid) of slot `i`. */
  slotBase(i: number): number {
    return this.range.base + i * BUILDER_SLOT_IDS;
  }

  /**
   * Prepares {@link workDir} (root-owned, mode 0711) and removes staging dirs left by
   * processes that are gone (a crash or kill -9 mid-build). Call once before the first job.
   * @throws DsecError FailedPrecondition when a directory above workDir is not searchable
   *   by others (the builder could not reach its staging dir), naming it.
   */
  async init(): Promise<void> {
    await mkdir(this.workDir, { recursive: true, mode: 0o711 });
    await chown(this.workDir, 0, 0);
    await chmod(this.workDir, 0o711);
    for (let d = dirname(this.workDir); ; d = dirname(d)) {
      if ((statSync(d).mode & 0o001) === 0) {
        throw failedPrecondition(`${d} is not searchable by other users, so builder processes cannot reach their staging dirs under ${this.workDir}; chmod o+x ${d} or move the root`);
      }
      if (d === '/') break;
    }
    for (const n of await readdir(this.workDir)) {
      const m = /^(\d+)-[0-9a-f]+$/.exec(n);
      if (!m || Number(m[1]) === process.pid || pidAlive(Number(m[1]))) continue;
      // Its builder processes died with that dsecd (PR_SET_PDEATHSIG), so nothing writes
      // there any more; a failed removal only leaves garbage for the next start.
      await rm(join(this.workDir, n), { recursive: true, force: true }).catch(() => undefined);
    }
  }

  /**
   * Checks that builds can run: the tools exist, and a command run as slot 0 sees the
   * id map "0 <slot 0 base> 65536". Takes a few milliseconds.
   * @throws DsecError FailedPrecondition naming the missing tool or what the kernel refused, with a hint.
   */
  async probe(): Promise<void> {
    for (const [what, p] of [['runner', this.tools.runner], ['mkfs.erofs shim', this.tools.mkfsShim], ['worker', this.tools.worker]] as const) {
      if (!existsSync(p)) throw failedPrecondition(`builder identity: the ${what} ${p} is missing; build it (make -C native, npx tsc) or set [builder] enabled = false to build images as root`);
    }
    const base = this.slotBase(0);
    const r = await execa(this.tools.runner, ['--base', String(base), '--count', String(BUILDER_SLOT_IDS), '--', 'cat', '/proc/self/uid_map'], { reject: false, stdin: 'ignore', cwd: '/' });
    const map = String(r.stdout).trim().split(/\s+/).map(Number);
    if (r.exitCode !== 0 || map[0] !== 0 || map[1] !== base || map[2] !== BUILDER_SLOT_IDS) {
      throw failedPrecondition(`builder identity: a probe as host uid ${base} failed (exit ${r.exitCode}): ${String(r.stderr).trim() || String(r.stdout).trim()}; user namespaces must be available to root, or set [builder] enabled = false to build images as root`);
    }
  }

  /**
   * Runs `fn` with a job: a slot held exclusively and a fresh staging dir
   * `<workDir>/<pid>-<hex>` owned by the slot's uid (mode 0700), which is every builder
   * command's working directory. The dir and everything in it is removed afterwards, also
   * when `fn` fails; the slot is then released. Waits for a free slot (first come first
   * served) unless `signal` aborts first. Call {@link init} first.
   * @throws whatever `fn` throws; the signal's reason when aborted while waiting.
   */
  async withJob<T>(fn: (job: BuilderJob) => Promise<T>, signal?: AbortSignal): Promise<T> {
    const slot = await this.acquire(signal);
    const uid = this.slotBase(slot);
    const dir = join(this.workDir, `${process.pid}-${randomBytes(6).toString('hex')}`);
    try {
      await mkdir(dir, { mode: 0o700 });
      await chown(dir, uid, uid);
      await chmod(dir, 0o700);
      return await fn(new BuilderJob(this, uid, dir));
    } finally {
      // Every builder process of this job is dead (each ran as pid 1 of its own pid
      // namespace), so nothing changes the tree while it is removed; rm never follows links.
      await rm(dir, { recursive: true, force: true }).catch(() => undefined);
      this.release(slot);
    }
  }

  private acquire(signal?: AbortSignal): Promise<number> {
    signal?.throwIfAborted();
    const slot = this.free.shift();
    if (slot !== undefined) return Promise.resolve(slot);
    return new Promise<number>((resolve, reject) => {
      const take = (s: number) => {
        signal?.removeEventListener('abort', onAbort);
        resolve(s);
      };
      const onAbort = () => {
        const i = this.waiting.indexOf(take);
        if (i >= 0) this.waiting.splice(i, 1);
        reject(signal!.reason);
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiting.push(take);
    });
  }

  private release(slot: number): void {
    const next = this.waiting.shift();
    if (next) next(slot);
    else this.free.push(slot);
  }
}

/**
 * One job of the builder: a slot's uid and its staging dir. Created by
 * {@link Builder.withJob}; valid only inside its callback.
 */
export class BuilderJob {
  /** @internal Created by {@link Builder.withJob}. */
  constructor(
    readonly builder: Builder,
    /** Host uid and gid of the job's uid 0. */
    readonly uid: number,
    /** The staging dir (host path), owned by {@link uid}; the working directory of every command. */
    readonly dir: string,
  ) {}

  /**
   * Runs `argv` as the job's builder identity (see native/builder/dsec-builder.c) in the
   * staging dir, with `opts.fds` as its fds 3, 4, ... Resolves with the exit status and
   * output whatever the status; the caller decides what a failure means.
   * @throws DsecError Internal when dsec-builder itself failed (exit 125: the namespace
   *   could not be made), naming what failed; the signal's reason when aborted.
   */
  async run(argv: string[], opts: BuilderRunOptions = {}): Promise<BuilderRunResult> {
    const fds = opts.fds ?? [];
    const env = Object.entries(opts.env ?? {}).flatMap(([k, v]) => ['--env', `${k}=${v}`]);
    const args = ['--base', String(this.uid), '--count', String(BUILDER_SLOT_IDS), '--fds', String(fds.length), ...env, '--', ...argv];
    const sub = execa(this.builder.tools.runner, args, {
      cwd: this.dir,
      reject: false,
      extendEnv: false,
      env: {},
      stdio: [opts.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe', ...fds],
      input: opts.input,
      cancelSignal: opts.signal,
      maxBuffer: 64 << 20,
      buffer: { stdout: opts.onLine === undefined, stderr: true },
      stripFinalNewline: false,
    } as Options);
    let lineError: unknown;
    if (opts.onLine) {
      try {
        for await (const line of sub.iterable({ from: 'stdout' })) opts.onLine(String(line));
      } catch (e) {
        // The caller's callback failed: end the build (the runner takes its pid namespace with it).
        lineError = e;
        sub.kill('SIGKILL');
      }
    }
    const r = await sub;
    if (lineError !== undefined) throw lineError;
    opts.signal?.throwIfAborted();
    const stderr = String(r.stderr ?? '');
    if (r.exitCode === RUNNER_FAILED && stderr.includes('dsec-builder:')) {
      throw internal(`running ${argv[0]} as the builder (host uid ${this.uid}) failed: ${stderr.trim()}`);
    }
    return { exitCode: r.exitCode ?? 128, stdout: opts.onLine ? '' : String(r.stdout ?? ''), stderr };
  }

  /**
   * Runs one operation of the Node worker (daemon/image/builder-worker.ts) as the
   * builder: `request` goes to its stdin as JSON, `onProgress` receives the numbers it
   * reports, and the result it prints is returned.
   * @throws DsecError of the kind the worker reported (e.g. InvalidArgument for a refused
   *   archive), Internal when it died without a result (the message quotes its stderr).
   */
  async worker<T>(op: string, request: Record<string, unknown>, opts: { fds?: number[]; onProgress?(n: number): void; signal?: AbortSignal } = {}): Promise<T> {
    let result: { result?: T; error?: { kind: string; message: string } } | undefined;
    const r = await this.run([this.builder.tools.node, this.builder.tools.worker], {
      fds: opts.fds,
      input: JSON.stringify({ op, ...request }),
      env: { HOME: '/nonexistent', LC_ALL: 'C' },
      signal: opts.signal,
      onLine: (line) => {
        let msg: { progress?: number; result?: T; error?: { kind: string; message: string } };
        try {
          msg = JSON.parse(line);
        } catch {
          return; // not a protocol line
        }
        if (typeof msg?.progress === 'number') opts.onProgress?.(msg.progress);
        else if (msg && ('result' in msg || 'error' in msg)) result = msg;
      },
    });
    if (result?.error) {
      const kind = (ERROR_KINDS as string[]).includes(result.error.kind) ? (result.error.kind as ErrorKind) : 'Internal';
      throw new DsecError(kind, result.error.message);
    }
    if (r.exitCode !== 0 || !result || !('result' in result)) {
      throw internal(`builder ${op} (host uid ${this.uid}) exited with status ${r.exitCode} without a result: ${r.stderr.trim().split('\n').slice(-5).join(' | ') || 'no output'}`);
    }
    return result.result as T;
  }

  /** Absolute host path of `rel` inside the staging dir. */
  path(rel: string): string {
    return join(this.dir, rel);
  }

  /**
   * An fd (O_RDONLY, O_DIRECTORY, O_NOFOLLOW) on the directory `rel` of the staging dir,
   * to hand to a builder command as `/proc/self/fd/N/.`. Close with `fs.closeSync`.
   * @throws DsecError Internal when it is not a directory (e.g. a symlink left in its place).
   */
  openDir(rel: string): number {
    try {
      return openSync(this.path(rel), fsc.O_RDONLY | fsc.O_DIRECTORY | fsc.O_NOFOLLOW);
    } catch (e) {
      throw internal(`builder staging tree ${this.path(rel)} cannot be opened as a directory: ${(e as Error).message}`, e);
    }
  }

  /**
   * A read-only view of the host directory `src` for this job's builder commands: a
   * detached idmapped mount (native.openTreeIdmapped) in which a file owned by host id
   * `idBase + k` appears owned by the job's uid `k`, so the builder reads the tree with
   * in-image ownership and without any permission on `src` or its parents. `idBase` is 0
   * for a tree with image ids (a root-made tree, `dsec image build DIR`), a sandbox's base
   * uid for its writable layer. Owners outside [idBase, idBase + 65536) appear as 65534.
   * Mounts below `src` are not part of the view. Close the fd with `fs.closeSync`.
   * @throws DsecError FailedPrecondition when the filesystem of `src` cannot be idmapped
   *   (with a hint), NotFound when `src` does not exist, Internal otherwise.
   */
  view(src: string, idBase: number): number {
    try {
      return native.openTreeIdmapped(src, idBase, this.uid, BUILDER_SLOT_IDS, true);
    } catch (e) {
      const code = native.errnoCode(e);
      if (code === 'ENOENT') throw new DsecError('NotFound', `${src} not found`, { cause: e });
      if (code === 'EINVAL' || code === 'EOPNOTSUPP') {
        throw failedPrecondition(`${src}: its filesystem does not support idmapped mounts, which the builder identity reads trees through; copy the tree to a local filesystem (ext4, xfs, btrfs, tmpfs) first`, e);
      }
      throw internal(`making a builder view of ${src} failed: ${(e as Error).message}`, e);
    }
  }

  /**
   * A root-owned file descriptor holding `data` (e.g. a NUL-separated path list), for a
   * builder command to read by fd only: written to a temp file beside the staging dir (in
   * the root-owned 0711 work dir, so no builder can open it by path), opened read-only
   * and unlinked at once. Close with `fs.closeSync`.
   */
  dataFd(data: Buffer): number {
    const p = `${this.dir}.data-${randomBytes(4).toString('hex')}`;
    const w = openSync(p, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW, 0o600);
    try {
      for (let off = 0; off < data.length; ) off += writeSync(w, data, off);
    } finally {
      closeSync(w);
    }
    try {
      return openSync(p, fsc.O_RDONLY | fsc.O_NOFOLLOW);
    } finally {
      unlinkSync(p);
    }
  }

  /**
   * Takes over the file `rel` the builder produced (e.g. a blob mkfs.erofs wrote): opens
   * it without following links, checks it is a regular file with one link owned by the
   * job's uid (so it is the builder's own new file, not a link to anything else), makes
   * it owned by root, mode `mode`, and returns the open fd (O_RDONLY; the caller closes
   * it) with its path. Nothing of the builder runs any more, so the file stays as checked.
   * @throws DsecError Internal when the file is missing or fails a check.
   */
  adopt(rel: string, mode: number): { fd: number; path: string } {
    const p = this.path(rel);
    let fd: number;
    try {
      fd = openSync(p, fsc.O_RDONLY | fsc.O_NOFOLLOW);
    } catch (e) {
      throw internal(`the builder's output ${p} cannot be opened: ${(e as Error).message}`, e);
    }
    try {
      const st = fstatSync(fd);
      if (!st.isFile() || st.nlink !== 1 || st.uid !== this.uid) {
        throw internal(`the builder's output ${p} is not a new regular file of host uid ${this.uid} (uid ${st.uid}, ${st.nlink} links); refusing to publish it`);
      }
      fchownSync(fd, 0, 0);
      fchmodSync(fd, mode);
      return { fd, path: p };
    } catch (e) {
      closeSync(fd);
      throw e;
    }
  }
}

/** True when a process with this pid exists (EPERM counts: it exists, as another user). */
function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}
