/**
 * The default seccomp profile (daemon/security/seccomp.ts) on real runc: in a container
 * sandbox and in an fncall call (POST /v1/run), every probed dangerous syscall and ioctl
 * fails with EPERM before the kernel looks at its arguments, while ordinary programs run.
 *
 * The probe (seccomp-probe.c) is compiled static on the host and fed to the sandbox on
 * stdin. On the host, without a filter, the same probe gets other answers (ENOTTY,
 * EINVAL): the assertions can fail, so they prove the filter.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { IS_ROOT, REPO, TestDaemon, postJson, runCli } from '../integration/harness.js';

/** Probes that must answer EPERM (names as seccomp-probe.c knows them). */
const DENIED = [
  'mount', 'umount2', 'mount_setattr', 'open_tree', 'fsopen', 'pivot_root', 'bpf', 'keyctl', 'add_key', 'userfaultfd',
  'perf_event_open', 'io_uring_setup', 'open_by_handle_at', 'kexec_load', 'init_module', 'ptrace', 'pidfd_getfd',
  'process_vm_readv', 'setns', 'unshare_user', 'clone_user', 'swapon', 'syslog', 'settimeofday',
  'vsock', 'vsock_hibits', 'socket_tipc', 'socket_rds',
  'XFS_IOC_SWAPEXT', 'XFS_IOC_SWAPEXT_HIBITS', 'XFS_IOC_EXCHANGE_RANGE', 'FIFREEZE', 'XFS_IOC_GOINGDOWN', 'TIOCSTI',
];
/** Probes that must still work (or fail as without a filter). */
const CONTROLS: Record<string, string> = { getpid: 'ok', FIONREAD: 'ok', clone3: 'ENOSYS', socket_unix: 'ok', socket_inet: 'ok', socket_netlink: 'ok' };
/** Without a filter AF_VSOCK sockets are created wherever the vsock core is loaded (a VM host): the probe can tell. */
const vsockOnHost: [string, string][] = existsSync('/dev/vsock') ? [['vsock', 'ok'], ['vsock_hibits', 'ok']] : [];
const ALL = [...DENIED, ...Object.keys(CONTROLS)];
/** Copies the probe from stdin and runs every probe; then some ordinary busybox work. */
const SCRIPT = [
  'cat > /tmp/probe && chmod +x /tmp/probe || exit 99',
  `for n in ${ALL.join(' ')}; do /tmp/probe $n; done`,
  'grep -E "^Seccomp(_filters)?:" /proc/self/status',
  'echo hello | wc -c | tr -d " "; ls / >/dev/null && echo ls-ok; echo abc > /tmp/f && cp /tmp/f /tmp/g && cat /tmp/g',
  'busybox sh -c "sort </dev/null; seq 3 | tail -1"',
].join('\n');

function parse(out: string): Map<string, string> {
  const m = new Map<string, string>();
  for (const line of out.split('\n')) {
    const [k, v] = line.split(' ');
    if (k && v) m.set(k, v);
  }
  return m;
}

function expectDenials(out: string, filters: number): void {
  const got = parse(out);
  const bad = DENIED.filter((n) => got.get(n) !== 'EPERM').map((n) => `${n}=${got.get(n)}`);
  expect(bad).toEqual([]);
  for (const [n, want] of Object.entries(CONTROLS)) expect(`${n}=${got.get(n)}`).toBe(`${n}=${want}`);
  expect(out).toMatch(/^Seccomp:\s+2$/m); // filter mode
  expect(out).toMatch(new RegExp(`^Seccomp_filters:\\s+${filters}$`, 'm'));
  expect(out).toContain('\n6\nls-ok\nabc\n');
  expect(out).toMatch(/\n3\n?$/);
}

describe.skipIf(!IS_ROOT)('attack: dangerous syscalls and ioctls (seccomp)', () => {
  let d: TestDaemon;
  let tmp: string;
  let probe: Buffer;
  const post = <T>(p: string, body: unknown) => postJson<T>(d, p, body);

  beforeAll(async () => {
    tmp = mkdtempSync(path.join(os.tmpdir(), 'dsec-seccomp-'));
    const bin = path.join(tmp, 'probe');
    await execa('gcc', ['-static', '-O1', '-o', bin, path.join(REPO, 'test/attacks/seccomp-probe.c')]);
    probe = readFileSync(bin);
    d = await TestDaemon.start({ slot: 0, config: '[fncall]\nmax_workers = 1\nmin_idle = 1\n' });
  }, 120_000);
  afterAll(async () => {
    await d?.cleanup();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  it('the probe tells a filter apart: without one, the host answers otherwise', async () => {
    const cwd = tmp;
    for (const [n, want] of [['XFS_IOC_SWAPEXT', 'ENOTTY'], ['XFS_IOC_SWAPEXT_HIBITS', 'ENOTTY'], ['TIOCSTI', 'ENOTTY'], ['bpf', 'EINVAL'], ...vsockOnHost]) {
      const r = await execa(path.join(tmp, 'probe'), [n], { cwd });
      expect(r.stdout).toBe(`${n} ${want}`);
    }
    rmSync('/tmp/.seccomp-probe', { force: true });
  });

  it('a container sandbox: every denial answers EPERM, ordinary programs run', async () => {
    const { id } = await d.client.createSandbox({ image: 'busybox' });
    const r = await d.client.exec(id, { argv: ['sh', '-c', SCRIPT], stdin: probe });
    const out = r.stdout.toString();
    expect(r.stderr.toString()).toBe('');
    expect(r.exit_code).toBe(0);
    expectDenials(out, 1);
    // The neighbour-visible effect of a denied attempt: none; the sandbox keeps working.
    expect((await d.client.exec(id, { argv: ['echo', 'alive'] })).stdout.toString()).toBe('alive\n');

    // Every denial was seen and counted for this sandbox by the seccomp monitor: the
    // stats name the calls, and seccomp.denied events (coalesced per second) say so too.
    const st = await d.client.sandboxStats(id);
    expect(st.seccomp_denials).toBeTruthy();
    const by = st.seccomp_denials!.by_syscall;
    for (const n of ['mount', 'bpf', 'keyctl', 'userfaultfd', 'perf_event_open', 'io_uring_setup', 'open_by_handle_at', 'ptrace', 'setns', 'swapon'])
      expect(by[n], n).toBeGreaterThanOrEqual(1);
    // The XFS/FS/TTY ioctl probes and unshare/clone with CLONE_NEWUSER are conditional rules on ioctl/unshare/clone.
    expect(by.ioctl).toBeGreaterThanOrEqual(6);
    expect(st.seccomp_denials!.total).toBeGreaterThanOrEqual(DENIED.length);
    expect(st.seccomp_denials!.flooded).toBe(false);
    // The same counters reach a person at the terminal: `dsec inspect --stats`.
    const cli = await runCli(d, ['inspect', id, '--stats']);
    expect(cli.code, cli.stderr).toBe(0);
    expect(JSON.parse(cli.stdout).stats.seccomp_denials.by_syscall.mount).toBe(by.mount);
    const ev: string[] = [];
    for (let i = 0; i < 50 && !ev.some((m) => /ioctl/.test(m)); i++) {
      ev.length = 0;
      for await (const e of d.client.events({ selector: '' })) if (e.type === 'seccomp.denied' && e.sandbox_id === id) ev.push(e.message ?? '');
      if (!ev.some((m) => /ioctl/.test(m))) await new Promise((r) => setTimeout(r, 100));
    }
    expect(ev.join('\n')).toMatch(/system calls? denied \(.*ioctl/);
    expect(ev.join('\n')).toMatch(/in all$/m);
    // A neighbour that did nothing has nothing counted.
    const quiet = await d.client.createSandbox({ image: 'busybox' });
    await d.client.exec(quiet.id, { argv: ['true'] });
    expect((await d.client.sandboxStats(quiet.id)).seccomp_denials?.total ?? 0).toBe(0);
    await d.client.deleteSandbox(quiet.id, { force: true });
    await d.client.deleteSandbox(id, { force: true });
  }, 120_000);

  it('counting survives a dsecd restart: the monitor keeps the totals and keeps answering EPERM', async () => {
    const { id } = await d.client.createSandbox({ image: 'busybox' });
    const probeOnce = async (n: string) => (await d.client.exec(id, { argv: ['sh', '-c', `cat > /tmp/probe && chmod +x /tmp/probe && /tmp/probe ${n}`], stdin: probe })).stdout.toString().trim();
    expect(await probeOnce('bpf')).toBe('bpf EPERM');
    const before = (await d.client.sandboxStats(id)).seccomp_denials!.total;
    expect(before).toBeGreaterThanOrEqual(1);
    // A sandbox process that runs the mount probe on SIGUSR1 (sent from the host while
    // dsecd is down), then exits.
    const marker = `dsec-missed-${id.slice(0, 8)}`;
    await d.client.exec(id, { argv: ['sh', '-c', `sh -c 'trap "/tmp/probe mount >/tmp/m.out; exit 0" USR1; while :; do sleep 0.1; done' ${marker} >/dev/null 2>&1 &`] });
    const findWaiter = () => readdirSync('/proc').filter((p) => /^\d+$/.test(p)).map(Number).find((p) => {
      try { return readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0')[0] === 'sh' && readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0').includes(marker); } catch { return false; }
    });
    let waiter = findWaiter();
    for (let i = 0; i < 100 && !waiter; i++) {
      await new Promise((r) => setTimeout(r, 50));
      waiter = findWaiter();
    }
    expect(waiter).toBeTruthy();
    // dsecd saves the counts it has read at most once a second (seen.json): wait for the
    // bpf denial to be in it, or a crash this early would report it once more.
    const seenTotal = () => {
      try { return (JSON.parse(readFileSync(path.join(d.root, 'seccomp', 'seen.json'), 'utf8')) as Record<string, { total: number }>)[id]?.total; } catch { return undefined; }
    };
    for (let i = 0; i < 100 && seenTotal() !== before; i++) await new Promise((r) => setTimeout(r, 50));
    expect(seenTotal()).toBe(before);
    await d.kill9();
    process.kill(waiter!, 'SIGUSR1');
    for (let i = 0; i < 600 && existsSync(`/proc/${waiter}/cmdline`) && !readFileSync(`/proc/${waiter}/stat`, 'utf8').includes(') Z'); i++) await new Promise((r) => setTimeout(r, 50));
    await d.launch();
    // The denial no dsecd saw is counted and reported once, as an event of its own.
    expect((await d.client.sandboxStats(id)).seccomp_denials!.total).toBe(before + 1);
    const missed: string[] = [];
    for await (const e of d.client.events({ selector: '' })) if (e.type === 'seccomp.denied' && e.sandbox_id === id && /not connected/.test(e.message ?? '')) missed.push(e.message ?? '');
    expect(missed).toEqual([`1 system call denied while dsecd was not connected (mount); ${before + 1} in all`]);
    expect(await probeOnce('keyctl')).toBe('keyctl EPERM');
    const after = (await d.client.sandboxStats(id)).seccomp_denials!;
    expect(after.total).toBe(before + 2);
    expect(after.by_syscall.keyctl).toBe(1);
    // A second restart with nothing new reports nothing more.
    await new Promise((r) => setTimeout(r, 1100)); // seen.json is saved at most once a second
    await d.kill9();
    await d.launch();
    let again = 0;
    for await (const e of d.client.events({ selector: '' })) if (e.type === 'seccomp.denied' && e.sandbox_id === id && /not connected/.test(e.message ?? '')) again++;
    expect(again).toBe(1);
    const info = await d.client.hostInfo();
    expect((info.defences as Record<string, { enforced: boolean }>).seccomp_denial_counting.enforced).toBe(true);
    await d.client.deleteSandbox(id, { force: true });
  }, 120_000);

  it('a per-sandbox override lifts and adds denials, kept across stop/start; bad names are refused', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', seccomp: { allow: ['ptrace'], deny: ['getpid'] } });
    expect(sb.seccomp).toEqual({ allow: ['ptrace'], deny: ['getpid'] });
    const run = async () => parse((await d.client.exec(sb.id, { argv: ['sh', '-c', 'cat > /tmp/probe && chmod +x /tmp/probe && for n in ptrace getpid keyctl; do /tmp/probe $n; done'], stdin: probe })).stdout.toString());
    const check = (got: Map<string, string>) => {
      expect(got.get('ptrace')).not.toBe('EPERM'); // PTRACE_TRACEME is allowed now
      expect(got.get('getpid')).toBe('EPERM');
      expect(got.get('keyctl')).toBe('EPERM'); // the rest of the profile stays
    };
    check(await run());
    // inspect says what is in force: the override, and that denials are counted.
    const def = (await d.client.getSandbox(sb.id)).defences!;
    expect(def.seccomp).toMatchObject({ enforced: true });
    expect(def.seccomp.detail).toMatch(/sandbox override: allow ptrace deny getpid; denials answered and counted by the seccomp monitor/);
    expect(def.user_namespace.detail).toMatch(/^uids and gids 0-65535 inside are \d+-\d+ on the host$/);
    expect(def.capabilities.detail).toMatch(/without CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_NET_ADMIN/);
    await d.client.stopSandbox(sb.id, { timeoutMs: 0 });
    await d.client.startSandbox(sb.id);
    check(await run()); // the spec is rebuilt from the stored override
    await d.client.deleteSandbox(sb.id, { force: true });
    await expect(d.client.createSandbox({ image: 'busybox', seccomp: { allow: ['Not A Syscall'] } })).rejects.toMatchObject({ code: 'InvalidArgument' });
    // Denying what the runtime needs is the caller's mistake, said as such (not a failed start).
    await expect(d.client.createSandbox({ image: 'busybox', seccomp: { deny: ['execve'] } })).rejects.toMatchObject({ code: 'InvalidArgument', message: expect.stringMatching(/execve cannot be denied/) });
    const cli = await runCli(d, ['create', '--seccomp-deny', 'execve']);
    expect(cli.code).not.toBe(0);
    expect(cli.stderr).toMatch(/execve cannot be denied/);
  }, 120_000);

  it('an fncall call: the same denials (runc filter plus the agent\'s own), ordinary programs run', async () => {
    interface Result { exit_code: number | null; stdout_b64: string; stderr_b64: string }
    const r = await post<Result>('/v1/run', { backend: 'fncall', argv: ['sh', '-c', SCRIPT], stdin_b64: probe.toString('base64') });
    const out = Buffer.from(r.stdout_b64, 'base64').toString();
    expect(Buffer.from(r.stderr_b64, 'base64').toString()).toBe('');
    expect(r.exit_code).toBe(0);
    // Two filters: runc's (mount, mount_setattr and umount2 left to the agent) and the agent's.
    expectDenials(out, 2);
    // The worker's agent still isolates the next call (it mounts under runc's filter).
    const again = await post<Result>('/v1/run', { backend: 'fncall', argv: ['sh', '-c', 'ls /tmp | wc -l'] });
    expect(Buffer.from(again.stdout_b64, 'base64').toString().trim()).toBe('0');
  }, 120_000);
});
