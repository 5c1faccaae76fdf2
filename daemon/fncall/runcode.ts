/**
 * A SandboxFusion-compatible `run_code` (POST /run_code), so reward code written for
 * SandboxFusion can point at dsec unchanged.
 *
 * One request is one isolated fncall on the language's image (default `judge:bookworm`:
 * Debian + python3 + gcc/g++). The call runs a small Python driver ({@link DRIVER}) that
 * reads the request from stdin, writes the code and `files` into a fresh working
 * directory on the call's tmpfs, compiles (c, cpp) and runs with their own timeouts,
 * collects `fetch_files`, and prints one JSON result. Nothing of a call survives it
 * (daemon/fncall/pool.ts). Wire shapes: {@link RunCodeRequest}, {@link RunCodeResponse}.
 */
import { z } from 'zod';
import { LIMITS } from '../model/resources.js';
import { DsecError, invalidArgument } from '../errors.js';
import type { FncallPools } from './pool.js';

/** Languages and how each is built and run inside the working directory. */
export const LANGUAGES = {
  python: { file: 'main.py', compile: null, run: ['python3', 'main.py'] },
  bash: { file: 'main.sh', compile: null, run: ['bash', 'main.sh'] },
  c: { file: 'main.c', compile: ['gcc', '-O2', '-o', 'main', 'main.c', '-lm'], run: ['./main'] },
  cpp: { file: 'main.cpp', compile: ['g++', '-O2', '-std=c++17', '-o', 'main', 'main.cpp'], run: ['./main'] },
} as const;
export type Language = keyof typeof LANGUAGES;

/** Longest compile or run timeout: 15 min, far above any judge task; a day is a typo. */
const MAX_TIMEOUT_S = 900;
/**
 * Output kept per stream and phase: 512 KiB. Four streams base64-encoded, plus fetched
 * files, must fit in the exec output cap (4 MiB) with the driver's JSON around them.
 */
const MAX_PHASE_OUTPUT_BYTES = 512 * 1024;
/** Total bytes of fetch_files returned: 1 MiB (files beyond it are skipped and noted). */
const MAX_FETCH_BYTES = 1024 * 1024;
/** Size of the call's /tmp, which holds the working directory: 512 MiB (charged to the memory limit only as used). */
const WORKDIR_TMPFS_BYTES = 512 * 1024 * 1024;
/** tmpfs holding a phase's stdin and output files: stdin (≤ 16 MiB) plus 8 MiB of output; a flood gets ENOSPC there. */
const IO_TMPFS_BYTES = 24 * 1024 * 1024;
/** Memory the driver itself needs on top of the program's limit: 64 MiB (python3 and the output files). */
const DRIVER_MEMORY_BYTES = 64 * 1024 * 1024;
/** The uid (and gid) programs run as: 65534, "nobody" in Debian images; never the driver's. */
const PROGRAM_UID = 65534;
/** Memory limit when a request sends SandboxFusion's -1 ("no limit"): 4 GiB, bounded so one call cannot take the host. */
const UNLIMITED_MEMORY_MB = 4096;

const relPath = z.string().min(1).max(4096).refine((p) => !p.startsWith('/') && !p.split('/').includes('..') && !p.includes('\0'),
  'file paths are relative to the working directory, without ".." or NUL');

/** POST /run_code request (SandboxFusion's field names; timeouts in seconds). Unknown fields are ignored, as SandboxFusion does. */
export const RunCodeRequest = z.object({
  code: z.string().describe('Source code.'),
  language: z.string().describe(`One of ${Object.keys(LANGUAGES).join(', ')}.`),
  compile_timeout: z.number().gt(0).max(MAX_TIMEOUT_S).default(10).describe('Seconds; default 10.'),
  run_timeout: z.number().gt(0).max(MAX_TIMEOUT_S).default(10).describe('Seconds; default 10.'),
  memory_limit_MB: z.number().int().refine((n) => n === -1 || (n >= 16 && n <= 64 * 1024), 'memory_limit_MB is -1 (no limit) or 16-65536')
    .default(1024).describe(`Memory limit of the program, MiB; default 1024; -1 (SandboxFusion's "no limit") means ${UNLIMITED_MEMORY_MB}.`),
  stdin: z.string().max(LIMITS.maxStdinBytes).nullable().optional().describe('Text fed to the program; at most 16 MiB.'),
  files: z.record(z.string(), z.string().base64().nullable()).default({}).superRefine((files, ctx) => {
    const paths = Object.keys(files).filter((p) => files[p] !== null);
    for (const p of paths) {
      const r = relPath.safeParse(p);
      if (!r.success) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(p)}: ${r.error.issues[0].message}` });
      const dir = paths.find((q) => p.startsWith(`${q}/`));
      if (dir) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(dir)} is a file, so ${JSON.stringify(p)} cannot be below it` });
    }
  }).describe('Extra files, path -> base64 content (null: skipped), written before compiling.'),
  fetch_files: z.array(relPath).default([]).describe('Files to return after the run, by path.'),
}).passthrough();
export type RunCodeRequest = z.infer<typeof RunCodeRequest>;

/** One phase's outcome (SandboxFusion's CommandRunResult). */
export const PhaseResult = z.object({
  status: z.enum(['Finished', 'TimeLimitExceeded', 'Error']),
  execution_time: z.number().nullable().describe('Seconds.'),
  return_code: z.number().int().nullable().describe('Exit status; negative: killed by that signal (e.g. -9).'),
  stdout: z.string().nullable(),
  stderr: z.string().nullable(),
});
export type PhaseResult = z.infer<typeof PhaseResult>;

/** POST /run_code response. */
export const RunCodeResponse = z.object({
  status: z.enum(['Success', 'Failed', 'SandboxError']),
  message: z.string(),
  compile_result: PhaseResult.nullable().describe('null for interpreted languages.'),
  run_result: PhaseResult.nullable().describe('null when compilation failed or dsec could not run the code.'),
  executor_pod_name: z.string().nullable(),
  files: z.record(z.string(), z.string()).describe('fetch_files that exist, path -> base64.'),
});
export type RunCodeResponse = z.infer<typeof RunCodeResponse>;

/**
 * The in-call driver. Reads {file, code, compile, run, compile_timeout, run_timeout,
 * stdin, files, fetch, cap, fetch_cap, uid} as JSON on stdin; prints one JSON line
 * {compile, run, files, notes} with outputs base64-encoded (so the line's size is
 * bounded: 4/3 of the caps, well inside the exec output cap).
 *
 * Each phase runs as an unprivileged uid (`uid`, 65534) in its own session, with stdin,
 * stdout and stderr on files in a bounded tmpfs (never pipes, so a daemonized child
 * cannot hold the driver open). The driver itself stays root: the program can neither
 * open the driver's /proc entries (its stdout, where the result goes) nor signal or
 * trace it. After each phase, every process but the driver and the namespace init is
 * SIGKILLed (kill(-1)), so nothing of the phase outlives it.
 */
export const DRIVER = String.raw`
import base64, json, os, signal, subprocess, sys, time
r = json.load(sys.stdin)
uid = r['uid']
w, io = '/tmp/work', '/tmp/io'
os.makedirs(w)
os.chmod(io, 0o700)
def put(p, data):
    d = os.path.dirname(p)
    if d: os.makedirs(d, exist_ok=True)
    with open(p, 'wb') as f: f.write(data)
os.chdir(w)
for p, b in r['files'].items(): put(p, base64.b64decode(b))
put(r['file'], r['code'].encode())
for root, dirs, files in os.walk(w):
    for n in dirs + files: os.lchown(os.path.join(root, n), uid, uid)
os.chown(w, uid, uid)
notes = []
def grab(path, cap, name):
    with open(path, 'rb') as f: data = f.read(cap + 1)
    if len(data) > cap:
        notes.append(name + ' truncated to ' + str(cap) + ' bytes')
        data = data[:cap]
    return base64.b64encode(data).decode()
def phase(name, argv, timeout, stdin):
    with open(io + '/in', 'wb') as f: f.write(stdin)
    fi, fo, fe = open(io + '/in', 'rb'), open(io + '/out', 'wb'), open(io + '/err', 'wb')
    t = time.monotonic()
    try:
        p = subprocess.Popen(argv, stdin=fi, stdout=fo, stderr=fe, start_new_session=True, user=uid, group=uid, extra_groups=[], umask=0o022)
    except OSError as e:
        return {'status': 'Error', 'execution_time': 0, 'return_code': None, 'stdout_b64': '', 'stderr_b64': base64.b64encode(str(e).encode()).decode()}
    finally:
        fi.close(); fo.close(); fe.close()
    try:
        rc = p.wait(timeout=timeout)
        status = 'Finished'
    except subprocess.TimeoutExpired:
        status = 'TimeLimitExceeded'
    took = round(time.monotonic() - t, 6)
    try: os.kill(-1, signal.SIGKILL)
    except ProcessLookupError: pass
    rc = p.wait()
    return {'status': status, 'execution_time': took, 'return_code': rc,
            'stdout_b64': grab(io + '/out', r['cap'], name + ' stdout'), 'stderr_b64': grab(io + '/err', r['cap'], name + ' stderr')}
res = {'compile': None, 'run': None, 'files': {}, 'notes': notes}
ok = True
if r['compile']:
    res['compile'] = phase('compile', r['compile'], r['compile_timeout'], b'')
    ok = res['compile']['status'] == 'Finished' and res['compile']['return_code'] == 0
if ok:
    res['run'] = phase('run', r['run'], r['run_timeout'], (r['stdin'] or '').encode())
left = r['fetch_cap']
for p in r['fetch']:
    try:
        with open(os.path.join(w, p), 'rb') as f: data = f.read(left + 1)
    except OSError: continue
    if len(data) > left:
        notes.append('fetch_files ' + p + ' skipped: over the ' + str(r['fetch_cap']) + ' byte total')
        continue
    left -= len(data)
    res['files'][p] = base64.b64encode(data).decode()
sys.stdout.write(json.dumps(res))
`;

/** Image per language (config `[sandboxfusion] images`); default judge:bookworm for all. */
export type LanguageImages = Partial<Record<Language, string>>;

/** The image every language uses unless configured otherwise. */
export const DEFAULT_JUDGE_IMAGE = 'judge:bookworm';

/**
 * Runs one SandboxFusion request on the fncall tier.
 * @returns the SandboxFusion response; a program that fails is `Failed`, not an error.
 * @throws DsecError InvalidArgument (unknown language, bad timeouts or paths),
 *   FailedPrecondition (the language's image is missing: bootstrap it), ResourceExhausted.
 */
export async function runCode(pools: FncallPools, req: RunCodeRequest, images: LanguageImages = {}): Promise<RunCodeResponse> {
  if (!Object.prototype.hasOwnProperty.call(LANGUAGES, req.language)) {
    throw invalidArgument(`unknown language ${JSON.stringify(req.language)}; dsec runs ${Object.keys(LANGUAGES).join(', ')}`);
  }
  const lang = LANGUAGES[req.language as Language];
  const image = images[req.language as Language] ?? DEFAULT_JUDGE_IMAGE;
  const files = Object.fromEntries(Object.entries(req.files).filter(([, v]) => v !== null));
  const input = {
    file: lang.file, code: req.code, compile: lang.compile, run: lang.run, compile_timeout: req.compile_timeout, run_timeout: req.run_timeout,
    stdin: req.stdin ?? '', files, fetch: req.fetch_files, cap: MAX_PHASE_OUTPUT_BYTES, fetch_cap: MAX_FETCH_BYTES, uid: PROGRAM_UID,
  };
  const memoryMb = req.memory_limit_MB === -1 ? UNLIMITED_MEMORY_MB : req.memory_limit_MB;
  const sandboxError = (message: string): RunCodeResponse => ({ status: 'SandboxError', message, compile_result: null, run_result: null, executor_pod_name: null, files: {} });
  let r;
  try {
    r = await pools.run({
      image, argv: ['python3', '-c', DRIVER], stdin: Buffer.from(JSON.stringify(input)),
      // The phases have their own timeouts; this one only bounds the driver (writing files, packing results).
      timeoutMs: Math.ceil((lang.compile ? req.compile_timeout : 0) * 1000 + req.run_timeout * 1000) + 30_000,
      memoryBytes: memoryMb * 1024 * 1024 + DRIVER_MEMORY_BYTES,
      tmpBytes: WORKDIR_TMPFS_BYTES,
      scratch: [{ path: '/tmp/io', bytes: IO_TMPFS_BYTES }],
    });
  } catch (e) {
    if (e instanceof DsecError && e.kind === 'NotFound' && /image/.test(e.message)) {
      throw new DsecError('FailedPrecondition', `run_code for ${req.language} needs image ${image}, which this host does not have; build it with \`dsec image bootstrap judge\``, { cause: e });
    }
    throw e;
  }
  const out = Buffer.from(r.stdout_b64, 'base64').toString();
  if (r.exit_code !== 0) {
    const why = r.oom ? 'ran out of memory' : r.timed_out ? 'timed out' : r.signal ? `was killed by ${r.signal}` : `exited with ${r.exit_code}`;
    return sandboxError(`the run_code driver ${why}: ${Buffer.from(r.stderr_b64, 'base64').toString().slice(-500)}`);
  }
  // The driver's output is bounded by construction; a truncated one is not a result.
  if (r.stdout_truncated) return sandboxError('the run_code driver printed more than the exec output cap');
  type Raw = { status: PhaseResult['status']; execution_time: number | null; return_code: number | null; stdout_b64: string; stderr_b64: string };
  let raw: { compile: Raw | null; run: Raw | null; files: Record<string, string>; notes: string[] };
  try {
    raw = JSON.parse(out);
  } catch {
    return sandboxError(`the run_code driver printed no result (${out.length} bytes of output)`);
  }
  const text = (b64: string) => Buffer.from(b64, 'base64').toString('utf8');
  const decode = (p: Raw | null): PhaseResult | null => p && ({
    status: p.status, execution_time: p.execution_time, return_code: p.return_code, stdout: text(p.stdout_b64), stderr: text(p.stderr_b64),
  });
  const res = { compile: decode(raw.compile), run: decode(raw.run), files: raw.files };
  const compileFailed = res.compile !== null && !(res.compile.status === 'Finished' && res.compile.return_code === 0);
  const runOk = res.run !== null && res.run.status === 'Finished' && res.run.return_code === 0;
  const message = compileFailed ? (res.compile!.status === 'TimeLimitExceeded' ? 'compilation timed out' : 'compilation failed')
    : !res.run ? 'not run'
      : res.run.status === 'TimeLimitExceeded' ? 'time limit exceeded'
        : res.run.return_code === -9 ? `killed by SIGKILL (by itself, or at the memory limit of ${memoryMb} MiB)`
          : res.run.return_code !== 0 ? `exited with ${res.run.return_code}` : '';
  return {
    status: runOk && !compileFailed ? 'Success' : 'Failed', message: [message, ...raw.notes].filter(Boolean).join('; '),
    compile_result: res.compile, run_result: res.run, executor_pod_name: null, files: res.files,
  };
}
