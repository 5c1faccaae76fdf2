/**
 * A host's persistent fleet identity: a random 16-hex id kept in `<root>/fleet/host.json`,
 * made at the first start with a fleet configured and never changed after. The id (not
 * the name) is what a registration claims a host name with, so two dsecds that share a
 * name (network namespaces of one machine, a copied config) are told apart, and the
 * id's tag begins the ids of what the host creates (daemon/fleet/layout.ts hostTag).
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { failedPrecondition } from '../errors.js';
import { hostTag } from './layout.js';

/** A host's identity as kept in its root. */
export interface HostIdentity {
  /** 16 hex. */
  id: string;
  /** {@link hostTag} of the id. */
  tag: string;
  /** When the id was made, ms since the epoch. */
  createdAt: number;
}

const IdentityFile = z.object({ id: z.string().regex(/^[0-9a-f]{16}$/), created_at: z.number().int() });

/** Path of the identity file under a dsecd root. */
export function identityFile(root: string): string {
  return path.join(root, 'fleet', 'host.json');
}

/**
 * Reads the host identity of `root`, making it on first use (written to a temp file and
 * renamed, so a crash never leaves half a file).
 * @throws DsecError FailedPrecondition when the file exists but is not a valid identity
 *   (never replaced silently: sandboxes of the old id would lose their routing).
 */
export function loadOrCreateIdentity(root: string): HostIdentity {
  const file = identityFile(root);
  let text: string | null = null;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
  }
  if (text !== null) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = null;
    }
    const r = IdentityFile.safeParse(parsed);
    if (!r.success) throw failedPrecondition(`${file} is not a valid host identity; restore it from a backup, or remove it to give this host a new id (its sandboxes' ids then no longer name it)`);
    return { id: r.data.id, tag: hostTag(r.data.id), createdAt: r.data.created_at };
  }
  const id = randomBytes(8).toString('hex');
  const createdAt = Date.now();
  mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
  const tmp = `${file}.tmp`;
  writeFileSync(tmp, `${JSON.stringify({ id, created_at: createdAt })}\n`, { mode: 0o600 });
  renameSync(tmp, file);
  return { id, tag: hostTag(id), createdAt };
}
