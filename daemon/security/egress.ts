/**
 * Egress rules: validation, host-name patterns, merging a named policy with a sandbox's
 * inline rules, and compilation into the entries of the egress programs' LPM tries
 * (native/bpf/egress.bpf.c), with the byte layouts of their keys and values. Pure;
 * unit-tested in test/unit/egress.test.ts.
 *
 * Compilation. The programs do one LPM lookup per trie and destination, so each entry
 * must carry everything that applies to every address it is the longest match for.
 * Prefixes nest or are disjoint; so if the entry of prefix P carries the union of the
 * port sets of every rule whose prefix contains P, the longest match for an address a
 * carries exactly the union over the rules containing a: any rule R containing a is an
 * entry no longer than P and containing a, hence containing P. Entries are computed per
 * list (allow, deny) and family; deny is checked first, so deny wins.
 */
import { contains, formatPrefix, parsePrefix, type Family, type Prefix } from '../net/addr.js';
import { invalidArgument } from '../errors.js';
import { z } from 'zod';
import type { EgressRule, NetworkSpec } from '../model/network.js';

/**
 * Network policy names (and the `policy` of a sandbox's network): lowercase
 * `[a-z0-9][a-z0-9._-]{0,62}`, so a name is a file name as is (policies are data files,
 * docs/SECURITY.md).
 */
export const PolicyNameSchema = z.string().regex(/^[a-z0-9][a-z0-9._-]{0,62}$/, 'policy names are 1-63 characters of [a-z0-9._-], starting with a letter or digit');

/**
 * One egress rule as the API and policy files give it: a destination (exactly one of
 * `cidr` and `host`), optional ports and a protocol. `host` names are resolved by dsecd
 * and refreshed on their DNS TTL (docs/SECURITY.md "Networking"); `*.example.org` matches
 * every name below example.org. Syntax beyond the shape is {@link ruleProblem}'s.
 */
export const EgressRuleSchema = z
  .object({
    cidr: z.string().min(2).max(43).optional().describe('IPv4 or IPv6 prefix, e.g. `10.0.0.0/8`, `2001:db8::/32`; a bare address means /32 or /128.'),
    host: z.string().min(1).max(253).optional().describe('DNS name, or `*.` and a name for every name below it; resolved by dsecd.'),
    ports: z.array(z.union([z.number().int().min(1).max(65535), z.string().regex(/^\d{1,5}-\d{1,5}$/, 'port ranges are "low-high"')])).min(1).max(16).optional()
      .describe('Destination ports or "low-high" ranges; default every port.'),
    protocol: z.enum(['tcp', 'udp', 'any']).optional().describe('Default any.'),
  })
  .strict()
  .refine((r) => (r.cidr === undefined) !== (r.host === undefined), 'an egress rule has exactly one of cidr and host')
  .superRefine((r, ctx) => {
    // Prefix syntax and host bits, host-name syntax, port-range order.
    const problem = ruleProblem(r);
    if (problem) ctx.addIssue({ code: 'custom', message: problem });
  }) satisfies z.ZodType<EgressRule>; // parses into the model's shape

/** Protocol bits of a port range, as in egress.bpf.c. */
export const PROTO_TCP = 1;
export const PROTO_UDP = 2;
export const PROTO_ANY = PROTO_TCP | PROTO_UDP;

/** Most ranges one trie entry carries: MAX_RANGES of egress.bpf.c (32, twice the 16 ports one rule may list). */
export const MAX_RANGES = 32;

/** Mode numbers of the `egress_conf` map (MODE_* of egress.bpf.c). */
export const MODE_CODE = { allow: 1, open: 2 } as const;

/** A destination port range, inclusive, host order, and its protocol bits. */
export interface PortRange {
  lo: number;
  hi: number;
  protos: number;
}

/** A network whose mode is settled and whose named policy is merged in. */
export interface EffectiveNetwork {
  mode: 'none' | 'allow' | 'open';
  /** The named policy merged in, if any. */
  policy?: string;
  allow: EgressRule[];
  deny: EgressRule[];
}

/** A named policy as loaded from its data file (daemon/security/egress-policy.ts). */
export interface NetworkPolicy {
  name: string;
  description?: string;
  mode: 'allow' | 'open';
  allow: EgressRule[];
  deny: EgressRule[];
}

/** One label of a host name: letters, digits, hyphens, 1-63 characters, no leading or trailing hyphen. */
const LABEL = /^(?!-)[a-z0-9-]{1,63}(?<!-)$/;

/**
 * Normalises a host rule: lowercase, without a trailing dot. Accepts a DNS name of
 * labels of [a-z0-9-] (underscores too, for service names such as _http._tcp), or `*.`
 * followed by such a name of at least two labels (`*.pythonhosted.org`).
 * @throws DsecError InvalidArgument naming the pattern and what is wrong.
 */
export function normaliseHost(pattern: string): string {
  let p = pattern.trim().toLowerCase();
  if (p.endsWith('.')) p = p.slice(0, -1);
  const wild = p.startsWith('*.');
  const name = wild ? p.slice(2) : p;
  const labels = name.split('.');
  const ok = name.length > 0 && name.length <= 253 && labels.every((l) => LABEL.test(l.replace(/_/g, 'a')));
  if (!ok || name.includes('*')) {
    throw invalidArgument(`host ${JSON.stringify(pattern)} is not a DNS name or a wildcard *.name (labels of letters, digits and hyphens; * only as the whole first label)`);
  }
  if (wild && labels.length < 2) throw invalidArgument(`host ${JSON.stringify(pattern)}: a wildcard must stand above a name of at least two labels (e.g. *.example.org), not a top-level domain`);
  return p;
}

/**
 * True when DNS name `name` matches host rule `pattern` (both compared lowercase, a
 * trailing dot ignored): an exact name matches itself only; `*.example.org` matches
 * every name below example.org (`a.example.org`, `a.b.example.org`), not example.org.
 */
export function hostMatches(pattern: string, name: string): boolean {
  const p = pattern.toLowerCase().replace(/\.$/, '');
  const n = name.toLowerCase().replace(/\.$/, '');
  if (p.startsWith('*.')) return n.endsWith(p.slice(1)) && n.length > p.length - 1;
  return n === p;
}

/**
 * The port ranges of a rule: its `ports` (numbers or "low-high"), or every port, for its
 * `protocol` (default any: TCP and UDP).
 * @throws DsecError InvalidArgument for a range whose low end is above its high end or outside 1-65535.
 */
export function rulePorts(r: EgressRule): PortRange[] {
  const protos = r.protocol === 'tcp' ? PROTO_TCP : r.protocol === 'udp' ? PROTO_UDP : PROTO_ANY;
  if (!r.ports) return [{ lo: 0, hi: 65535, protos }];
  return r.ports.map((p) => {
    if (typeof p === 'number') return { lo: p, hi: p, protos };
    const [lo, hi] = p.split('-').map(Number);
    if (!(lo >= 1 && hi <= 65535 && lo <= hi)) throw invalidArgument(`port range ${JSON.stringify(p)} must be "low-high" with 1 <= low <= high <= 65535`);
    return { lo, hi, protos };
  });
}

/**
 * Checks one rule beyond its schema: the prefix parses (host bits zero), the host is a
 * name or wildcard, port ranges are ordered.
 * @returns an error message, or null when the rule is valid.
 */
export function ruleProblem(r: EgressRule): string | null {
  try {
    if (r.cidr !== undefined) parsePrefix(r.cidr);
    if (r.host !== undefined) normaliseHost(r.host);
    rulePorts(r);
    return null;
  } catch (e) {
    return (e as Error).message;
  }
}

/**
 * Settles a sandbox's network: the mode (the request's, else the policy's, else none),
 * and the rules (the policy's, then the inline ones).
 * @param policy the loaded policy the spec names (the caller resolves the name).
 * @throws DsecError InvalidArgument when rules or a policy come with mode none, or
 *   rules come without a mode and without a policy to take one from.
 */
export function effectiveNetwork(spec: NetworkSpec | null | undefined, policy?: NetworkPolicy): EffectiveNetwork {
  if (!spec) return { mode: 'none', allow: [], deny: [] };
  const hasRules = (spec.allow?.length ?? 0) + (spec.deny?.length ?? 0) > 0;
  const mode = spec.mode ?? policy?.mode ?? (hasRules ? null : 'none');
  if (mode === null) throw invalidArgument('network rules need a mode: set network.mode to allow or open (or name a policy, which has one)');
  if (mode === 'none' && (hasRules || spec.policy)) {
    throw invalidArgument('network mode none has no route out, so it takes no allow/deny rules or policy; set network.mode to allow or open');
  }
  return {
    mode,
    ...(spec.policy ? { policy: spec.policy } : {}),
    allow: [...(policy?.allow ?? []), ...(spec.allow ?? [])],
    deny: [...(policy?.deny ?? []), ...(spec.deny ?? [])],
  };
}

/**
 * Minimal sorted ranges covering the same (port, protocol) pairs as `rs`: a sweep over
 * every boundary, merging neighbours with the same protocol bits.
 */
export function normaliseRanges(rs: readonly PortRange[]): PortRange[] {
  const cuts = new Set<number>();
  for (const r of rs) { cuts.add(r.lo); cuts.add(r.hi + 1); }
  const pts = [...cuts].sort((a, b) => a - b);
  const out: PortRange[] = [];
  for (let i = 0; i + 1 < pts.length; i++) {
    const lo = pts[i], hi = pts[i + 1] - 1;
    let protos = 0;
    for (const r of rs) if (r.lo <= lo && r.hi >= hi) protos |= r.protos;
    if (!protos) continue;
    const prev = out[out.length - 1];
    if (prev && prev.protos === protos && prev.hi + 1 === lo) prev.hi = hi;
    else out.push({ lo, hi, protos });
  }
  return out;
}

/** One entry of a trie: a prefix and the port ranges an LPM match on it means. */
export interface TrieEntry {
  prefix: Prefix;
  ports: PortRange[];
}

/** The four tries' entries for one sandbox, keyed by prefix text (`10.0.0.0/8`). */
export interface CompiledEgress {
  allow4: Map<string, TrieEntry>;
  deny4: Map<string, TrieEntry>;
  allow6: Map<string, TrieEntry>;
  deny6: Map<string, TrieEntry>;
}

/** A rule's destinations with its ports, after host names were resolved. */
interface Dest { prefix: Prefix; ports: PortRange[] }

/**
 * Entries for one list and family: for every distinct prefix, the union of the ports of
 * every destination containing it (see the module comment).
 * @throws DsecError InvalidArgument when a union needs more than {@link MAX_RANGES} ranges.
 */
function compileList(dests: Dest[]): Map<string, TrieEntry> {
  const byPrefix = new Map<string, { prefix: Prefix; ports: PortRange[] }>();
  for (const d of dests) {
    const k = formatPrefix(d.prefix);
    const e = byPrefix.get(k);
    if (e) e.ports.push(...d.ports);
    else byPrefix.set(k, { prefix: d.prefix, ports: [...d.ports] });
  }
  const out = new Map<string, TrieEntry>();
  const all = [...byPrefix.values()];
  for (const [k, e] of byPrefix) {
    const ports: PortRange[] = [];
    for (const o of all) if (contains(o.prefix, e.prefix)) ports.push(...o.ports);
    const merged = normaliseRanges(ports);
    if (merged.length > MAX_RANGES) {
      throw invalidArgument(`egress rules overlapping at ${k} need ${merged.length} port ranges, more than the ${MAX_RANGES} one prefix can carry; merge ports into ranges`);
    }
    out.set(k, { prefix: e.prefix, ports: merged });
  }
  return out;
}

/** Inputs of {@link compileEgress} besides the rules. */
export interface CompileContext {
  /** Current addresses of a host rule's name (exact names: resolved by dsecd; wildcards: learned from the sandbox's resolver). */
  addressesOf(host: string): readonly string[];
  /** Prefixes denied to every sandbox whatever its rules (the bridge subnet, the user-mode network's own services). */
  infraDeny: readonly Prefix[];
  /** More denials with their own ports (open mode: DNS to anything but the resolver). */
  extraDeny?: readonly { prefix: Prefix; ports: PortRange[] }[];
}

/**
 * Compiles a settled network into trie entries. Host rules contribute one /32 or /128
 * per current address; a host with no address yet contributes nothing (nothing is
 * reachable through it until it resolves).
 * @throws DsecError InvalidArgument (bad prefix, too many port ranges at one prefix).
 */
export function compileEgress(net: EffectiveNetwork, ctx: CompileContext): CompiledEgress {
  const dests = (rules: EgressRule[]) => {
    const d: Dest[] = [];
    for (const r of rules) {
      const ports = rulePorts(r);
      if (r.cidr !== undefined) d.push({ prefix: parsePrefix(r.cidr), ports });
      else for (const a of ctx.addressesOf(normaliseHost(r.host!))) d.push({ prefix: parsePrefix(a), ports });
    }
    return d;
  };
  const allow = dests(net.allow);
  const deny = [...dests(net.deny), ...ctx.infraDeny.map((prefix) => ({ prefix, ports: [{ lo: 0, hi: 65535, protos: PROTO_ANY }] })), ...(ctx.extraDeny ?? [])];
  const fam = (ds: Dest[], f: Family) => ds.filter((d) => d.prefix.family === f);
  return {
    allow4: net.mode === 'allow' ? compileList(fam(allow, 4)) : new Map(),
    allow6: net.mode === 'allow' ? compileList(fam(allow, 6)) : new Map(),
    deny4: compileList(fam(deny, 4)),
    deny6: compileList(fam(deny, 6)),
  };
}

/** Exact host names (not wildcards) of a settled network's rules, lowercase: what dsecd resolves itself. */
export function exactHosts(net: EffectiveNetwork): string[] {
  const s = new Set<string>();
  for (const r of [...net.allow, ...net.deny]) if (r.host !== undefined && !r.host.startsWith('*.')) s.add(normaliseHost(r.host));
  return [...s].sort();
}

// ---- byte layouts shared with egress.bpf.c ----

/** Key size of the v4 and v6 tries: u32 prefixlen, u64 cgroup id, address. */
export const KEY4_BYTES = 16;
export const KEY6_BYTES = 28;
/** Value size of the tries (struct portset): u32 n, u32 pad, MAX_RANGES x (u16 lo, u16 hi, u32 protos). */
export const PORTSET_BYTES = 8 + MAX_RANGES * 8;
/** Value size of egress_conf (struct conf). */
export const CONF_BYTES = 16;
/** Value size of egress_counters (struct counters). */
export const COUNTERS_BYTES = 64;

/** The u64 key of egress_conf and egress_counters: the cgroup id, little-endian (host order on x86-64). */
export function cgroupKey(cgid: bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(cgid);
  return b;
}

/** A trie key: prefixlen = 64 + prefix length, then the cgroup id, then the address bytes. */
export function trieKey(cgid: bigint, p: Prefix): Buffer {
  const b = Buffer.alloc(p.family === 4 ? KEY4_BYTES : KEY6_BYTES);
  b.writeUInt32LE(64 + p.len, 0);
  b.writeBigUInt64LE(cgid, 4);
  p.bytes.copy(b, 12);
  return b;
}

/** Decodes a trie key written by {@link trieKey}. */
export function parseTrieKey(b: Buffer): { cgid: bigint; prefix: Prefix } {
  const family: Family = b.length === KEY4_BYTES ? 4 : 6;
  return { cgid: b.readBigUInt64LE(4), prefix: { family, len: b.readUInt32LE(0) - 64, bytes: Buffer.from(b.subarray(12)) } };
}

/** A trie value (struct portset). @throws DsecError InvalidArgument beyond {@link MAX_RANGES}. */
export function portsetValue(ports: readonly PortRange[]): Buffer {
  if (ports.length > MAX_RANGES) throw invalidArgument(`${ports.length} port ranges, more than ${MAX_RANGES}`);
  const b = Buffer.alloc(PORTSET_BYTES);
  b.writeUInt32LE(ports.length, 0);
  ports.forEach((r, i) => {
    b.writeUInt16LE(r.lo, 8 + i * 8);
    b.writeUInt16LE(r.hi, 10 + i * 8);
    b.writeUInt32LE(r.protos, 12 + i * 8);
  });
  return b;
}

/** An egress_conf value: mode code and the resolver's IPv4 address (network order). */
export function confValue(mode: 'allow' | 'open', resolver4: Buffer): Buffer {
  const b = Buffer.alloc(CONF_BYTES);
  b.writeUInt32LE(MODE_CODE[mode], 0);
  resolver4.copy(b, 4);
  return b;
}

/** What egress_counters holds for one sandbox. */
export interface DenialCounters {
  connect: number;
  sendmsg: number;
  sockCreate: number;
  /** The last denied attempt, or null when nothing was denied yet. */
  last: { kind: 'connect' | 'sendmsg' | 'sock_create'; address: string | null; port: number | null; protocol: string; socketType: number | null } | null;
}

const PROTO_NAMES: Record<number, string> = { 0: 'ip', 1: 'icmp', 6: 'tcp', 17: 'udp', 58: 'icmpv6', 132: 'sctp', 136: 'udplite', 255: 'raw' };

/** Decodes an egress_counters value (struct counters). */
export function parseCounters(b: Buffer): DenialCounters {
  const connect = Number(b.readBigUInt64LE(0));
  const sendmsg = Number(b.readBigUInt64LE(8));
  const sockCreate = Number(b.readBigUInt64LE(16));
  const kindCode = b.readUInt32LE(52);
  if (!kindCode) return { connect, sendmsg, sockCreate, last: null };
  const family = b.readUInt8(50);
  const proto = b.readUInt8(51);
  const kind = kindCode === 1 ? 'connect' : kindCode === 2 ? 'sendmsg' : 'sock_create';
  let address: string | null = null;
  if (family === 4) address = [...b.subarray(32, 36)].join('.');
  else if (family === 6) address = formatPrefix({ family: 6, bytes: Buffer.from(b.subarray(32, 48)), len: 128 }).replace(/\/128$/, '');
  return {
    connect, sendmsg, sockCreate,
    last: { kind, address, port: family ? b.readUInt16LE(48) : null, protocol: PROTO_NAMES[proto] ?? String(proto), socketType: kind === 'sock_create' ? b.readUInt32LE(56) : null },
  };
}

// ---- policy lint ----

/** A destination denied whatever the rules, and why (daemon/net/decisions.ts `builtinDeny`). */
export interface AlwaysDenied {
  prefix: Prefix;
  reason: string;
}

/** True when deny pattern `deny` matches every name allow pattern `allow` can match (both normalised). */
function hostCovers(deny: string, allow: string): boolean {
  if (!allow.startsWith('*.')) return hostMatches(deny, allow);
  // A wildcard is covered by the same wildcard or one above it (`*.org` covers `*.example.org`).
  return deny.startsWith('*.') && (deny === allow || allow.endsWith(deny.slice(1)));
}

/** True when the (port, protocol) pairs of `inner` are all in `outer`. */
function portsCover(outer: readonly PortRange[], inner: readonly PortRange[]): boolean {
  const o = normaliseRanges(outer);
  return JSON.stringify(o) === JSON.stringify(normaliseRanges([...outer, ...inner]));
}

/**
 * Allow rules of a policy that can never take effect, as messages naming the rule by its
 * index (`allow.2`): the allow rules of an `open` policy as a whole (open mode allows
 * everything not denied, so they count only for a sandbox that names the policy with
 * mode allow of its own); an allow cidr inside a destination denied to every
 * sandbox (`alwaysDenied`: the bridge subnet, the host's addresses, link-local metadata
 * addresses, ...); an allow rule whose destinations and ports a deny rule of the same
 * policy covers (deny wins). Rules that only partly overlap a denial are not reported.
 * Pure; rules are assumed valid (the policy file was parsed).
 */
export function policyWarnings(p: Pick<NetworkPolicy, 'mode' | 'allow' | 'deny'>, alwaysDenied: readonly AlwaysDenied[]): string[] {
  const out: string[] = [];
  if (p.mode === 'open' && p.allow.length) {
    const n = p.allow.length;
    out.push(`mode open allows every destination that is not denied, so its ${n} allow rule${n === 1 ? '' : 's'} take${n === 1 ? 's' : ''} effect only for a sandbox that names this policy with mode allow of its own; use mode allow, or drop ${n === 1 ? 'it' : 'them'}`);
  }
  p.allow.forEach((r, i) => {
    const what = r.cidr !== undefined ? r.cidr : r.host!;
    const ports = rulePorts(r);
    if (r.cidr !== undefined) {
      const pre = parsePrefix(r.cidr);
      const b = alwaysDenied.find((d) => contains(d.prefix, pre));
      if (b) {
        out.push(`allow.${i} (${what}) can never match: ${formatPrefix(b.prefix)} is ${b.reason}, denied to every sandbox whatever its rules`);
        return;
      }
      const j = p.deny.findIndex((d) => d.cidr !== undefined && contains(parsePrefix(d.cidr), pre) && portsCover(rulePorts(d), ports));
      if (j >= 0) out.push(`allow.${i} (${what}) can never match: deny.${j} (${p.deny[j].cidr}) covers it and deny wins over allow`);
      return;
    }
    const name = normaliseHost(r.host!);
    const j = p.deny.findIndex((d) => d.host !== undefined && hostCovers(normaliseHost(d.host), name) && portsCover(rulePorts(d), ports));
    if (j >= 0) out.push(`allow.${i} (${what}) can never match: deny.${j} (${p.deny[j].host}) covers it and deny wins over allow`);
  });
  return out;
}
