/**
 * Idempotency keys and held creates (daemon/sandbox/create-records.ts) on a real SQLite
 * store: a key runs its create once, a concurrent retry waits for it, a reused key with
 * another request is refused, a failed create leaves no key; held sandboxes past their
 * deadline are taken with their keys, acknowledged ones never are, a replay does not
 * re-hold an acknowledged sandbox, and all of it survives reopening the store.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { openDb, type Db } from '../../daemon/db/db.js';
import { CreateRecords, idsOf } from '../../daemon/sandbox/create-records.js';

describe('CreateRecords', () => {
  const dirs: string[] = [];
  const dbs: Db[] = [];
  afterEach(() => {
    for (const d of dbs.splice(0)) d.close();
    for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
  });
  function open(file?: string) {
    const f = file ?? path.join((dirs.push(mkdtempSync(path.join(os.tmpdir(), 'dsec-cr-'))), dirs[dirs.length - 1]), 'db.sqlite');
    const db = openDb(f);
    dbs.push(db);
    let t = 1_000_000;
    const clock = { set: (v: number) => (t = v), get: () => t };
    return { f, db, clock, rec: new CreateRecords(db, { keyTtlMs: 60_000, ackTimeoutMs: 5_000, now: () => t }) };
  }
  const fp = CreateRecords.fingerprint('POST', '/v1/sandboxes', { image: 'busybox' });

  it('runs a keyed create once; a concurrent retry waits for it; a later retry replays it', async () => {
    const { rec } = open();
    let runs = 0;
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const create = async () => {
      runs++;
      await gate;
      return { id: 'aaaaaaaaaaaaaaaa' };
    };
    const a = rec.once('t', 'k1', fp, create);
    const b = rec.once('t', 'k1', fp, create);
    release();
    expect(await a).toEqual({ result: { id: 'aaaaaaaaaaaaaaaa' }, replayed: false });
    expect(await b).toEqual({ result: { id: 'aaaaaaaaaaaaaaaa' }, replayed: true });
    expect(await rec.once('t', 'k1', fp, create)).toEqual({ result: { id: 'aaaaaaaaaaaaaaaa' }, replayed: true });
    expect(runs).toBe(1);
    // Another tenant's same key is another create.
    expect((await rec.once('u', 'k1', fp, create)).replayed).toBe(false);
    expect(runs).toBe(2);
  });

  it('refuses a key reused for another request, and keeps no key for a failed create', async () => {
    const { rec } = open();
    await rec.once('t', 'k', fp, async () => ({ id: 'aaaaaaaaaaaaaaaa' }));
    await expect(rec.once('t', 'k', CreateRecords.fingerprint('POST', '/v1/sandboxes', { image: 'other' }), async () => ({}))).rejects.toMatchObject({ kind: 'InvalidArgument' });
    await expect(rec.once('t', 'bad key', fp, async () => ({}))).rejects.toMatchObject({ kind: 'InvalidArgument' });
    await expect(rec.once('t', 'f', fp, async () => { throw new Error('boom'); })).rejects.toThrow('boom');
    expect((await rec.once('t', 'f', fp, async () => ({ id: 'bbbbbbbbbbbbbbbb' }))).replayed).toBe(false);
  });

  it('expires keys after their lifetime', async () => {
    const { rec, clock } = open();
    await rec.once('t', 'k', fp, async () => ({ id: 'aaaaaaaaaaaaaaaa' }));
    clock.set(clock.get() + 60_001);
    expect((await rec.once('t', 'k', fp, async () => ({ id: 'cccccccccccccccc' }))).replayed).toBe(false);
    clock.set(clock.get() + 120_000);
    expect(rec.expireKeys()).toBe(1);
  });

  it('takes held sandboxes past their deadline with their keys, never acknowledged ones, across a reopen', async () => {
    const { rec, clock, f, db } = open();
    await rec.once('t', 'k', fp, async () => ({ id: 'aaaaaaaaaaaaaaaa' }));
    rec.hold(['aaaaaaaaaaaaaaaa'], 't', 'k');
    rec.hold(['bbbbbbbbbbbbbbbb', 'cccccccccccccccc'], 't', null);
    expect(rec.ack(['bbbbbbbbbbbbbbbb'])).toBe(1);
    // A replay delivered late does not hold an acknowledged sandbox again.
    rec.hold(['bbbbbbbbbbbbbbbb'], 't', null, true);
    expect(rec.held()).toBe(2);
    expect(rec.overdue()).toEqual([]);
    db.close();
    dbs.pop();
    const again = open(f);
    again.clock.set(clock.get() + 5_000);
    expect(again.rec.overdue().sort()).toEqual(['aaaaaaaaaaaaaaaa', 'cccccccccccccccc']);
    // Still held until destroyed.
    expect(again.rec.held()).toBe(2);
    again.rec.reaped('aaaaaaaaaaaaaaaa');
    again.rec.reaped('cccccccccccccccc');
    expect(again.rec.held()).toBe(0);
    // The key of a reaped sandbox is forgotten: its retry creates afresh.
    expect((await again.rec.once('t', 'k', fp, async () => ({ id: 'dddddddddddddddd' }))).replayed).toBe(false);
  });

  it('acknowledges a held sandbox that a later call names', () => {
    const { rec, clock } = open();
    rec.hold(['aaaaaaaaaaaaaaaa', 'bbbbbbbbbbbbbbbb'], 't', null);
    rec.used('aaaaaaaaaaaaaaaa');
    rec.used('eeeeeeeeeeeeeeee');
    clock.set(clock.get() + 5_000);
    expect(rec.overdue()).toEqual(['bbbbbbbbbbbbbbbb']);
  });

  it('reads the ids of a create answer and of a fork answer', () => {
    expect(idsOf({ id: 'aaaaaaaaaaaaaaaa' })).toEqual(['aaaaaaaaaaaaaaaa']);
    expect(idsOf({ sandboxes: [{ id: 'aaaaaaaaaaaaaaaa' }, { id: 'bbbbbbbbbbbbbbbb' }] })).toEqual(['aaaaaaaaaaaaaaaa', 'bbbbbbbbbbbbbbbb']);
    expect(idsOf({ id: 'not-a-sandbox' })).toEqual([]);
  });
});
