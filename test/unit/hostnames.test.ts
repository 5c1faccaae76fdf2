import { describe, expect, it } from 'vitest';
import pino from 'pino';
import type dgram from 'node:dgram';
import { HostNames } from '../../daemon/net/hostnames.js';
// @ts-expect-error plain JavaScript fixture without types
import { startDns } from '../fixtures/netns-servers.mjs';

describe('host-rule names resolved by dsecd', () => {
  const records: Record<string, string[]> = { 'pypi.org': ['192.0.2.1'] };
  const ttl = 1;
  let server: dgram.Socket;
  const log = pino({ level: 'silent' });

  it('resolves, refreshes on the (clamped) TTL, reports changes, keeps addresses through an outage', async () => {
    server = await startDns('127.0.0.1', 0, records, () => {}, ttl);
    const changed: string[] = [];
    let wake: (() => void) | null = null;
    const names = new HostNames({
      servers: [`127.0.0.1:${server.address().port}`], ttlMinS: 1, ttlMaxS: 1, log, sweepMs: 20,
      onChange: (n) => { changed.push(n); wake?.(); },
    });
    await names.ensure(['pypi.org', 'nx.example']);
    expect(names.addresses('pypi.org')).toEqual(['192.0.2.1']);
    expect(names.addresses('nx.example')).toEqual([]);
    expect(changed).toEqual(['pypi.org']);
    names.start();
    records['pypi.org'] = ['192.0.2.2', '192.0.2.3'];
    await new Promise<void>((r) => { wake = r; });
    expect(names.addresses('pypi.org')).toEqual(['192.0.2.2', '192.0.2.3']);
    // An outage (no server) keeps what was resolved.
    server.close();
    await names.refresh('pypi.org');
    expect(names.addresses('pypi.org')).toEqual(['192.0.2.2', '192.0.2.3']);
    names.retain(new Set());
    expect(names.addresses('pypi.org')).toEqual([]);
    names.close();
  });
});
