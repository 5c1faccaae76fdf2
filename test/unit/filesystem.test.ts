/**
 * Read-only system paths without a sandbox (daemon/security/filesystem.ts): the option
 * schema, globs, precedence (request > image > config), resolution inside an image's
 * tree (symlinks never leave it), the bind plan over real image layouts (busybox, a
 * merged-/usr Debian), and the OCI spec built from a plan (daemon/drivers/container/spec.ts).
 * The same in real sandboxes: test/attacks/filesystem.test.ts.
 */
import { describe, expect, it } from 'vitest';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { FilesystemOptionsSchema, createPlannedDirs, globMatch, hostTree, pathMatches, planFilesystem, readonlyAdvice, resolveInTree, type TreeView } from '../../daemon/security/filesystem.js';
import { checkImageSecurity } from '../../daemon/image/security.js';
import type { DsecError } from '../../daemon/errors.js';
import { AGENT_FLAG_LANDLOCK, AGENT_FLAG_WRITABLE, AGENT_PATH, buildSpec } from '../../daemon/drivers/container/spec.js';
import { loadConfig } from '../../daemon/config.js';
import { mergeConfig } from '../../daemon/api/routes/images.js';
import { CreateSandboxRequest } from '../../daemon/api/schema.js';
import { DEFAULT_FILESYSTEM, resolveFilesystem, type ResolvedFilesystem } from '../../daemon/model/filesystem.js';

/** A tree from a flat description: `dir/` a directory, `a -> b` a symlink, anything else a file. */
function tree(entries: string[]): TreeView {
  const kinds = new Map<string, { kind: 'dir' | 'symlink' | 'other'; target?: string }>([['/', { kind: 'dir' }]]);
  for (const e of entries) {
    const [p, target] = e.split(' -> ');
    const clean = `/${p.replace(/\/$/, '')}`;
    for (let q = path.posix.dirname(clean); q !== '/'; q = path.posix.dirname(q)) if (!kinds.has(q)) kinds.set(q, { kind: 'dir' });
    kinds.set(clean, target !== undefined ? { kind: 'symlink', target } : p.endsWith('/') ? { kind: 'dir' } : { kind: 'other' });
  }
  return {
    kind: (p) => kinds.get(p)?.kind ?? 'missing',
    readlink: (p) => kinds.get(p)!.target!,
    list: (p) => [...kinds.keys()].filter((k) => k !== '/' && path.posix.dirname(k) === p).map((k) => path.posix.basename(k)),
  };
}

/** The busybox image's top level (daemon/image/builtin.ts). */
const BUSYBOX = tree(['bin/', 'sbin/', 'usr/bin/', 'usr/local/bin/', 'etc/', 'proc/', 'sys/', 'dev/', 'tmp/', 'root/', 'home/', 'var/tmp/', 'run/', 'linuxrc -> /bin/busybox']);
/** A merged-/usr image (Debian bookworm's layout). */
const MERGED = tree(['bin -> usr/bin', 'sbin -> usr/sbin', 'lib -> usr/lib', 'lib64 -> usr/lib64', 'usr/bin/', 'usr/lib/', 'usr/lib64/', 'usr/local/', 'etc/', 'proc/', 'sys/', 'dev/', 'tmp/', 'var/tmp/', 'root/', 'home/', 'opt/', 'srv/', 'mnt/', 'media/', 'run/', 'boot/']);

const fsOf = (o: Partial<ResolvedFilesystem> = {}): ResolvedFilesystem => ({ ...DEFAULT_FILESYSTEM, readonly_paths: [...DEFAULT_FILESYSTEM.readonly_paths], ...o });

describe('option paths', () => {
  const parse = (readonly_paths: string[], writable_paths: string[] = []) => FilesystemOptionsSchema.safeParse({ readonly_paths, writable_paths });
  it('accepts absolute, normalised paths with globs in the last component, and "/" as a read-only path', () => {
    expect(parse(['/bin', '/lib*', '/usr/lib/python3.1?', '/'], ['/work', '/usr/local', '/opt/a b']).success).toBe(true);
  });
  it.each([
    [['bin'], /absolute/], [['/usr/'], /trailing/], [['/a//b'], /empty components/], [['/a/../etc'], /"\." or "\.\."/], [['/./etc'], /"\." or "\.\."/],
    [['/l*b/x'], /last component only/], [['/proc/sys'], /runtime's own mounts/], [['/dev'], /runtime's own mounts/], [['/sys/fs/cgroup'], /runtime's own mounts/],
    [['/a\0b'], /NUL/],
  ])('refuses %j, naming the entry', (ro, why) => {
    const r = parse(ro);
    expect(r.success).toBe(false);
    expect(r.error!.issues[0].message).toMatch(why);
    expect(r.error!.issues[0].message).toContain(JSON.stringify(ro[0]));
  });
  it('refuses "/" as a writable path (that is readonly_paths: [])', () => {
    expect(parse(['/bin'], ['/']).error!.issues[0].message).toMatch(/readonly_paths: \[\]/);
  });
  it('refuses more than 64 entries and unknown fields', () => {
    expect(parse(Array.from({ length: 65 }, (_, i) => `/p${i}`)).success).toBe(false);
    expect(FilesystemOptionsSchema.safeParse({ landlok: false }).success).toBe(false);
  });
  it('is the filesystem field of a create request', () => {
    expect(CreateSandboxRequest.safeParse({ filesystem: { writable_paths: ['work'] } }).success).toBe(false);
    expect(CreateSandboxRequest.parse({ filesystem: { writable_paths: ['/work'], landlock: false } }).filesystem).toEqual({ writable_paths: ['/work'], landlock: false });
  });
});

describe('globs', () => {
  it('* matches any run of characters, ? one; nothing else is special', () => {
    expect(globMatch('lib*', 'lib')).toBe(true);
    expect(globMatch('lib*', 'lib64')).toBe(true);
    expect(globMatch('lib*', 'xlib')).toBe(false);
    expect(globMatch('lib?2', 'libx2')).toBe(true);
    expect(globMatch('a.b', 'aXb')).toBe(false);
    expect(globMatch('(x)+', '(x)+')).toBe(true);
  });
  it('a path matches when the parents are equal and the last component matches', () => {
    expect(pathMatches('/lib*', '/lib32')).toBe(true);
    expect(pathMatches('/lib*', '/usr/lib')).toBe(false);
    expect(pathMatches('/usr/lib*', '/usr/libexec')).toBe(true);
    expect(pathMatches('/', '/')).toBe(true);
    expect(pathMatches('/', '/bin')).toBe(false);
  });
});

describe('precedence: request > image > config, field by field', () => {
  const config: ResolvedFilesystem = { readonly_paths: ['/usr'], writable_paths: ['/data'], landlock: true };
  it('takes each field from the first source that has it', () => {
    expect(resolveFilesystem(undefined, undefined, config)).toEqual(config);
    expect(resolveFilesystem({ landlock: false }, { writable_paths: ['/work'], landlock: true }, config))
      .toEqual({ readonly_paths: ['/usr'], writable_paths: ['/work'], landlock: false });
    expect(resolveFilesystem({ readonly_paths: [] }, { readonly_paths: ['/'] }, config)).toEqual({ readonly_paths: [], writable_paths: ['/data'], landlock: true });
    expect(resolveFilesystem(null, { readonly_paths: ['/'] }, config).readonly_paths).toEqual(['/']);
  });
  it('returns fresh arrays', () => {
    const r = resolveFilesystem(undefined, undefined, config);
    r.writable_paths.push('/x');
    expect(config.writable_paths).toEqual(['/data']);
  });
  it('config: [filesystem] over the defaults; a bad path is refused at load, naming the key', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dsec-fs-cfg-'));
    try {
      const file = path.join(dir, 'dsecd.toml');
      fs.writeFileSync(file, '[filesystem]\nwritable_paths = ["/work"]\n');
      expect(loadConfig({ config: file, env: {} }).filesystem).toEqual({ readonly_paths: ['/bin', '/sbin', '/usr', '/lib*', '/etc'], writable_paths: ['/work'], landlock: true });
      fs.writeFileSync(path.join(dir, 'empty.toml'), '');
      expect(loadConfig({ config: path.join(dir, 'empty.toml'), env: {} }).filesystem).toEqual(DEFAULT_FILESYSTEM);
      fs.writeFileSync(file, '[filesystem]\nreadonly_paths = ["usr"]\n');
      expect(() => loadConfig({ config: file, env: {} })).toThrow(/filesystem\.readonly_paths\.0: "usr": paths are absolute/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
  it('image security: validated with the field named; a base image\'s fields are kept by a partial override', () => {
    expect(checkImageSecurity({ writable_paths: ['/work'], seccomp: { allow: ['ptrace'] } })).toEqual({ ok: true, value: { writable_paths: ['/work'], seccomp: { allow: ['ptrace'] } } });
    expect(checkImageSecurity({ writable_paths: ['work'] })).toEqual({ ok: false, message: expect.stringMatching(/^security\.writable_paths\.0: "work": paths are absolute/) });
    expect(checkImageSecurity({ seccomp: { allow: ['Ptrace'] } }).ok).toBe(false);
    const base = { env: [], cwd: '/', user: '0', cmd: ['sh'], security: { seccomp: { allow: ['ptrace'] }, landlock: false } };
    expect(mergeConfig(base, { security: { writable_paths: ['/work'] } }).security).toEqual({ seccomp: { allow: ['ptrace'] }, landlock: false, writable_paths: ['/work'] });
    expect(mergeConfig(base, { cwd: '/w' })).toEqual({ ...base, cwd: '/w' });
  });
});

describe('resolving a path inside the image', () => {
  it('follows relative and absolute symlinks, and .. never climbs above /, naming each symlink followed', () => {
    const t = tree(['usr/lib/', 'lib -> usr/lib', 'abs -> /usr', 'up -> ../../../usr/lib', 'w -> /nope/x']);
    expect(resolveInTree(t, '/lib', 'x')).toEqual({ path: '/usr/lib', missing: 0, links: [{ at: '/lib', target: 'usr/lib' }] });
    expect(resolveInTree(t, '/abs/lib', 'x')).toEqual({ path: '/usr/lib', missing: 0, links: [{ at: '/abs', target: '/usr' }] });
    expect(resolveInTree(t, '/usr/lib/up', 'x')).toEqual({ path: '/usr/lib/up', missing: 1, links: [] });
    expect(resolveInTree(tree(['usr/lib/', 'a/up -> ../../../usr/lib']), '/a/up', 'x')).toEqual({ path: '/usr/lib', missing: 0, links: [{ at: '/a/up', target: '../../../usr/lib' }] });
    expect(resolveInTree(t, '/w/y', 'x')).toEqual({ path: '/nope/x/y', missing: 3, links: [{ at: '/w', target: '/nope/x' }] });
    expect(resolveInTree(t, '/new/a/b', 'x')).toEqual({ path: '/new/a/b', missing: 3, links: [] });
  });
  it('refuses ".." after a missing directory (creating /new/../etc would be /etc)', () => {
    const t = tree(['etc/', 'root/conf -> /new/../etc']);
    expect(() => resolveInTree(t, '/root/conf', 'writable path')).toThrow(/writable path \/root\/conf: the symlink \/root\/conf -> \/new\/\.\.\/etc leads through the missing \/new and then "\.\."/);
    expect(() => planFilesystem(fsOf({ writable_paths: ['/root/conf'] }), t)).toThrow(expect.objectContaining({ kind: 'FailedPrecondition', reason: 'writable_path_refused' }));
  });
  it('refuses a file in the way and symlink loops', () => {
    expect(() => resolveInTree(tree(['etc/passwd']), '/etc/passwd/x', 'writable path')).toThrow(/writable path \/etc\/passwd\/x: \/etc\/passwd in the image is not a directory/);
    expect(() => resolveInTree(tree(['a -> b', 'b -> a']), '/a', 'writable path')).toThrow(/too many symlinks/);
  });
});

describe('the bind plan', () => {
  it('busybox, defaults: read-only root, every other top-level directory a read-write bind; /proc, /sys, /dev and top-level symlinks left alone', () => {
    expect(planFilesystem(fsOf(), BUSYBOX)).toEqual({
      readonlyRoot: true,
      binds: ['/home', '/root', '/run', '/tmp', '/var'].map((p) => ({ path: p, readonly: false })),
      create: [],
      writable: ['/home', '/root', '/run', '/tmp', '/var'],
    });
  });
  it('merged /usr: /bin, /lib* are symlinks into the read-only /usr and stay as they are', () => {
    const p = planFilesystem(fsOf(), MERGED);
    expect(p.binds.map((b) => b.path)).toEqual(['/boot', '/home', '/media', '/mnt', '/opt', '/root', '/run', '/srv', '/tmp', '/var']);
    expect(p.binds.every((b) => !b.readonly)).toBe(true);
  });
  it('writable exceptions below read-only paths are binds on top; missing ones are created, parents first', () => {
    const p = planFilesystem(fsOf({ writable_paths: ['/usr/local', '/work/src', '/etc/app'] }), BUSYBOX);
    expect(p.create).toEqual(['/work', '/etc/app', '/work/src']);
    expect(p.binds).toEqual([
      ...['/home', '/root', '/run', '/tmp', '/var', '/work'].map((x) => ({ path: x, readonly: false })),
      { path: '/etc/app', readonly: false }, { path: '/usr/local', readonly: false },
    ]);
    expect(p.writable).toEqual(['/etc/app', '/home', '/root', '/run', '/tmp', '/usr/local', '/var', '/work']);
  });
  it('a writable path through a symlink binds its target (the host path has no symlink)', () => {
    const p = planFilesystem(fsOf({ writable_paths: ['/lib/python3/site-packages'] }), MERGED);
    expect(p.create).toEqual(['/usr/lib/python3', '/usr/lib/python3/site-packages']);
    expect(p.binds.at(-1)).toEqual({ path: '/usr/lib/python3/site-packages', readonly: false });
  });
  it('refuses a writable path that leads into /proc, /sys or /dev, or onto a file', () => {
    expect(() => planFilesystem(fsOf({ writable_paths: ['/shm'] }), tree([...['etc/', 'dev/'], 'shm -> /dev/shm']))).toThrow(/resolves to \/dev\/shm .*runtime's own mounts/);
    expect(() => planFilesystem(fsOf({ writable_paths: ['/etc/passwd'] }), tree(['etc/passwd']))).toThrow(/not a directory/);
  });
  describe('symlinks in writable paths (the sandbox may have made them)', () => {
    /** The busybox layout after the sandbox replaced its writable paths with these symlinks. */
    const planted = (...links: string[]) => tree(['bin/', 'sbin/', 'usr/bin/', 'usr/local/', 'etc/', 'proc/', 'sys/', 'dev/', 'tmp/cache/', 'root/', 'home/', 'var/tmp/', 'run/', 'opt/tools/', ...links]);
    const refusal = (fs: Partial<ResolvedFilesystem>, t: TreeView) => {
      try {
        planFilesystem(fsOf(fs), t);
      } catch (e) {
        return { kind: (e as DsecError).kind, reason: (e as DsecError).reason, message: (e as Error).message };
      }
      return null;
    };
    it('to /etc, to /usr/bin (relative), to /: refused with reason writable_path_refused and the way out', () => {
      expect(refusal({ writable_paths: ['/root/data'] }, planted('root/data -> /etc'))).toEqual({
        kind: 'FailedPrecondition', reason: 'writable_path_refused',
        message: 'writable path /root/data resolves through the symlink /root/data -> /etc to /etc, which is or contains the read-only path /etc; dsecd makes a read-only path writable only when writable_paths names it; the sandbox keeps its files: snapshot it and restore it without this writable path (filesystem.writable_paths), or name the target itself',
      });
      expect(refusal({ writable_paths: ['/var/cache'] }, planted('var/cache -> ../usr/bin'))?.message)
        .toMatch(/^writable path \/var\/cache resolves through the symlink \/var\/cache -> \.\.\/usr\/bin, which is in a writable part of the sandbox \(the sandbox may have made it\), to \/usr\/bin, outside its writable places/);
      expect(refusal({ writable_paths: ['/root/top'] }, planted('root/top -> /'))?.message).toMatch(/^writable path \/root\/top resolves to \/ through the symlink \/root\/top -> \//);
      // Above a read-only place: /usr holds the read-only /usr/bin... and is read-only itself.
      expect(refusal({ writable_paths: ['/root/u'] }, planted('root/u -> ../usr'))?.message).toMatch(/to \/usr, which is or contains the read-only path \/usr/);
      // Above a deeper read-only bind.
      expect(refusal({ readonly_paths: ['/usr', '/opt/tools'], writable_paths: ['/root/o'] }, planted('root/o -> /opt'))?.message).toMatch(/to \/opt, which is or contains the read-only path \/opt\/tools/);
      // A chain of two, the last one in the sandbox's /tmp.
      expect(refusal({ writable_paths: ['/root/a'] }, planted('root/a -> /tmp/b', 'tmp/b -> /usr/local'))?.message).toMatch(/through the symlinks \/root\/a -> \/tmp\/b, \/tmp\/b -> \/usr\/local, which are in a writable part/);
      // A glob's match is checked as well.
      expect(refusal({ writable_paths: ['/var/c*'] }, planted('var/cache -> /etc', 'var/cx/'))?.reason).toBe('writable_path_refused');
      // Two sandbox links cannot vouch for each other.
      expect(refusal({ writable_paths: ['/root/a', '/root/b'] }, planted('root/a -> /usr/local', 'root/b -> /usr/local'))?.reason).toBe('writable_path_refused');
    });
    it('read-only paths off: only a link to / or to a new top-level directory is refused', () => {
      expect(refusal({ readonly_paths: [], writable_paths: ['/root/top'] }, planted('root/top -> /'))?.reason).toBe('writable_path_refused');
      expect(refusal({ readonly_paths: [], writable_paths: ['/root/n'] }, planted('root/n -> /newtop/x'))?.message).toMatch(/to \/newtop\/x, outside its writable places/);
      expect(planFilesystem(fsOf({ readonly_paths: [], writable_paths: ['/root/e'] }), planted('root/e -> /etc')).readonlyRoot).toBe(false);
    });
    it('a symlink that stays inside the writable area is followed; image symlinks on the read-only part are followed into read-only paths', () => {
      const p = planFilesystem(fsOf({ writable_paths: ['/root/cache'] }), planted('root/cache -> /tmp/cache'));
      expect(p.binds).toEqual(['/home', '/opt', '/root', '/run', '/tmp', '/var'].map((x) => ({ path: x, readonly: false })));
      expect(p.create).toEqual([]);
      // Missing inside the writable area: created there.
      expect(planFilesystem(fsOf({ writable_paths: ['/root/n'] }), planted('root/n -> /tmp/new/dir')).create).toEqual(['/tmp/new', '/tmp/new/dir']);
      // Named literally, /etc is the user's exception, and a sandbox link to it is then harmless.
      expect(planFilesystem(fsOf({ writable_paths: ['/etc', '/root/e'] }), planted('root/e -> /etc')).writable).toContain('/etc');
      // The image's own /usr/local -> ../opt/local (on the read-only /usr) is followed.
      expect(planFilesystem(fsOf({ writable_paths: ['/usr/local/app'] }), tree(['usr/bin/', 'opt/local/', 'usr/local -> ../opt/local'])).create).toEqual(['/opt/local/app']);
    });
  });
  it('deeper read-only paths below writable ones are read-only binds; globs skip files; writable wins over read-only', () => {
    const t = tree(['usr/', 'opt/tools/', 'opt/data/', 'opt/tool.sh', 'opt/toolbox -> tools', 'home/']);
    const p = planFilesystem(fsOf({ readonly_paths: ['/usr', '/opt/tool*'], writable_paths: ['/opt/tools'] }), t);
    expect(p.binds).toEqual([{ path: '/home', readonly: false }, { path: '/opt', readonly: false }]);
    const q = planFilesystem(fsOf({ readonly_paths: ['/usr', '/opt/tool*'] }), t);
    expect(q.binds).toEqual([{ path: '/home', readonly: false }, { path: '/opt', readonly: false }, { path: '/opt/tools', readonly: true }]);
    expect(q.writable).toEqual(['/home', '/opt']);
  });
  it('refuses more writable places than the agent takes (128)', () => {
    const wide = tree(Array.from({ length: 130 }, (_, i) => `d${i}/`));
    expect(() => planFilesystem(fsOf(), wide)).toThrow(/130 writable places .*at most 128/);
    expect(planFilesystem(fsOf({ readonly_paths: ['/'], writable_paths: ['/d1'] }), wide).writable).toEqual(['/d1']);
  });
  it('"/" read-only: only writable paths are writable', () => {
    const p = planFilesystem(fsOf({ readonly_paths: ['/'], writable_paths: ['/tmp', '/work'] }), BUSYBOX);
    expect(p.binds).toEqual([{ path: '/tmp', readonly: false }, { path: '/work', readonly: false }]);
    expect(p.create).toEqual(['/work']);
  });
  it('readonly_paths []: a read-write root and no binds; Landlock still names the top-level directories (and created ones)', () => {
    const p = planFilesystem(fsOf({ readonly_paths: [], writable_paths: ['/work'] }), BUSYBOX);
    expect(p).toEqual({ readonlyRoot: false, binds: [], create: ['/work'], writable: ['/bin', '/etc', '/home', '/root', '/run', '/sbin', '/tmp', '/usr', '/var', '/work'] });
  });
  it('creates the planned directories on the host, owned by the sandbox root, and refuses a symlink in the way', async () => {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), 'dsec-fs-plan-'));
    try {
      fs.mkdirSync(path.join(root, 'etc'));
      const plan = planFilesystem(fsOf({ writable_paths: ['/work/a/b'] }), hostTree(root));
      expect(plan.create).toEqual(['/work', '/work/a', '/work/a/b']);
      const uid = process.getuid!();
      await createPlannedDirs(root, plan, uid);
      await createPlannedDirs(root, plan, uid); // twice is fine
      const st = fs.statSync(path.join(root, 'work/a/b'));
      expect({ dir: st.isDirectory(), mode: st.mode & 0o777, uid: st.uid }).toEqual({ dir: true, mode: 0o755, uid });
      fs.symlinkSync('/etc', path.join(root, 'evil'));
      await expect(createPlannedDirs(root, { create: ['/evil'] }, uid)).rejects.toThrow(/symlink there, not a directory/);
      expect(fs.readdirSync(path.join(root, 'etc'))).toEqual([]);
    } finally {
      fs.rmSync(root, { recursive: true, force: true });
    }
  });
});

describe('advice for a path found read-only', () => {
  const dflt = fsOf();
  it('a new top-level directory: --writable for it, never --no-readonly', () => {
    const a = readonlyAdvice('/work/upload.txt', 'file', dflt)!;
    expect(a.why).toBe('the top level is read-only: no new top-level entry can be made');
    expect(a.advice).toBe('create the sandbox with `--writable /work` (filesystem.writable_paths; dsecd creates the directory when missing)');
    expect(readonlyAdvice('/work', 'dir', dflt)!.advice).toMatch(/--writable \/work`/);
    expect(readonlyAdvice('/state', 'file', dflt)!.advice).toMatch(/^write below a writable directory/);
  });
  it('a file in a read-only path: its directory, never the file itself; --no-readonly only for a whole read-only path', () => {
    const a = readonlyAdvice('/etc/passwd', 'file', dflt)!;
    expect(a.why).toBe('below the read-only path /etc');
    expect(a.advice).toMatch(/`--writable \/etc` .*which makes all of \/etc writable \(writable paths are directories: \/etc\/passwd itself cannot be one\), or with `--no-readonly`$/);
    expect(a.advice).not.toMatch(/--writable \/etc\/passwd/);
    expect(readonlyAdvice('/usr/local/lib/x.so', 'file', dflt)).toEqual({ why: 'below the read-only path /usr', advice: expect.stringMatching(/^create the sandbox with `--writable \/usr\/local\/lib` \(filesystem.writable_paths; dsecd creates the directory when missing\)$/) });
    expect(readonlyAdvice('/lib64/x', 'file', dflt)!.why).toBe('below the read-only path /lib64');
    expect(readonlyAdvice('/var/log/x', 'file', fsOf({ readonly_paths: ['/'], writable_paths: ['/tmp'] }))!.advice).toMatch(/--writable \/var\/log`/);
  });
  it('none when read-only paths are not why: they are off, or the path is in a writable path', () => {
    expect(readonlyAdvice('/etc/passwd', 'file', fsOf({ readonly_paths: [] }))).toBeNull();
    expect(readonlyAdvice('/work/x', 'file', fsOf({ writable_paths: ['/work'] }))).toBeNull();
    expect(readonlyAdvice('/usr/local/x', 'file', fsOf({ writable_paths: ['/usr/local'] }))).toBeNull();
    // A deeper read-only path below a writable one still is why.
    expect(readonlyAdvice('/opt/tools/x', 'file', fsOf({ readonly_paths: ['/opt/tools'], writable_paths: ['/opt'] }))!.why).toBe('below the read-only path /opt/tools');
  });
});

describe('the OCI spec of a plan', () => {
  const input = { id: 'abcd', rootfs: '/r/rootfs', agentBinary: '/opt/dsec-agent', uidBase: 2 ** 31, uidCount: 65536, cgroupsPath: 'dsec-x/abcd', cpus: 1, memoryBytes: 256 << 20, pids: 64 };
  const plan = planFilesystem(fsOf({ readonly_paths: ['/usr', '/opt/tools'], writable_paths: ['/etc/app'] }), tree(['usr/', 'etc/app/', 'opt/tools/', 'tmp/', 'proc/', 'dev/', 'sys/']));
  it('root read-only, the binds first and parents before children, then the runtime mounts; writable binds nosuid,nodev', () => {
    const spec = buildSpec({ ...input, filesystem: { ...plan, landlock: false } }) as any;
    expect(spec.root).toEqual({ path: '/r/rootfs', readonly: true });
    expect(plan.binds).toEqual([{ path: '/etc', readonly: false }, { path: '/opt', readonly: false }, { path: '/tmp', readonly: false }, { path: '/opt/tools', readonly: true }]);
    const dests = spec.mounts.map((m: any) => m.destination);
    expect(spec.mounts.slice(0, plan.binds.length)).toEqual(plan.binds.map((b) => ({
      destination: b.path, type: 'bind', source: `/r/rootfs${b.path}`, options: b.readonly ? ['rbind', 'ro'] : ['rbind', 'rw', 'nosuid', 'nodev', 'rnosuid', 'rnodev'],
    })));
    // Every later mount (the agent, /proc, /dev, ...) comes after the binds, so a bind never hides one.
    expect(dests.indexOf('/proc')).toBe(plan.binds.length);
    expect(dests.indexOf(AGENT_PATH)).toBeGreaterThan(plan.binds.length);
    expect(spec.process.args).toEqual([AGENT_PATH, '--listen-fd', '3']);
  });
  it('Landlock: --landlock and one --writable per writable place', () => {
    const spec = buildSpec({ ...input, filesystem: { ...plan, landlock: true } }) as any;
    expect(spec.process.args).toEqual([AGENT_PATH, '--listen-fd', '3', AGENT_FLAG_LANDLOCK, ...plan.writable.flatMap((w) => [AGENT_FLAG_WRITABLE, w])]);
  });
  it('readonly off: a read-write root and no binds', () => {
    const off = planFilesystem(fsOf({ readonly_paths: [] }), BUSYBOX);
    const spec = buildSpec({ ...input, filesystem: { ...off, landlock: false } }) as any;
    expect(spec.root.readonly).toBe(false);
    expect(JSON.stringify(spec.mounts)).toBe(JSON.stringify((buildSpec(input) as any).mounts));
  });
  it('a worker keeps its fully read-only root, no binds, and gets --landlock alone', () => {
    const spec = buildSpec({ ...input, worker: true, filesystem: { ...plan, landlock: true } }) as any;
    expect(spec.root.readonly).toBe(true);
    expect(spec.mounts[0].destination).toBe('/proc');
    expect(spec.process.args).toEqual([AGENT_PATH, '--listen-fd', '3', '--worker', AGENT_FLAG_LANDLOCK]);
  });
});
