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
/** Output kept per stream and phase: 1 MiB (SandboxFusion returns text; more is a flood). */
const MAX_PHASE_OUTPUT_BYTES = 1024 * 1024;
/** Size of the call's /tmp, which holds the working directory: 512 MiB (charged to the memory limit only as used). */
const WORKDIR_TMPFS_BYTES = 512 * 1024 * 1024;
/** Memory the driver itself needs on top of the program's limit: 64 MiB (python3 and the pipes). */
const DRIVER_MEMORY_BYTES = 64 * 1024 * 1024;

const relPath = z.string().min(1).max(4096).refine((p) => !p.startsWith('/') && !p.split('/').includes('..') && !p.includes('\0'),
  'file paths are relative to the working directory, without ".." or NUL');

/** POST /run_code request (SandboxFusion's field names; timeouts in seconds). Unknown fields are ignored, as SandboxFusion does. */
export const RunCodeRequest = z.object({
  code: z.string().describe('Source code.'),
  language: z.string().describe(`One of ${Object.keys(LANGUAGES).join(', ')}.`),
  compile_timeout: z.number().gt(0).max(MAX_TIMEOUT_S).default(10).describe('Seconds; default 10.'),
  run_timeout: z.number().gt(0).max(MAX_TIMEOUT_S).default(10).describe('Seconds; default 10.'),
  memory_limit_MB: z.number().int().min(16).max(64 * 1024).default(1024).describe('Memory limit of the program, MiB; default 1024.'),
  stdin: z.string().nullable().optional().describe('Text fed to the program.'),
  files: z.record(z.string(), z.string().base64()).default({}).superRefine((files, ctx) => {
    for (const p of Object.keys(files)) {
      const r = relPath.safeParse(p);
      if (!r.success) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(p)}: ${r.error.issues[0].message}` });
    }
  }).describe('Extra files, path -> base64 content, written before compiling.'),
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
 * The in-call driver: reads {lang, code, file, compile, run, compile_timeout,
 * run_timeout, stdin, files, fetch, cap} as JSON on stdin; prints {compile, run, files}.
 * Each phase runs in its own session, killed as a group at its timeout.
 */
export const DRIVER = String.raw`
import base64, json, os, signal, subprocess, sys, time
r = json.load(sys.stdin)
w = '/tmp/work'
os.makedirs(w)
os.chdir(w)
def put(p, data):
    d = os.path.dirname(p)
    if d: os.makedirs(d, exist_ok=True)
    with open(p, 'wb') as f: f.write(data)
for p, b in r['files'].items(): put(p, base64.b64decode(b))
put(r['file'], r['code'].encode())
cap = r['cap']
def phase(argv, timeout, stdin):
    t = time.monotonic()
    try:
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        return {'status': 'Error', 'execution_time': 0, 'return_code': None, 'stdout': '', 'stderr': str(e)}
    try:
        out, err = p.communicate(stdin, timeout=timeout)
        status = 'Finished'
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        status = 'TimeLimitExceeded'
    try: os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError: pass
    return {'status': status, 'execution_time': round(time.monotonic() - t, 6), 'return_code': p.returncode,
            'stdout': out[:cap].decode('utf-8', 'replace'), 'stderr': err[:cap].decode('utf-8', 'replace')}
res = {'compile': None, 'run': None, 'files': {}}
ok = True
if r['compile']:
    res['compile'] = phase(r['compile'], r['compile_timeout'], b'')
    ok = res['compile']['status'] == 'Finished' and res['compile']['return_code'] == 0
if ok:
    res['run'] = phase(r['run'], r['run_timeout'], (r['stdin'] or '').encode())
for p in r['fetch']:
    try:
        with open(p, 'rb') as f: res['files'][p] = base64.b64encode(f.read()).decode()
    except OSError: pass
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
  const input = {
    file: lang.file, code: req.code, compile: lang.compile, run: lang.run, compile_timeout: req.compile_timeout, run_timeout: req.run_timeout,
    stdin: req.stdin ?? '', files: req.files, fetch: req.fetch_files, cap: MAX_PHASE_OUTPUT_BYTES,
  };
  const sandboxError = (message: string): RunCodeResponse => ({ status: 'SandboxError', message, compile_result: null, run_result: null, executor_pod_name: null, files: {} });
  let r;
  try {
    r = await pools.run({
      image, argv: ['python3', '-c', DRIVER], stdin: Buffer.from(JSON.stringify(input)),
      // The phases have their own timeouts; this one only bounds the driver (writing files, packing results).
      timeoutMs: Math.ceil((lang.compile ? req.compile_timeout : 0) * 1000 + req.run_timeout * 1000) + 30_000,
      memoryBytes: req.memory_limit_MB * 1024 * 1024 + DRIVER_MEMORY_BYTES,
      tmpBytes: WORKDIR_TMPFS_BYTES,
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
  let res: { compile: PhaseResult | null; run: PhaseResult | null; files: Record<string, string> };
  try {
    res = JSON.parse(out);
  } catch {
    return sandboxError(`the run_code driver printed no result (${out.length} bytes of output)`);
  }
  const compileFailed = res.compile !== null && !(res.compile.status === 'Finished' && res.compile.return_code === 0);
  const runOk = res.run !== null && res.run.status === 'Finished' && res.run.return_code === 0;
  const message = compileFailed ? (res.compile!.status === 'TimeLimitExceeded' ? 'compilation timed out' : 'compilation failed')
    : !res.run ? 'not run'
      : res.run.status === 'TimeLimitExceeded' ? 'time limit exceeded'
        : res.run.return_code === -9 ? `killed by SIGKILL (the memory limit is ${req.memory_limit_MB} MiB)`
          : res.run.return_code !== 0 ? `exited with ${res.run.return_code}` : '';
  return {
    status: runOk && !compileFailed ? 'Success' : 'Failed', message,
    compile_result: res.compile, run_result: res.run, executor_pod_name: null, files: res.files,
  };
}
