/**
 * API field names in dsecd's error messages, said as the CLI flags that set them.
 *
 * dsecd validates requests and names what it refused by the API's field path and unit:
 * `invalid create request: memory_bytes: Too small: expected number to be >=4194304`.
 * A person typed `--memory 1K`, so {@link rewriteFieldMessage} turns that into
 * `invalid create request: --memory is too small: the smallest is 4MiB`. It is applied,
 * per verb, to every InvalidArgument and FailedPrecondition message (cli/util/errors.ts),
 * for every verb that builds its request from flags ({@link VERB_FIELDS}); others are left
 * as dsecd said them.
 *
 * What is rewritten:
 * - a zod issue `PATH: MESSAGE` (after `invalid WHAT: ` or `; `): PATH becomes the flag
 *   (array items `#n`, record keys by name: `--allow #2`, `--label job`) and the common
 *   bounds (`Too small: expected number to be >=N`) become words with N in the flag's unit;
 * - an API field name with an underscore (or `cpus`, `pids`) anywhere as a word
 *   (`memory_bytes 5 is more than ...`, `leave disk_bytes out`), with a number right after it
 *   shown in the field's unit;
 * - `N bytes` anywhere, when the verb has a byte-valued field: `4MiB`.
 * Plain-word fields (`image`, `env`, `user`) are only rewritten in an issue path, where
 * they cannot be ordinary words of a sentence.
 */
import { formatBytes, formatDuration } from './output.js';

/** How a field is set on the command line. */
export interface FieldFlag {
  /** The flag (or what stands for it), e.g. `--memory`, `the command (after --)`. */
  flag: string;
  /** Unit of the field's numbers, to show bounds in the flag's own units. */
  unit?: 'bytes' | 'ms' | 's';
}

/** Fields of a sandbox as `create`, `run`, `restore` and `fork` set them (cli/commands/create.ts). */
const SANDBOX_FIELDS: Record<string, FieldFlag> = {
  backend: { flag: '--backend' },
  image: { flag: '--image' },
  cpus: { flag: '--cpus' },
  memory_bytes: { flag: '--memory', unit: 'bytes' },
  pids: { flag: '--pids' },
  disk_bytes: { flag: '--disk', unit: 'bytes' },
  labels: { flag: '--label' },
  env: { flag: '--env' },
  ttl_s: { flag: '--ttl', unit: 's' },
  priority: { flag: '--priority' },
  idle_timeout_s: { flag: '--idle-timeout', unit: 's' },
  'network.mode': { flag: '--network' },
  'network.policy': { flag: '--network-policy' },
  'network.allow': { flag: '--allow' },
  'network.deny': { flag: '--deny' },
  'seccomp.allow': { flag: '--seccomp-allow' },
  'seccomp.deny': { flag: '--seccomp-deny' },
  'filesystem.writable_paths': { flag: '--writable' },
  'filesystem.readonly_paths': { flag: '--readonly' },
  'filesystem.landlock': { flag: '--landlock' },
};

/** Fields of a command as `exec`, `run` and `call` set them (cli/commands/exec.ts, run.ts). */
const COMMAND_FIELDS: Record<string, FieldFlag> = {
  argv: { flag: 'the command (after --)' },
  env: { flag: '--env' },
  cwd: { flag: '--cwd' },
  user: { flag: '--user' },
  timeout_ms: { flag: '--timeout', unit: 'ms' },
  stdin_b64: { flag: 'stdin (-i)' },
};

/** Fields of a network change (`network set`, `add`, `rm`: the body is the network itself). */
const NETWORK_FIELDS: Record<string, FieldFlag> = {
  mode: { flag: '--network' },
  policy: { flag: '--network-policy' },
  allow: { flag: '--allow' },
  deny: { flag: '--deny' },
};

/** Image config fields as `image build` and `commit` set them. */
const IMAGE_CONFIG_FIELDS: Record<string, FieldFlag> = {
  env: { flag: '--env' },
  cwd: { flag: '--cwd' },
  user: { flag: '--user' },
  cmd: { flag: '--cmd' },
  'security.seccomp.allow': { flag: '--seccomp-allow' },
  'security.seccomp.deny': { flag: '--seccomp-deny' },
  'security.writable_paths': { flag: '--writable' },
  'security.readonly_paths': { flag: '--readonly' },
  'security.landlock': { flag: '--landlock' },
};

/** API fields → flags, per verb (`ctx.verb`): the verbs that build a request from flags. */
export const VERB_FIELDS: Record<string, Record<string, FieldFlag>> = {
  create: SANDBOX_FIELDS,
  run: { ...SANDBOX_FIELDS, ...COMMAND_FIELDS },
  call: { ...COMMAND_FIELDS, image: { flag: '--image' }, memory_bytes: { flag: '--memory', unit: 'bytes' } },
  restore: SANDBOX_FIELDS,
  fork: { ...SANDBOX_FIELDS, count: { flag: '-n' } },
  exec: { ...COMMAND_FIELDS, trajectory: { flag: '--trajectory' }, step: { flag: '--step' }, 'tty.rows': { flag: 'the terminal height' }, 'tty.cols': { flag: 'the terminal width' } },
  stop: { timeout_ms: { flag: '--time', unit: 'ms' } },
  ttl: { ttl_s: { flag: 'the TTL', unit: 's' } },
  'job lease': { ttl_s: { flag: '--ttl', unit: 's' } },
  'job renew': { ttl_s: { flag: '--ttl', unit: 's' } },
  'network set': NETWORK_FIELDS,
  'network add': NETWORK_FIELDS,
  'network rm': NETWORK_FIELDS,
  'image build': { ...Object.fromEntries(Object.entries(IMAGE_CONFIG_FIELDS).map(([k, v]) => [`config.${k}`, v])), base: { flag: '--base' }, tag: { flag: '-t' } },
  'image bootstrap': { include: { flag: '--include' }, tag: { flag: '-t' } },
  commit: { exclude: { flag: '--exclude' }, ...Object.fromEntries(Object.entries(IMAGE_CONFIG_FIELDS).filter(([k]) => k.startsWith('security.'))) },
  'execs kill': { signal: { flag: '--signal' } },
  'snapshot create': { name: { flag: 'NAME' } },
};

/** Fields that are safe to rewrite wherever they stand as a word (no ordinary word is spelled so). */
function isDistinctive(field: string): boolean {
  return field.includes('_') || field === 'cpus' || field === 'pids';
}

/** `n` in a field's unit as the flag would take it: `4MiB`, `1m30s`; bytes that are no whole unit keep the exact count too. */
export function inUnit(n: number, unit: FieldFlag['unit']): string {
  if (!Number.isFinite(n)) return String(n);
  if (unit === 'bytes') {
    const h = formatBytes(n);
    return /^\d+(B|KiB|MiB|GiB|TiB|PiB)$/.test(h) ? h : `${h} (${n} bytes)`;
  }
  if (unit === 'ms') return n >= 0 && Number.isInteger(n) ? formatDuration(n) : `${n}ms`;
  if (unit === 's') return n >= 0 && Number.isInteger(n) ? formatDuration(n * 1000) : `${n}s`;
  return String(n);
}

/** A zod issue message in words, with its bound in `unit`; undefined when it is not one of the common bounds. */
function boundWords(message: string, unit: FieldFlag['unit']): string | undefined {
  const num = /^Too (small|big): expected (?:number|int) to be (>=|>|<=|<)(-?[\d.e+]+)$/.exec(message);
  if (num) {
    const v = inUnit(Number(num[3]), unit);
    switch (num[2]) {
      case '>=': return `is too small: the smallest is ${v}`;
      case '>': return `must be more than ${v}`;
      case '<=': return `is too large: the largest is ${v}`;
      default: return `must be less than ${v}`;
    }
  }
  const arr = /^Too (small|big): expected array to have (>=|<=)(\d+) items?$/.exec(message);
  if (arr) return arr[2] === '<=' ? `is given too often: at most ${arr[3]} times` : `must be given at least ${arr[3]} times`;
  const str = /^Too (small|big): expected string to have (>=|<=)(\d+) characters?$/.exec(message);
  if (str) return str[2] === '<=' ? `is too long: at most ${str[3]} characters` : `is too short: at least ${str[3]} characters`;
  return undefined;
}

/**
 * The flag for an issue path (`network.allow.1.ports`): the longest mapped prefix of its
 * non-index segments, then the first segment after it (`#2` for an array index, the key of
 * a record). Undefined when no prefix is mapped.
 */
function flagOfPath(path: string, fields: Record<string, FieldFlag>): { text: string; unit?: FieldFlag['unit'] } | undefined {
  const segs = path.split('.');
  for (let end = segs.length; end > 0; end--) {
    const key = segs.slice(0, end).filter((s) => !/^\d+$/.test(s)).join('.');
    // The prefix must end on a name, not an index (`allow.0` is item 1 of `allow`).
    if (/^\d+$/.test(segs[end - 1]) || !Object.prototype.hasOwnProperty.call(fields, key)) continue;
    const f = fields[key];
    const next = segs[end];
    const which = next === undefined ? '' : /^\d+$/.test(next) ? ` #${Number(next) + 1}` : ` ${next}`;
    return { text: f.flag + which, unit: f.unit };
  }
  return undefined;
}

/**
 * `message` (from dsecd, refusing a request `verb` built from flags) with API field names
 * and units said as the CLI's flags and units; see the module comment. Unchanged for a
 * verb without a field table.
 */
export function rewriteFieldMessage(message: string, verb: string): string {
  const fields = VERB_FIELDS[verb];
  if (!fields) return message;
  // 1. Issues: `invalid WHAT: PATH: MSG; PATH: MSG`.
  let out = message.replace(/(^invalid [^:;]+: |; )([A-Za-z_][\w]*(?:\.[\w-]+)*): ([^;]*)/g, (all, lead: string, path: string, msg: string) => {
    const f = flagOfPath(path, fields);
    if (!f) return all;
    const words = boundWords(msg.trim(), f.unit);
    return words ? `${lead}${f.text} ${words}` : `${lead}${f.text}: ${msg}`;
  });
  // 2. Distinctive field names anywhere, a number right after one in its unit.
  for (const [field, f] of Object.entries(fields)) {
    if (field.includes('.') || !isDistinctive(field)) continue;
    out = out.replace(new RegExp(`(?<![\\w-])${field}\\b( (?:is |of )?(-?\\d+(?:\\.\\d+)?)\\b(?! ?(?:bytes|MiB|GiB|KiB|ms|s)\\b))?`, 'g'), (_all, tail?: string, n?: string) => {
      if (tail === undefined || n === undefined) return f.flag;
      return f.flag + tail.slice(0, tail.length - n.length) + inUnit(Number(n), f.unit);
    });
  }
  // 3. `N bytes` in a message about a verb with byte-valued fields.
  if (Object.values(fields).some((f) => f.unit === 'bytes')) {
    out = out.replace(/\b(\d+) bytes\b/g, (all, n: string) => {
      const h = formatBytes(Number(n));
      return /^\d+(KiB|MiB|GiB|TiB|PiB)$/.test(h) ? h : all;
    });
  }
  return out;
}
