/**
 * The seccomp profile is a data file ([security] seccomp_profile): validated at start (a
 * malformed file stops dsecd with an error naming the file and field), reloaded by
 * POST /v1/security/seccomp/reload, SIGHUP and `dsec host reload`, where a malformed
 * file is refused and the profile in force stays. New sandboxes get the profile in
 * force; running ones keep the filter the kernel installed.
 *
 * The probe's `kcmp` is allowed by the shipped profile; the test's second profile
 * denies it, so which profile a sandbox got is visible from inside.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { IS_ROOT, REPO, TestDaemon, rejection, runCli } from './harness.js';
import { defaultProfilePath } from '../../daemon/security/seccomp.js';
import { waitFor } from '../fixtures/agent.js';

describe.skipIf(!IS_ROOT)('seccomp profile as a data file: validation and reload', () => {
  let d: TestDaemon;
  let tmp: string;
  let profile: string;
  let probe: Buffer;
  const shipped = readFileSync(defaultProfilePath(), 'utf8');
  const withKcmp = (() => {
    const p = JSON.parse(shipped);
    p.syscalls.push({ names: ['kcmp'], action: 'SCMP_ACT_ERRNO', errnoRet: 1, comment: 'test: deny kcmp' });
    return JSON.stringify(p, null, 1);
  })();

  beforeAll(async () => {
    tmp = mkdtempSync(path.join(os.tmpdir(), 'dsec-profiles-'));
    const bin = path.join(tmp, 'probe');
    await execa('gcc', ['-static', '-O1', '-o', bin, path.join(REPO, 'test/attacks/seccomp-probe.c')]);
    probe = readFileSync(bin);
    profile = path.join(tmp, 'seccomp.json');
    writeFileSync(profile, shipped);
    d = await TestDaemon.start({ slot: 42, config: `[security]\nseccomp_profile = "${profile}"\n` });
  }, 120_000);
  afterAll(async () => {
    await d?.cleanup();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  const kcmp = async (id: string) =>
    (await d.client.exec(id, { argv: ['sh', '-c', 'cat > /tmp/probe && chmod +x /tmp/probe && /tmp/probe kcmp'], stdin: probe })).stdout.toString().trim();

  it('loads the configured file and reports it', async () => {
    const info = await d.client.seccompProfile();
    expect(info.file).toBe(profile);
    expect(info.sha256).toMatch(/^[0-9a-f]{64}$/);
    expect(info.denied).toBeGreaterThan(30);
    expect(info.missing_core).toEqual([]);
    expect(info.warnings).toEqual([]);
    const sb = await d.client.createSandbox({ image: 'busybox' });
    expect(await kcmp(sb.id)).toBe('kcmp ok');
    await d.client.deleteSandbox(sb.id, { force: true });
  });

  it('a malformed file is refused with the file and field named; the profile in force stays', async () => {
    const before = await d.client.seccompProfile();
    writeFileSync(profile, JSON.stringify({ ...JSON.parse(withKcmp), defaultAction: 'SCMP_ACT_MAYBE' }));
    const e = await rejection(d.client.reloadSeccompProfile());
    expect(e.code).toBe('InvalidArgument');
    expect(e.message).toContain(profile);
    expect(e.message).toMatch(/defaultAction/);
    writeFileSync(profile, '{ not json');
    expect((await rejection(d.client.reloadSeccompProfile())).message).toMatch(/not JSON/);
    expect(await d.client.seccompProfile()).toEqual(before);
    // New sandboxes still get the profile that was in force (kcmp allowed).
    const sb = await d.client.createSandbox({ image: 'busybox' });
    expect(await kcmp(sb.id)).toBe('kcmp ok');
    await d.client.deleteSandbox(sb.id, { force: true });
    // The CLI says so and exits non-zero.
    const r = await runCli(d, ['host', 'reload']);
    expect(r.code).not.toBe(0);
    expect(r.stdout + r.stderr).toMatch(/seccomp: refused, the profile in force stays/);
  });

  it('a valid file takes effect for new sandboxes (API and SIGHUP); running ones keep their filter', async () => {
    writeFileSync(profile, shipped);
    await d.client.reloadSeccompProfile();
    const old = await d.client.createSandbox({ image: 'busybox' });
    writeFileSync(profile, withKcmp);
    const info = await d.client.reloadSeccompProfile();
    expect(info.denied).toBe((await d.client.seccompProfile()).denied);
    const fresh = await d.client.createSandbox({ image: 'busybox' });
    expect(await kcmp(fresh.id)).toBe('kcmp EPERM');
    expect(await kcmp(old.id)).toBe('kcmp ok');
    // SIGHUP reloads too: back to the shipped profile.
    writeFileSync(profile, shipped);
    process.kill(d.pid, 'SIGHUP');
    const want = createHash('sha256').update(shipped).digest('hex');
    for (let i = 0; i < 100 && (await d.client.seccompProfile()).sha256 !== want; i++) await new Promise((r) => setTimeout(r, 50));
    expect((await d.client.seccompProfile()).sha256).toBe(want);
    const third = await d.client.createSandbox({ image: 'busybox' });
    expect(await kcmp(third.id)).toBe('kcmp ok');
    for (const id of [old.id, fresh.id, third.id]) await d.client.deleteSandbox(id, { force: true });
  });

  it('a profile lacking core denials is loaded with a warning; host info and inspect say what the filter in force denies', async () => {
    type Defences = Record<string, { enforced: boolean; detail: string }>;
    const hostSeccomp = async () => ((await d.client.hostInfo()) as unknown as { defences: Defences }).defences.seccomp;
    // No rules at all.
    writeFileSync(profile, JSON.stringify({ defaultAction: 'SCMP_ACT_ALLOW', architectures: ['SCMP_ARCH_X86_64'], syscalls: [] }));
    const empty = await d.client.reloadSeccompProfile();
    expect(empty.denied).toBe(0);
    expect(empty.missing_core).toContain('bpf');
    expect(empty.missing_core).toContain('mount');
    expect(empty.warnings).toHaveLength(1);
    expect(empty.warnings[0]).toMatch(new RegExp(`^seccomp profile ${profile.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')} does not deny 25 of the 25 core syscalls: bpf, mount,`));
    // dsecd's log line reaches this process through a pipe, after the API's answer.
    await waitFor('the warning in dsecd\'s log', () => d.stderr.includes('does not deny 25 of the 25 core syscalls'));
    expect(await hostSeccomp()).toEqual({ enforced: false, detail: `profile ${profile} (sha256 ${empty.sha256.slice(0, 12)}) on every container sandbox and fncall worker (microvm: see microvm_guest): it denies no syscall` });
    const sb = await d.client.createSandbox({ image: 'busybox' });
    expect((await d.client.getSandbox(sb.id)).defences!.seccomp).toEqual({ enforced: false, detail: 'a seccomp filter from seccomp.json that denies no syscall (no denying rules)' });
    await d.client.deleteSandbox(sb.id, { force: true });
    // `dsec host reload` prints the warning (and succeeds: the profile is valid).
    const cli = await runCli(d, ['host', 'reload']);
    expect(cli.stdout).toMatch(/seccomp: .* 0 syscalls denied\)/);
    expect(cli.stderr).toMatch(/dsec: warning: seccomp profile .* does not deny 25 of the 25 core syscalls/);

    // The shipped profile without ptrace: one core denial missing, named everywhere.
    const noPtrace = JSON.parse(shipped);
    for (const r of noPtrace.syscalls) r.names = r.names.filter((n: string) => n !== 'ptrace');
    writeFileSync(profile, JSON.stringify(noPtrace));
    const lax = await d.client.reloadSeccompProfile();
    expect(lax.missing_core).toEqual(['ptrace']);
    expect((await hostSeccomp()).detail).toMatch(/syscalls denied; lacks core denials: ptrace$/);
    const sb2 = await d.client.createSandbox({ image: 'busybox' });
    const def = (await d.client.getSandbox(sb2.id)).defences!.seccomp;
    expect(def.enforced).toBe(true);
    expect(def.detail).toMatch(/^\d+ rules from seccomp\.json, denying \d+ syscalls \(\d+ unconditionally\); denials answered and counted by the seccomp monitor; lacks core denials: ptrace$/);
    await d.client.deleteSandbox(sb2.id, { force: true });

    // The shipped profile: no warning, and host info says so.
    writeFileSync(profile, shipped);
    const ok = await d.client.reloadSeccompProfile();
    expect(ok.warnings).toEqual([]);
    expect(await hostSeccomp()).toMatchObject({ enforced: true });
    expect((await hostSeccomp()).detail).toMatch(/\d+ syscalls denied; includes every core denial \(25:/);
  });

  it('dsecd refuses to start on a malformed profile, naming the file', async () => {
    writeFileSync(profile, JSON.stringify({ defaultAction: 'SCMP_ACT_ALLOW', architectures: [], syscalls: [] }));
    await d.stop();
    await expect(d.launch()).rejects.toThrow(new RegExp(`seccomp profile ${profile.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}: architectures`));
    writeFileSync(profile, shipped);
    await d.launch();
    expect((await d.client.seccompProfile()).file).toBe(profile);
  });
});
