/** The seccomp profile data file, its validation, the override merge and the ioctl numbers. */
import { describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import {
  buildSeccomp, defaultProfile, defaultProfilePath, deniedNames, ioc, parseProfile, SeccompOverrideSchema, knownSyscalls,
  SeccompProfileError, WORKER_AGENT_SYSCALLS, type OciSeccomp,
} from '../../daemon/security/seccomp.js';
import { buildSpec } from '../../daemon/drivers/container/spec.js';

const ioctlValues = (s: OciSeccomp) => s.syscalls.filter((r) => r.names.includes('ioctl')).map((r) => r.args![0].valueTwo);

describe('seccomp default profile', () => {
  it('validates, denies with EPERM, and covers every x86 ABI', () => {
    const p = defaultProfile();
    expect(p.defaultAction).toBe('SCMP_ACT_ALLOW');
    expect(p.architectures).toEqual(['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86', 'SCMP_ARCH_X32']);
    for (const r of p.syscalls) {
      expect(r.action).toBe('SCMP_ACT_ERRNO');
      expect(r.errnoRet).toBe(r.names.includes('clone3') ? 38 : 1);
      expect(r.comment, r.names.join(',')).toBeTruthy();
    }
    const denied = deniedNames(buildSeccomp());
    for (const n of ['bpf', 'mount', 'umount2', 'move_mount', 'open_tree', 'fsopen', 'fsconfig', 'fsmount', 'fspick', 'mount_setattr',
      'pivot_root', 'kexec_load', 'kexec_file_load', 'keyctl', 'add_key', 'request_key', 'open_by_handle_at', 'name_to_handle_at',
      'userfaultfd', 'perf_event_open', 'io_uring_setup', 'io_uring_enter', 'io_uring_register', 'init_module', 'finit_module',
      'delete_module', 'reboot', 'swapon', 'swapoff', 'acct', 'settimeofday', 'clock_settime', 'setns', 'ptrace', 'pidfd_getfd',
      'process_vm_readv', 'process_vm_writev', 'lookup_dcookie', 'quotactl', 'syslog']) expect(denied, n).toContain(n);
  });

  it('has the right ioctl numbers, compared on the low 32 bits', () => {
    // struct xfs_swapext on x86_64: 5 × 8 + 16 + sizeof(struct xfs_bstat) 136 = 192;
    // the i386 compat layout (packed, 4-byte aligned s64) is 40 + 16 + 108 = 164.
    const want = {
      XFS_IOC_SWAPEXT: ioc('rw', 'X', 109, 192), XFS_IOC_SWAPEXT_32: ioc('rw', 'X', 109, 164),
      XFS_IOC_EXCHANGE_RANGE: ioc('w', 'X', 129, 40), XFS_IOC_START_COMMIT: ioc('r', 'X', 130, 88), XFS_IOC_COMMIT_RANGE: ioc('w', 'X', 131, 88),
      EXT4_IOC_MOVE_EXT: ioc('rw', 'f', 15, 40), EXT4_IOC_SWAP_BOOT: ioc('none', 'f', 17, 0),
      FIFREEZE: ioc('rw', 'X', 119, 4), FITHAW: ioc('rw', 'X', 120, 4), XFS_IOC_GOINGDOWN: ioc('r', 'X', 125, 4),
      TIOCSTI: 0x5412, TIOCLINUX: 0x541c,
    };
    expect(want.XFS_IOC_SWAPEXT).toBe(0xc0c0586d);
    expect(want.XFS_IOC_SWAPEXT_32).toBe(0xc0a4586d);
    expect(want.FIFREEZE).toBe(0xc0045877);
    expect(want.XFS_IOC_GOINGDOWN).toBe(0x8004587d);
    const rules = defaultProfile().syscalls.filter((r) => r.names.includes('ioctl'));
    expect(rules.map((r) => r.args![0].valueTwo).sort()).toEqual(Object.values(want).sort());
    for (const r of rules) {
      expect(r.args).toEqual([{ index: 1, value: 0xffffffff, valueTwo: r.args![0].valueTwo, op: 'SCMP_CMP_MASKED_EQ' }]);
      const name = Object.entries(want).find(([, v]) => v === r.args![0].valueTwo)![0];
      expect(r.comment).toContain(`${name} = `);
      expect(r.comment).toContain(`0x${r.args![0].valueTwo!.toString(16)}`);
    }
    // Reflinks and FS_IOC_SETFLAGS are allowed on purpose (see seccomp.ts).
    for (const v of [0x40049409, 0x4020940d, 0xc0189436, 0x40086602]) expect(ioctlValues(buildSeccomp())).not.toContain(v);
  });

  it('denies nested user namespaces by flag, and clone3 with ENOSYS', () => {
    const s = buildSeccomp();
    for (const n of ['unshare', 'clone']) {
      const r = s.syscalls.find((x) => x.names.includes(n))!;
      expect(r.args).toEqual([{ index: 0, value: 0x10000000, valueTwo: 0x10000000, op: 'SCMP_CMP_MASKED_EQ' }]);
    }
    expect(s.syscalls.find((x) => x.names.includes('clone3'))).toEqual({ names: ['clone3'], action: 'SCMP_ACT_ERRNO', errnoRet: 38 });
  });

  it('refuses a malformed profile with a clear error', () => {
    const good = readFileSync(defaultProfilePath(), 'utf8');
    expect(() => parseProfile('{', 'x.json')).toThrow(SeccompProfileError);
    expect(() => parseProfile('{', 'x.json')).toThrow(/x\.json: not JSON/);
    const bad = JSON.parse(good);
    bad.syscalls[0].action = 'SCMP_ACT_NOPE';
    expect(() => parseProfile(JSON.stringify(bad), 'p.json')).toThrow(/p\.json: syscalls\.0\.action/);
    const noErrno = JSON.parse(good);
    delete noErrno.syscalls[0].errnoRet;
    expect(() => parseProfile(JSON.stringify(noErrno), 'p.json')).toThrow(/errnoRet/);
    const badName = JSON.parse(good);
    badName.syscalls[0].names = ['Mount; rm'];
    expect(() => parseProfile(JSON.stringify(badName), 'p.json')).toThrow(/syscall name/);
    expect(() => parseProfile(JSON.stringify({ ...JSON.parse(good), architectures: ['SCMP_ARCH_ARM'] }), 'p.json')).toThrow(SeccompProfileError);
    // The smallest profile a user would write first: the missing field is named with what to put there.
    expect(() => parseProfile(JSON.stringify({ defaultAction: 'SCMP_ACT_ALLOW', syscalls: [] }), 'p.json')).toThrow(/p\.json: architectures: architectures is required: .*SCMP_ARCH_X86_64/);
    // A misspelt name would make its denial vanish (libseccomp skips what it cannot resolve).
    const typo = JSON.parse(good);
    typo.syscalls[0].names = ['keyctll'];
    expect(() => parseProfile(JSON.stringify(typo), 'p.json')).toThrow(/p\.json: syscalls\.0\.names\.0: unknown syscall "keyctll"/);
    // A default that denies would stop runc's init and the agent before any sandbox runs.
    expect(() => parseProfile(JSON.stringify({ ...JSON.parse(good), defaultAction: 'SCMP_ACT_KILL' }), 'p.json')).toThrow(/defaultAction must be SCMP_ACT_ALLOW/);
    // Overrides are checked the same way; names of either x86 ABI are known (stime is i386-only).
    expect(SeccompOverrideSchema.safeParse({ allow: ['ptrac'] }).success).toBe(false);
    expect(SeccompOverrideSchema.safeParse({ deny: ['nosuchcall'] }).success).toBe(false);
    expect(SeccompOverrideSchema.safeParse({ allow: ['ptrace'], deny: ['stime', 'kcmp'] }).success).toBe(true);
    // What runc's init and the agent need cannot be denied: refused with the reason, not a failed start.
    for (const n of ['execve', 'execveat', 'exit_group', 'futex', 'read']) {
      const r = SeccompOverrideSchema.safeParse({ deny: ['kcmp', n] });
      expect(r.success, n).toBe(false);
      expect(r.error!.issues[0]).toMatchObject({ path: ['deny', 1], message: `${n} cannot be denied: runc's init and the sandbox agent need it (the sandbox could not start or run anything)` });
    }
    expect(SeccompOverrideSchema.safeParse({ allow: ['execve'] }).success).toBe(true);
    expect(knownSyscalls()?.has('io_uring_setup')).toBe(true);
  });

  it('merges overrides: image first, sandbox last; allow lifts every rule naming the syscall', () => {
    const base = buildSeccomp();
    expect(base.syscalls.every((r) => !('comment' in r))).toBe(true);
    const uring = buildSeccomp({ image: { allow: ['io_uring_setup', 'io_uring_enter', 'io_uring_register'] } });
    expect(deniedNames(uring)).not.toContain('io_uring_setup');
    expect(deniedNames(uring)).toContain('bpf');
    // Image denies, sandbox allows back; sandbox deny adds an EPERM rule.
    const s = buildSeccomp({ image: { deny: ['chroot'] }, sandbox: { allow: ['chroot', 'ptrace'], deny: ['kcmp'] } });
    expect(deniedNames(s)).not.toContain('chroot');
    expect(deniedNames(s)).not.toContain('ptrace');
    expect(deniedNames(s)).toContain('process_vm_readv');
    expect(s.syscalls.at(-1)).toEqual({ names: ['kcmp'], action: 'SCMP_ACT_ERRNO', errnoRet: 1 });
    // allow: ["ioctl"] lifts all ioctl denials (the caller asked for it by name).
    expect(ioctlValues(buildSeccomp({ sandbox: { allow: ['ioctl'] } }))).toEqual([]);
    // The profile itself is not modified by merging.
    expect(buildSeccomp()).toEqual(base);
    expect(SeccompOverrideSchema.safeParse({ allow: ['io_uring_setup'], extra: 1 }).success).toBe(false);
    expect(SeccompOverrideSchema.safeParse({ deny: ['BAD NAME'] }).success).toBe(false);
  });

  it('a worker leaves exactly mount, mount_setattr and umount2 to its agent', () => {
    const all = deniedNames(buildSeccomp());
    const w = deniedNames(buildSeccomp({ worker: true }));
    expect(all.filter((n) => !w.includes(n)).sort()).toEqual([...WORKER_AGENT_SYSCALLS].sort());
  });

  it('counted denials become SCMP_ACT_NOTIFY rules naming the monitor; ENOSYS and override denials stay ERRNO', () => {
    const plain = buildSeccomp({ sandbox: { deny: ['kcmp'] } });
    const n = buildSeccomp({ sandbox: { deny: ['kcmp'] }, notify: { listenerPath: '/r/seccomp/notify.sock', metadata: '0123456789abcdef' } });
    expect(n.listenerPath).toBe('/r/seccomp/notify.sock');
    expect(n.listenerMetadata).toBe('0123456789abcdef');
    expect(plain.listenerPath).toBeUndefined();
    // Same rules, same order and conditions; only the action of the profile's EPERM rules changes.
    expect(n.syscalls.map((r) => r.names)).toEqual(plain.syscalls.map((r) => r.names));
    n.syscalls.forEach((r, i) => {
      const p = plain.syscalls[i];
      expect(r.args).toEqual(p.args);
      if (p.action === 'SCMP_ACT_ERRNO' && p.errnoRet === 1 && !p.names.includes('kcmp')) expect(r).toEqual({ ...p, action: 'SCMP_ACT_NOTIFY', errnoRet: undefined });
      else expect(r).toEqual(p);
    });
    expect(n.syscalls.find((r) => r.names.includes('clone3'))).toMatchObject({ action: 'SCMP_ACT_ERRNO', errnoRet: 38 });
    expect(n.syscalls.find((r) => r.names.includes('kcmp'))).toMatchObject({ action: 'SCMP_ACT_ERRNO', errnoRet: 1 });
    expect(n.syscalls.find((r) => r.names.includes('bpf'))).toEqual({ names: ['bpf'], action: 'SCMP_ACT_NOTIFY' });
    expect(() => buildSeccomp({ notify: { listenerPath: '/x', metadata: 'Bad Id' } })).toThrow(/not a sandbox id/);
  });

  it('is in every sandbox spec', () => {
    const input = { id: 'abcd', rootfs: '/r', agentBinary: '/a', uidBase: 2 ** 31, uidCount: 65536, cgroupsPath: 'x/abcd', cpus: 1, memoryBytes: 1 << 28, pids: 64 };
    expect((buildSpec(input) as any).linux.seccomp).toEqual(buildSeccomp());
    expect((buildSpec({ ...input, worker: true }) as any).linux.seccomp).toEqual(buildSeccomp({ worker: true }));
    expect((buildSpec({ ...input, seccomp: { sandbox: { allow: ['ptrace'] } } }) as any).linux.seccomp).toEqual(buildSeccomp({ sandbox: { allow: ['ptrace'] } }));
  });
});
