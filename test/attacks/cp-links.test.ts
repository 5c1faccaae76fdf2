/**
 * Attacks on the host through `dsec cp` and symlinks (issue 17; docs/SECURITY.md "Copying
 * out of a sandbox"): the sandbox is the attacker and shapes its links so that a copy
 * out leaves links on the host that resolve outside the destination, up to the host's
 * `/`, and a later copy in of such a path carries host files into the sandbox.
 *
 * Against a real dsecd (slot 31), a sandbox plants, in the directory the user copies:
 *   - a chain through `..` across links (`x -> .`, `top -> x/x/.../../..`), which climbs
 *     to `/` although its text, read on its own, stays inside;
 *   - a link to that link (`etc -> top/etc`), planted so that dsecd's walk sends it
 *     before `top` (adversarial order: `top` does not exist yet when it arrives);
 *   - a link through a missing directory (`m -> x/a/../..`): dangling on the host until
 *     someone makes `a`, then out;
 *   - absolute targets, inside the copied directory and outside it;
 *   - a lone symlink copied out by name;
 * and a tar upload whose own symlink climbs above the sandbox's root, to check what the
 * refusal says. Then the user's side: a host symlink copied into the sandbox by name.
 *
 * Shapes dsecd's own walk never sends (it sends each path once, symlinks as leaves, no
 * hard links) but a dsecd reached over the network, or one an attacker controls, could:
 * a directory link used as a path prefix by later entries, hard links naming a link or
 * going through one, a directory replaced by a link of the same name. These come from a
 * stand-in dsecd serving the crafted archive, through the same CLI code.
 *
 * Each case checks, from the host, that no link below the destination resolves outside
 * it (realpath), and that a secret host file next to the destination never reaches the
 * sandbox.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, realpathSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import tarStream from 'tar-stream';
import { execa } from 'execa';
import { IS_ROOT, REPO, TestDaemon, out, runCli } from '../integration/harness.js';
import { json, runCli as runCliFake, startFakeDsecd, type FakeDsecd } from '../fixtures/fake-dsecd.js';

/** Every symlink below `root` (relative path), walking real directories only. */
function linksBelow(root: string, rel = ''): string[] {
  const found: string[] = [];
  for (const name of readdirSync(path.join(root, rel))) {
    const r = path.join(rel, name);
    const st = lstatSync(path.join(root, r));
    if (st.isSymbolicLink()) found.push(r);
    else if (st.isDirectory()) found.push(...linksBelow(root, r));
  }
  return found;
}

/** The links below `root` that the kernel resolves to a path outside it (`link -> where`). */
function escaping(root: string): string[] {
  const real = realpathSync.native(root);
  const bad: string[] = [];
  for (const l of linksBelow(root)) {
    let to: string;
    try {
      to = realpathSync.native(path.join(root, l));
    } catch {
      continue; // dangling: resolves to nothing
    }
    if (to !== real && !to.startsWith(real + '/')) bad.push(`${l} -> ${to}`);
  }
  return bad;
}

/** A tar in memory with exactly these members, in this order (duplicates and hard links too). */
async function craft(entries: Array<{ name: string; type?: 'file' | 'directory' | 'symlink' | 'link'; linkname?: string; body?: string }>): Promise<Buffer> {
  const pack = tarStream.pack();
  for (const e of entries) {
    const type = e.type ?? 'file';
    pack.entry({ name: e.name, type, linkname: e.linkname, mode: type === 'directory' ? 0o755 : 0o644 }, type === 'file' ? (e.body ?? 'x') : undefined);
  }
  pack.finalize();
  const chunks: Buffer[] = [];
  for await (const c of pack) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/** `x/x/.../x/../..`: `n` times through `x -> .`, then `n` times up. Its text alone stays inside. */
const climb = (n: number) => [...Array<string>(n).fill('x'), ...Array<string>(n).fill('..')].join('/');

describe.skipIf(!IS_ROOT)('dsec cp and symlinks: a sandbox that plants links', () => {
  let d: TestDaemon;
  let sb: string;
  let tmp: string;
  /** A host file next to every destination; a copy that escapes could carry it into the sandbox. */
  let secret: string;
  const marker = `dsec-cp-${randomBytes(4).toString('hex')}`;
  const sh = (script: string) => d.client.exec(sb, { argv: ['sh', '-c', script] });
  /** GET on dsecd's API, JSON. */
  const get = <T>(p: string) => (d.client as unknown as { request<R>(m: string, p: string): Promise<R> }).request<T>('GET', p);
  /** Names in /root/d in the order dsecd's walk sends them (the agent's directory order). */
  const walkOrder = async () => (await get<{ entries: Array<{ name: string }> }>(`/v1/sandboxes/${sb}/files/list?path=/root/d`)).entries.map((e) => e.name);

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 31 });
    tmp = mkdtempSync('/tmp/dsec-cp-attack-');
    secret = path.join(tmp, `${marker}-secret`);
    writeFileSync(secret, 'host secret\n');
    sb = (await d.client.createSandbox({ image: 'busybox' })).id;
    // /tmp/dsec-cp-attack-X/out is the destination: 3 levels below /, climb(12) leaves it
    // whatever the depth of the test's temp dir.
    const plant = [
      'mkdir -p /root/d/sub && cd /root/d',
      'echo keep > keep.txt',
      'ln -s . x',
      'ln -s x/a/../.. m',
      'ln -s /root/d/keep.txt sub/abs',
      'ln -s /root/d here',
      'ln -s /etc/passwd hostabs',
      'ln -s /root/d/../../etc sneaky',
      'ln -s ../../../../../../tmp /root/lone',
      'ln -s /etc/passwd /root/lone-abs',
      'ln -s /root/d/keep.txt /root/lone-in',
    ].join(' && ');
    const r = await sh(plant);
    expect(r.exit_code, out(r)).toBe(0);
    // Adversarial order: a link to `top` that dsecd sends before `top` itself. Made
    // first; where the directory's order is a hash of the name (ext4, XFS) rather than
    // creation (btrfs), names are tried until one lands before `top`.
    for (let i = 0; ; i++) {
      expect(i, 'no name of 64 lands before top in the walk').toBeLessThan(64);
      const name = `etc${i}`;
      await sh(`cd /root/d && rm -f top && ln -s top/etc ${name} && ln -s ${climb(12)} top`);
      const order = await walkOrder();
      if (order.indexOf(name) < order.indexOf('top')) break;
      await sh(`rm /root/d/${name}`);
    }
  }, 180_000);
  afterAll(async () => {
    if (tmp) rmSync(tmp, { recursive: true, force: true });
    await d?.cleanup();
  });

  it('copy out: chains through `..`, a link to a link to /, links through a missing dir and absolute targets outside are refused; the rest arrives', async () => {
    const dest = path.join(tmp, 'out');
    const r = await runCli(d, ['cp', `${sb}:/root/d`, dest]);
    expect(r.code, r.stderr).toBe(125);
    const etc = (await walkOrder()).find((n) => /^etc\d+$/.test(n))!;
    for (const name of ['top', etc, 'm', 'hostabs', 'sneaky']) expect(r.stderr).toMatch(new RegExp(`^dsec: warning: refused d/${name}: a symlink to `, 'm'));
    expect(r.stderr).toMatch(/refused d\/top: a symlink to "x\/x\/.*", which climbs above the destination$/m);
    expect(r.stderr).toMatch(/refused d\/hostabs: a symlink to the absolute path \/etc\/passwd, outside the copied directory \/root\/d$/m);
    expect(r.stderr).toMatch(/^dsec: 5 entries were refused \(above\); the rest was copied to .*\/out\nhint: a link is made here only when it resolves inside the destination/m);
    // What stays inside arrives: the file, x -> ., an absolute target inside as the relative equivalent.
    expect(readFileSync(path.join(dest, 'keep.txt'), 'utf8')).toBe('keep\n');
    expect(readlinkSync(path.join(dest, 'x'))).toBe('.');
    expect(readlinkSync(path.join(dest, 'sub/abs'))).toBe('../keep.txt');
    expect(readFileSync(path.join(dest, 'sub/abs'), 'utf8')).toBe('keep\n');
    expect(readlinkSync(path.join(dest, 'here'))).toBe('.');
    expect(linksBelow(dest).sort()).toEqual(['here', 'sub/abs', 'x']);
    expect(escaping(dest)).toEqual([]);
    // Made later by the user, `a` would have let `m -> x/a/../..` out: m was never made.
    mkdirSync(path.join(dest, 'a'));
    expect(escaping(dest)).toEqual([]);

    // The second half of the attack: a later copy in through such a path carries a host file in.
    const carried = await runCli(d, ['cp', path.join(dest, 'top', secret), `${sb}:/tmp/stolen`]);
    expect(carried.code).toBe(125);
    expect(carried.stderr).toMatch(/no such file or directory/);
    expect(out(await sh('cat /tmp/stolen 2>&1 || echo absent'))).toMatch(/absent\n$/);

    // Into an existing directory (members keep the d/ prefix): the same.
    const into = path.join(tmp, 'into');
    mkdirSync(into);
    const r2 = await runCli(d, ['cp', `${sb}:/root/d`, into]);
    expect(r2.code).toBe(125);
    expect(readlinkSync(path.join(into, 'd/sub/abs'))).toBe('../keep.txt');
    expect(readlinkSync(path.join(into, 'd/here'))).toBe('.');
    expect(linksBelow(into).sort()).toEqual(['d/here', 'd/sub/abs', 'd/x']);
    expect(escaping(into)).toEqual([]);
  });

  it('copy out of a lone symlink: kept only when it resolves inside the directory that receives it; -L copies what it points to', async () => {
    for (const [link, why] of [['lone', /a symlink to "\.\.\/\.\.\/\.\.\/\.\.\/\.\.\/\.\.\/tmp", which climbs above the destination/], ['lone-abs', /the absolute path \/etc\/passwd, outside the copied directory \/root/]] as const) {
      const dest = path.join(tmp, `${link}-copy`);
      const r = await runCli(d, ['cp', `${sb}:/root/${link}`, dest]);
      expect(r.code, r.stderr).toBe(125);
      expect(r.stderr).toMatch(why);
      expect(r.stderr).toMatch(/hint: .*-L copies what it points to/);
      expect(existsSync(dest) || lstatSync(dest, { throwIfNoEntry: false }) !== undefined).toBe(false);
    }
    // Inside the sandbox directory it came from (/root): the same place here, relative.
    const inside = path.join(tmp, 'lone-in-copy');
    expect((await runCli(d, ['cp', `${sb}:/root/lone-in`, inside])).code).toBe(0);
    expect(readlinkSync(inside)).toBe('d/keep.txt');
    const followed = path.join(tmp, 'lone-followed');
    const f = await runCli(d, ['cp', '-L', `${sb}:/root/lone-in`, followed]);
    expect(f.code, f.stderr).toBe(0);
    expect(lstatSync(followed).isFile()).toBe(true);
    expect(readFileSync(followed, 'utf8')).toBe('keep\n');
    expect(escaping(tmp)).toEqual([]);
  });

  it('copy in of a host symlink named as the source: the link itself, not the host file it points to; -L follows it', async () => {
    const link = path.join(tmp, `${marker}-link`);
    symlinkSync(secret, link);
    const r = await runCli(d, ['cp', link, `${sb}:/tmp/`]);
    expect(r.code, r.stderr).toBe(0);
    const inside = `/tmp/${marker}-link`;
    expect(out(await sh(`readlink ${inside}; cat ${inside} 2>/dev/null || echo unreadable`))).toBe(`${secret}\nunreadable\n`);
    // Under another name onto a missing path, as a file would be.
    expect((await runCli(d, ['cp', link, `${sb}:/tmp/renamed`])).code).toBe(0);
    expect(out(await sh('readlink /tmp/renamed'))).toBe(`${secret}\n`);
    // -L: what it points to, by the user's choice.
    expect((await runCli(d, ['cp', '-L', link, `${sb}:/tmp/followed`])).code).toBe(0);
    expect(out(await sh('cat /tmp/followed'))).toBe('host secret\n');
  });

  it('a tar upload whose own symlink climbs above the sandbox root: the refusal names the entry, the link and why', async () => {
    const tar = await craft([{ name: 'up', type: 'symlink', linkname: '../../../..' }, { name: 'up/placed.txt' }]);
    const r = await execa(process.execPath, [path.join(REPO, 'bin/dsec'), '--socket', d.socket, 'cp', '-', `${sb}:/root`], { input: tar, reject: false });
    expect(r.exitCode).toBe(125);
    expect(String(r.stderr)).toMatch(
      /^dsec: archive entry "up\/placed.txt" was refused: it goes through \/root\/up, a symlink this archive made \(-> \.\.\/\.\.\/\.\.\/\.\.\), which leaves the sandbox's root \(its "\.\." climb above \/, so the sandbox resolves it to \/\); writing there failed: write \/root\/up\/placed.txt: Read-only file system \(FailedPrecondition\)\nhint: a symlink in the archive leads the entries below it out of the destination/,
    );
    expect(String(r.stderr)).not.toMatch(/top level is read-only|--writable/);
    // The refused archive left nothing of its own behind (the link is removed again).
    expect(out(await sh('ls /root/up /placed.txt 2>&1 | wc -l; test -e /root/up || echo gone'))).toBe('2\ngone\n');
  });
});

describe('dsec cp and symlinks: shapes only a hostile or remote dsecd can send', () => {
  let fake: FakeDsecd;
  let dir: string;
  let secretDir: string;

  /** Serves `body` as the archive of the sandbox directory /srv/d. */
  const serve = (body: Buffer) => {
    fake.routes['GET /v1/sandboxes/:id/files/stat'] = (req, res) => json(res, 200, { path: req.query.get('path'), type: 'dir', size: 0, mode: 0o755, uid: 0, gid: 0, mtime_ms: 1 });
    fake.routes['GET /v1/sandboxes/:id/archive'] = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-tar' });
      res.end(body);
    };
  };
  const cp = (dest: string) => runCliFake(['cp', 'sb1:/srv/d', dest], { socket: fake.socketPath });

  beforeAll(async () => {
    fake = await startFakeDsecd();
    dir = mkdtempSync('/tmp/dsec-cp-hostile-');
    secretDir = path.join(dir, 'secret');
    mkdirSync(secretDir);
    writeFileSync(path.join(secretDir, 'key'), 'host secret\n');
  });
  afterAll(async () => {
    await fake?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('a directory link used as a path prefix by later entries, and a directory replaced by a link: nothing written through, no link out', async () => {
    serve(await craft([
      { name: 'd/', type: 'directory' },
      { name: 'd/x', type: 'symlink', linkname: '.' },
      { name: 'd/l', type: 'symlink', linkname: climb(2) },
      { name: 'd/l/pwned-through' },
      { name: 'd/sub/', type: 'directory' },
      { name: 'd/sub', type: 'symlink', linkname: climb(2) },
      { name: 'd/sub/inside.txt', body: 'in' },
      { name: 'd/abs', type: 'symlink', linkname: '/srv/d/sub' },
      { name: 'd/abs/pwned-abs' },
    ]));
    const dest = path.join(dir, 'prefix');
    const r = await cp(dest);
    expect(r.code, r.err).toBe(125);
    expect(r.err).toMatch(/^dsec: warning: refused d\/l\/pwned-through: it is below l, a link of the same archive \(never written through\)$/m);
    expect(r.err).toMatch(/^dsec: warning: refused d\/sub: a link where the directory sub is \(a directory is never replaced by a link\)$/m);
    expect(r.err).toMatch(/^dsec: warning: refused d\/l: a symlink to "x\/x\/\.\.\/\.\.", which climbs above the destination$/m);
    expect(r.err).toMatch(/^dsec: warning: refused d\/abs\/pwned-abs: it is below abs/m);
    expect(lstatSync(path.join(dest, 'sub')).isDirectory()).toBe(true);
    expect(readFileSync(path.join(dest, 'sub/inside.txt'), 'utf8')).toBe('in');
    expect(readlinkSync(path.join(dest, 'abs'))).toBe('sub');
    expect(existsSync(path.join(dir, 'pwned-through')) || existsSync(path.join(dest, 'sub/pwned-abs'))).toBe(false);
    expect(linksBelow(dest).sort()).toEqual(['abs', 'x']);
    expect(escaping(dest)).toEqual([]);
  });

  it('hard links: never to a symlink, never through one, never out of the archive; to a file of it they are made', async () => {
    serve(await craft([
      { name: 'd/', type: 'directory' },
      { name: 'd/f', body: 'F' },
      { name: 'd/x', type: 'symlink', linkname: '.' },
      { name: 'd/a/b/l', type: 'symlink', linkname: '../../f' },
      { name: 'd/h-to-link', type: 'link', linkname: 'd/a/b/l' },
      { name: 'd/h-through', type: 'link', linkname: 'd/x/f' },
      { name: 'd/h-out', type: 'link', linkname: `../../..${secretDir}/key` },
      { name: 'd/h-abs', type: 'link', linkname: `${secretDir}/key` },
      { name: 'd/h-ok', type: 'link', linkname: 'd/f' },
      { name: 'd/up', type: 'symlink', linkname: climb(3) },
    ]));
    const dest = path.join(dir, 'hard');
    const r = await cp(dest);
    expect(r.code, r.err).toBe(125);
    expect(r.err).toMatch(/refused d\/h-to-link: a hard link to a\/b\/l: a symlink of the same archive/);
    expect(r.err).toMatch(/refused d\/h-through: a hard link to x\/f: it is below x, a symlink/);
    expect(r.err).toMatch(/refused d\/h-out: a hard link to ".*", outside the archive/);
    expect(r.err).toMatch(/refused d\/h-abs: a hard link to .*secret\/key: no such file/);
    expect(r.err).toMatch(/refused d\/up: a symlink to "x\/x\/x\/\.\.\/\.\.\/\.\.", which climbs above the destination/);
    expect(statSync(path.join(dest, 'h-ok')).ino).toBe(statSync(path.join(dest, 'f')).ino);
    for (const n of ['h-to-link', 'h-through', 'h-out', 'h-abs', 'up']) expect(lstatSync(path.join(dest, n), { throwIfNoEntry: false }), n).toBeUndefined();
    expect(readlinkSync(path.join(dest, 'a/b/l'))).toBe('../../f');
    expect(statSync(path.join(secretDir, 'key')).nlink).toBe(1);
    expect(escaping(dest)).toEqual([]);
  });

  it('without the native addon (the CLI on a laptop), the portable check alone refuses the same chains', async () => {
    serve(await craft([
      { name: 'd/', type: 'directory' },
      { name: 'd/etc', type: 'symlink', linkname: 'top/etc' },
      { name: 'd/top', type: 'symlink', linkname: climb(12) },
      { name: 'd/x', type: 'symlink', linkname: '.' },
      { name: 'd/keep', body: 'k' },
    ]));
    const dest = path.join(dir, 'portable');
    const r = await execa(process.execPath, [path.join(REPO, 'bin/dsec'), '--socket', fake.socketPath, 'cp', 'sb1:/srv/d', dest], { reject: false, env: { DSEC_NATIVE_ADDON: path.join(dir, 'no-such-addon.node') } });
    expect(r.exitCode, String(r.stderr)).toBe(125);
    expect(String(r.stderr)).toMatch(/refused d\/top: .*climbs above the destination/);
    expect(String(r.stderr)).toMatch(/refused d\/etc: a symlink to "top\/etc"/);
    expect(readFileSync(path.join(dest, 'keep'), 'utf8')).toBe('k');
    expect(linksBelow(dest)).toEqual(['x']);
    expect(escaping(dest)).toEqual([]);
  });
});
