/**
 * The fleet's token store (daemon/remote/tokens.ts TokenStore) in etcd: with a fleet,
 * etcd is the one store of API tokens, so a token made at one gateway works at every
 * gateway and a token revoked anywhere (a gateway, or a host's Unix socket) is refused
 * everywhere at once. daemon/fleet/layout.ts has the keys: a hash under `tokens/`
 * (gateways only), the rest under `token-meta/`, a revocation under `revoked/`.
 *
 * Reads come from in-memory mirrors of those prefixes (daemon/fleet/mirror.ts), so
 * checking a presented token never waits for etcd; a store that may not read hashes (a
 * host's) mirrors only the records and revocations.
 */
import { EtcdPermissionDeniedError, type Etcd3 } from 'etcd3';
import type { Logger } from 'pino';
import { z } from 'zod';
import { alreadyExists, DsecError } from '../errors.js';
import { TOKEN_ROLES, type TokenRecord, type TokenStore } from '../remote/tokens.js';
import type { FleetKeys } from './layout.js';
import { parseRecord } from './layout.js';
import { PrefixMirror } from './mirror.js';

const Meta = z.object({
  id: z.string().regex(/^[0-9a-f]{16}$/),
  tenant: z.string(),
  role: z.enum(TOKEN_ROLES),
  description: z.string().nullable(),
  created_at: z.number().int(),
  expires_at: z.number().int().nullable(),
});
const Hash = z.object({ hash: z.string().regex(/^[0-9a-f]{64}$/) });
const Revoked = z.object({ at: z.number().int() });

/** Turns etcd's permission refusal into the API's PermissionDenied, naming what this member may not do. */
function denied(e: unknown, what: string): never {
  if (e instanceof EtcdPermissionDeniedError) {
    throw new DsecError('PermissionDenied', `this fleet member may not ${what} in etcd (its etcd role does not allow it); do it through a gateway`, { cause: e });
  }
  throw e;
}

/** Token records in etcd; see the module comment. */
export class EtcdTokenStore implements TokenStore {
  private readonly meta: PrefixMirror;
  private readonly revoked: PrefixMirror;
  private readonly hashes: PrefixMirror | null;
  private readonly revocationListeners = new Set<(id: string) => void>();

  /**
   * @param readHashes whether this member may read token hashes (gateways); a host's store does not, and cannot authenticate tokens.
   */
  constructor(private readonly etcd: Etcd3, private readonly keys: FleetKeys, log: Logger, readonly readHashes: boolean) {
    this.meta = new PrefixMirror(etcd, keys.tokenMeta, log);
    this.revoked = new PrefixMirror(etcd, keys.revoked, log);
    this.hashes = readHashes ? new PrefixMirror(etcd, keys.tokens, log) : null;
    this.revoked.on('change', (c: { key: string; value: Buffer | null }) => {
      if (c.value === null) return;
      const id = c.key.slice(keys.revoked.length);
      for (const fn of this.revocationListeners) fn(id);
    });
  }

  /** Reads the prefixes and starts their watches (retrying while etcd is unreachable). */
  async start(signal?: AbortSignal): Promise<void> {
    await Promise.all([this.meta.start(signal), this.revoked.start(signal), this.hashes?.start(signal)]);
  }

  /** Whether every mirror's watch is up (else answers are the last known). */
  get connected(): boolean {
    return this.meta.connected && this.revoked.connected && (this.hashes?.connected ?? true);
  }

  /**
   * Adds a token: its hash and record in one transaction that requires the id to be new.
   * @throws DsecError AlreadyExists for a known id; PermissionDenied where etcd's role forbids writing tokens (a host).
   */
  async put(rec: TokenRecord): Promise<void> {
    const { hash, revoked_at: _r, ...meta } = rec;
    const r = await this.etcd.if(this.keys.tokens + rec.id, 'Create', '==', 0)
      .then(
        this.etcd.put(this.keys.tokens + rec.id).value(JSON.stringify({ hash })),
        this.etcd.put(this.keys.tokenMeta + rec.id).value(JSON.stringify(meta)),
      )
      .commit().catch((e) => denied(e, 'create tokens'));
    if (!r.succeeded) throw alreadyExists(`token ${rec.id} exists`);
    // The mirrors see the write through their watches; record it now so a check right after create succeeds.
    this.hashes?.entries.set(this.keys.tokens + rec.id, Buffer.from(JSON.stringify({ hash })));
    this.meta.entries.set(this.keys.tokenMeta + rec.id, Buffer.from(JSON.stringify(meta)));
  }

  /** The record of `id` from memory; its hash is '' where this member cannot read hashes. */
  async get(id: string): Promise<TokenRecord | null> {
    const meta = parseRecord(Meta, this.meta.entries.get(this.keys.tokenMeta + id));
    if (!meta) return null;
    const hash = this.hashes ? parseRecord(Hash, this.hashes.entries.get(this.keys.tokens + id))?.hash : '';
    if (hash === undefined) return null;
    const rev = parseRecord(Revoked, this.revoked.entries.get(this.keys.revoked + id));
    return { ...meta, hash, revoked_at: rev ? rev.at : null };
  }

  /** Every record, oldest first (hashes '' where this member cannot read them). */
  async list(): Promise<TokenRecord[]> {
    const out: TokenRecord[] = [];
    for (const key of this.meta.entries.keys()) {
      const r = await this.get(key.slice(this.keys.tokenMeta.length));
      if (r) out.push(this.hashes ? r : { ...r, hash: '' });
    }
    return out.sort((a, b) => a.created_at - b.created_at || a.id.localeCompare(b.id));
  }

  /**
   * Revokes `id` (its revocation key is created once; a second revoke keeps the first time).
   * @returns the record, or null when no token has this id.
   */
  async revoke(id: string, at: number): Promise<TokenRecord | null> {
    if (!this.meta.entries.has(this.keys.tokenMeta + id)) {
      // Not in memory yet (made a moment ago elsewhere): ask etcd.
      const v = await this.etcd.get(this.keys.tokenMeta + id).buffer();
      if (!v) return null;
      this.meta.entries.set(this.keys.tokenMeta + id, v);
    }
    await this.etcd.if(this.keys.revoked + id, 'Create', '==', 0)
      .then(this.etcd.put(this.keys.revoked + id).value(JSON.stringify({ at })))
      .commit().catch((e) => denied(e, 'revoke tokens'));
    if (!this.revoked.entries.has(this.keys.revoked + id)) this.revoked.entries.set(this.keys.revoked + id, Buffer.from(JSON.stringify({ at })));
    const rec = await this.get(id);
    return rec ?? { ...parseRecord(Meta, this.meta.entries.get(this.keys.tokenMeta + id))!, hash: '', revoked_at: at };
  }

  /** Calls `fn(id)` for every revocation seen in etcd (made here or by any other member). */
  watchRevocations(fn: (id: string) => void): () => void {
    this.revocationListeners.add(fn);
    return () => this.revocationListeners.delete(fn);
  }

  /** Stops the watches. */
  async close(): Promise<void> {
    await Promise.all([this.meta.close(), this.revoked.close(), this.hashes?.close()]);
  }
}
