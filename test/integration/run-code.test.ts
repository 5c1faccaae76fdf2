/**
 * The SandboxFusion-compatible POST /run_code on the judge image: python, bash, c and
 * cpp programs, a compile error, a time limit, stdin, files in and out, bad requests;
 * over the API socket and over the configured TCP address.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, TestDaemon, postJson } from './harness.js';
import { freePort } from '../fixtures/ports.js';

interface Phase { status: string; execution_time: number | null; return_code: number | null; stdout: string | null; stderr: string | null }
interface RunCodeResponse { status: string; message: string; compile_result: Phase | null; run_result: Phase | null; files: Record<string, string> }


describe.skipIf(!IS_ROOT)('run_code (SandboxFusion)', () => {
  let d: TestDaemon;
  let port: number;
  const runCode = (body: unknown) => postJson<RunCodeResponse>(d, '/run_code', body);

  beforeAll(async () => {
    port = await freePort();
    d = await TestDaemon.start({ slot: 28, config: `[sandboxfusion]\naddress = "127.0.0.1:${port}"\n` });
    // From the bootstrap caches (debian tree, toolkit tree) when earlier tests filled them.
    await d.client.bootstrapImage({ distro: 'debian', toolkit: 'judge' });
  }, 15 * 60_000);
  afterAll(async () => {
    await d?.cleanup();
  });

  it('runs python and bash with stdin; compile_result is null for them', async () => {
    const py = await runCode({ code: 'import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))', language: 'python', stdin: '1 2 3' });
    expect(py).toMatchObject({ status: 'Success', compile_result: null, run_result: { status: 'Finished', return_code: 0, stdout: '6\n', stderr: '' } });
    expect(py.run_result!.execution_time).toBeGreaterThan(0);
    const sh = await runCode({ code: 'read x; echo "got $x"; echo oops >&2; exit 3', language: 'bash', stdin: 'hi\n' });
    expect(sh).toMatchObject({ status: 'Failed', run_result: { status: 'Finished', return_code: 3, stdout: 'got hi\n', stderr: 'oops\n' } });
  });

  it('compiles and runs c and cpp', async () => {
    const c = await runCode({ code: '#include <stdio.h>\n#include <math.h>\nint main(){printf("%.2f\\n", sqrt(2.0));return 0;}', language: 'c' });
    expect(c).toMatchObject({ status: 'Success', compile_result: { status: 'Finished', return_code: 0 }, run_result: { status: 'Finished', return_code: 0, stdout: '1.41\n' } });
    const cpp = await runCode({ code: '#include <iostream>\n#include <vector>\n#include <numeric>\nint main(){std::vector<int> v{1,2,3};std::cout<<std::accumulate(v.begin(),v.end(),0)<<"\\n";}', language: 'cpp' });
    expect(cpp).toMatchObject({ status: 'Success', run_result: { stdout: '6\n', return_code: 0 } });
  });

  it('a compile error is a Failed compile_result and nothing runs', async () => {
    const r = await runCode({ code: 'int main( { return 0; }', language: 'c' });
    expect(r.status).toBe('Failed');
    expect(r.message).toBe('compilation failed');
    expect(r.compile_result!.status).toBe('Finished');
    expect(r.compile_result!.return_code).not.toBe(0);
    expect(r.compile_result!.stderr).toMatch(/error/);
    expect(r.run_result).toBeNull();
  });

  it('a time limit is TimeLimitExceeded and kills the program', async () => {
    const r = await runCode({ code: 'import time\nprint("start", flush=True)\ntime.sleep(30)', language: 'python', run_timeout: 0.5 });
    expect(r.status).toBe('Failed');
    expect(r.run_result!.status).toBe('TimeLimitExceeded');
    expect(r.run_result!.stdout).toBe('start\n');
    expect(r.run_result!.execution_time!).toBeLessThan(5);
  });

  it('writes files before the run and returns fetch_files', async () => {
    const r = await runCode({
      code: 'data = open("in/data.txt").read()\nopen("out.txt", "w").write(data.upper())\nprint(len(data))',
      language: 'python', files: { 'in/data.txt': Buffer.from('abc').toString('base64') }, fetch_files: ['out.txt', 'missing.txt'],
    });
    expect(r.status).toBe('Success');
    expect(r.run_result!.stdout).toBe('3\n');
    expect(Object.keys(r.files)).toEqual(['out.txt']);
    expect(Buffer.from(r.files['out.txt'], 'base64').toString()).toBe('ABC');
  });

  it('a memory limit kills a program that exceeds it', async () => {
    const r = await runCode({ code: 'x = bytearray(512 * 1024 * 1024)\nprint(len(x))', language: 'python', memory_limit_MB: 64 });
    expect(r.status).toBe('Failed');
    expect(r.run_result!.return_code).toBe(-9);
    expect(r.message).toMatch(/at the memory limit of 64 MiB/);
    // The pool stays healthy.
    expect((await runCode({ code: 'print(1)', language: 'python' })).status).toBe('Success');
  });

  it('a program cannot forge the result through the driver, and what it leaves behind dies with its phase', async () => {
    const forge = [
      'import os',
      'try:',
      '    open("/proc/%d/fd/1" % os.getppid(), "w").write("{}" + " " * 100)',
      '    print("forged")',
      'except OSError as e:',
      '    print("denied", e.errno)',
      'import sys; sys.exit(1)',
    ].join('\n');
    const r = await runCode({ code: forge, language: 'python' });
    // The driver runs as another user: the program may not ptrace-read it, so the call's
    // /proc (hidepid=invisible) does not list it (ENOENT); where it is listed, EACCES.
    expect(r).toMatchObject({ status: 'Failed', run_result: { return_code: 1 } });
    expect(r.run_result!.stdout).toMatch(/^denied (2|13)\n$/);
    const t0 = Date.now();
    const daemon = await runCode({ code: '(setsid sleep 100 &) ; echo hi', language: 'bash', run_timeout: 1 });
    expect(daemon).toMatchObject({ status: 'Success', run_result: { status: 'Finished', return_code: 0, stdout: 'hi\n' } });
    expect(Date.now() - t0).toBeLessThan(10_000);
    const flood = await runCode({ code: 'import sys\nwhile True: sys.stdout.write("x" * 65536)', language: 'python', run_timeout: 2 });
    expect(flood.status).toBe('Failed');
    expect(flood.message).toMatch(/run stdout truncated to 524288 bytes/);
    expect(flood.run_result!.stdout!.length).toBe(524288);
  });

  it('kernel keyrings are out of reach, so no key can carry data to the next call', async () => {
    const code = [
      'import ctypes, os',
      'libc = ctypes.CDLL(None, use_errno=True)',
      'r = libc.syscall(248, b"user", b"carry", b"secret", 6, -3)  # add_key into the session keyring',
      'print(r, ctypes.get_errno())',
    ].join('\n');
    const r = await runCode({ code, language: 'python' });
    expect(r.run_result!.stdout).toBe('-1 1\n'); // EPERM from the seccomp profile
  });

  it('accepts SandboxFusion defaults: memory_limit_MB -1 and null files', async () => {
    const r = await runCode({ code: 'print(open("a").read())', language: 'python', memory_limit_MB: -1, files: { a: Buffer.from('A').toString('base64'), b: null } });
    expect(r).toMatchObject({ status: 'Success', run_result: { stdout: 'A\n' } });
  });

  it('refuses bad requests clearly', async () => {
    for (const [body, re] of [
      [{ code: 'x', language: 'cobol' }, /unknown language "cobol"; dsec runs python, bash, c, cpp/],
      [{ code: 'x', language: 'python', run_timeout: 0 }, /run_timeout/],
      [{ code: 'x', language: 'python', run_timeout: 86400 }, /run_timeout/],
      [{ code: 'x', language: 'python', files: { '../etc/passwd': 'eA==' } }, /relative/],
      [{ language: 'python' }, /code/],
      [{ code: 'x', language: 'python', files: { d: 'eA==', 'd/x': 'eA==' } }, /"d" is a file/],
      [{ code: 'x', language: 'python', stdin: 'x'.repeat(17 * 1024 * 1024) }, /stdin/],
    ] as const) {
      await expect(runCode(body)).rejects.toMatchObject({ code: 'InvalidArgument', message: expect.stringMatching(re) });
    }
  });

  it('answers over the configured TCP address too', async () => {
    const res = await fetch(`http://127.0.0.1:${port}/run_code`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ code: 'echo tcp', language: 'bash' }) });
    expect(res.status).toBe(200);
    expect(((await res.json()) as RunCodeResponse).run_result!.stdout).toBe('tcp\n');
    // Only run_code is served over TCP.
    expect((await fetch(`http://127.0.0.1:${port}/v1/sandboxes`)).status).toBe(404);
  });
});
