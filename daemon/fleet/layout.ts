/**
 * The fleet's key layout in etcd and the records kept there, shared by dsecd's
 * registration (daemon/fleet/registration.ts) and the gateway (gateway/). docs/ARCHITECTURE.md
 * "The fleet" has the same table for operators.
 *
 * Every key lives under a prefix (`--etcd-prefix`, default {@link DEFAULT_PREFIX}) and a
 * layout version segment, so two fleets can share one etcd and a later layout can sit
 * beside this one during an upgrade:
 *
 * | key | value | lease | written by |
 * |---|---|---|---|
 * | `<p>/v1/hosts/<name>/id` | the host id (16 hex) that owns the name | none | the host, once, by transaction |
 * | `<p>/v1/hosts/<name>/info` | {@link HostInfoRecord}: address, labels, backends, capacity | none | the host, at each registration |
 * | `<p>/v1/hosts/<name>/live` | {@link HostLiveRecord}: load; present only while the host is up | the host's | the host, every few seconds |
 * | `<p>/v1/hosts/<name>/images` | {@link HostImagesRecord}: images on the host | the host's | the host, when they change |
 * | `<p>/v1/cordons/<name>` | {@link CordonRecord} | none | gateways (`dsec host cordon/drain`) |
 * | `<p>/v1/tokens/<id>` | `{ hash }` of an API token (daemon/remote/tokens.ts) | none | gateways (`dsec token create` through one, `dsec-gateway token create`) |
 * | `<p>/v1/token-meta/<id>` | the token's record without its hash | none | gateways |
 * | `<p>/v1/revoked/<id>` | `{ at }`: the token is revoked | none | gateways and hosts (`dsec token revoke` anywhere) |
 * | `<p>/v1/idempotency/<tenant>/<sha256 of key>` | the name of the host a keyed create was sent to | a gateway's (24 h) | gateways (gateway/idempotency.ts) |
 * | `<p>/v1/quotas/<tenant>/usage` | `{ count, cpus, memory_bytes }`: the tenant's count against its fleet-wide quota | none | gateways, by compare-and-swap (gateway/quotas.ts) |
 * | `<p>/v1/quotas/<tenant>/held/<uuid>` | one create's reservation | the reserving gateway's (10 s) | gateways |
 * | `<p>/v1/quotas/<tenant>/made/<sandbox id>` | a counted sandbox's share and host | none | gateways |
 *
 * Token hashes sit apart from the rest of a token's record so that etcd's roles can let
 * hosts list tokens and revoke them without reading a hash or minting a token: only
 * gateways read `tokens/` (they authenticate callers), and a revocation is a key of its
 * own that any member may add and every door watches.
 *
 * Host names are keys, not ids, so that etcd's role-based access can give each host
 * write access to its own `hosts/<name>/` prefix and nothing else (a host's etcd user is
 * the CN of its certificate, which is its name); the id inside tells two dsecds that
 * claim one name apart.
 */
import { createHash, randomBytes } from 'node:crypto';
import { z } from 'zod';
import { invalidArgument } from '../errors.js';

/** Default key prefix of a fleet in etcd (`--etcd-prefix`). */
export const DEFAULT_PREFIX = '/dsec';

/** Version segment of the layout; a change of record shapes that old readers cannot take bumps it. */
export const LAYOUT_VERSION = 'v1';

/**
 * Host names: what `--host-name` accepts (a DNS label, 1-63 of `[a-z0-9-]`, not starting
 * or ending with `-`), so a name is safe in an etcd key, a URL path and a certificate CN.
 */
export const HOST_NAME_RE = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

/** Label keys and values of `--host-label k=v` (the sandbox label grammar: 1-63 of `[A-Za-z0-9._/-]`). */
export const HOST_LABEL_RE = /^[A-Za-z0-9._/-]{1,63}$/;

/**
 * Lease TTL of a host's registration: 5 s. A dead host disappears from the fleet within
 * it (the DESIGN target: visible within the TTL + 2 s); etcd3 renews at a third of it,
 * so a host rides over two lost keep-alives (a GC pause, a busy 2-core machine) before
 * its lease lapses.
 */
export const DEFAULT_LEASE_TTL_S = 5;
/** A host's `live` record is rewritten at least every 2 s: a gateway's view of load is at most that old between large changes. */
export const DEFAULT_REFRESH_MS = 2000;

/**
 * Parses `--etcd URL[,URL...]`: each URL `http(s)://host:port`.
 * @throws DsecError InvalidArgument naming the malformed entry.
 */
export function parseEndpoints(text: string | string[]): string[] {
  const list = (Array.isArray(text) ? text : text.split(',')).map((s) => s.trim()).filter(Boolean);
  if (!list.length) throw invalidArgument('--etcd needs at least one URL, e.g. https://10.0.0.1:2379');
  for (const u of list) {
    let url: URL;
    try {
      url = new URL(u);
    } catch {
      throw invalidArgument(`--etcd: ${JSON.stringify(u)} is not a URL (https://HOST:PORT)`);
    }
    if (!['http:', 'https:'].includes(url.protocol) || !url.port || (url.pathname !== '/' && url.pathname !== '')) {
      throw invalidArgument(`--etcd: ${JSON.stringify(u)} must be http(s)://HOST:PORT`);
    }
  }
  return list;
}

/** Key builders for one fleet prefix. */
export class FleetKeys {
  /** `<prefix>/v1/`: everything of the fleet. */
  readonly root: string;

  /** @param prefix e.g. `/dsec`; a trailing slash is dropped. */
  constructor(readonly prefix: string = DEFAULT_PREFIX) {
    this.root = `${prefix.replace(/\/+$/, '')}/${LAYOUT_VERSION}/`;
  }

  /** Prefix of every host's keys. */
  get hosts(): string {
    return `${this.root}hosts/`;
  }

  /** Prefix of one host's keys (what its etcd role may write). */
  host(name: string): string {
    return `${this.hosts}${name}/`;
  }

  hostId(name: string): string {
    return `${this.host(name)}id`;
  }

  hostInfo(name: string): string {
    return `${this.host(name)}info`;
  }

  hostLive(name: string): string {
    return `${this.host(name)}live`;
  }

  hostImages(name: string): string {
    return `${this.host(name)}images`;
  }

  /** Where a keyed create went: one key per (tenant, Idempotency-Key), the key hashed so any text fits. */
  idempotency(tenant: string, keyHash: string): string {
    return `${this.root}idempotency/${tenant}/${keyHash}`;
  }

  /** Prefix of fleet-wide tenant quota counts (gateway/quotas.ts): `<tenant>/usage`, `<tenant>/held/<uuid>`, `<tenant>/made/<id>`. */
  get quotas(): string {
    return `${this.root}quotas/`;
  }

  /** Prefix of cordon records. */
  get cordons(): string {
    return `${this.root}cordons/`;
  }

  cordon(name: string): string {
    return `${this.cordons}${name}`;
  }

  /** Prefix of token hashes (gateways only). */
  get tokens(): string {
    return `${this.root}tokens/`;
  }

  /** Prefix of token records without hashes. */
  get tokenMeta(): string {
    return `${this.root}token-meta/`;
  }

  /** Prefix of token revocations. */
  get revoked(): string {
    return `${this.root}revoked/`;
  }

  /**
   * Splits a key under {@link hosts} into host name and leaf (`id`, `info`, `live`,
   * `images`); null for any other key.
   */
  parseHostKey(key: string): { name: string; leaf: string } | null {
    if (!key.startsWith(this.hosts)) return null;
    const rest = key.slice(this.hosts.length).split('/');
    if (rest.length !== 2 || !HOST_NAME_RE.test(rest[0])) return null;
    return { name: rest[0], leaf: rest[1] };
  }

  /** The host name of a key under {@link cordons}, or null. */
  parseCordonKey(key: string): string | null {
    if (!key.startsWith(this.cordons)) return null;
    const name = key.slice(this.cordons.length);
    return HOST_NAME_RE.test(name) ? name : null;
  }
}

/** Backends a host may offer (the API's isolation tiers). */
export const FleetBackend = z.enum(['container', 'fncall', 'microvm', 'vm']);

/** `hosts/<name>/info`: what a host is; rewritten at each registration. */
export const HostInfoRecord = z.object({
  /** Host id (16 hex), persistent in the host's root (daemon/fleet/identity.ts). */
  id: z.string().regex(/^[0-9a-f]{16}$/),
  name: z.string().regex(HOST_NAME_RE),
  /** Id tag (6 hex) that begins the ids of the sandboxes and snapshots this host creates ({@link hostTag}). */
  tag: z.string().regex(/^[0-9a-f]{6}$/),
  /** Where gateways reach the host's API over mutual TLS, `https://ADDR:PORT`. */
  advertise: z.string().url(),
  labels: z.record(z.string().regex(HOST_LABEL_RE), z.string().regex(HOST_LABEL_RE)),
  /** Backends available on this host (host info's `backends.*.available`). */
  backends: z.array(FleetBackend),
  capacity: z.object({
    cores: z.number().int().min(1),
    memory_bytes: z.number().int().min(0),
    /** Size of the writable-layer store, bytes; null when the layers live on the host filesystem without a size. */
    disk_bytes: z.number().int().min(0).nullable(),
  }),
  /** Admission limits (dsecd's `[admission]`): what the limits of admitted sandboxes may sum to. */
  admission: z.object({
    max_sandboxes: z.number().int().min(0),
    cpus: z.number().min(0),
    memory_bytes: z.number().min(0),
    disk_bytes: z.number().min(0).nullable(),
  }),
  /** Limits a sandbox gets when its create names none (dsecd's `[defaults]`). */
  defaults: z.object({ cpus: z.number().positive(), memory_bytes: z.number().int().positive() }),
  version: z.string(),
  /** When this dsecd process started, ms since the epoch. */
  started_at: z.number().int(),
});
export type HostInfoRecord = z.infer<typeof HostInfoRecord>;

/** One warm pool's fill as a host reports it (daemon/sandbox/warm-pool.ts WarmPoolStats). */
export const WarmPoolFill = z.object({ image: z.string(), network: z.string(), ready: z.number().int().min(0), size: z.number().int().min(0) });

/** `hosts/<name>/live`: the host's load, under its lease, so it vanishes when the host stops renewing. */
export const HostLiveRecord = z.object({
  id: z.string().regex(/^[0-9a-f]{16}$/),
  /** Increments with each write by this dsecd process. */
  seq: z.number().int().min(0),
  /** When the host took these numbers, ms since the epoch (its clock). */
  at: z.number().int(),
  /** Sandboxes by state (warm-pool shells and fncall workers included). */
  sandboxes: z.record(z.string(), z.number().int().min(0)),
  /** What admission counts (sandboxes other than warm-pool shells): their number and the sums of their limits. */
  admitted: z.object({
    count: z.number().int().min(0),
    cpus: z.number().min(0),
    memory_bytes: z.number().min(0),
    disk_bytes: z.number().min(0),
  }),
  /** CPU use: the 1-minute load average and the busy fraction of all cores (0..1) since the previous record. */
  cpu: z.object({ load1: z.number().min(0), busy: z.number().min(0).max(1) }),
  /** MemAvailable of /proc/meminfo, bytes. */
  memory_available_bytes: z.number().int().min(0),
  warm_pools: z.array(WarmPoolFill),
  /** Sandboxes per value of the `job` label (the 256 largest jobs), for spreading or packing a job. */
  jobs: z.record(z.string(), z.number().int().min(0)),
  /**
   * Sandboxes whose id does not begin with the host's tag (made before the host joined the
   * fleet): a gateway that does not find such an id at the tag's host asks the hosts that have some.
   */
  untagged: z.number().int().min(0),
});
export type HostLiveRecord = z.infer<typeof HostLiveRecord>;

/** `hosts/<name>/images`: image references (`name:tag`) and their manifest digests on the host. */
export const HostImagesRecord = z.object({
  id: z.string().regex(/^[0-9a-f]{16}$/),
  /** Image names of the host's store; `tenant` is set for a tenant's own image (absent: a `system` image every tenant creates from). */
  images: z.array(z.object({
    ref: z.string(), digest: z.string().nullable(), tenant: z.string().optional(),
    /** Sum of the image's layer blobs, bytes: what a copy to another host moves (placement's copy cost, gateway/placement.ts). Absent from older hosts. */
    size_bytes: z.number().int().min(0).optional(),
  })),
});
export type HostImagesRecord = z.infer<typeof HostImagesRecord>;

/** `cordons/<name>`: no new placements on the host; `drain` also means its sandboxes are to leave. */
export const CordonRecord = z.object({
  at: z.number().int(),
  /** Who cordoned it (the caller's tenant/token name as the gateway saw it). */
  by: z.string(),
  drain: z.boolean(),
});
export type CordonRecord = z.infer<typeof CordonRecord>;

/**
 * Parses a record with `schema`; null (never a throw) when the bytes are not JSON of that
 * shape, so one malformed key never stops a watcher.
 */
export function parseRecord<S extends z.ZodType>(schema: S, raw: Buffer | string | null | undefined): z.infer<S> | null {
  if (raw === null || raw === undefined) return null;
  try {
    const r = schema.safeParse(JSON.parse(typeof raw === 'string' ? raw : raw.toString('utf8')));
    return r.success ? r.data : null;
  } catch {
    return null;
  }
}

/**
 * The id tag of a host: the first 6 hex digits of sha256("dsec-host-tag:" + host id).
 * Sandbox and snapshot ids made by a host in a fleet begin with it ({@link taggedId}), so a
 * gateway finds the host of an id in its in-memory table, without asking etcd or the
 * hosts. 24 bits: among 160 hosts two share a tag with probability ~0.08%; a gateway
 * that sees a shared tag asks each host with it (gateway/router.ts).
 */
export function hostTag(hostId: string): string {
  return createHash('sha256').update(`dsec-host-tag:${hostId}`).digest('hex').slice(0, 6);
}

export { taggedId } from '../model/ids.js';

/**
 * An image's content identity for the fleet's image records: `sha256:` of its layer
 * digests (lowest first) joined by commas, so two hosts holding the same layers under one
 * name report the same digest.
 */
export function imageDigest(layers: readonly string[]): string {
  return `sha256:${createHash('sha256').update(layers.join(',')).digest('hex')}`;
}

/** The tag part of a 16-hex id (its first 6 digits), or null for anything else. */
export function tagOfId(id: string): string | null {
  const m = /^(?:snap-)?([0-9a-f]{16})$/.exec(id);
  return m ? m[1].slice(0, 6) : null;
}
