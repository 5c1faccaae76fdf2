/**
 * Ids of what dsecd creates: sandboxes (`<16 hex>`) and snapshots (`snap-<16 hex>`).
 * In a fleet the first 6 hex digits are the creating host's tag (daemon/fleet/layout.ts
 * hostTag), so a gateway finds the host of an id in its in-memory table, without asking
 * etcd or the hosts.
 */
import { randomBytes } from 'node:crypto';

/**
 * A new id: 16 lowercase hex digits. With a host tag (6 hex; a fleet is configured) the
 * first 6 are the tag and 10 are random (40 bits: a collision among a host's ~2,400 live
 * sandboxes has probability ~3e-9 per create, and the store's primary key refuses it);
 * without one, all 16 are random.
 */
export function taggedId(tag: string | null | undefined): string {
  if (!tag) return randomBytes(8).toString('hex');
  return tag + randomBytes(5).toString('hex');
}
