/**
 * The E2B front's one door into dsec: {@link E2bHost}, the few operations E2B's control
 * plane and envd need of a host, and {@link localHost}, its implementation over this
 * dsecd's lifecycle services. Everything else under daemon/api/e2b speaks only to this
 * interface, so:
 * - the daemon's lifecycle services (daemon/sandbox/) are reached only through
 *   {@link localHost};
 * - another implementation (e.g. over a remote dsecd's /v1) can stand in for it: every
 *   operation here maps to one /v1 route.
 * Sandboxes are ordinary dsec sandboxes: what the E2B front creates, `dsec ls` lists.
 */
import type { Readable } from 'node:stream';
import type { Sandbox } from '../wire/sandboxes.js';
import { sandboxView } from '../convert.js';
import type { SandboxInput } from '../../model/sandbox.js';
import type { SandboxRepo } from '../../db/sandboxes.js';
import type { LayerStore } from '../../image/layer-store.js';
import { SYSTEM_TENANT, tenantScope } from '../../model/tenant.js';
import type { SandboxCreator } from '../../sandbox/create.js';
import type { SandboxLifecycle } from '../../sandbox/lifecycle.js';
import type { RoundService } from '../../sandbox/rounds.js';
import type { ExecService } from '../../sandbox/exec.js';
import type { ExecSession, StreamName } from '../../sandbox/exec-sessions.js';
import type { AgentFileRead } from '../../agent/client.js';
import type { FileEntry, FileInfo } from '../../agent/protocol.js';
import { FileWriteFlag } from '../../agent/protocol.js';
import type { Metrics } from '../../metrics.js';

/** A running or finished process the E2B front started (an exec session underneath). */
export interface HostProcess {
  /** pid inside the sandbox (resolved once the program runs), or null if it never started. */
  readonly pid: number | null;
  /** Whether it ended (exit, signal, or its sandbox went away). */
  readonly ended: boolean;
  /** Bytes of `stream` produced so far (the offset a new reader starts at to see only what comes next). */
  size(stream: StreamName): number;
  /**
   * Streams `stream` from `offset` to `write` (which paces the reading), following new
   * output until the end when `follow`; stops when `aborted()` turns true.
   * @returns the offset reached
   */
  pipe(stream: StreamName, offset: number, follow: boolean, write: (b: Buffer) => Promise<void>, aborted: () => boolean): Promise<number>;
  /** Resolves once it ended. */
  wait(): Promise<void>;
  /** How it ended (null fields while running): exit code, signal name, why it could not start. */
  result(): { exitCode: number | null; signal: string | null; error: string | null };
  /** Signal (1..64) to its process group; a no-op once ended. */
  signal(signo: number): void;
  /** Bytes to its stdin (or its terminal). @throws DsecError FailedPrecondition when stdin is closed or was never open. */
  writeStdin(b: Buffer): void;
  /** Resolves when the connection can take more stdin. */
  drained(): Promise<void>;
  /** Closes stdin. Safe to call twice. */
  closeStdin(): void;
  /** Resizes its terminal. @throws DsecError FailedPrecondition for a process without a tty. */
  resize(rows: number, cols: number): void;
  /**
   * Its readers left while it runs: from now on output nobody reads is dropped, so the
   * process is never held back by a missing reader (envd's contract: a background
   * command runs on after its client disconnects). A reader that comes later gets the
   * output from then on. Safe to call twice.
   */
  unwatched(): void;
}

/** What to run (E2B's ProcessConfig, resolved: user, cwd and environment decided by the caller). */
export interface ProcessSpec {
  argv: string[];
  env: Record<string, string>;
  cwd: string;
  /** User inside the sandbox (name or uid); undefined: the image's default. */
  user: string | undefined;
  stdin: boolean;
  tty?: { rows: number; cols: number };
}

/** File operations inside a running sandbox, as a user of it (the agent's, daemon/agent/client.ts). */
export interface HostFiles {
  readFile(path: string, opts: { user: string }): AgentFileRead;
  /** Writes (creating parents when `parents`) atomically from `source`. @returns bytes written */
  writeFile(path: string, source: Readable | Buffer, opts: { user: string; parents: boolean }): Promise<{ bytes: number }>;
  stat(path: string, opts: { user: string; nofollow?: boolean }): Promise<FileInfo>;
  list(path: string, opts: { user: string }): Promise<FileEntry[]>;
  mkdir(path: string, opts: { user: string; parents?: boolean }): Promise<void>;
  remove(path: string, opts: { user: string; recursive?: boolean }): Promise<void>;
}

/** A sandbox to create: resolved from an E2B create request by the front. */
export interface HostCreate {
  image: string;
  backend: SandboxInput['backend'];
  /** The caller's metadata (already checked against dsec's label rules) plus the front's own `dsec.e2b.*` labels. */
  labels: Record<string, string>;
  env: Record<string, string>;
  /** Seconds after creation when it is destroyed. */
  ttlS: number;
  network: SandboxInput['network'];
  /** The caller's tenant: the sandbox is that tenant's in dsec's model too (its /v1 views, its quotas). */
  tenant: string;
}

/** What the E2B front needs of a dsec host (see the module comment). All may throw DsecErrors of the closed set. */
export interface E2bHost {
  /** Creates and starts a sandbox. */
  create(req: HostCreate): Promise<Sandbox>;
  /** One sandbox. @throws DsecError NotFound */
  get(id: string): Promise<Sandbox>;
  /** Every sandbox of the host (warm-pool shells excluded), oldest first. */
  list(): Promise<Sandbox[]>;
  /** Destroys a sandbox, running or not. @throws DsecError NotFound */
  destroy(id: string): Promise<void>;
  /** Freezes a running sandbox (idempotent on a paused one). */
  pause(id: string): Promise<void>;
  /** Thaws a paused sandbox (idempotent on a running one). */
  resume(id: string): Promise<void>;
  /** Stops every process; the writable layer stays. */
  stop(id: string): Promise<void>;
  /** Starts a stopped sandbox on its writable layer. */
  start(id: string): Promise<void>;
  /** Sets the TTL: seconds from creation, or null for none. */
  setTtl(id: string, ttlS: number | null): Promise<void>;
  /**
   * Whether the image store has `ref` as `tenant` names it (its own image, else the
   * `system` one; default `system`). @throws DsecError InvalidArgument for a malformed ref
   */
  imageExists(ref: string, tenant?: string): Promise<boolean>;
  /**
   * Starts a process; resolves once it runs or failed to start (then ended, with `result().error`).
   * @throws DsecError FailedPrecondition (sandbox not running), InvalidArgument (a cwd or user it lacks)
   */
  startProcess(id: string, spec: ProcessSpec): Promise<HostProcess>;
  /** File operations of a running sandbox. @throws DsecError NotFound, FailedPrecondition (not running), Unavailable */
  files(id: string): Promise<HostFiles>;
  /** Runs a command to completion (e.g. `mv` for a move). */
  run(id: string, argv: string[], user: string): Promise<{ exitCode: number | null; stdout: string; stderr: string }>;
  /** Observes the duration of a create through the E2B door (the same histogram as /v1 creates). */
  timeCreate?(backend: string): () => void;
}

/**
 * {@link HostProcess} over a paced exec session of this daemon: output is held in memory
 * for its readers and the command waits for them (daemon/sandbox/execs.ts), with no spool
 * files: a command's start and end then touch no disk, which is most of its cost on a
 * slow store. {@link HostProcess.unwatched} adds a reader that drops what it reads, so a
 * process nobody listens to any more is never paused.
 */
function sessionProcess(s: ExecSession): HostProcess {
  let draining = false;
  return {
    get pid() {
      return s.pid;
    },
    get ended() {
      return s.ended;
    },
    size: (stream) => s.spools[stream].size,
    pipe: (stream, offset, follow, write, aborted) => s.pipe(stream, offset, follow, write, aborted),
    wait: () => s.wait(),
    result: () => {
      const i = s.info();
      return { exitCode: i.exit_code, signal: i.signal, error: i.error };
    },
    signal: (n) => s.handle.signal(n),
    writeStdin: (b) => s.handle.writeStdin(b),
    drained: () => s.handle.drained(),
    closeStdin: () => s.handle.closeStdin(),
    resize: (rows, cols) => s.handle.resize(rows, cols),
    unwatched: () => {
      if (draining || s.ended) return;
      draining = true;
      const drop = async () => {};
      // From the oldest byte held (offset 0 is clamped to it): output already held must go
      // too, since the command may be paused on it and then nothing new would come to move
      // a reader that started at the end.
      for (const stream of ['stdout', 'stderr'] as const) void s.pipe(stream, 0, true, drop).catch(() => {});
    },
  };
}

/**
 * Owner uid recorded on the exec sessions the E2B front starts. Root's (0): they are
 * shown to root on the Unix socket (`dsec exec` sessions of other uids stay hidden from
 * each other as before), and the front keeps its own pid table per sandbox.
 */
const E2B_EXEC_OWNER_UID = 0;

/** The services {@link localHost} drives (daemon/startup/services.ts builds them). */
export interface LocalHostDeps {
  creator: Pick<SandboxCreator, 'create'>;
  lifecycle: Pick<SandboxLifecycle, 'get' | 'list' | 'destroy' | 'stop' | 'start'>;
  rounds: Pick<RoundService, 'pause' | 'resume'>;
  exec: Pick<ExecService, 'startExec' | 'exec' | 'files'>;
  repo: Pick<SandboxRepo, 'setTtl'>;
  images: Pick<LayerStore, 'get'>;
  metrics?: Metrics;
}

/** {@link E2bHost} over this dsecd's lifecycle services, repo and image store. */
export function localHost(d: LocalHostDeps): E2bHost {
  const lc = d.lifecycle;
  return {
    async create(req) {
      const sb = await d.creator.create({ backend: req.backend, image: req.image, labels: req.labels, env: req.env, ttlS: req.ttlS, tenant: req.tenant, ...(req.network ? { network: req.network } : {}) });
      return sandboxView(sb);
    },
    async get(id) {
      return sandboxView(lc.get(id));
    },
    async list() {
      return lc.list().map(sandboxView);
    },
    async destroy(id) {
      await lc.destroy(id, true, 'killed through the E2B API');
    },
    async pause(id) {
      await d.rounds.pause(id);
    },
    async resume(id) {
      await d.rounds.resume(id);
    },
    async stop(id) {
      await lc.stop(id);
    },
    async start(id) {
      await lc.start(id);
    },
    async setTtl(id, ttlS) {
      lc.get(id);
      d.repo.setTtl(id, ttlS);
    },
    async imageExists(ref, tenant) {
      return d.images.get(ref, tenantScope(tenant ?? SYSTEM_TENANT)).then(() => true, (e: { kind?: string }) => {
        if (e.kind === 'NotFound') return false;
        throw e;
      });
    },
    async startProcess(id, spec) {
      const s = await d.exec.startExec(id, {
        argv: spec.argv, env: spec.env, cwd: spec.cwd, ...(spec.user !== undefined ? { user: spec.user } : {}), stdin: spec.stdin, ...(spec.tty ? { tty: spec.tty } : {}),
        paced: true,
      }, E2B_EXEC_OWNER_UID);
      // The pid is known once the program runs (startExec resolves after that, or after it failed).
      await s.handle.pid.catch(() => {});
      return sessionProcess(s);
    },
    async files(id) {
      const a = await d.exec.files(id);
      return {
        readFile: (p, o) => a.readFile(p, { user: o.user }),
        writeFile: (p, src, o) => a.writeFile(p, src, { user: o.user, flags: FileWriteFlag.CREATE | (o.parents ? FileWriteFlag.PARENTS : 0) }),
        stat: (p, o) => a.stat(p, o),
        list: (p, o) => a.list(p, o),
        mkdir: (p, o) => a.mkdir(p, { user: o.user, parents: o.parents }),
        remove: (p, o) => a.remove(p, o),
      };
    },
    async run(id, argv, user) {
      const r = await d.exec.exec(id, { argv, user });
      return { exitCode: r.exit_code, stdout: Buffer.from(r.stdout_b64, 'base64').toString(), stderr: Buffer.from(r.stderr_b64, 'base64').toString() };
    },
    timeCreate: d.metrics ? (backend) => d.metrics!.createSeconds.startTimer({ backend }) : undefined,
  };
}
