/**
 * Running helper binaries (the OCI runtime, `ip`, ...) from dsecd without forking dsecd:
 * children are started with posix_spawn(3) by the native addon (native/addon/spawn.c) and
 * reaped by a thread of its own.
 *
 * Why not child_process/execa: libuv forks the whole Node process on the JS thread. On
 * this development host that blocks dsecd's event loop 6 ms per spawn at 50 MiB RSS and
 * 10-15 ms at 150-350 MiB, and under a creation burst the `runc run` and `runc delete`
 * spawns were the largest share of dsecd's CPU (docs/BENCHMARKS.md, "Where the create
 * time goes"). posix_spawn (CLONE_VM|CLONE_VFORK) costs ~0.35 ms whatever dsecd's size.
 *
 * The posix_spawn itself runs on the addon's thread (with CLONE_VFORK its caller waits
 * until the child has exec'd, several ms on a loaded host), so a call costs the event loop
 * only the preparation: argument copies and fd dups, which are taken before this returns,
 * so the caller may close its fds right after calling.
 *
 * The interface is a small, explicit subset of what execa offers: argument arrays only
 * (never a shell), fds mapped by number, stdin given whole, stdout/stderr captured up to a
 * cap, a timeout that SIGKILLs. Use execa for anything else (streaming output, pipes).
 */
import { DsecError } from '../errors.js';
import { addonModule } from './native.js';

/** What a finished child left. */
export interface SpawnResult {
  /** Exit status when it exited, else null. */
  exitCode: number | null;
  /** Name of the signal that killed it (`"SIGKILL"`), else null. */
  signal: string | null;
  /** Captured fd 1 (UTF-8, at most {@link SpawnOptions.maxOutputBytes}); '' when fd 1 was mapped. */
  stdout: string;
  /** Captured fd 2, likewise. */
  stderr: string;
  /** True when {@link SpawnOptions.timeoutMs} passed and the child was SIGKILLed. */
  timedOut: boolean;
  /** Host pid the child had. */
  pid: number;
}

/** Options of {@link spawnNative}. */
export interface SpawnOptions {
  /**
   * Fds of the child, by number (0..63): `{ 3: someFd }` makes the caller's `someFd` the
   * child's fd 3. Unnamed 0/1/2 are /dev/null, or {@link input} and the captured output.
   * Every other fd of dsecd is closed in the child.
   */
  fds?: Record<number, number>;
  /** Contents of the child's stdin (ignored when `fds` names 0). */
  input?: string | Buffer;
  /** The child's whole environment; default: dsecd's. */
  env?: Record<string, string | undefined>;
  /** Working directory; default: dsecd's. */
  cwd?: string;
  /** SIGKILL the child after this many ms (default: never). */
  timeoutMs?: number;
  /** Bytes of stdout and of stderr kept, each (default 1 MiB; 0: both go to /dev/null). */
  maxOutputBytes?: number;
}

/** The addon's raw functions (native/addon/spawn.c). */
interface SpawnAddon {
  spawn(file: string, argv: string[], envp: string[] | null, cwd: string | null, fds: number[], stdin: Buffer | null, capture: number):
    [Promise<{ pid: number; exitCode: number | null; signal: number | null; stdout: Buffer | null; stderr: Buffer | null }>, unknown];
  spawnKill(handle: unknown, signo: number): boolean;
}

/** Signal numbers to names (x86-64 Linux), for {@link SpawnResult.signal}. */
const SIGNAL_NAMES: Record<number, string> = {
  1: 'SIGHUP', 2: 'SIGINT', 3: 'SIGQUIT', 4: 'SIGILL', 5: 'SIGTRAP', 6: 'SIGABRT', 7: 'SIGBUS', 8: 'SIGFPE', 9: 'SIGKILL',
  10: 'SIGUSR1', 11: 'SIGSEGV', 12: 'SIGUSR2', 13: 'SIGPIPE', 14: 'SIGALRM', 15: 'SIGTERM', 24: 'SIGXCPU', 25: 'SIGXFSZ', 31: 'SIGSYS',
};

const DEFAULT_MAX_OUTPUT = 1 << 20;

/**
 * Runs `file` with `args` to completion. `file` without a '/' is searched in dsecd's PATH.
 * Never rejects for the child's own failure: look at `exitCode`/`signal`. The fds named in
 * `opts.fds` are duplicated before this returns (the caller may close them at once).
 * @throws (rejects) Error with `code` (errno name) and `syscall: "posix_spawn"` when the
 *   program cannot be started (ENOENT: not installed, EACCES); TypeError for arguments
 *   the addon refuses (an fd number outside 0..63); DsecError FailedPrecondition when the
 *   addon is not built.
 */
export async function spawnNative(file: string, args: readonly string[], opts: SpawnOptions = {}): Promise<SpawnResult> {
  const a = addonModule() as unknown as SpawnAddon;
  if (typeof a.spawn !== 'function') throw new DsecError('FailedPrecondition', 'the native addon has no spawn(): rebuild it (make -C native/addon)');
  const fds: number[] = [];
  for (const [child, parent] of Object.entries(opts.fds ?? {})) fds.push(Number(child), parent);
  const envp = opts.env ? Object.entries(opts.env).filter(([, v]) => v !== undefined).map(([k, v]) => `${k}=${v}`) : null;
  const input = opts.input === undefined ? null : Buffer.isBuffer(opts.input) ? opts.input : Buffer.from(opts.input);
  const [done, handle] = a.spawn(file, [file, ...args], envp, opts.cwd ?? null, fds, input, opts.maxOutputBytes ?? DEFAULT_MAX_OUTPUT);
  let timedOut = false;
  let timer: NodeJS.Timeout | undefined;
  if (opts.timeoutMs !== undefined) {
    timer = setTimeout(() => {
      timedOut = a.spawnKill(handle, 9);
    }, opts.timeoutMs);
  }
  try {
    const r = await done;
    return {
      exitCode: r.exitCode, signal: r.signal === null ? null : SIGNAL_NAMES[r.signal] ?? `SIG${r.signal}`,
      stdout: r.stdout?.toString('utf8') ?? '', stderr: r.stderr?.toString('utf8') ?? '', timedOut, pid: r.pid,
    };
  } finally {
    if (timer) clearTimeout(timer);
  }
}
