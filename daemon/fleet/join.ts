/**
 * Wiring of a dsecd into its fleet: the etcd client and the registration, loaded only
 * when a fleet is configured (daemon/main.ts imports this module dynamically, so a dsecd
 * without `--etcd` never loads gRPC).
 */
import type { Logger } from 'pino';
import type { FleetConfig } from '../config.js';
import { invalidArgument } from '../errors.js';
import { openEtcd } from './etcd.js';
import type { HostIdentity } from './identity.js';
import { FleetKeys } from './layout.js';
import { Registration, type FleetHostSource } from './registration.js';

/** A dsecd's membership, as the daemon holds it. */
export interface FleetMembership {
  /** The registration's state (host info's `fleet`). */
  status(): ReturnType<Registration['status']>;
  /** Revokes the lease and closes the etcd client; never throws. */
  stop(): Promise<void>;
}

/**
 * Opens the etcd client and makes the first registration attempt.
 * @throws DsecError InvalidArgument when `--advertise` is missing or a PEM file is unreadable;
 *   FailedPrecondition (NameTakenError) when etcd says another host id holds the name.
 */
export async function joinFleet(cfg: FleetConfig, identity: HostIdentity, source: FleetHostSource, log: Logger): Promise<FleetMembership> {
  if (!cfg.advertise) throw invalidArgument('a fleet host needs --advertise https://ADDR:PORT: the address at which gateways reach its TLS listener');
  const etcd = openEtcd({ endpoints: cfg.etcd, cert: cfg.cert, key: cfg.key, ca: cfg.ca });
  const reg = new Registration({
    etcd, keys: new FleetKeys(cfg.prefix), identity, name: cfg.hostName, advertise: cfg.advertise, labels: cfg.labels,
    leaseTtlS: cfg.leaseTtlS, refreshMs: cfg.refreshMs, source, log,
  });
  try {
    await reg.start();
  } catch (e) {
    etcd.close();
    throw e;
  }
  return {
    status: () => reg.status(),
    async stop() {
      await reg.stop();
      etcd.close();
    },
  };
}
