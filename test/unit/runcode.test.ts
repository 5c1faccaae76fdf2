import { describe, expect, it } from 'vitest';
import pino from 'pino';
import { FncallPools, type FncallCall, type WorkerHost } from '../../daemon/fncall/pool.js';
import { RunCodeRequest, runCode } from '../../daemon/fncall/runcode.js';
import { notFound } from '../../daemon/errors.js';
import type { ExecResult } from '../../daemon/model/exec.js';
import type { SandboxRecord } from '../../daemon/model/sandbox.js';

/** Pools whose single worker answers every call with `answer(call)`. */
function pools(answer: (c: FncallCall) => Partial<ExecResult>, images = new Set(['judge:bookworm'])) {
  const calls: FncallCall[] = [];
  const host: WorkerHost = {
    resolveImage: async (ref) => {
      if (!images.has(ref)) throw notFound(`image ${ref} not found`);
      return { ref, key: ref };
    },
    alive: () => true,
    createWorker: async () => ({ id: 'w' }) as SandboxRecord,
    destroyWorker: async () => {},
    setMemoryLimit: async () => {},
    execIsolated: async (_sb, c) => {
      calls.push(c);
      return {
        exit_code: 0, signal: null, stdout_b64: '', stderr_b64: '', stdout_truncated: false, stderr_truncated: false, duration_ms: 1, oom: false, timed_out: false,
        ...answer(c),
      };
    },
  };
  const p = new FncallPools(host, { maxWorkers: 1, minIdle: 0, idleMs: 1000, callsPerWorker: 100, maxQueue: 10, memoryBytes: 1 << 28, cpus: 1, pids: 64 }, pino({ level: 'silent' }));
  return { p, calls };
}
const b64 = (o: unknown) => Buffer.from(JSON.stringify(o)).toString('base64');
const phase = (rc: number, status = 'Finished') => ({ status, execution_time: 0.01, return_code: rc, stdout_b64: Buffer.from('out').toString('base64'), stderr_b64: '' });

describe('run_code', () => {
  it('parses SandboxFusion requests with their defaults and ignores unknown fields', () => {
    const r = RunCodeRequest.parse({ code: 'x', language: 'python', extra_field: 1 });
    expect(r).toMatchObject({ compile_timeout: 10, run_timeout: 10, memory_limit_MB: 1024, files: {}, fetch_files: [] });
    expect(RunCodeRequest.safeParse({ code: 'x', language: 'c', files: { '/abs': 'eA==' } }).success).toBe(false);
    expect(RunCodeRequest.safeParse({ code: 'x', language: 'c', fetch_files: ['a/../../b'] }).success).toBe(false);
  });

  it('sends the driver the language recipe, limits and timeouts; maps results to SandboxFusion statuses', async () => {
    const { p, calls } = pools(() => ({ stdout_b64: b64({ compile: phase(0), run: phase(0), files: {}, notes: [] }) }));
    const r = await runCode(p, RunCodeRequest.parse({ code: 'int main(){}', language: 'c', run_timeout: 2, compile_timeout: 3, memory_limit_MB: 128 }));
    expect(r).toMatchObject({ status: 'Success', message: '', executor_pod_name: null, run_result: { stdout: 'out', stderr: '' } });
    const input = JSON.parse(calls[0].stdin!.toString());
    expect(input).toMatchObject({ file: 'main.c', run: ['./main'], compile_timeout: 3, run_timeout: 2 });
    expect(calls[0]).toMatchObject({ image: 'judge:bookworm', memoryBytes: (128 + 64) * 1024 * 1024, argv: ['python3', '-c', expect.any(String)], scratch: [{ path: '/tmp/io' }] });
    expect(input.uid).toBe(65534);
  });

  it('compile failure, time limit and non-zero exit are Failed; a broken driver is SandboxError', async () => {
    const cases: Array<[unknown, string, string]> = [
      [{ compile: phase(1), run: null, files: {}, notes: [] }, 'Failed', 'compilation failed'],
      [{ compile: null, run: phase(-9, 'TimeLimitExceeded'), files: {}, notes: [] }, 'Failed', 'time limit exceeded'],
      [{ compile: null, run: phase(2), files: {}, notes: [] }, 'Failed', 'exited with 2'],
    ];
    for (const [res, status, message] of cases) {
      const { p } = pools(() => ({ stdout_b64: b64(res) }));
      expect(await runCode(p, RunCodeRequest.parse({ code: 'x', language: 'python' }))).toMatchObject({ status, message });
    }
    const { p } = pools(() => ({ exit_code: null, signal: 'SIGKILL', oom: true }));
    expect(await runCode(p, RunCodeRequest.parse({ code: 'x', language: 'python' }))).toMatchObject({ status: 'SandboxError', message: expect.stringMatching(/ran out of memory/) });
  });

  it('refuses unknown languages and names the missing judge image', async () => {
    const { p } = pools(() => ({}), new Set());
    await expect(runCode(p, RunCodeRequest.parse({ code: 'x', language: 'cobol' }))).rejects.toMatchObject({ kind: 'InvalidArgument' });
    await expect(runCode(p, RunCodeRequest.parse({ code: 'x', language: 'bash' }))).rejects.toMatchObject({ kind: 'FailedPrecondition', message: expect.stringMatching(/dsec image bootstrap judge/) });
    const custom = pools(() => ({ stdout_b64: b64({ compile: null, run: phase(0), files: {}, notes: [] }) }), new Set(['py:3']));
    expect((await runCode(custom.p, RunCodeRequest.parse({ code: 'x', language: 'python' }), { python: 'py:3' })).status).toBe('Success');
  });
});
