/**
 * A sandbox's network as the lifecycle and the networking layer see it: a mode and
 * egress rules (docs/SECURITY.md "Networking and egress"). The wire format and its
 * validation are daemon/api/schema.ts (NetworkSpec) and daemon/security/egress.ts
 * (EgressRuleSchema); this is the shape both produce.
 */

/** `none`: loopback only; `allow`: egress only to allow rules; `open`: egress anywhere but deny rules. */
export type NetworkMode = 'none' | 'allow' | 'open';

/**
 * One egress rule: a destination (exactly one of `cidr` and `host`), optional ports and a
 * protocol. `host` names are resolved by dsecd; `*.example.org` matches every name below
 * example.org.
 */
export interface EgressRule {
  /** IPv4 or IPv6 prefix, e.g. `10.0.0.0/8`; a bare address means /32 or /128. */
  cidr?: string;
  /** DNS name, or `*.` and a name for every name below it. */
  host?: string;
  /** Destination ports or `"low-high"` ranges; absent: every port. */
  ports?: (number | string)[];
  /** Absent: any. */
  protocol?: 'tcp' | 'udp' | 'any';
}

/**
 * A sandbox's network: mode and rules. `mode` may be absent when `policy` names a policy
 * file (its mode applies); the spec a sandbox stores always has the settled mode.
 */
export interface NetworkSpec {
  mode?: NetworkMode;
  /** Name of a network policy data file, merged under the inline rules. */
  policy?: string;
  allow?: EgressRule[];
  deny?: EgressRule[];
}
