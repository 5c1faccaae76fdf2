/** Sandbox networks on the wire: the network spec, its state on the host, denial counters and network policies. */
import { z } from 'zod';
import type { NetworkSpec as ModelNetworkSpec } from '../../model/network.js';
import { EgressRule, PolicyName } from './common.js';

/**
 * The network of a sandbox. `none` (default): a network namespace with loopback only.
 * `allow`: a veth on the instance bridge, egress only to `allow` (and the sandbox's
 * resolver), minus `deny`. `open`: egress anywhere except `deny`. `policy` names a
 * network policy data file whose rules are merged under the inline ones. `mode` may be
 * left out when `policy` is given: the policy's mode applies (docs/SECURITY.md
 * "Networking and egress"); the stored spec always has the settled mode.
 */
export const NetworkSpec = z
  .object({
    mode: z.enum(['none', 'allow', 'open']).optional().describe("none (loopback only), allow (allow-list) or open (anything but deny); default the policy's mode, else none."),
    policy: PolicyName.optional().describe('Name of a network policy data file (docs/SECURITY.md), merged under the inline rules.'),
    allow: z.array(EgressRule).max(256).optional().describe('Destinations reachable in mode allow.'),
    deny: z.array(EgressRule).max(256).optional().describe('Destinations never reachable; wins over allow.'),
  })
  .strict() satisfies z.ZodType<ModelNetworkSpec>; // parses into the model's shape
export type NetworkSpec = z.infer<typeof NetworkSpec>;

/** Denials of one sandbox's egress programs and resolver since it was attached (cumulative for its current container). */
export const NetworkDenials = z.object({
  connect: z.number().int().describe('connect() calls refused (EPERM).'),
  sendmsg: z.number().int().describe('UDP sendto/sendmsg calls to an address refused (EPERM).'),
  sock_create: z.number().int().describe('Raw or non-TCP/UDP inet sockets refused (EPERM).'),
  dns_refused: z.number().int().describe('DNS questions the resolver refused (REFUSED, never forwarded), for its current container; kept across dsecd restarts (recorded before it is shown).'),
  last: z.string().nullable().describe('The last denied attempt, e.g. `10.0.0.9:80/tcp (connect)`.'),
});

/** GET/PUT /v1/sandboxes/{id}/network response: the settled network and its state on the host. */
export const SandboxNetwork = z.object({
  id: z.string(),
  mode: z.enum(['none', 'allow', 'open']),
  policy: z.string().nullable().describe('The named policy merged in, if any.'),
  allow: z.array(EgressRule).describe("Effective allow rules: the policy's, then the sandbox's own."),
  deny: z.array(EgressRule).describe("Effective deny rules: the policy's, then the sandbox's own."),
  address: z.string().nullable().describe('The sandbox\'s IPv4 address on the instance bridge (derived from its uid-range slot), null in mode none.'),
  gateway: z.string().nullable(),
  resolver: z.string().nullable().describe('The resolver its /etc/resolv.conf names, `gateway:53`.'),
  attached: z.boolean().describe('Whether its veth and egress programs are in place now (running or paused).'),
  hosts: z.record(z.string(), z.array(z.string())).describe('Addresses dsecd resolved for each exact host rule (refreshed on the DNS TTL, clamped).'),
  learned: z.number().int().describe('Addresses allowed because the resolver answered them for an allow host rule (wildcards included).'),
  denied: NetworkDenials,
});

/** One loaded network policy (GET /v1/network/policies). */
export const NetworkPolicyView = z.object({
  name: z.string(),
  file: z.string().describe('The data file it was loaded from.'),
  description: z.string().nullable(),
  mode: z.enum(['allow', 'open']),
  allow: z.array(EgressRule),
  deny: z.array(EgressRule),
});

/** GET /v1/network/policies response. */
export const NetworkPolicyList = z.object({ policies: z.array(NetworkPolicyView) });

/** POST /v1/network/policies/reload response. */
export const PolicyReloadResult = z.object({
  loaded: z.array(z.string()).describe('Every policy loaded now.'),
  changed: z.array(z.string()).describe('Policies whose content changed, appeared or disappeared.'),
  reapplied: z.array(z.string()).describe('Sandboxes whose network was re-applied because their policy changed.'),
  shadowed: z.array(z.object({
    name: z.string(),
    file: z.string().describe('The operator\'s file in force.'),
    shadows: z.string().describe('The shipped file it hides.'),
  })).describe('Shipped policies hidden by an operator policy of the same name (every one in force, not only new ones).'),
  warnings: z.array(z.object({
    policy: z.string(),
    file: z.string(),
    message: z.string().describe('Which allow rule (`allow.<index>`) never takes effect and why: inside a destination every sandbox is denied (bridge subnet, host addresses, link-local metadata range, ...), covered by a deny rule of the policy, or in an open policy.'),
  })).describe('Allow rules of loaded policies that can never take effect; they do not refuse the reload.'),
  modes: z.array(z.object({
    id: z.string().describe('Sandbox id.'),
    policy: z.string(),
    mode: z.enum(['allow', 'open']).describe("The sandbox's mode now."),
    policy_mode: z.enum(['allow', 'open']).describe("The policy's mode after the reload."),
    changed: z.boolean().describe('True when the sandbox took the new mode (its stored network names no mode of its own); false when it keeps the mode settled at its create (PUT its network to change it).'),
  })).describe("Sandboxes naming a policy whose mode this reload changed (each also gets a network.policy_mode_changed event)."),
});
export type PolicyReloadResult = z.infer<typeof PolicyReloadResult>;
