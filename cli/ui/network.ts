/**
 * Text rendering of `dsec network show` and `dsec network policies`. Pure: data in, string out.
 */
import type { NetworkPolicy, SandboxNetwork } from '../../sdk/index.js';
import { makeTable, tableText } from '../util/output.js';

type Rule = SandboxNetwork['allow'][number];

/** One rule as the flags write it: `pypi.org:443/tcp`, `10.0.0.0/8`, `[2001:db8::/32]:53`. */
export function formatRule(r: Rule): string {
  const dest = r.cidr ?? r.host ?? '?';
  const d = r.ports && dest.includes(':') ? `[${dest}]` : dest;
  return `${d}${r.ports ? `:${r.ports.join(',')}` : ''}${r.protocol && r.protocol !== 'any' ? `/${r.protocol}` : ''}`;
}

/** A sandbox's network: facts, then its rules, resolved hosts and denials. */
export function renderNetwork(n: SandboxNetwork, opts: { color?: boolean } = {}): string {
  const facts: [string, string][] = [
    ['mode', n.mode],
    ['policy', n.policy ?? '-'],
    ['address', n.address ?? '-'],
    ['gateway', n.gateway ?? '-'],
    ['resolver', n.resolver ?? '-'],
    ['attached', n.attached ? 'yes' : 'no'],
    ['learned', String(n.learned)],
    ['denied', `connect=${n.denied.connect} sendmsg=${n.denied.sendmsg} sock_create=${n.denied.sock_create} dns_refused=${n.denied.dns_refused}`],
    ['last denied', n.denied.last ?? '-'],
  ];
  const w = Math.max(...facts.map(([k]) => k.length));
  let out = facts.map(([k, v]) => `${k.padEnd(w)}  ${v}`).join('\n') + '\n';
  if (n.allow.length || n.deny.length) {
    const t = makeTable(['RULE', 'DESTINATION', 'RESOLVED'], { color: opts.color ?? false });
    for (const [kind, rules] of [['allow', n.allow], ['deny', n.deny]] as const) {
      for (const r of rules) t.push([kind, formatRule(r), r.host && n.hosts[r.host.toLowerCase()] ? n.hosts[r.host.toLowerCase()].join(' ') || '(none yet)' : r.host?.startsWith('*.') ? '(from DNS answers)' : '-']);
    }
    out += '\n' + tableText(t);
  }
  return out;
}

/** The loaded policies: name, mode, rule counts, file. */
export function renderPolicies(ps: NetworkPolicy[], opts: { color?: boolean } = {}): string {
  const t = makeTable(['POLICY', 'MODE', 'ALLOW', 'DENY', 'FILE'], { color: opts.color ?? false });
  for (const p of ps) t.push([p.name, p.mode, String(p.allow.length), String(p.deny.length), p.file]);
  return tableText(t);
}
