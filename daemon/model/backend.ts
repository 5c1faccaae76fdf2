/**
 * Isolation tiers (backends). Which tier a sandbox runs on is fixed at its create; what
 * each tier can do on this host is its driver's `capabilities()` (daemon/drivers/types.ts),
 * never a test of the name.
 */

/**
 * Every tier, in the order the API lists them: `container` (an OCI container on the host
 * kernel), `fncall` (pooled container workers for isolated one-shot calls), `microvm`
 * (QEMU `-M microvm`), `vm` (QEMU q35).
 */
export const BACKENDS = ['container', 'fncall', 'microvm', 'vm'] as const;

/** One of {@link BACKENDS}. */
export type Backend = (typeof BACKENDS)[number];
