/**
 * Wiring of a dsecd into its fleet: the etcd client and the registration, loaded only
 * when a fleet is configured (daemon/main.ts imports this module dynamically, so a dsecd
 * without `--etcd` never loads gRPC).
 */
import type { Etcd3 } from 'etcd3';
import type { Logger } from 'pino';
import type { FleetConfig } from '../config.js';
import { invalidArgument } from '../errors.js';
import { openEtcd } from './etcd.js';
import type { HostIdentity } from './identity.js';
import { FleetKeys } from './layout.js';
import { NameTakenError, Registration, type FleetHostSource } from './registration.js';
import { EtcdTokenStore } from './tokens.js';

/**
 * How long the start-up check of the name claim waits for etcd: 1 s. An etcd that does not
 * answer by then delays nothing more (the registration retries in the background).
 */
const PRECHECK_MS = 1000;

/** A dsecd's membership, as the daemon holds it. */
export interface FleetMembership {
  /** The registration's state (host info's `fleet`). */
  status(): ReturnType<Registration['status']>;
  /** Revokes the lease, stops the token store's watches and closes the etcd client; never throws. */
  stop(): Promise<void>;
}

/** A fleet joined at start: the name checked, the registration not begun yet. */
export interface FleetJoin {
  /** Begins registering (first attempt in the background); never throws. */
  register(source: FleetHostSource): FleetMembership;
  /** Stops the token store's watches and closes the etcd client (a start that failed later). */
  close(): void;
  /**
   * The fleet's token store (etcd is the one store of API tokens in a fleet): a host reads
   * token records and revocations, never hashes, and may revoke but not create
   * (daemon/fleet/tokens.ts). Its mirrors load in the background.
   */
  tokenStore(): EtcdTokenStore;
}

/**
 * Opens the etcd client and checks, before dsecd creates anything, that no other host id
 * holds the name (a quick read; the registration claims the name by transaction later).
 * @throws DsecError InvalidArgument when `--advertise` is missing or a PEM file is
 *   unreadable; FailedPrecondition ({@link NameTakenError}) when etcd answers that another
 *   host id holds the name. An etcd that does not answer within 1 s is not an error.
 */
export async function prepareFleet(cfg: FleetConfig, identity: HostIdentity, log: Logger): Promise<FleetJoin> {
  if (!cfg.advertise) throw invalidArgument('a fleet host needs --advertise https://ADDR:PORT: the address at which gateways reach its TLS listener');
  const etcd = openEtcd({ endpoints: cfg.etcd, cert: cfg.cert, key: cfg.key, ca: cfg.ca });
  const keys = new FleetKeys(cfg.prefix);
  try {
    await precheck(etcd, keys, cfg.hostName, identity, log);
  } catch (e) {
    etcd.close();
    throw e;
  }
  let store: EtcdTokenStore | null = null;
  let reg: Registration | null = null;
  const close = async () => {
    await reg?.stop();
    await store?.close();
    etcd.close();
  };
  return {
    register(source) {
      const r = new Registration({
        etcd, keys, identity, name: cfg.hostName, advertise: cfg.advertise!, labels: cfg.labels,
        leaseTtlS: cfg.leaseTtlS, refreshMs: cfg.refreshMs, source, log,
      });
      reg = r;
      void r.start();
      return { status: () => r.status(), stop: close };
    },
    close: () => void close(),
    tokenStore() {
      store ??= new EtcdTokenStore(etcd, keys, log, false);
      void store.start().catch(() => {});
      return store;
    },
  };
}

/** Refuses a name held by another id; anything else (etcd down, a slow answer) passes. */
async function precheck(etcd: Etcd3, keys: FleetKeys, name: string, identity: HostIdentity, log: Logger): Promise<void> {
  let held: string | null;
  try {
    held = await etcd.get(keys.hostId(name)).options({ deadline: Date.now() + PRECHECK_MS }).string();
  } catch (e) {
    log.warn({ err: (e as Error).message }, 'fleet: etcd did not answer at start; registering in the background');
    return;
  }
  if (held !== null && held !== identity.id) throw new NameTakenError(name, held, identity.id);
}
