/**
 * What sandbox networking decides without state (pure, unit-tested): the destinations
 * every allow/open sandbox is denied whatever its rules, and the resolver's answer for
 * a name under a sandbox's network.
 */
import os from 'node:os';
import { hostMatches, normaliseHost, type EffectiveNetwork } from '../security/egress.js';
import { parsePrefix, type Prefix, type Subnet } from './addr.js';
import { SLIRP } from './instance.js';

/** A destination denied to every allow/open sandbox whatever its rules, and why (for messages). */
export interface BuiltinDeny {
  prefix: Prefix;
  reason: string;
}

/**
 * Link-local IPv4, 169.254.0.0/16: where cloud instance metadata services answer
 * (169.254.169.254 on AWS, GCP, Azure, OpenStack; 169.254.170.2 for ECS task
 * credentials). Through the user-mode uplink a sandbox's connect there becomes a socket of
 * the host, which would reach the host's metadata service and its credentials.
 */
export const LINK_LOCAL_4 = '169.254.0.0/16';

/**
 * The destinations every allow/open sandbox is denied whatever its rules (deny wins over
 * allow): the bridge subnet, the user-mode DNS forwarder, the user-mode gateway to the
 * host's loopback (unless `host_loopback`), link-local addresses ({@link LINK_LOCAL_4}),
 * and the host's own interface addresses (the uplink would reach the host's services on
 * them). Pure but for `interfaces` (default: this host's).
 */
export function builtinDeny(subnet: Subnet, hostLoopback: boolean, interfaces: NodeJS.Dict<os.NetworkInterfaceInfo[]> = os.networkInterfaces()): BuiltinDeny[] {
  const out: BuiltinDeny[] = [
    { prefix: subnet.prefix, reason: 'the sandbox bridge subnet ([network] subnet)' },
    { prefix: parsePrefix(`${SLIRP.dns}/32`), reason: "the user-mode network's DNS forwarder (only the sandbox resolver asks it)" },
    { prefix: parsePrefix(LINK_LOCAL_4), reason: 'link-local addresses, where cloud instance metadata services answer' },
  ];
  if (!hostLoopback) out.push({ prefix: parsePrefix(`${SLIRP.hostGateway}/32`), reason: "the user-mode gateway to the host's loopback ([network] host_loopback is off)" });
  for (const [name, addrs] of Object.entries(interfaces)) {
    for (const a of addrs ?? []) {
      if (a.internal || a.address.startsWith('fe80')) continue;
      try {
        out.push({ prefix: parsePrefix(a.address), reason: `an address of this host (${name})` });
      } catch { /* an address form the rules do not take */ }
    }
  }
  return out;
}

/**
 * The resolver's decision for `name` under a sandbox's network (pure; unit-tested):
 * mode none refuses everything; a name matching a deny host rule is refused; in allow
 * mode only names matching an allow host rule are forwarded, and `patterns` names those
 * rules (the answer's addresses are pinned under them); open mode forwards the rest.
 */
export function dnsDecision(net: EffectiveNetwork, name: string): { action: 'refuse'; reason: string } | { action: 'forward'; patterns: string[] } {
  if (net.mode === 'none') return { action: 'refuse', reason: 'mode none' };
  const deny = net.deny.find((r) => r.host !== undefined && hostMatches(normaliseHost(r.host), name));
  if (deny) return { action: 'refuse', reason: `deny ${deny.host}` };
  if (net.mode === 'open') return { action: 'forward', patterns: [] };
  const patterns = [...new Set(net.allow.filter((r) => r.host !== undefined && hostMatches(normaliseHost(r.host), name)).map((r) => normaliseHost(r.host!)))];
  if (!patterns.length) return { action: 'refuse', reason: 'not in allow rules' };
  return { action: 'forward', patterns };
}

