/**
 * Parsers for flag values. Each throws {@link UserError} naming the bad value and
 * the accepted forms, so a typo never reaches the daemon as a confusing 400.
 *
 * - SIZE: bytes, or a number with K, M, G, T (or KiB, MiB, GiB, TiB); always binary
 *   (K = 1024). Decimal `KB`/`MB` are refused as ambiguous.
 * - DUR: `500ms`, `2s`, `1m`, `1h`, `1d`, or combinations such as `1m30s`. A unit is
 *   required: a bare number (`10`) is refused as ambiguous (it once meant ms), except `0`.
 * - `k=v` pairs for `--label` and `--env`, repeatable; a key given twice is refused.
 * - Label selectors as dsecd parses them (parseSelector in daemon/model/selector.ts).
 */
import { UserError } from './errors.js';

/** Multipliers of the binary size suffixes (case-insensitive; `i`/`iB` optional). */
const SIZE_UNITS: Record<string, number> = { '': 1, b: 1, k: 1024, m: 1024 ** 2, g: 1024 ** 3, t: 1024 ** 4 };

const SIZE_HINT = 'sizes are bytes or a number with K, M, G (KiB, MiB, GiB), e.g. 512M or 2GiB';
const DUR_HINT = 'durations are a number with a unit, ms, s, m, h or d, e.g. 500ms, 2s, 1m30s';

/** Parses SIZE into bytes (a non-negative integer). `512M` → 536870912. */
export function parseSize(text: string): number {
  const s = text.trim();
  const m = /^(\d+(?:\.\d+)?)\s*([a-zA-Z]*)$/.exec(s);
  if (!m) throw new UserError(`invalid size ${JSON.stringify(text)}`, SIZE_HINT);
  const unit = m[2].toLowerCase();
  let key: string;
  if (unit === '' || unit === 'b') key = unit;
  else if (/^[kmgt](i|ib)?$/.test(unit)) key = unit[0];
  else if (/^[kmgt]b$/.test(unit)) throw new UserError(`ambiguous size unit in ${JSON.stringify(text)}`, `dsec sizes are binary: write ${m[1]}${unit[0].toUpperCase()} or ${m[1]}${unit[0].toUpperCase()}iB`);
  else throw new UserError(`invalid size unit ${JSON.stringify(m[2])} in ${JSON.stringify(text)}`, SIZE_HINT);
  const bytes = Number(m[1]) * SIZE_UNITS[key];
  if (!Number.isSafeInteger(bytes)) throw new UserError(`size ${JSON.stringify(text)} is not a whole number of bytes`, SIZE_HINT);
  return bytes;
}

/** Milliseconds per duration unit. */
const DUR_UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/**
 * Parses DUR into milliseconds (a non-negative integer, rounded). `1m30s` → 90000.
 * `name` (e.g. `--timeout`) names the value in errors. A bare number other than `0` is
 * refused: `--timeout 10` meant 10 ms once and 10 s to most readers.
 */
export function parseDuration(text: string, name = 'duration'): number {
  const s = text.trim();
  if (/^\d+(\.\d+)?$/.test(s)) {
    if (Number(s) === 0) return 0;
    throw new UserError(`${name} ${JSON.stringify(text)} has no unit`, `write ${s}s or ${s}ms`);
  }
  if (!/^(\d+(\.\d+)?(ms|s|m|h|d))+$/.test(s)) throw new UserError(`invalid ${name} ${JSON.stringify(text)}`, DUR_HINT);
  let ms = 0;
  for (const part of s.matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h|d)/g)) ms += Number(part[1]) * DUR_UNITS[part[2]];
  const out = Math.round(ms);
  if (!Number.isSafeInteger(out)) throw new UserError(`${name} ${JSON.stringify(text)} is too long`, DUR_HINT);
  return out;
}

/** Longest TTL-like value the API accepts (LIMITS.maxTtlS): 30 days, in seconds. */
export const MAX_TTL_S = 30 * 24 * 3600;

/**
 * Parses a DUR that dsecd takes in whole seconds (`ttl_s`, `idle_timeout_s`, a lease's
 * `ttl_s`): at least 1s, at most 30 days, rounded up to whole seconds; returns seconds.
 * `name` (e.g. `--idle-timeout`) names the value in errors.
 */
export function parseWholeSeconds(text: string, name: string): number {
  const ms = parseDuration(text, name);
  if (ms < 1000) throw new UserError(`${name} must be at least 1s, got ${JSON.stringify(text)}`, name.startsWith('-') ? `e.g. ${name} 10m` : 'e.g. 10m');
  if (ms > MAX_TTL_S * 1000) throw new UserError(`${name} ${JSON.stringify(text)} is longer than 30 days`);
  return Math.ceil(ms / 1000);
}

/** Label keys, as the API accepts them (daemon/api/schema.ts). */
const LABEL_KEY = /^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$/;
/** Label values, as the API accepts them. */
const LABEL_VALUE = /^[A-Za-z0-9._/-]{0,63}$/;
/** Environment variable names, as the API accepts them. */
const ENV_KEY = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Parses one `--label k=v` into its key and value; the value may be empty. */
export function parseLabel(text: string): [string, string] {
  const eq = text.indexOf('=');
  if (eq < 0) throw new UserError(`invalid label ${JSON.stringify(text)}: expected key=value`, 'write --label key=value, e.g. --label job=a');
  const k = text.slice(0, eq);
  const v = text.slice(eq + 1);
  if (!LABEL_KEY.test(k)) throw new UserError(`invalid label key ${JSON.stringify(k)}`, 'label keys are 1-63 of [A-Za-z0-9._/-], starting with a letter or digit');
  if (!LABEL_VALUE.test(v)) throw new UserError(`invalid label value ${JSON.stringify(v)} for ${k}`, 'label values are 0-63 of [A-Za-z0-9._/-] (no , or =)');
  return [k, v];
}

/** Parses one `--env K=V`; the value may be empty or contain `=`, not NUL. */
export function parseEnv(text: string): [string, string] {
  const eq = text.indexOf('=');
  if (eq < 0) throw new UserError(`invalid env ${JSON.stringify(text)}: expected NAME=value`, 'write --env NAME=value, e.g. --env PATH=/bin');
  const k = text.slice(0, eq);
  const v = text.slice(eq + 1);
  if (!ENV_KEY.test(k)) throw new UserError(`invalid env name ${JSON.stringify(k)}`, 'env names match [A-Za-z_][A-Za-z0-9_]*');
  if (v.includes('\0')) throw new UserError(`env value of ${k} contains NUL`);
  return [k, v];
}

/** Records made by {@link addPair}: the collectors may add to these in place. */
const ownRecords = new WeakSet<object>();

/**
 * `prev` with `k: v` added, for repeatable-flag collectors. Commander hands a collector
 * its own previous return value, so the record it made on the first call is extended in
 * place: O(1) per flag, where copying it each time made n flags cost O(n²) (10,000
 * `--env` took 13.8 s of CPU). A record the collector did not make (a default, a
 * caller's) is copied once and never changed. The pair is defined as an own property, so
 * a name like `__proto__` is a key like any other (as it was in an object literal).
 */
function addPair(prev: Record<string, string> | undefined, k: string, v: string): Record<string, string> {
  let out = prev;
  if (!out || !ownRecords.has(out)) {
    out = { ...prev };
    ownRecords.add(out);
  }
  Object.defineProperty(out, k, { value: v, enumerable: true, writable: true, configurable: true });
  return out;
}

/**
 * Commander collector for repeatable `--label`: returns the record with the pair added
 * (see {@link addPair}: linear in the number of flags). A key given twice is refused
 * (even with the same value): which one wins is a guess.
 */
export function collectLabel(text: string, prev: Record<string, string> | undefined): Record<string, string> {
  const [k, v] = parseLabel(text);
  if (prev && Object.prototype.hasOwnProperty.call(prev, k)) {
    throw new UserError(`label ${k} given twice (${k}=${prev[k]} and ${text})`, `give each label key once, e.g. --label ${k}=${v}`);
  }
  return addPair(prev, k, v);
}

/**
 * Commander collector for repeatable `--env`: returns the record with the pair added
 * (see {@link addPair}: linear in the number of flags); a name given twice is refused.
 */
export function collectEnv(text: string, prev: Record<string, string> | undefined): Record<string, string> {
  const [k, v] = parseEnv(text);
  if (prev && Object.prototype.hasOwnProperty.call(prev, k)) {
    throw new UserError(`env ${k} given twice`, `give each variable once, e.g. --env ${k}=...`);
  }
  return addPair(prev, k, v);
}

const SELECTOR_HINT = 'a selector is comma-separated terms: key=value, key!=value or key (has the key), e.g. job=a,round!=3,team';

/**
 * Validates a label selector and returns it unchanged. The syntax is dsecd's
 * (parseSelector in daemon/model/selector.ts), checked here so a typo fails before any
 * request: comma-separated terms, each trimmed, empty terms skipped; a term is `k!=v`
 * (label k is not v, or absent), `k=v` (label k is v) or `k` (has label k), and every
 * key is a label key. Values are not checked (dsecd does not either; a value no label can
 * have simply matches nothing). A selector with no terms at all is refused here (dsecd
 * would match everything), since it is almost always an empty variable.
 */
export function parseSelector(text: string): string {
  const terms = text.split(',').map((t) => t.trim()).filter(Boolean);
  if (terms.length === 0) throw new UserError('empty selector', SELECTOR_HINT);
  for (const t of terms) {
    const ne = t.indexOf('!=');
    const eq = t.indexOf('=');
    const key = ne > 0 ? t.slice(0, ne) : eq < 0 ? t : t.slice(0, eq);
    if (eq === 0) throw new UserError(`selector term ${JSON.stringify(t)} has an empty key`, SELECTOR_HINT);
    if (!LABEL_KEY.test(key)) throw new UserError(`invalid key ${JSON.stringify(key)} in selector term ${JSON.stringify(t)}`, SELECTOR_HINT);
  }
  return text;
}

/** Parses a CPU amount in cores: a positive number, fractions allowed (`0.5`). */
export function parseCpus(text: string): number {
  const s = text.trim();
  const n = /^\d+(\.\d+)?$|^\.\d+$/.test(s) ? Number(s) : NaN;
  if (!(n > 0)) throw new UserError(`invalid CPU amount ${JSON.stringify(text)}`, 'write a positive number of cores, e.g. --cpus 0.5 or --cpus 2');
  return n;
}

/** Parses a positive integer (e.g. `--pids`). */
export function parsePositiveInt(text: string): number {
  const s = text.trim();
  const n = /^\d+$/.test(s) ? Number(s) : NaN;
  if (!Number.isSafeInteger(n) || n <= 0) throw new UserError(`invalid count ${JSON.stringify(text)}`, 'write a positive whole number');
  return n;
}

/**
 * Wraps a parser for use as a commander option parser, prefixing errors with the flag,
 * e.g. `--memory: invalid size "lots"` (unless the message already names it: `invalid
 * --ttl "5x"`, `--timeout "10" has no unit`).
 */
export function flag<T, P = T>(name: string, parse: (text: string, prev: P) => T): (text: string, prev: P) => T {
  return (text, prev) => {
    try {
      return parse(text, prev);
    } catch (e) {
      if (e instanceof UserError) throw e.message.startsWith(name) || e.message.split(/\s+/).includes(name) ? e : new UserError(`${name}: ${e.message}`, e.hint);
      throw e;
    }
  };
}
