/**
 * Image names per tenant in the layer store (daemon/image/layer-store.ts): a name
 * resolves in the caller's tenant first, then in `system`; another tenant's image of the
 * name answers as a missing one; writes replace only the writer's tenant's name; the
 * store written before tenancy (manifests/ only) reads as system images; prune keeps
 * every tenant's layers. Blobs are plain files here: the manifest rules never read them.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { LayerStore, type ImageManifest } from '../../daemon/image/layer-store.js';
import { SYSTEM_SCOPE, tenantScope, type Scope } from '../../daemon/model/tenant.js';

const dir = mkdtempSync(join(tmpdir(), 'dsec-image-tenants-'));
const root = join(dir, 'store');
const A = tenantScope('team-a'), B = tenantScope('team-b');
const ADMIN_B: Scope = { tenant: 'team-b', all: true };
let store: LayerStore;

/** A blob with content `text` in the store (old enough for prune), its digest. */
function blob(text: string): string {
  const hex = createHash('sha256').update(text).digest('hex');
  mkdirSync(join(root, 'blobs', 'sha256'), { recursive: true });
  writeFileSync(join(root, 'blobs', 'sha256', hex), text);
  return `sha256:${hex}`;
}

const manifest = (name: string, tag: string, layers: string[], tenant?: string): ImageManifest => ({
  name, tag, layers, config: { env: [], cwd: '/', user: '0', cmd: ['/bin/sh'] }, created_ms: 1, ...(tenant ? { tenant } : {}),
});

/** A manifest file as dsecd wrote it before image names had a tenant. */
function oldLayoutManifest(name: string, tag: string, layers: string[]): void {
  const d = join(root, 'manifests', ...name.split('/'));
  mkdirSync(d, { recursive: true });
  writeFileSync(join(d, `@${tag}.json`), JSON.stringify(manifest(name, tag, layers)));
}

let base: string, la: string, lb: string;

beforeAll(async () => {
  base = blob('base');
  la = blob('content of a');
  lb = blob('content of b');
  oldLayoutManifest('busybox', 'latest', [base]);
  oldLayoutManifest('team/py', '1', [base]);
  store = new LayerStore({ root, pruneGraceMs: 0 });
  await store.init();
  await store.putManifest(manifest('app', 'v1', [base, la], 'team-a'));
  await store.putManifest(manifest('app', 'v1', [base, lb], 'team-b'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('image names per tenant', () => {
  it('reads the store written before tenancy as system images every tenant sees', async () => {
    for (const s of [SYSTEM_SCOPE, A, B]) {
      const m = await store.get('busybox', s);
      expect(m.layers).toEqual([base]);
      expect(m.tenant).toBeUndefined();
    }
    expect(existsSync(join(root, 'manifests', 'busybox', '@latest.json'))).toBe(true);
  });

  it("resolves a name in the caller's tenant; another tenant's answers as a missing one", async () => {
    expect((await store.get('app:v1', A)).layers).toEqual([base, la]);
    expect((await store.get('app:v1', B)).layers).toEqual([base, lb]);
    const other = await store.get('app:v1', tenantScope('team-c')).catch((e: Error) => e);
    const missing = await store.get('nope:v1', tenantScope('team-c')).catch((e: Error) => e);
    expect(other).toMatchObject({ kind: 'NotFound', message: 'image app:v1 not found' });
    expect(missing).toMatchObject({ kind: 'NotFound', message: 'image nope:v1 not found' });
    // An admin resolves in its own tenant too (then system), never in another's.
    await expect(store.get('app:v1', SYSTEM_SCOPE)).rejects.toMatchObject({ kind: 'NotFound' });
    expect((await store.get('app:v1', ADMIN_B)).layers).toEqual([base, lb]);
  });

  it("lists a tenant's own and the system images, an admin every tenant's, with whose each is", async () => {
    const refs = async (s?: Scope) => (await store.list(s)).map((m) => `${m.tenant ?? 'system'}/${m.name}:${m.tag}`);
    expect(await refs(A)).toEqual(['team-a/app:v1', 'system/busybox:latest', 'system/team/py:1']);
    expect(await refs(B)).toEqual(['team-b/app:v1', 'system/busybox:latest', 'system/team/py:1']);
    expect(await refs(SYSTEM_SCOPE)).toEqual(['team-a/app:v1', 'team-b/app:v1', 'system/busybox:latest', 'system/team/py:1']);
    expect(await refs()).toEqual(await refs(SYSTEM_SCOPE));
  });

  it("tags into the caller's tenant: a system name is shadowed for it only, never replaced", async () => {
    const t = await store.tag('app:v1', 'team/py:1', B);
    expect(t).toMatchObject({ tenant: 'team-b', layers: [base, lb] });
    expect((await store.get('team/py:1', B)).layers).toEqual([base, lb]);
    expect((await store.get('team/py:1', A)).layers).toEqual([base]);
    expect((await store.get('team/py:1', SYSTEM_SCOPE)).layers).toEqual([base]);
    // B removing the name removes B's; the system image shows through again.
    expect(await store.removeImage('team/py:1', B)).toMatchObject({ tenant: 'team-b' });
    expect((await store.get('team/py:1', B)).layers).toEqual([base]);
  });

  it("refuses a user's removal of a system image (PermissionDenied), allows an admin's; B's removal leaves A's", async () => {
    await expect(store.removeImage('busybox', B)).rejects.toMatchObject({ kind: 'PermissionDenied', message: expect.stringContaining('system image') });
    expect((await store.get('busybox', B)).layers).toEqual([base]);
    await store.putManifest(manifest('scratch', 'x', [base]));
    expect(await store.removeImage('scratch:x', ADMIN_B)).toMatchObject({ name: 'scratch' });
    await store.putManifest(manifest('gone', 'v1', [lb], 'team-b'));
    await expect(store.removeImage('gone:v1', A)).rejects.toMatchObject({ kind: 'NotFound', message: 'image gone:v1 not found' });
    await store.removeImage('gone:v1', B);
    await store.putManifest(manifest('app', 'v2', [la], 'team-b'));
    await store.removeImage('app:v2', B);
    expect((await store.get('app:v1', A)).layers).toEqual([base, la]);
  });

  it("prune keeps the layers any tenant's image names", async () => {
    const orphan = blob('no image names this');
    const rep = await store.prune(new Set(), { now: Date.now() + 1000 });
    expect(rep.removed.map((l) => l.digest)).toEqual([orphan]);
    for (const d of [base, la, lb]) expect(await store.hasBlob(d)).toBe(true);
  });

  it('refuses a tenant name that is not one (no path out of tenants/)', async () => {
    await expect(store.putManifest(manifest('x', 'y', [base], '../manifests'))).rejects.toMatchObject({ kind: 'InvalidArgument' });
    await expect(store.get('x:y', tenantScope('../x'))).rejects.toMatchObject({ kind: 'InvalidArgument' });
  });

  it('two removes of one name racing: one removes it, the other is NotFound (never a failed unlink)', async () => {
    for (let i = 0; i < 10; i++) {
      await store.putManifest(manifest('race', `v${i}`, [base], 'team-b'));
      const r = await Promise.allSettled([store.removeImage(`race:v${i}`, B), store.removeImage(`race:v${i}`, B)]);
      expect(r.filter((x) => x.status === 'fulfilled')).toHaveLength(1);
      expect(r.flatMap((x) => (x.status === 'rejected' ? [(x.reason as { kind?: string }).kind] : []))).toEqual(['NotFound']);
    }
  });
});
