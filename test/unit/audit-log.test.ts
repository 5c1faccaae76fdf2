// The audit log file: records as JSON lines, mode 0600, and nothing written (or thrown)
// after close, when a response finishes during dsecd's shutdown.
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { AuditLog, type AuditRecord } from '../../daemon/remote/audit.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'dsec-audit-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const rec = (result: number): AuditRecord => ({ door: 'tcp', remote: '127.0.0.1', token: 't1', tenant: 'a', role: 'user', peer: null, action: 'POST /v1/sandboxes', object: null, result, error: null });

describe('AuditLog', () => {
  it('writes JSON lines to a 0600 file; after close a record is dropped, never thrown', async () => {
    const file = path.join(dir, 'audit.log');
    const log = new AuditLog(file);
    log.write(rec(201));
    await log.close();
    expect(() => log.write(rec(200))).not.toThrow();
    expect(() => log.reopen()).not.toThrow();
    await log.close();
    const lines = readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(lines.map((l) => l.result)).toEqual([201]);
    expect(statSync(file).mode & 0o777).toBe(0o600);
  });
});
