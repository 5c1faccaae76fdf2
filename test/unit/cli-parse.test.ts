import { describe, expect, it } from 'vitest';
import { UserError } from '../../cli/util/errors.js';
import { exitCodeOf, parseGrace, parseTimeout } from '../../cli/util/exec.js';
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
import { parseSelector as daemonParseSelector } from '../../daemon/model/selector.js';

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
  it('refuses a bare number (once milliseconds) with the flag name and both readings as hint; 0 needs no unit', () => {
    const e = catchErr(() => parseDuration('10', '--timeout'));
    expect(e).toBeInstanceOf(UserError);
    expect(e.message).toBe('--timeout "10" has no unit');
    expect(e.hint).toBe('write 10s or 10ms');
    expect(catchErr(() => parseDuration('250')).message).toBe('duration "250" has no unit');
    expect(catchErr(() => parseDuration('1.5')).hint).toBe('write 1.5s or 1.5ms');
    expect(parseDuration('0')).toBe(0);
    expect(parseDuration('0', '--time')).toBe(0);
  });
  it('flag() does not repeat a flag name the message already starts with', () => {
    const e = catchErr(() => flag<number, unknown>('--timeout', (t: string) => parseTimeout(t))('10', undefined));
    expect(e.message).toBe('--timeout "10" has no unit');
    expect(e.hint).toBe('write 10s or 10ms');
    // Nor one it names further on.
    expect(catchErr(() => flag<number, unknown>('--ttl', (t: string) => parseDuration(t, '--ttl'))('5x', undefined)).message).toBe('invalid --ttl "5x"');
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
  it('parseTimeout bounds it to 1ms..24h and wants a unit', () => {
    expect(parseTimeout('2s')).toBe(2000);
    expect(parseTimeout('500ms')).toBe(500);
    expect(() => parseTimeout('0')).toThrow(UserError);
    expect(() => parseTimeout('25h')).toThrow(UserError);
    expect(catchErr(() => parseTimeout('10')).message).toBe('--timeout "10" has no unit');
  });
  it('parseGrace (stop -t) takes 0..24h', () => {
    expect(parseGrace('0')).toBe(0);
    expect(parseGrace('0s')).toBe(0);
    expect(parseGrace('30s')).toBe(30_000);
    expect(() => parseGrace('25h')).toThrow(UserError);
    expect(catchErr(() => parseGrace('5')).message).toBe('--time "5" has no unit');
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
  it('repeatable --label accumulates, never changing a record it did not make', () => {
    const first = collectLabel('job=a', undefined);
    const second = collectLabel('round=3', first);
    expect(second).toEqual({ job: 'a', round: '3' });
    const given = Object.freeze({ team: 'x' });
    expect(collectLabel('job=a', given)).toEqual({ team: 'x', job: 'a' });
    expect(given).toEqual({ team: 'x' });
  });
  it('10,000 --env or --label cost one record, not a copy per flag (linear, not quadratic)', () => {
    // Copying the record on each flag made n flags O(n²): 10,000 --env took 13.8 s of
    // CPU. The structure shows it without a clock: every call after the first must
    // return the very record the first one made.
    for (const [collect, name, make] of [[collectEnv, '--env', (i: number) => `V${i}=x${i}`], [collectLabel, '--label', (i: number) => `k${i}=v${i}`]] as const) {
      const f = flag(name, collect);
      const first = f(make(0), undefined);
      let acc = first;
      for (let i = 1; i < 10_000; i++) {
        const next = f(make(i), acc);
        if (next !== acc) expect.fail(`${name} #${i} returned a copy of the record`);
        acc = next;
      }
      expect(Object.keys(acc).length).toBe(10_000);
      expect(Object.entries(acc).every(([k, v], i) => k === make(i).split('=')[0] && v === make(i).split('=')[1])).toBe(true);
      expect(() => f(make(1234), acc)).toThrow(/given twice/);
    }
  });
  it('an env name __proto__ is an ordinary key', () => {
    const e = collectEnv('B=2', collectEnv('__proto__=1', undefined));
    expect(Object.getPrototypeOf(e)).toBe(Object.prototype);
    expect(Object.keys(e)).toEqual(['__proto__', 'B']);
    expect(JSON.parse(JSON.stringify(e))).toEqual(e);
  });
  it('a label key or env name given twice is a UserError naming it', () => {
    const l = catchErr(() => collectLabel('a=c', collectLabel('a=b', undefined)));
    expect(l).toBeInstanceOf(UserError);
    expect(l.message).toBe('label a given twice (a=b and a=c)');
    expect(() => collectLabel('a=b', { a: 'b' })).toThrow(/label a given twice/);
    const e = catchErr(() => collectEnv('A=2', collectEnv('A=1', undefined)));
    expect(e).toBeInstanceOf(UserError);
    expect(e.message).toBe('env A given twice');
    expect(catchErr(() => flag('--label', collectLabel)('a=c', { a: 'b' })).message).toBe('--label: label a given twice (a=b and a=c)');
  });
  it('parses env K=V, keeping = in the value', () => {
    expect(parseEnv('A=1')).toEqual(['A', '1']);
    expect(parseEnv('URL=http://x?a=b')).toEqual(['URL', 'http://x?a=b']);
    expect(parseEnv('EMPTY=')).toEqual(['EMPTY', '']);
    expect(collectEnv('B=2', collectEnv('A=1', undefined))).toEqual({ A: '1', B: '2' });
    for (const bad of ['A', '1A=x', 'A-B=x', '=x']) expect(() => parseEnv(bad), bad).toThrow(UserError);
  });
  it('accepts what dsecd accepts: k=v, k (has key), k!=v, spaces and empty terms', () => {
    for (const ok of ['job=a,round=3', 'job', 'job!=a', 'job=a,team,round!=3', 'example.com/team=rl', ' job=a , round ', 'job=a,', 'job=', 'job!=', 'job=a=b', 'job=a b']) {
      expect(parseSelector(ok), ok).toBe(ok);
    }
  });
  it('agrees with dsecd\'s own parser on every non-empty selector', () => {
    const samples = [
      'job=a', 'job', 'job!=a', 'a,b=c,d!=e', ' job=a , round ', 'job=a,', 'job=a=b', 'job!=a!=b', 'job=a b', 'x.y/z-1=v',
      '=a', '!=a', 'job = a', 'job!', '-x', '.x', 'a b', 'a,=b', `${'k'.repeat(63)}=v`, `${'k'.repeat(64)}=v`, 'ü=1', 'a=ü',
    ];
    for (const sel of samples) {
      const daemonOk = ok(() => daemonParseSelector(sel));
      expect(ok(() => parseSelector(sel)), sel).toBe(daemonOk);
    }
  });
  it('refuses what dsecd refuses, with a hint giving the syntax', () => {
    for (const bad of ['=a', 'job=a,=b', '!=a', '-x=1', 'a b=c', 'job!', '.x']) {
      const e = catchErr(() => parseSelector(bad));
      expect(e, bad).toBeInstanceOf(UserError);
      expect(e.hint, bad).toMatch(/key=value, key!=value or key/);
    }
    expect(catchErr(() => parseSelector('=a')).message).toBe('selector term "=a" has an empty key');
  });
  it('refuses an empty selector (dsecd would match everything)', () => {
    for (const bad of ['', ' ', ',', ' , ']) expect(() => parseSelector(bad), JSON.stringify(bad)).toThrow(/empty selector/);
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
    const e = catchErr(() => flag<number, unknown>('--memory', parseSize)('lots', undefined));
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

function ok(fn: () => unknown): boolean {
  try {
    fn();
    return true;
  } catch {
    return false;
  }
}

function catchErr(fn: () => unknown): UserError {
  try {
    fn();
  } catch (e) {
    return e as UserError;
  }
  throw new Error('expected a throw');
}
