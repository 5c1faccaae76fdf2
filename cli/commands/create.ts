/**
 * `dsec create`: creates a sandbox and prints its id (or the Sandbox with --json); `-n N`
 * creates N in one batched request (ids one per line). On a
 * terminal, stderr shows a spinner with the elapsed time and dsecd's phase while it
 * works (a microvm takes seconds, a vm under emulation tens of them), erased before the
 * id is printed; ^C then stops waiting and says which sandbox dsecd goes on making.
 * Also exports the create flags and their translation, which `dsec run` shares.
 */
import type { Command } from 'commander';
import type { Backend, CreateSandboxInput, SandboxPriority } from '../../sdk/index.js';
import type { Ctx } from '../util/context.js';
import { UserError } from '../util/errors.js';
import { runCreate } from '../util/long.js';
import { writeJson } from '../util/output.js';
import { collectEnv, collectLabel, flag, parseCpus, parsePositiveInt, parseSize, parseWholeSeconds } from '../util/parse.js';
import { addNetworkOptions, networkRequest, type NetworkFlags } from '../util/network.js';
import { addFilesystemOptions, collectSyscall, filesystemOf, type FilesystemFlags } from '../util/security.js';

/** The backends the API names (whether this host has each: `dsec host info`). */
export const BACKENDS = ['container', 'fncall', 'microvm', 'vm'] as const satisfies readonly Backend[];

/** Scheduling classes the API names (`--priority`). */
export const PRIORITIES = ['latency', 'batch'] as const satisfies readonly SandboxPriority[];

/** Parsed create flags, as commander hands them to the action (network flags: cli/util/network.ts; filesystem flags: cli/util/security.ts). */
export interface CreateFlags extends NetworkFlags, FilesystemFlags {
  /** `--backend`. */
  backend?: string;
  /** `--image`. */
  image?: string;
  /** `--cpus`, cores. */
  cpus?: number;
  /** `--memory`, bytes. */
  memory?: number;
  /** `--pids`. */
  pids?: number;
  /** `--label`, accumulated. */
  label?: Record<string, string>;
  /** `--env`, accumulated. */
  env?: Record<string, string>;
  /** `--seccomp-allow`, accumulated syscall names. */
  seccompAllow?: string[];
  /** `--seccomp-deny`, accumulated syscall names. */
  seccompDeny?: string[];
  /** `--ttl`, ms (whole seconds). */
  ttl?: number;
  /** `--priority`. */
  priority?: SandboxPriority;
  /** `--idle-timeout`, seconds. */
  idleTimeout?: number;
  /** `--disk`, bytes: quota on the writable layer. */
  disk?: number;
  /** `--io-weight`, 1-10,000 (cgroup v2 io.weight scale). */
  ioWeight?: number;
  /** `--io-read-bps`, `--io-write-bps`, bytes per second; `--io-read-iops`, `--io-write-iops`. */
  ioReadBps?: number;
  ioWriteBps?: number;
  ioReadIops?: number;
  ioWriteIops?: number;
}

/** Parses `--backend`: one of {@link BACKENDS}. */
function parseBackend(text: string): string {
  if (!(BACKENDS as readonly string[]).includes(text)) {
    throw new UserError(`unknown backend ${JSON.stringify(text)}`, `backends are ${BACKENDS.join(', ')}; \`dsec host info\` shows which this host has`);
  }
  return text;
}

/** Parses `--ttl DUR` into ms: at least 1s, at most 30 days, rounded up to whole seconds; a unit is required. */
export function parseTtl(text: string): number {
  return parseWholeSeconds(text, '--ttl') * 1000;
}

/** Parses `--priority`: one of {@link PRIORITIES}. */
export function parsePriority(text: string): SandboxPriority {
  if (!(PRIORITIES as readonly string[]).includes(text)) {
    throw new UserError(`unknown priority ${JSON.stringify(text)}`, 'latency (the default) or batch (runs only on CPU time latency sandboxes leave over)');
  }
  return text as SandboxPriority;
}

/**
 * Adds the create flags (`--backend`, `--image`, `--cpus`, `--memory`, `--pids`, `--disk`,
 * `--io-weight`, `--io-read-bps`, `--io-write-bps`, `--io-read-iops`, `--io-write-iops`,
 * `--label`, `--env`, `--ttl`, `--priority`, `--idle-timeout`, `--seccomp-allow`,
 * `--seccomp-deny`, the network flags of cli/util/network.ts, and the filesystem flags of
 * cli/util/security.ts: `--writable`, `--readonly`, `--no-readonly`, `--landlock`,
 * `--no-landlock`) to `cmd`.
 */
export function addCreateOptions(cmd: Command): Command {
  const c = addNetworkOptions(cmd)
    .option('--backend <backend>', `isolation tier: ${BACKENDS.join(', ')} (default container)`, flag('--backend', parseBackend))
    .option('--image <name>', 'image, name or name:tag (default busybox)')
    .option('--cpus <n>', 'CPU limit in cores, fractions allowed (e.g. 0.5)', flag('--cpus', parseCpus))
    .option('--memory <size>', 'memory limit: bytes or K/M/G (binary), e.g. 512M', flag('--memory', parseSize))
    .option('--pids <n>', 'maximum number of processes', flag('--pids', parsePositiveInt))
    .option('--disk <size>', 'quota on the writable layer: bytes or K/M/G (binary), at least 16M, e.g. 2G (default: the daemon\'s [defaults] disk_bytes)', flag('--disk', parseSize))
    .option('--io-weight <n>', 'share of the writable-layer device under contention, 1-10000 (cgroup v2 io.weight scale; default the daemon\'s [defaults] io_weight, 100); container only', flag('--io-weight', parsePositiveInt))
    .option('--io-read-bps <size>', 'limit reads from the writable-layer device: bytes/s or K/M/G per second (io_max)', flag('--io-read-bps', parseSize))
    .option('--io-write-bps <size>', 'limit writes to the writable-layer device: bytes/s or K/M/G per second (io_max; on cgroup v1 direct I/O only, see `dsec host info`)', flag('--io-write-bps', parseSize))
    .option('--io-read-iops <n>', 'limit read IOs per second on the writable-layer device (io_max)', flag('--io-read-iops', parsePositiveInt))
    .option('--io-write-iops <n>', 'limit write IOs per second on the writable-layer device (io_max)', flag('--io-write-iops', parsePositiveInt))
    .option('--label <k=v>', 'label, repeatable (each key once)', flag('--label', collectLabel))
    .option('--env <K=V>', 'environment for every exec, repeatable (each name once)', flag('--env', collectEnv))
    .option('--ttl <dur>', 'destroy the sandbox this long after creation; a number with a unit, s, m, h or d (e.g. 90s, 10m, 2h; rounded up to whole seconds)', flag('--ttl', parseTtl))
    .option('--priority <class>', `scheduling class: ${PRIORITIES.join(' or ')}; batch runs at SCHED_IDLE with minimal CPU shares, so it never delays latency sandboxes (default latency)`, flag('--priority', parsePriority))
    .option('--seccomp-allow <syscall>', 'lift the default seccomp profile\'s denial of this syscall (e.g. ptrace for a debugger task), repeatable', flag('--seccomp-allow', collectSyscall))
    .option('--seccomp-deny <syscall>', 'also deny this syscall (EPERM), repeatable', flag('--seccomp-deny', collectSyscall))
    .option('--idle-timeout <dur>', 'pause the sandbox after this long without an exec (e.g. 5m; rounded up to whole seconds); `dsec resume` thaws it', flag('--idle-timeout', (t: string) => parseWholeSeconds(t, '--idle-timeout')));
  return addFilesystemOptions(c, 'the sandbox');
}

/** The API request for parsed create flags; unset flags are left to the daemon's defaults. A TTL is rounded up to whole seconds. */
export function createRequest(f: CreateFlags): CreateSandboxInput {
  const req: CreateSandboxInput = {};
  if (f.backend !== undefined) req.backend = f.backend as Backend;
  if (f.image !== undefined) req.image = f.image;
  if (f.cpus !== undefined) req.cpus = f.cpus;
  if (f.memory !== undefined) req.memory_bytes = f.memory;
  if (f.pids !== undefined) req.pids = f.pids;
  if (f.disk !== undefined) req.disk_bytes = f.disk;
  if (f.ioWeight !== undefined) req.io_weight = f.ioWeight;
  const ioMax = {
    ...(f.ioReadBps !== undefined ? { read_bps: f.ioReadBps } : {}), ...(f.ioWriteBps !== undefined ? { write_bps: f.ioWriteBps } : {}),
    ...(f.ioReadIops !== undefined ? { read_iops: f.ioReadIops } : {}), ...(f.ioWriteIops !== undefined ? { write_iops: f.ioWriteIops } : {}),
  };
  if (Object.keys(ioMax).length) req.io_max = ioMax;
  if (f.label !== undefined) req.labels = f.label;
  if (f.env !== undefined) req.env = f.env;
  if (f.ttl !== undefined) req.ttl_s = Math.ceil(f.ttl / 1000);
  if (f.priority !== undefined) req.priority = f.priority;
  if (f.idleTimeout !== undefined) req.idle_timeout_s = f.idleTimeout;
  const network = networkRequest(f);
  if (network) req.network = network;
  if (f.seccompAllow !== undefined || f.seccompDeny !== undefined) {
    req.seccomp = { ...(f.seccompAllow ? { allow: f.seccompAllow } : {}), ...(f.seccompDeny ? { deny: f.seccompDeny } : {}) };
  }
  const fs = filesystemOf(f);
  if (fs) req.filesystem = fs;
  return req;
}

/** The spinner's label of a create (cli/util/long.ts runCreate): `creating a microvm sandbox`. */
export function createLabel(f: Pick<CreateFlags, 'backend'>): string {
  return `creating a ${f.backend ?? 'container'} sandbox`;
}

/** Most sandboxes one `dsec create -n` asks for: the batch bound of POST /v1/sandboxes:batch (LIMITS.maxBatchSandboxes in daemon/model/resources.ts). */
export const MAX_CREATE_COUNT = 1000;

/** Parses `-n N`: a whole number from 1 to {@link MAX_CREATE_COUNT}. */
export function parseCreateCount(text: string): number {
  const n = parsePositiveInt(text);
  if (n > MAX_CREATE_COUNT) throw new UserError(`create count ${n} is more than ${MAX_CREATE_COUNT}`, `create at most ${MAX_CREATE_COUNT} per call; run \`dsec create -n\` several times for a larger job`);
  return n;
}

/**
 * Adds `create` to `parent`. With `-n N` the N sandboxes are one batched create
 * (POST /v1/sandboxes:batch): the ids are printed one per line in order, each sandbox that
 * was not made is reported on stderr with its error and the exit code is 1; with --json
 * the answer `{results, created, failed}` is printed as is.
 */
export function register(parent: Command, ctx: Ctx): Command {
  return addCreateOptions(parent.command('create').description('create a sandbox (or N with -n) and print its id'))
    .option('--allow-burst', 'through a gateway: a pool=burst host may take it while the primary pool is above its threshold')
    .option('-n, --count <n>', `create N sandboxes of this spec in one batched request, 1-${MAX_CREATE_COUNT}`, flag('-n', parseCreateCount))
    .action(async (flags: CreateFlags & { allowBurst?: boolean; count?: number }) => {
      if (flags.count !== undefined) return createMany(ctx, flags, flags.count);
      const sandbox = await runCreate(ctx, { label: createLabel(flags), abortOnInterrupt: true }, (o) => ctx.client().createSandbox(createRequest(flags), { ...o, allowBurst: flags.allowBurst }));
      if (!sandbox) return;
      if (ctx.json) writeJson(ctx.io.stdout, sandbox);
      else ctx.out(sandbox.id + '\n');
    });
}

/** `dsec create -n N`: one batched create; see {@link register}. */
async function createMany(ctx: Ctx, flags: CreateFlags & { allowBurst?: boolean }, count: number): Promise<void> {
  const label = `creating ${count} ${flags.backend ?? 'container'} sandboxes`;
  const r = await runCreate(ctx, { label, count, abortOnInterrupt: true }, (o) => ctx.client().createSandboxes({ count, spec: createRequest(flags) }, { signal: o.signal, allowBurst: flags.allowBurst }));
  if (!r) return;
  if (ctx.json) writeJson(ctx.io.stdout, r);
  else ctx.out(r.results.filter((x) => x.sandbox).map((x) => x.sandbox!.id + '\n').join(''));
  const failed = r.results.map((x, i) => [i, x] as const).filter(([, x]) => x.error);
  if (failed.length) {
    if (!ctx.json) for (const [i, x] of failed) ctx.err(`dsec: sandbox ${i + 1} of ${count} not created: ${x.error!.code}: ${x.error!.message}\n`);
    ctx.exitCode = 1;
  }
}
