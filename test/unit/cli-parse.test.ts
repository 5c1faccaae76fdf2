import { describe, expect, it } from 'vitest';
import { UserError } from '../../cli/util/errors.js';
import { exitCodeOf, parseTimeout } from '../../cli/util/exec.js';
import { formatAge, formatBytes, formatDuration, formatLabels } from '../../cli/util/output.js';
import {
  collectEnv,
  collectLabel,
  flag,
  parseCpus,
  parseDuration,
  parseEnv,
  parseLabel,
  parsePositiveInt,
  parseSelector,
  parseSize,
} from '../../cli/util/parse.js';

describe('parseSize', () => {
  it('takes plain bytes', () => {
    expect(parseSize('0')).toBe(0);
    expect(parseSize('4096')).toBe(4096);
    expect(parseSize('100B')).toBe(100);
  });
  it('reads K/M/G/T as binary, in any case, with or without i/iB', () => {
    expect(parseSize('1K')).toBe(1024);
    expect(parseSize('512M')).toBe(512 * 1024 ** 2);
    expect(parseSize('512m')).toBe(512 * 1024 ** 2);
    expect(parseSize('2G')).toBe(2 * 1024 ** 3);
    expect(parseSize('2GiB')).toBe(2 * 1024 ** 3);
    expect(parseSize('64MiB')).toBe(64 * 1024 ** 2);
    expect(parseSize('1Ti')).toBe(1024 ** 4);
    expect(parseSize('1.5G')).toBe(1.5 * 1024 ** 3);
  });
  it('refuses garbage, unknown units, ambiguous KB/MB and fractional bytes with a UserError and hint', () => {
    for (const bad of ['', 'lots', '-1', '1X', '12 parsecs', '1.5', '0.3K', 'M']) {
      expect(() => parseSize(bad), bad).toThrow(UserError);
    }
    const e = catchErr(() => parseSize('5MB'));
    expect(e.message).toMatch(/ambiguous/);
    expect(e.hint).toMatch(/5M or 5MiB/);
  });
});

describe('parseDuration', () => {
  it('takes a plain integer as milliseconds', () => {
    expect(parseDuration('250')).toBe(250);
    expect(parseDuration('0')).toBe(0);
  });
  it('takes ms, s, m, h, d and combinations', () => {
    expect(parseDuration('500ms')).toBe(500);
    expect(parseDuration('2s')).toBe(2000);
    expect(parseDuration('1m')).toBe(60_000);
    expect(parseDuration('1h')).toBe(3_600_000);
    expect(parseDuration('1d')).toBe(86_400_000);
    expect(parseDuration('1m30s')).toBe(90_000);
    expect(parseDuration('1.5s')).toBe(1500);
  });
  it('refuses garbage with a UserError and hint', () => {
    for (const bad of ['', 'soon', '5x', '-2s', '2 s', 's', '1m30']) {
      const e = catchErr(() => parseDuration(bad));
      expect(e, bad).toBeInstanceOf(UserError);
      expect(e.hint).toMatch(/durations/);
    }
  });
  it('parseTimeout bounds it to 1ms..24h', () => {
    expect(parseTimeout('2s')).toBe(2000);
    expect(() => parseTimeout('0')).toThrow(UserError);
    expect(() => parseTimeout('25h')).toThrow(UserError);
  });
});

describe('labels, env, selectors', () => {
  it('parses k=v, allowing an empty value', () => {
    expect(parseLabel('job=a')).toEqual(['job', 'a']);
    expect(parseLabel('round=')).toEqual(['round', '']);
    expect(parseLabel('example.com/team=rl')).toEqual(['example.com/team', 'rl']);
  });
  it('refuses labels the API would refuse', () => {
    for (const bad of ['job', '=a', 'job=a,b', 'job=a=b', '-x=1', 'a b=c']) {
      expect(() => parseLabel(bad), bad).toThrow(UserError);
    }
  });
  it('repeatable --label accumulates, later keys winning, without mutating the previous value', () => {
    const first = collectLabel('job=a', undefined);
    const second = collectLabel('round=3', first);
    expect(collectLabel('job=b', second)).toEqual({ job: 'b', round: '3' });
    expect(first).toEqual({ job: 'a' });
  });
  it('parses env K=V, keeping = in the value', () => {
    expect(parseEnv('A=1')).toEqual(['A', '1']);
    expect(parseEnv('URL=http://x?a=b')).toEqual(['URL', 'http://x?a=b']);
    expect(parseEnv('EMPTY=')).toEqual(['EMPTY', '']);
    expect(collectEnv('B=2', collectEnv('A=1', undefined))).toEqual({ A: '1', B: '2' });
    for (const bad of ['A', '1A=x', 'A-B=x', '=x']) expect(() => parseEnv(bad), bad).toThrow(UserError);
  });
  it('validates selectors', () => {
    expect(parseSelector('job=a,round=3')).toBe('job=a,round=3');
    expect(() => parseSelector('job')).toThrow(UserError);
    expect(() => parseSelector('')).toThrow(UserError);
  });
});

describe('numbers', () => {
  it('cpus are positive numbers, fractions allowed', () => {
    expect(parseCpus('0.5')).toBe(0.5);
    expect(parseCpus('2')).toBe(2);
    for (const bad of ['0', '-1', 'two', '1e3', '']) expect(() => parseCpus(bad), bad).toThrow(UserError);
  });
  it('counts are positive integers', () => {
    expect(parsePositiveInt('64')).toBe(64);
    for (const bad of ['0', '1.5', '-3', 'x']) expect(() => parsePositiveInt(bad), bad).toThrow(UserError);
  });
  it('flag() prefixes the flag name and keeps the hint', () => {
    const e = catchErr(() => flag('--memory', parseSize)('lots', undefined));
    expect(e).toBeInstanceOf(UserError);
    expect(e.message).toBe('--memory: invalid size "lots"');
    expect(e.hint).toMatch(/512M/);
  });
});

describe('formats', () => {
  it('bytes in binary units', () => {
    expect(formatBytes(100)).toBe('100B');
    expect(formatBytes(512 * 1024 ** 2)).toBe('512MiB');
    expect(formatBytes(1.5 * 1024 ** 3)).toBe('1.5GiB');
    expect(formatBytes(24 * 1024 ** 3)).toBe('24GiB');
  });
  it('ages and durations', () => {
    expect(formatAge(5_000)).toBe('5s');
    expect(formatAge(3 * 60_000 + 5)).toBe('3m');
    expect(formatAge(2 * 3_600_000)).toBe('2h');
    expect(formatAge(3 * 86_400_000)).toBe('3d');
    expect(formatAge(-10)).toBe('0s');
    expect(formatDuration(500)).toBe('500ms');
    expect(formatDuration(90_000)).toBe('1m30s');
    expect(parseDuration(formatDuration(3_723_004))).toBe(3_723_004);
  });
  it('labels sorted, - when empty', () => {
    expect(formatLabels({ round: '3', job: 'a' })).toBe('job=a,round=3');
    expect(formatLabels({})).toBe('-');
  });
});

describe('exit code of an exec', () => {
  const r = { exit_code: null as number | null, signal: null as string | null, timed_out: false };
  it('passes exit codes through, 128+N for signals, 124 for timeouts', () => {
    expect(exitCodeOf({ ...r, exit_code: 3 })).toBe(3);
    expect(exitCodeOf({ ...r, exit_code: 127 })).toBe(127);
    expect(exitCodeOf({ ...r, signal: 'SIGKILL' })).toBe(137);
    expect(exitCodeOf({ ...r, signal: 'SIGTERM' })).toBe(143);
    expect(exitCodeOf({ ...r, signal: 'SIGKILL', timed_out: true })).toBe(124);
    expect(exitCodeOf({ ...r, signal: 'SIGNOPE' })).toBe(125);
  });
});

function catchErr(fn: () => unknown): UserError {
  try {
    fn();
  } catch (e) {
    return e as UserError;
  }
  throw new Error('expected a throw');
}
