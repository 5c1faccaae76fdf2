/**
 * Per-sandbox envd access tokens of the E2B front (`envdAccessToken`, sent back by the
 * SDKs as `X-Access-Token` on every in-sandbox request), and the signatures of E2B's
 * pre-signed file URLs.
 *
 * A token is `<sandbox id>.<mac>`, where mac is HMAC-SHA256 under a 256-bit key from the
 * CSPRNG (`<root>/e2b/envd.key`, mode 0600, made at first start), over a domain
 * separator and the sandbox id, in base64url (43 characters, 256 bits). Why this shape:
 * - nothing per sandbox is stored: dsecd keeps only the key and recomputes a sandbox's
 *   token to check one, so its database holds no secret (a copy of dsec.db lets nobody
 *   into a sandbox) and every sandbox, whoever made it (E2B, `dsec create`, a restore or
 *   a fork), has a token without a migration or a write at create;
 * - the token is unguessable without the key: each is a PRF output under 256 random key
 *   bits (the issue's floor is 128 random bits); a sandbox's token differs from any
 *   other's, and knowing ids (they show in listings) does not help;
 * - the token names its sandbox: the 2.8 SDKs send `/files` requests with no
 *   `E2b-Sandbox-Id` header, so the token alone must route them;
 * - checking never tells whether a sandbox exists: a token is verified against the id it
 *   names (or the request names) before any lookup, in constant time;
 * - pre-signed URLs (`signature`, `signature_expiration`) can be checked, because the
 *   signature is a hash over the token itself (E2B's scheme, below).
 * A token lives as long as its sandbox id: E2B offers no rotation either. Rotating the
 * key file (and restarting dsecd) invalidates every token at once; clients get new ones
 * from `Sandbox.connect`.
 */
import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { mkdirSync, openSync, readFileSync, writeSync, closeSync, chmodSync } from 'node:fs';
import path from 'node:path';
import { internal } from '../../errors.js';

/** Domain separator of the MAC, so the key can never produce a value valid elsewhere. */
const MAC_CONTEXT = 'dsec-e2b-envd-access-token-v1\0';

/** Sandbox ids: 16 lowercase hex (daemon/sandbox/repo.ts). */
export const SANDBOX_ID_RE = /^[0-9a-f]{16}$/;

/** Well-formed token text: sandbox id, a dot, 43 base64url characters (256 bits). */
export const ENVD_TOKEN_RE = /^([0-9a-f]{16})\.([A-Za-z0-9_-]{43})$/;

/** Key length, bytes: 256 bits, HMAC-SHA256's block-size-independent sweet spot. */
export const ENVD_KEY_BYTES = 32;

/** Makes and checks envd access tokens under one key (see the module comment). */
export class EnvdTokens {
  /** @param key the HMAC key, {@link ENVD_KEY_BYTES} bytes */
  constructor(private readonly key: Buffer) {
    if (key.length !== ENVD_KEY_BYTES) throw internal(`envd token key must be ${ENVD_KEY_BYTES} bytes, got ${key.length}`);
  }

  /**
   * Reads the key at `file`, making it (mode 0600, its directory 0700) when absent.
   * @throws DsecError Internal when the file exists but does not hold {@link ENVD_KEY_BYTES} bytes.
   */
  static fromFile(file: string): EnvdTokens {
    let key: Buffer;
    try {
      key = readFileSync(file);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
      mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
      const fresh = randomBytes(ENVD_KEY_BYTES);
      // O_EXCL: two starts racing on a fresh root never end up with two keys.
      try {
        const fd = openSync(file, 'wx', 0o600);
        try {
          writeSync(fd, fresh);
        } finally {
          closeSync(fd);
        }
        chmodSync(file, 0o600);
        key = fresh;
      } catch (e2) {
        if ((e2 as NodeJS.ErrnoException).code !== 'EEXIST') throw e2;
        key = readFileSync(file);
      }
    }
    if (key.length !== ENVD_KEY_BYTES) throw internal(`${file} holds ${key.length} bytes; an envd token key is ${ENVD_KEY_BYTES} random bytes (remove the file to make a new one: every sandbox's token changes)`);
    return new EnvdTokens(key);
  }

  private mac(id: string): Buffer {
    return createHmac('sha256', this.key).update(MAC_CONTEXT).update(id).digest();
  }

  /** The token of sandbox `id` (16 hex). */
  tokenOf(id: string): string {
    return `${id}.${this.mac(id).toString('base64url')}`;
  }

  /**
   * Checks a presented token, in constant time over its secret part.
   * @param expectId the sandbox the request names (header or host), or null to take the one the token names
   * @returns the sandbox id it is valid for, or null for a missing, malformed or wrong token (one answer for all)
   */
  verify(token: string | undefined, expectId: string | null): string | null {
    if (!token) return null;
    const m = ENVD_TOKEN_RE.exec(token);
    if (!m) return null;
    const id = m[1];
    const want = this.mac(id);
    const got = Buffer.from(m[2], 'base64url');
    const ok = got.length === want.length && timingSafeEqual(got, want);
    // The id comparison comes after the MAC, so a token of another sandbox costs the same.
    if (!ok || (expectId !== null && expectId !== id)) return null;
    return id;
  }

  /**
   * Checks the signature of a pre-signed file URL (E2B's scheme: `v1_` + base64 of
   * SHA-256 over `path:operation:user:token`, plus `:expiration` when the URL expires,
   * `=` padding dropped; user '' for the default user).
   * @param expiration unix seconds, or null for a URL that never expires
   * @param now ms since the epoch
   * @returns true when it matches sandbox `id`'s token and has not expired
   */
  verifySignature(id: string, sig: string, op: 'read' | 'write', filePath: string, user: string, expiration: number | null, now = Date.now()): boolean {
    if (expiration !== null && (!Number.isFinite(expiration) || expiration * 1000 < now)) return false;
    const raw = `${filePath}:${op}:${user}:${this.tokenOf(id)}${expiration !== null ? `:${expiration}` : ''}`;
    const want = Buffer.from(`v1_${createHash('sha256').update(raw).digest('base64').replace(/=+$/, '')}`);
    const got = Buffer.from(sig);
    return got.length === want.length && timingSafeEqual(got, want);
  }
}
