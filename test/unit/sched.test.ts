/**
 * Host scheduling detection (daemon/host/sched.ts): the core-scheduling and SCHED_IDLE
 * probes through the native addon, and how their results are reported.
 *
 * The probe tests run against this kernel. Which answer is right is read from the
 * kernel's own build config (/proc/config.gz) when it has one, so the assertions cannot
 * pass for the wrong reason: on this development host CONFIG_SCHED_CORE is not set and
 * the probe must fail with EINVAL; on a kernel with it the probe must succeed or fail
 * with ENODEV (no SMT).
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { gunzipSync } from 'node:zlib';
import { beforeAll, describe, expect, it } from 'vitest';
import * as native from '../../daemon/host/native.js';
import {
  describeErrno, detectCoreScheduling, detectSchedIdle, parseStatPolicy, readSchedPolicy, SCHED_POLICY,
} from '../../daemon/host/sched.js';

/** CONFIG_SCHED_CORE of the running kernel: true / false, or null when its config is not readable. */
function kernelHasSchedCore(): boolean | null {
  try {
    const cfg = gunzipSync(readFileSync('/proc/config.gz')).toString();
    if (/^CONFIG_SCHED_CORE=y$/m.test(cfg)) return true;
    if (/^# CONFIG_SCHED_CORE is not set$/m.test(cfg)) return false;
    return false; // absent: an older kernel (< 5.14) without the option at all
  } catch {
    return null;
  }
}

/** Policies of every thread of this process. */
function threadPolicies(): number[] {
  return readdirSync('/proc/self/task').map((t) => readSchedPolicy(Number(t))).filter((p): p is number => p !== null);
}

const EINVAL = 22;
const ENODEV = 19;

describe('core scheduling detection', () => {
  beforeAll(() => {
    // A no-op when the addon is up to date with dsec_native.c.
    const addon = path.join(native.repoRoot(), native.ADDON_RELATIVE_PATH);
    execFileSync('make', ['-s', '-C', path.join(native.repoRoot(), 'native/addon')], { stdio: 'inherit' });
    expect(existsSync(addon)).toBe(true);
  });

  it('reports exactly what the probe returned: available iff prctl(PR_SCHED_CORE_GET) returned 0, the errno in the reason otherwise', () => {
    const rc = native.schedCoreProbe();
    expect(Number.isInteger(rc) && rc >= 0).toBe(true);
    const d = detectCoreScheduling();
    expect(d.available).toBe(rc === 0);
    if (rc !== 0) expect(d.reason).toContain(describeErrno(rc));
  });

  it.skipIf(kernelHasSchedCore() !== false)('on a kernel built without CONFIG_SCHED_CORE (this host): unavailable, EINVAL in the reason', () => {
    const rc = native.schedCoreProbe();
    expect(rc).toBe(EINVAL);
    const d = detectCoreScheduling();
    expect(d.available).toBe(false);
    expect(d.reason).toContain('EINVAL (errno 22)');
    expect(d.reason).toContain('CONFIG_SCHED_CORE');
  });

  it.skipIf(kernelHasSchedCore() !== true)('on a kernel with CONFIG_SCHED_CORE: available, or ENODEV without SMT', () => {
    const rc = native.schedCoreProbe();
    expect([0, ENODEV]).toContain(rc);
    expect(detectCoreScheduling().available).toBe(rc === 0);
  });

  it('interprets each probe result', () => {
    expect(detectCoreScheduling(() => 0)).toEqual({ available: true, reason: expect.stringContaining('succeeded') });
    expect(detectCoreScheduling(() => EINVAL)).toEqual({ available: false, reason: expect.stringMatching(/EINVAL \(errno 22\).*without CONFIG_SCHED_CORE/) });
    expect(detectCoreScheduling(() => ENODEV)).toEqual({ available: false, reason: expect.stringMatching(/ENODEV \(errno 19\).*no SMT/) });
    expect(detectCoreScheduling(() => 1)).toEqual({ available: false, reason: expect.stringContaining('EPERM (errno 1)') });
    expect(detectCoreScheduling(() => { throw new Error('native addon not built'); }))
      .toEqual({ available: false, reason: expect.stringContaining('native addon not built') });
  });
});

describe('SCHED_IDLE detection', () => {
  it('is available on this kernel, and probing leaves every thread of the caller in its policy', () => {
    const before = threadPolicies();
    expect(native.schedIdleProbe()).toBe(0);
    const d = detectSchedIdle();
    expect(d).toEqual({ available: true, reason: expect.stringContaining('SCHED_IDLE') });
    expect(threadPolicies()).not.toContain(SCHED_POLICY.IDLE);
    expect(readSchedPolicy(process.pid)).toBe(before[0]);
  });

  it('reports a failing probe with its errno, and falls back to chrt when the addon is missing', () => {
    expect(detectSchedIdle(() => 1)).toEqual({ available: false, reason: expect.stringContaining('EPERM (errno 1)') });
    const fallback = detectSchedIdle(() => { throw new Error('not built'); });
    expect(fallback.reason).toContain('chrt --idle 0 true');
    expect(fallback.available).toBe(existsSync('/usr/bin/chrt') || existsSync('/bin/chrt'));
  });
});

describe('policy of a process from /proc/PID/stat', () => {
  it('reads field 41, counting after the last ")" of comm', () => {
    const fields = (policy: number) => ['S', ...Array.from({ length: 37 }, (_, i) => String(i + 4)), String(policy), '0', '0'].join(' ');
    expect(parseStatPolicy(`123 (a) b) c) ${fields(5)}`)).toBe(5);
    expect(parseStatPolicy(`1 (init) ${fields(0)}`)).toBe(0);
    expect(parseStatPolicy('1 (short) S 0')).toBeNull();
    expect(readSchedPolicy(process.pid)).toBe(threadPolicies()[0]);
    expect(readSchedPolicy(2 ** 30)).toBeNull();
  });
});
