/**
 * The E2B front's pieces that need no daemon: envd access tokens and pre-signed URL
 * signatures (checked against the SDK's own signing function), template aliases, the
 * metadata filter as the SDKs encode it, routing headers, watch diffs, a process stream
 * whose client leaves, and the freshness of the generated Connect code.
 */
import { describe, expect, it } from 'vitest';
import { mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { getSignature } from 'e2b';
import { EnvdTokens, ENVD_KEY_BYTES } from '../../daemon/api/e2b/tokens.js';
import { TemplateStore } from '../../daemon/api/e2b/templates.js';
import { parseMetadataFilter } from '../../daemon/api/e2b/control.js';
import { basicUser, namedSandbox } from '../../daemon/api/e2b/envd.js';
import { diffListings, permissionsText } from '../../daemon/api/e2b/filesystem.js';
import { endEvent, processEvents } from '../../daemon/api/e2b/process.js';
import type { HostProcess } from '../../daemon/api/e2b/host.js';
import { ttlFor } from '../../daemon/api/e2b/front.js';
import { EventType } from '../../daemon/api/e2b/gen/filesystem/filesystem_pb.js';
import type { FileInfo } from '../../daemon/agent/protocol.js';

const REPO = path.resolve(new URL('../..', import.meta.url).pathname);
const tmp = () => mkdtempSync(path.join(tmpdir(), 'dsec-e2b-'));

describe('envd access tokens', () => {
  const t = new EnvdTokens(Buffer.alloc(ENVD_KEY_BYTES, 7));
  const a = '0123456789abcdef';
  const b = 'fedcba9876543210';

  it('name their sandbox, carry 256 bits, and differ per sandbox and per key', () => {
    expect(t.tokenOf(a)).toMatch(/^0123456789abcdef\.[A-Za-z0-9_-]{43}$/);
    expect(t.tokenOf(a)).not.toBe(t.tokenOf(b));
    expect(new EnvdTokens(Buffer.alloc(ENVD_KEY_BYTES, 8)).tokenOf(a)).not.toBe(t.tokenOf(a));
    expect(t.tokenOf(a)).toBe(t.tokenOf(a));
  });

  it('verify against the sandbox the request names; a token of another sandbox, a changed one or garbage is null', () => {
    expect(t.verify(t.tokenOf(a), a)).toBe(a);
    expect(t.verify(t.tokenOf(a), null)).toBe(a);
    expect(t.verify(t.tokenOf(b), a)).toBeNull();
    // A token whose id part was swapped for another sandbox's: its MAC no longer matches.
    expect(t.verify(b + t.tokenOf(a).slice(16), b)).toBeNull();
    const tok = t.tokenOf(a);
    const flipped = tok.slice(0, -1) + (tok.endsWith('A') ? 'B' : 'A');
    expect(t.verify(flipped, a)).toBeNull();
    for (const bad of [undefined, '', 'x', `${a}.`, `${a}.${'A'.repeat(42)}`, `${a.toUpperCase()}.${tok.slice(17)}`]) expect(t.verify(bad, null)).toBeNull();
  });

  it('check pre-signed URLs exactly as the SDK signs them, with and without expiry', async () => {
    const tok = t.tokenOf(a);
    const s = await getSignature({ path: '/home/user/f.txt', operation: 'read', user: undefined, envdAccessToken: tok });
    expect(t.verifySignature(a, s.signature, 'read', '/home/user/f.txt', '', null)).toBe(true);
    expect(t.verifySignature(a, s.signature, 'write', '/home/user/f.txt', '', null)).toBe(false);
    expect(t.verifySignature(a, s.signature, 'read', '/etc/shadow', '', null)).toBe(false);
    expect(t.verifySignature(b, s.signature, 'read', '/home/user/f.txt', '', null)).toBe(false);
    const w = await getSignature({ path: 'x', operation: 'write', user: 'root', expirationInSeconds: 60, envdAccessToken: tok });
    expect(w.expiration).not.toBeNull();
    const exp = w.expiration!;
    expect(t.verifySignature(a, w.signature, 'write', 'x', 'root', exp, exp * 1000 - 1)).toBe(true);
    // Past its expiry, and with the expiry changed, it is refused.
    expect(t.verifySignature(a, w.signature, 'write', 'x', 'root', exp, exp * 1000 + 1000)).toBe(false);
    expect(t.verifySignature(a, w.signature, 'write', 'x', 'root', exp + 3600, exp * 1000)).toBe(false);
  });

  it('keep their key in a 0600 file made once', () => {
    const dir = tmp();
    try {
      const f = path.join(dir, 'e2b', 'envd.key');
      const one = EnvdTokens.fromFile(f);
      expect(statSync(f).mode & 0o777).toBe(0o600);
      expect(readFileSync(f).length).toBe(ENVD_KEY_BYTES);
      expect(EnvdTokens.fromFile(f).tokenOf(a)).toBe(one.tokenOf(a));
      writeFileSync(f, 'short');
      expect(() => EnvdTokens.fromFile(f)).toThrow(/holds 5 bytes/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('template aliases', () => {
  it('resolve an alias, else the built-in base, else the name as an image; kept across restarts', () => {
    const dir = tmp();
    try {
      const f = path.join(dir, 'templates.json');
      const s = new TemplateStore(f);
      expect(s.list()).toEqual([{ name: 'base', image: 'e2b-base', backend: 'container', builtin: true }]);
      expect(s.resolve('base')).toEqual({ image: 'e2b-base', backend: 'container' });
      expect(s.resolve('busybox:latest')).toEqual({ image: 'busybox:latest', backend: 'container' });
      s.set('py', 'python:3.12', 'microvm');
      s.set('base', 'debian:bookworm', 'container');
      const again = new TemplateStore(f);
      expect(again.resolve('py')).toEqual({ image: 'python:3.12', backend: 'microvm' });
      expect(again.resolve('base')).toEqual({ image: 'debian:bookworm', backend: 'container' });
      expect(again.list().map((x) => [x.name, x.builtin])).toEqual([['base', false], ['py', false]]);
      again.remove('base');
      expect(new TemplateStore(f).resolve('base')).toEqual({ image: 'e2b-base', backend: 'container' });
      expect(() => again.remove('nope')).toThrow(/not found/);
      expect(() => again.set('Bad Name', 'x', 'container')).toThrow(/template name/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('wire details', () => {
  it('read the metadata filter as the SDKs encode it (pairs URL-encoded twice)', () => {
    // What the SDKs send for { user: 'a b', 'k=1': 'x&y' }.
    const pairs = Object.fromEntries(Object.entries({ user: 'a b', 'k=1': 'x&y' }).map(([k, v]) => [encodeURIComponent(k), encodeURIComponent(v)]));
    expect(parseMetadataFilter(new URLSearchParams(pairs).toString())).toEqual({ user: 'a b', 'k=1': 'x&y' });
    expect(parseMetadataFilter(undefined)).toEqual({});
  });

  it('name the sandbox by header, else by the host form; read the Basic user', () => {
    expect(namedSandbox({ 'e2b-sandbox-id': 'abc', 'e2b-sandbox-port': '49983' })).toEqual({ id: 'abc', port: 49983 });
    expect(namedSandbox({ host: '49983-0123456789abcdef.e2b.example:443' })).toEqual({ id: '0123456789abcdef', port: 49983 });
    expect(namedSandbox({ host: '3000-0123456789abcdef.e2b.example' })).toEqual({ id: '0123456789abcdef', port: 3000 });
    expect(namedSandbox({ host: '127.0.0.1:8443' })).toEqual({ id: null, port: null });
    expect(basicUser(`Basic ${Buffer.from('user:').toString('base64')}`)).toBe('user');
    expect(basicUser(`Basic ${Buffer.from('root:').toString('base64')}`)).toBe('root');
    expect(basicUser('Bearer e2b_x')).toBeUndefined();
    expect(basicUser(undefined)).toBeUndefined();
  });

  it('end events read like envd\'s: exit status, signals as -1', () => {
    expect(endEvent({ exitCode: 0, signal: null, error: null })).toEqual({ event: { case: 'end', value: { exitCode: 0, exited: true, status: 'exit status 0' } } });
    expect(endEvent({ exitCode: 3, signal: null, error: null })).toEqual({ event: { case: 'end', value: { exitCode: 3, exited: true, status: 'exit status 3', error: 'exit status 3' } } });
    expect(endEvent({ exitCode: null, signal: 'SIGKILL', error: null })).toEqual({ event: { case: 'end', value: { exitCode: -1, exited: false, status: 'signal: killed', error: 'signal: killed' } } });
  });

  it('turn E2B timeouts into TTLs from creation', () => {
    expect(ttlFor(1_000_000, 300, 1_000_000)).toBe(300);
    expect(ttlFor(1_000_000, 300, 1_000_000 + 60_500)).toBe(361);
    expect(ttlFor(1_000_000, 0, 1_000_000)).toBe(1);
  });

  it('diff directory listings into watch events and print modes as Go does', () => {
    const f = (size: number, mtimeNs: bigint, mode = 0o644, type: FileInfo['type'] = 'file') => ({ info: { size, mode, rawMode: 0, uid: 0, gid: 0, mtimeNs, mtimeMs: 0, type } });
    const before = new Map([['a', f(1, 1n)], ['b', f(1, 1n)], ['c', f(1, 1n)], ['d', f(0, 1n, 0o755, 'dir')]]);
    const after = new Map([['a', f(2, 2n)], ['c', f(1, 1n, 0o600)], ['d', f(0, 9n, 0o755, 'dir')], ['e', f(0, 1n)]]);
    expect(diffListings(before, after)).toEqual([
      { name: 'a', type: EventType.WRITE },
      { name: 'c', type: EventType.CHMOD },
      { name: 'e', type: EventType.CREATE },
      { name: 'b', type: EventType.REMOVE },
    ]);
    expect(permissionsText({ type: 'dir', mode: 0o755 })).toBe('drwxr-xr-x');
    expect(permissionsText({ type: 'file', mode: 0o640 })).toBe('-rw-r-----');
    expect(permissionsText({ type: 'symlink', mode: 0o777 })).toBe('Lrwxrwxrwx');
  });
});

describe('process event streams', () => {
  it('let their output pumps go when the client leaves holding an event (the command is never held by a reader that left)', async () => {
    // A process with output on stdout: the pump writes two chunks; each write resolves
    // when the stream takes the chunk. The client takes the first event and leaves.
    let written = 0;
    let pumpDone!: () => void;
    const pumped = new Promise<void>((r) => (pumpDone = r));
    const proc: HostProcess = {
      pid: 7, ended: false, size: () => 0,
      async pipe(stream, _offset, _follow, write) {
        if (stream === 'stderr') return 0;
        for (const c of ['a', 'b']) {
          await write(Buffer.from(c));
          written += 1;
        }
        pumpDone();
        return 2;
      },
      wait: () => new Promise(() => {}),
      result: () => ({ exitCode: null, signal: null, error: null }),
      signal() {}, writeStdin() {}, drained: async () => {}, closeStdin() {}, resize() {}, unwatched() {},
    };
    const ac = new AbortController();
    const events = processEvents(proc, false, { stdout: 0, stderr: 0 }, 60_000, ac.signal);
    const first = await events.next();
    expect(first.value).toMatchObject({ event: { case: 'data', value: { output: { case: 'stdout' } } } });
    // The client is gone; the generator is never resumed (its consumer stopped pulling).
    ac.abort();
    await pumped;
    expect(written).toBe(2);
  });
});

describe('generated Connect code', () => {
  it('is what buf generates from the .proto files now (npm run proto)', async () => {
    const out = tmp();
    try {
      const dir = path.join(REPO, 'daemon/api/e2b');
      await execa('npx', ['buf', 'generate', '--output', out], { cwd: dir, env: { PATH: `${path.join(REPO, 'node_modules/.bin')}:${process.env.PATH}` } });
      const files = (d: string): string[] => readdirSync(d, { recursive: true, withFileTypes: true }).filter((e) => e.isFile()).map((e) => path.relative(d, path.join(e.parentPath, e.name))).sort();
      expect(files(path.join(out, 'gen'))).toEqual(files(path.join(dir, 'gen')));
      for (const f of files(path.join(dir, 'gen'))) expect(readFileSync(path.join(out, 'gen', f), 'utf8'), f).toBe(readFileSync(path.join(dir, 'gen', f), 'utf8'));
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });
});
