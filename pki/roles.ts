/**
 * The roles a fleet certificate names (daemon/remote/pki.ts), apart from the X.509 code so
 * the config can check them without loading it.
 */

/** Roles a fleet certificate can name (issue 20): a dsecd host, a gateway, or a client (a person's or a controller's). */
export const CERT_ROLES = ['host', 'gateway', 'client'] as const;
/** One of {@link CERT_ROLES}. */
export type CertRole = (typeof CERT_ROLES)[number];
