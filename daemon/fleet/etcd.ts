/**
 * The etcd client of dsecd and the gateway: the npm `etcd3` client (gRPC, etcd's v3 API,
 * which Debian's etcd 3.4 serves) with mutual TLS from PEM files and fault handling
 * tuned for a registry that must notice a lost etcd quickly and come back by itself.
 */
import { readFileSync } from 'node:fs';
import { Etcd3, isRecoverableError } from 'etcd3';
import { ExponentialBackoff, handleWhen, noop, retry, type IBackoff } from 'cockatiel';
import { invalidArgument } from '../errors.js';

export { parseEndpoints } from './layout.js';

/** How to reach etcd. */
export interface EtcdOptions {
  /** Client URLs, e.g. `https://10.88.0.1:2379` (one per cluster member). */
  endpoints: string[];
  /** Client certificate (PEM file) for etcd's `--client-cert-auth`; its CN is the etcd user. */
  cert?: string | null;
  /** Its key (PEM file). */
  key?: string | null;
  /** CA certificate(s) that signed etcd's server certificate (PEM file). */
  ca?: string | null;
  /** Deadline of one unary call (get, put, txn), ms; default {@link ETCD_CALL_MS}. */
  callTimeoutMs?: number;
}

/**
 * Deadline of one unary etcd call: 3 s. A healthy etcd answers in milliseconds; a
 * registration that waits longer is better retried than left hanging (the lease TTL is a
 * few seconds), and a watch (a stream) has no deadline.
 */
export const ETCD_CALL_MS = 3000;

/**
 * Opens a client (connections are made lazily, on the first call). For `https://`
 * endpoints, `ca` verifies etcd and `cert`/`key` authenticate the client; for `http://`
 * ones they are not used.
 * @throws DsecError InvalidArgument when a PEM file cannot be read or only one of cert/key is given.
 */
export function openEtcd(o: EtcdOptions): Etcd3 {
  const read = (f: string, what: string): Buffer => {
    try {
      return readFileSync(f);
    } catch (e) {
      throw invalidArgument(`etcd ${what} ${f}: ${(e as Error).message}`);
    }
  };
  if (!!o.cert !== !!o.key) throw invalidArgument('etcd client certificate and key go together: give both or neither');
  // TLS material applies to https:// endpoints; a plain http:// etcd (a single local one) is reached without it.
  const tls = (o.ca || o.cert) && o.endpoints.some((u) => u.startsWith('https:'));
  const credentials = tls
    ? {
      rootCertificate: o.ca ? read(o.ca, 'CA') : Buffer.alloc(0),
      ...(o.cert ? { certChain: read(o.cert, 'certificate'), privateKey: read(o.key!, 'key') } : {}),
    }
    : undefined;
  const deadline = o.callTimeoutMs ?? ETCD_CALL_MS;
  return new Etcd3({
    hosts: o.endpoints,
    ...(credentials ? { credentials } : {}),
    dialTimeout: deadline,
    defaultCallOptions: (ctx) => (ctx.isStream ? {} : { deadline: Date.now() + deadline }),
    faultHandling: {
      // No circuit breaker per member: it would keep refusing calls for seconds after etcd
      // came back. gRPC reconnects by itself; one retry rides over a member's restart.
      host: () => noop,
      global: retry(handleWhen(isRecoverableError), { maxAttempts: 1, backoff: new ExponentialBackoff({ initialDelay: 100, maxDelay: 500 }) }),
      // Watches reconnect within 2 s of etcd's return (the library's default backs off to 30 s).
      // (etcd3 calls next() on it, as on cockatiel's backoff factories; its typing names the product.)
      watchBackoff: new ExponentialBackoff({ initialDelay: 100, maxDelay: 2000 }) as unknown as IBackoff<unknown>,
    },
  });
}
