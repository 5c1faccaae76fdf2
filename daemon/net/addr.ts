/**
 * IPv4/IPv6 addresses and prefixes as bytes: parsing, formatting, containment, and the
 * deterministic address of a sandbox in the instance subnet. Pure; unit-tested in
 * test/unit/net-addr.test.ts.
 */
import { isIPv4, isIPv6 } from 'node:net';
import { failedPrecondition, invalidArgument } from '../errors.js';

/** An address family: 4 or 6. */
export type Family = 4 | 6;

/** A prefix: `bytes` (4 or 16, network order, host bits zero) and its length in bits. */
export interface Prefix {
  family: Family;
  bytes: Buffer;
  len: number;
}

/** Bytes of an IPv4 address in dotted-quad form, or null when `s` is not one. */
export function parse4(s: string): Buffer | null {
  if (!isIPv4(s)) return null;
  return Buffer.from(s.split('.').map(Number));
}

/**
 * Bytes (16) of an IPv6 address in any RFC 4291 text form, including `::` and an
 * embedded dotted quad (`::ffff:1.2.3.4`), or null when `s` is not one. A zone (`%eth0`)
 * is refused: rules name global destinations.
 */
export function parse6(s: string): Buffer | null {
  if (!isIPv6(s) || s.includes('%')) return null;
  let text = s;
  const last = text.lastIndexOf(':');
  if (text.slice(last + 1).includes('.')) {
    const v4 = parse4(text.slice(last + 1));
    if (!v4) return null;
    text = `${text.slice(0, last + 1)}${((v4[0] << 8) | v4[1]).toString(16)}:${((v4[2] << 8) | v4[3]).toString(16)}`;
  }
  const halves = text.split('::');
  if (halves.length > 2) return null;
  const words = (t: string) => (t === '' ? [] : t.split(':').map((x) => parseInt(x, 16)));
  const head = words(halves[0]);
  const tail = halves.length === 2 ? words(halves[1]) : [];
  const fill = halves.length === 2 ? 8 - head.length - tail.length : 0;
  const all = [...head, ...new Array<number>(Math.max(0, fill)).fill(0), ...tail];
  if (all.length !== 8 || all.some((w) => !Number.isInteger(w) || w < 0 || w > 0xffff)) return null;
  const b = Buffer.alloc(16);
  all.forEach((w, i) => b.writeUInt16BE(w, i * 2));
  return b;
}

/** Parses an address of either family. */
export function parseAddr(s: string): { family: Family; bytes: Buffer } | null {
  const v4 = parse4(s);
  if (v4) return { family: 4, bytes: v4 };
  const v6 = parse6(s);
  if (v6) return { family: 6, bytes: v6 };
  return null;
}

/** Dotted quad or RFC 5952 text (lowercase, longest zero run as `::`, IPv4-mapped as `::ffff:a.b.c.d`) of address bytes. */
export function formatAddr(b: Buffer): string {
  if (b.length === 4) return [...b].join('.');
  const v4 = unmap4(b);
  if (v4) return `::ffff:${[...v4].join('.')}`;
  const w = Array.from({ length: 8 }, (_, i) => b.readUInt16BE(i * 2));
  let best = -1, bestLen = 0;
  for (let i = 0; i < 8;) {
    if (w[i] !== 0) { i++; continue; }
    let j = i;
    while (j < 8 && w[j] === 0) j++;
    if (j - i > bestLen && j - i >= 2) { best = i; bestLen = j - i; }
    i = j;
  }
  const hex = w.map((x) => x.toString(16));
  if (best < 0) return hex.join(':');
  return `${hex.slice(0, best).join(':')}::${hex.slice(best + bestLen).join(':')}`;
}

/** `bytes` with every bit after the first `len` cleared (a copy). */
export function maskBytes(bytes: Buffer, len: number): Buffer {
  const out = Buffer.from(bytes);
  for (let i = 0; i < out.length; i++) {
    const keep = Math.max(0, Math.min(8, len - i * 8));
    out[i] &= keep === 8 ? 0xff : (0xff << (8 - keep)) & 0xff;
  }
  return out;
}

/** The IPv4 address of an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), else null. */
export function unmap4(b: Buffer): Buffer | null {
  if (b.length !== 16) return null;
  for (let i = 0; i < 10; i++) if (b[i] !== 0) return null;
  if (b[10] !== 0xff || b[11] !== 0xff) return null;
  return b.subarray(12, 16);
}

/**
 * Parses a prefix `addr/len` or a bare address (a /32 or /128). Host bits must be zero
 * (`10.0.0.1/8` is refused, as it is almost always a typo for 10.0.0.0/8). An IPv4-mapped
 * IPv6 prefix of length 96 or more becomes the IPv4 prefix it maps, so the v4 rules
 * apply to v4-mapped destinations (the programs check those against the v4 tries).
 * @throws DsecError InvalidArgument naming the text and what is wrong with it.
 */
export function parsePrefix(text: string): Prefix {
  const slash = text.indexOf('/');
  const addrText = slash < 0 ? text : text.slice(0, slash);
  const a = parseAddr(addrText);
  if (!a) throw invalidArgument(`${JSON.stringify(text)} is not an IPv4 or IPv6 address or prefix (e.g. 10.0.0.0/8, 2001:db8::/32, 192.0.2.7)`);
  const max = a.family === 4 ? 32 : 128;
  let len = max;
  if (slash >= 0) {
    const l = text.slice(slash + 1);
    if (!/^\d{1,3}$/.test(l) || Number(l) > max) throw invalidArgument(`${JSON.stringify(text)}: prefix length must be 0-${max}`);
    len = Number(l);
  }
  if (!maskBytes(a.bytes, len).equals(a.bytes)) {
    throw invalidArgument(`${JSON.stringify(text)} has bits set after /${len}; did you mean ${formatAddr(maskBytes(a.bytes, len))}/${len}?`);
  }
  if (a.family === 6 && len >= 96) {
    const v4 = unmap4(a.bytes);
    if (v4) return { family: 4, bytes: Buffer.from(v4), len: len - 96 };
  }
  return { family: a.family, bytes: a.bytes, len };
}

/** Text form of a prefix: `addr/len`. */
export function formatPrefix(p: Prefix): string {
  return `${formatAddr(p.bytes)}/${p.len}`;
}

/** True when prefix `outer` contains prefix `inner` (same family, shorter or equal, same leading bits). */
export function contains(outer: Prefix, inner: Prefix): boolean {
  return outer.family === inner.family && outer.len <= inner.len && maskBytes(inner.bytes, outer.len).equals(outer.bytes);
}

/** The instance subnet as configured: prefix, gateway (first host), and how many sandbox addresses it holds. */
export interface Subnet {
  prefix: Prefix;
  /** Gateway (bridge) address: the network address + 1. */
  gateway: Buffer;
  /** Sandbox addresses available: network + 2 .. broadcast - 1. */
  capacity: number;
}

/**
 * Parses the `[network] subnet` setting: an IPv4 prefix of length 8 to 30.
 * @throws DsecError InvalidArgument.
 */
export function parseSubnet(text: string): Subnet {
  const p = parsePrefix(text);
  if (p.family !== 4 || p.len < 8 || p.len > 30) throw invalidArgument(`network subnet ${JSON.stringify(text)} must be an IPv4 prefix of length 8 to 30 (e.g. 10.201.0.0/16)`);
  const base = p.bytes.readUInt32BE(0);
  const gateway = Buffer.alloc(4);
  gateway.writeUInt32BE(base + 1);
  return { prefix: p, gateway, capacity: 2 ** (32 - p.len) - 3 };
}

/**
 * The address of the sandbox in uid-range slot `slot` (0-based): network + 2 + slot.
 * Slots are unique among live sandboxes (a uid range is never shared), so addresses
 * need no allocation table and are never reused while a sandbox holds them.
 * @throws DsecError FailedPrecondition when the subnet has no address for that slot (dsecd checks at
 *   start that the subnet holds every slot of the uid pool, so this means a changed config).
 */
export function addressForSlot(s: Subnet, slot: number): Buffer {
  if (!Number.isInteger(slot) || slot < 0 || slot >= s.capacity) {
    throw failedPrecondition(`uid-range slot ${slot} has no address in network subnet ${formatPrefix(s.prefix)} (${s.capacity} addresses); choose a larger [network] subnet`);
  }
  const b = Buffer.alloc(4);
  b.writeUInt32BE(s.prefix.bytes.readUInt32BE(0) + 2 + slot);
  return b;
}
