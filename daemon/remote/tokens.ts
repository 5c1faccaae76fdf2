/**
 * API tokens of the TCP door: their text, their hash, where hashes live (a
 * {@link TokenStore}), and checking a presented token.
 *
 * A token is `e2b_` + 16 hex (its id) + 32 hex (a 128-bit secret from the CSPRNG): 52
 * characters matching `^e2b_[0-9a-f]+$`, the shape E2B's SDKs check an API key against
 * (issue 16 serves E2B's API on the same tokens). It is shown once, at creation; stores
 * keep only `HMAC-SHA256(key = "dsec-token-v1", token)`.
 *
 * Why a fast hash is enough: the secret is 128 random bits, not a password a person
 * chose, so there is no dictionary to try; inverting SHA-256 over a 2^128 space is out of
 * reach however fast each guess is. A slow KDF (scrypt, argon2) only helps low-entropy
 * secrets and would cost every request milliseconds. The HMAC key is a fixed, public
 * domain separator (not a pepper), so a store (SQLite here, etcd for a fleet) needs no
 * secret of its own and every dsecd and gateway of a fleet computes the same hash.
 * A stolen hash does not authenticate: the door hashes what it is given.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Db } from '../db/db.js';
import { invalidArgument, notFound } from '../errors.js';
import { TENANT_RE } from '../model/tenant.js';

/** Roles a token carries (docs/SECURITY.md "The TCP door"). */
export const TOKEN_ROLES = ['admin', 'user', 'reader', 'metrics'] as const;
/**
 * One of {@link TOKEN_ROLES}: `admin` everything, every tenant; `user` its tenant's
 * objects, no host-wide operation; `reader` reads only (GET, no attach); `metrics` GET
 * /metrics only (a Prometheus scraper).
 */
export type TokenRole = (typeof TOKEN_ROLES)[number];

/** Tenant names and the system tenant: the domain's (daemon/model/tenant.ts), re-exported for the door's callers. */
export { SYSTEM_TENANT, TENANT_RE } from '../model/tenant.js';

/** Well-formed token text: `e2b_`, 16 hex id, 32 hex secret. */
export const TOKEN_RE = /^e2b_([0-9a-f]{16})([0-9a-f]{32})$/;

/** A stored token: everything but its secret. Times are ms since the Unix epoch. */
export interface TokenRecord {
  /** 16 hex; the first part of the token text, shown by `dsec token ls`. */
  id: string;
  tenant: string;
  role: TokenRole;
  /** HMAC-SHA256 of the token text (see the module comment), 64 hex. */
  hash: string;
  /** Free text the admin gave (`--description`), or null. */
  description: string | null;
  created_at: number;
  /** When it stops authenticating, or null for never. */
  expires_at: number | null;
  /** When it was revoked, or null. */
  revoked_at: number | null;
}

/** A token as the API lists it: the record without its hash, plus its state now. */
export interface TokenView extends Omit<TokenRecord, 'hash'> {
  /** `active`, `expired` or `revoked`. */
  state: 'active' | 'expired' | 'revoked';
}

/**
 * Where token records live. dsecd's own is {@link SqliteTokenStore}; a fleet keeps them
 * in etcd (issue 20), so the door does not care where. Methods may be asynchronous.
 */
export interface TokenStore {
  /** Adds a record. @throws DsecError AlreadyExists for an id already stored. */
  put(rec: TokenRecord): Promise<void>;
  /** The record of `id`, or null. */
  get(id: string): Promise<TokenRecord | null>;
  /** Every record, oldest first. */
  list(): Promise<TokenRecord[]>;
  /** Marks `id` revoked at `at` (a second revoke keeps the first time). @returns the record, or null when there is none. */
  revoke(id: string, at: number): Promise<TokenRecord | null>;
  /**
   * Calls `fn` with the id of each token revoked elsewhere (another dsecd or gateway of a
   * fleet), so this process closes its open streams at once. @returns an unsubscribe.
   * A store only this process writes need not implement it.
   */
  watchRevocations?(fn: (id: string) => void): () => void;
}

/** Token records in dsecd's SQLite database (table `tokens`, migration 9). */
export class SqliteTokenStore implements TokenStore {
  constructor(private readonly db: Db) {}

  async put(rec: TokenRecord): Promise<void> {
    this.db.prepare('INSERT INTO tokens (id, tenant, role, hash, description, created_at, expires_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)')
      .run(rec.id, rec.tenant, rec.role, rec.hash, rec.description, rec.created_at, rec.expires_at, rec.revoked_at);
  }

  async get(id: string): Promise<TokenRecord | null> {
    return (this.db.prepare('SELECT * FROM tokens WHERE id = ?').get(id) as TokenRecord | undefined) ?? null;
  }

  async list(): Promise<TokenRecord[]> {
    return this.db.prepare('SELECT * FROM tokens ORDER BY created_at, id').all() as TokenRecord[];
  }

  async revoke(id: string, at: number): Promise<TokenRecord | null> {
    this.db.prepare('UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL').run(at, id);
    return this.get(id);
  }
}

/** The hash stores keep of a token text. */
export function tokenHash(token: string): string {
  return createHmac('sha256', 'dsec-token-v1').update(token).digest('hex');
}

/** Why a presented token was refused: for metrics and dsecd's log only, never for the caller. */
export type AuthFailure = 'missing' | 'malformed' | 'unknown' | 'revoked' | 'expired';

/** A fixed hash compared against when the id is unknown, so unknown and known ids cost the same. */
const DUMMY_HASH = tokenHash('e2b_' + '0'.repeat(48));

/** View of a record at time `now`. */
export function tokenView(r: TokenRecord, now = Date.now()): TokenView {
  const { hash: _hash, ...rest } = r;
  return { ...rest, state: r.revoked_at !== null ? 'revoked' : r.expires_at !== null && r.expires_at <= now ? 'expired' : 'active' };
}

/**
 * Token lifecycle over a {@link TokenStore}: create (the text is returned once), list,
 * revoke, and check a presented text. Revocations (here, or reported by the store's
 * watch) are announced to {@link onRevoke} listeners, which close that token's streams.
 */
export class TokenService {
  private readonly listeners = new Set<(id: string) => void>();
  private readonly unwatch: (() => void) | undefined;

  constructor(readonly store: TokenStore, private readonly now: () => number = Date.now) {
    this.unwatch = store.watchRevocations?.((id) => this.announce(id));
  }

  /**
   * Makes a token.
   * @param ttlMs lifetime in ms, or null for a token that never expires
   * @returns the token text (shown once: only its hash is kept) and its view.
   * @throws DsecError InvalidArgument for a bad tenant, role or ttl.
   */
  async create(opts: { tenant: string; role: TokenRole; ttlMs: number | null; description?: string | null }): Promise<{ token: string; view: TokenView }> {
    if (!TENANT_RE.test(opts.tenant)) throw invalidArgument(`tenant ${JSON.stringify(opts.tenant)}: 1-63 of a-z, 0-9, '_', '-', starting with a letter or digit`);
    if (!(TOKEN_ROLES as readonly string[]).includes(opts.role)) throw invalidArgument(`role ${JSON.stringify(opts.role)}: one of ${TOKEN_ROLES.join(', ')}`);
    if (opts.ttlMs !== null && !(opts.ttlMs > 0)) throw invalidArgument('ttl must be positive');
    const id = randomBytes(8).toString('hex');
    const token = `e2b_${id}${randomBytes(16).toString('hex')}`;
    const now = this.now();
    const rec: TokenRecord = {
      id, tenant: opts.tenant, role: opts.role, hash: tokenHash(token), description: opts.description ?? null,
      created_at: now, expires_at: opts.ttlMs === null ? null : now + opts.ttlMs, revoked_at: null,
    };
    await this.store.put(rec);
    return { token, view: tokenView(rec, now) };
  }

  /** Every token, without hashes. */
  async list(): Promise<TokenView[]> {
    const now = this.now();
    return (await this.store.list()).map((r) => tokenView(r, now));
  }

  /**
   * Revokes token `id`: it stops authenticating at once, and the streams it opened close.
   * @throws DsecError NotFound when there is no such token.
   */
  async revoke(id: string): Promise<TokenView> {
    if (!/^[0-9a-f]{16}$/.test(id)) throw notFound(`token ${id} not found`);
    const r = await this.store.revoke(id, this.now());
    if (!r) throw notFound(`token ${id} not found`);
    this.announce(id);
    return tokenView(r, this.now());
  }

  /**
   * Checks a presented token text.
   * @returns its record, or why it was refused (the caller answers every refusal alike).
   */
  async check(text: string | undefined): Promise<{ ok: true; rec: TokenRecord } | { ok: false; why: AuthFailure }> {
    if (text === undefined || text === '') return { ok: false, why: 'missing' };
    const m = TOKEN_RE.exec(text);
    if (!m) return { ok: false, why: 'malformed' };
    const rec = await this.store.get(m[1]);
    const want = Buffer.from(rec?.hash ?? DUMMY_HASH, 'hex');
    const got = Buffer.from(tokenHash(text), 'hex');
    if (!rec || want.length !== got.length || !timingSafeEqual(want, got)) return { ok: false, why: 'unknown' };
    if (rec.revoked_at !== null) return { ok: false, why: 'revoked' };
    if (rec.expires_at !== null && rec.expires_at <= this.now()) return { ok: false, why: 'expired' };
    return { ok: true, rec };
  }

  /** Calls `fn(id)` whenever a token is revoked. @returns an unsubscribe. */
  onRevoke(fn: (id: string) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  private announce(id: string): void {
    for (const fn of this.listeners) fn(id);
  }

  /** Stops watching the store. */
  close(): void {
    this.unwatch?.();
  }
}
