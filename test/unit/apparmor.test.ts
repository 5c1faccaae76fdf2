import { execaSync } from 'execa';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import {
  AppArmorProfileError, compileArgs, compileProfile, kernelHasAppArmor, loadProfile, prepareSandboxProfile, profileName,
  profilePath, readTemplate, renderProfile, writeProfile,
} from '../../daemon/security/apparmor.js';
import { buildSpec } from '../../daemon/drivers/container/spec.js';
import { isDsecError } from '../../daemon/errors.js';

const template = await readTemplate();
const base = { instance: 'default', sandboxId: '3f9c0a1b2c3d4e5f', stateRoot: '/var/lib/dsec', socketDir: '/run/dsec', template };
const ordinary = renderProfile(base);
const worker = renderProfile({ ...base, worker: true });

/** Rules of a rendered profile: lines without comments, trimmed. */
const rules = (text: string) => text.split('\n').map((l) => l.replace(/#(?!include).*$/, '').trim()).filter(Boolean);

const parser = (() => {
  try {
    return execaSync('sh', ['-c', 'command -v apparmor_parser']).stdout.trim() || null;
  } catch {
    return null;
  }
})();
const tmp = mkdtempSync(path.join(os.tmpdir(), 'dsec-apparmor-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe('AppArmor profile: rendering', () => {
  it('names the profile dsec-<instance>-<id> with attach_disconnected,mediate_deleted', () => {
    expect(profileName('default', '3f9c0a1b2c3d4e5f')).toBe('dsec-default-3f9c0a1b2c3d4e5f');
    expect(rules(ordinary)).toContain('profile dsec-default-3f9c0a1b2c3d4e5f flags=(attach_disconnected,mediate_deleted) {');
    for (const t of [ordinary, worker]) expect(t).not.toMatch(/\{\{|^\s*#@/m);
  });
  it('contains the deny rules', () => {
    const r = rules(ordinary);
    for (const d of [
      'deny @{PROC}/* w,', 'deny @{PROC}/sys/** wklx,', 'deny @{PROC}/sysrq-trigger rwklx,', 'deny @{PROC}/kcore rwklx,',
      'deny @{PROC}/kmem rwklx,', 'deny @{PROC}/mem rwklx,', 'deny /sys/** wklx,', 'deny /sys/kernel/security/** rwklx,',
      'deny /var/lib/dsec/** rwklx,', 'deny /run/dsec/** rwklx,',
      'deny network inet raw,', 'deny network inet6 raw,', 'deny network packet,',
      'deny mount,', 'deny remount,', 'deny umount,', 'deny pivot_root,',
      'deny capability sys_admin,', 'deny capability net_raw,', 'deny capability sys_module,',
      'deny ptrace (read, trace) peer=unconfined,', 'deny signal (send) peer=unconfined,',
    ]) expect(r, d).toContain(d);
  });
  it('keeps signals and ptrace within the profile and allows ordinary networking', () => {
    const r = rules(ordinary);
    expect(r).toContain('signal (send, receive) peer=dsec-default-3f9c0a1b2c3d4e5f,');
    expect(r).toContain('ptrace (read, readby, trace, tracedby) peer=dsec-default-3f9c0a1b2c3d4e5f,');
    for (const n of ['inet stream', 'inet dgram', 'inet6 stream', 'inet6 dgram', 'unix stream', 'unix dgram']) expect(r).toContain(`network ${n},`);
    // No blanket allow that a deny would have to fight: no bare `mount,`, `network,`, `capability,` or `ptrace,`.
    for (const bare of ['mount,', 'network,', 'capability,', 'ptrace,', 'signal,']) expect(r).not.toContain(bare);
  });
  it('gives fncall workers narrow mounts instead of deny mount, and still no pivot_root', () => {
    const r = rules(worker);
    expect(r).toContain('capability sys_admin,');
    expect(r).toContain('mount fstype=proc -> /proc/,');
    expect(r).toContain('deny pivot_root,');
    expect(r).not.toContain('deny mount,');
    expect(r).not.toContain('deny capability sys_admin,');
    expect(rules(ordinary)).not.toContain('capability sys_admin,');
  });
  it('rejects bad instance names, sandbox ids and paths', () => {
    for (const bad of ['', 'Default', '-x', 'a b', 'a/b', 'x,y', 'a{b}', 'x\nprofile evil {', 'a'.repeat(64), 'x*']) {
      expect(() => renderProfile({ ...base, instance: bad }), bad).toThrow(AppArmorProfileError);
      expect(() => renderProfile({ ...base, sandboxId: bad }), bad).toThrow(/invalid sandbox id/);
    }
    for (const bad of ['relative/dir', '/a b', '/a/../b', '/x/**', '/x,y', '/a{b}', '/x#y', '/"q"']) {
      expect(() => renderProfile({ ...base, stateRoot: bad }), bad).toThrow(/state root/);
      expect(() => renderProfile({ ...base, socketDir: bad }), bad).toThrow(/socket directory/);
    }
    expect(() => profilePath('/r', '../etc')).toThrow(AppArmorProfileError);
    expect(profilePath('/r', 'fork-ab12')).toBe('/r/sandboxes/fork-ab12/apparmor.profile');
  });
  it('refuses a template with an unknown placeholder or unbalanced conditionals', () => {
    expect(() => renderProfile({ ...base, template: 'profile {{nope}} {}' })).toThrow(/unknown placeholder \{\{nope\}\}/);
    expect(() => renderProfile({ ...base, template: '#@if worker\nx\n' })).toThrow(/#@if without #@end/);
    expect(() => renderProfile({ ...base, template: '#@if gpu\nx\n#@end\n' })).toThrow(/unknown condition/);
  });
});

describe('AppArmor profile: compiling (apparmor_parser -Q -K)', () => {
  it('compiles only: the argument list always skips the kernel load and the cache', () => {
    expect(compileArgs('/f')).toEqual(['-Q', '-K', '-q', '-o', '/dev/null', '/f']);
  });
  it.skipIf(!parser)(`the rendered profiles compile${parser ? '' : ' (SKIPPED: apparmor_parser is not installed; scripts/install.sh installs package apparmor)'}`, async () => {
    for (const [name, text] of [['ordinary', ordinary], ['worker', worker]] as const) {
      const f = await writeProfile(path.join(tmp, 'sandboxes', name, 'apparmor.profile'), text);
      await expect(compileProfile(f)).resolves.toBeUndefined();
    }
  });
  it.skipIf(!parser)('a broken template fails with the parser\'s message naming the file', async () => {
    const broken = template.replace('deny network packet,', 'deny network packets-please,');
    const f = await writeProfile(path.join(tmp, 'broken.profile'), renderProfile({ ...base, template: broken }));
    const err = await compileProfile(f).then(() => null, (e: unknown) => e as Error);
    expect(err).toBeInstanceOf(AppArmorProfileError);
    expect(err!.message).toContain(`apparmor_parser failed to compile ${f}`);
    expect(err!.message).toMatch(/network/i);
    expect(err!.message).not.toMatch(/Cache read\/write disabled/);
  });
  it('a missing parser is a clear error', async () => {
    const f = await writeProfile(path.join(tmp, 'p.profile'), ordinary);
    await expect(compileProfile(f, { parser: '/nonexistent/apparmor_parser' })).rejects.toThrow(/apparmor_parser failed to compile .*p\.profile/);
  });
});

describe('AppArmor: load and attach are gated on the kernel', () => {
  const missing = path.join(tmp, 'no-securityfs');
  it('kernelHasAppArmor follows the securityfs directory', () => {
    expect(kernelHasAppArmor(missing)).toBe(false);
    expect(kernelHasAppArmor(tmp)).toBe(true);
  });
  it('load and attach refuse without AppArmor, before running the parser or writing anything', async () => {
    // A parser that would fail loudly if it were ever run.
    const opts = { parser: '/bin/false', securityfs: missing };
    const e1 = await loadProfile('/x', opts).then(() => null, (e: unknown) => e);
    expect(isDsecError(e1, 'FailedPrecondition')).toBe(true);
    expect((e1 as Error).message).toMatch(/kernel has no AppArmor/);
    const root = path.join(tmp, 'root');
    const e2 = await prepareSandboxProfile({ root, instance: 'default', sandboxId: 'abcd', socketDir: '/run/dsec', ...opts }).then(() => null, (e: unknown) => e);
    expect(isDsecError(e2, 'FailedPrecondition')).toBe(true);
    expect(kernelHasAppArmor(root)).toBe(false); // nothing written
  });
});

describe('OCI spec and AppArmor', () => {
  const input = {
    id: 'abcd', rootfs: '/r/rootfs', agentBinary: '/opt/dsec-agent', uidBase: 2 ** 31, uidCount: 65536,
    cgroupsPath: 'dsec-x/abcd', cpus: 0.5, memoryBytes: 256 << 20, pids: 64,
  };
  it('a spec built without a loaded profile (a host without AppArmor) has no apparmorProfile', () => {
    const spec = buildSpec(input) as any;
    expect('apparmorProfile' in spec.process).toBe(false);
    expect(JSON.stringify(spec)).not.toMatch(/apparmor/i);
    expect('apparmorProfile' in (buildSpec({ ...input, worker: true }) as any).process).toBe(false);
  });
  it('names the profile only when one is given', () => {
    expect((buildSpec({ ...input, apparmorProfile: 'dsec-default-abcd' }) as any).process.apparmorProfile).toBe('dsec-default-abcd');
  });
  it.runIf(!kernelHasAppArmor())('this host: the kernel has no AppArmor, so the driver attaches none', () => {
    expect(kernelHasAppArmor()).toBe(false);
  });
});
