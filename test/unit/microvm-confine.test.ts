/**
 * The confinement dsecd sends to a microVM guest (daemon/drivers/microvm/confine.ts): the
 * profile resolved to x86-64 numbers, the capability mask, the directive text the guest
 * agent parses, and the filesystem plan over a tree read through (fake) agent file ops.
 */
import { describe, expect, it } from 'vitest';
import { AgentFileError, type AgentClient } from '../../daemon/agent/client.js';
import { capMask, confinePayload, guestSeccompRules, planGuestFilesystem } from '../../daemon/drivers/microvm/confine.js';
import { DEFAULT_CAPS } from '../../daemon/drivers/container/spec.js';
import { DEFAULT_FILESYSTEM } from '../../daemon/model/filesystem.js';

/** A fake agent over an in-memory tree: dirs (with children), symlinks, files. */
function fakeAgent(tree: Record<string, { type: 'dir' | 'file' | 'symlink'; target?: string }>): { client: AgentClient; calls: string[] } {
  const calls: string[] = [];
  const info = (p: string) => ({ size: 0, mode: 0o755, rawMode: 0, uid: 0, gid: 0, mtimeNs: 0n, mtimeMs: 0, type: tree[p].type, ...(tree[p].target ? { target: tree[p].target } : {}) });
  const client = {
    async stat(p: string) {
      calls.push(`stat ${p}`);
      if (!tree[p]) throw new AgentFileError(2, `${p}: ENOENT`);
      return info(p);
    },
    async list(p: string) {
      calls.push(`list ${p}`);
      const pre = p === '/' ? '/' : `${p}/`;
      return Object.keys(tree).filter((k) => k !== p && k.startsWith(pre) && !k.slice(pre.length).includes('/')).map((k) => ({ ...info(k), name: k.slice(pre.length) }));
    },
  } as unknown as AgentClient;
  return { client, calls };
}

describe('microvm guest confinement', () => {
  it('Docker\'s capability set is mask a80425fb, as CapEff shows it in a container', () => {
    expect(capMask(DEFAULT_CAPS).toString(16)).toBe('a80425fb');
    expect(() => capMask(['CAP_NOPE'])).toThrow(/unknown capability/);
  });

  it('the profile resolves to x86-64 numbers: unconditional EPERM, clone3 ENOSYS, CLONE_NEWUSER and ioctl commands by argument', () => {
    const { rules } = guestSeccompRules(undefined, { allow: ['ptrace'], deny: ['getcpu'] });
    const by = (n: string) => rules.filter((r) => r.name === n);
    expect(by('mount')).toEqual([{ nr: 165, name: 'mount', errno: 1 }]);
    expect(by('bpf')).toEqual([{ nr: 321, name: 'bpf', errno: 1 }]);
    expect(by('clone3')).toEqual([{ nr: 435, name: 'clone3', errno: 38 }]);
    expect(by('unshare')).toEqual([{ nr: 272, name: 'unshare', errno: 1, arg: { index: 0, mask: 0x10000000, datum: 0x10000000 } }]);
    expect(by('ioctl').length).toBeGreaterThan(5);
    expect(by('ioctl').every((r) => r.arg?.index === 1 && r.arg.mask === 0xffffffff)).toBe(true);
    // Overrides apply: ptrace allowed by the sandbox, getcpu denied.
    expect(by('ptrace')).toEqual([]);
    expect(by('getcpu')).toEqual([{ nr: 309, name: 'getcpu', errno: 1 }]);
    // i386-only names are not in the x86-64 table (the guest filter kills that ABI).
    expect(by('vm86')).toEqual([]);
  });

  it('the payload: mkdirs, binds in order, the read-only root, runtime paths, caps, rules, landlock, writable places', () => {
    const text = confinePayload(
      { readonlyRoot: true, binds: [{ path: '/root', readonly: false }, { path: '/usr/local', readonly: false }], create: ['/work'], writable: ['/root', '/usr/local', '/work'] },
      0xa80425fbn, [{ nr: 165, name: 'mount', errno: 1 }, { nr: 272, name: 'unshare', errno: 1, arg: { index: 0, mask: 0x10000000, datum: 0x10000000 } }], true,
    ).toString();
    expect(text).toBe([
      'mkdir /work', 'bind /root rw', 'bind /usr/local rw', 'rootro', 'bind /proc/sys ro', 'bind /proc/sysrq-trigger ro', 'bind /sys ro',
      `caps ${0xa80425fb}`, 'rule 165 1', 'rule 272 1 0 268435456 268435456', 'landlock 1', 'writable /root', 'writable /usr/local', 'writable /work', '',
    ].join('\n'));
    expect(() => confinePayload({ readonlyRoot: true, binds: [{ path: '/a\nrootro', readonly: false }], create: [], writable: [] }, 0n, [], false)).toThrow(/newline/);
  });

  it('plans the filesystem over the guest tree as for a container (symlinked /lib, a missing writable path)', async () => {
    const { client, calls } = fakeAgent({
      '/': { type: 'dir' }, '/bin': { type: 'dir' }, '/etc': { type: 'dir' }, '/lib': { type: 'symlink', target: 'usr/lib' }, '/usr': { type: 'dir' },
      '/usr/lib': { type: 'dir' }, '/usr/local': { type: 'dir' }, '/root': { type: 'dir' }, '/tmp': { type: 'dir' }, '/proc': { type: 'dir' }, '/var': { type: 'dir' },
    });
    const plan = await planGuestFilesystem({ ...DEFAULT_FILESYSTEM, writable_paths: ['/usr/local', '/work'] }, client);
    expect(plan).toEqual({
      readonlyRoot: true,
      binds: [{ path: '/root', readonly: false }, { path: '/tmp', readonly: false }, { path: '/var', readonly: false }, { path: '/work', readonly: false }, { path: '/usr/local', readonly: false }],
      create: ['/work'],
      writable: ['/root', '/tmp', '/usr/local', '/var', '/work'],
    });
    // Each fact is fetched once (the planner re-runs over the cache).
    expect(new Set(calls).size).toBe(calls.length);
    expect(calls).toContain('list /');
  });
});
