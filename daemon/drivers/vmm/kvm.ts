/**
 * The accelerator of this host's VMs: whether KVM works for the guest kernel (one probe
 * boot per host boot, its verdict cached in /run), and the host TSC rate a TCG guest is
 * told so it skips a calibration that fails on a busy host.
 */
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { MICROVM_MACHINE } from './qemu.js';

/**
 * The host TSC frequency in kHz (`dsec-vmm-launch --tsc-khz`), or null when it cannot be
 * used: not an x86 host, or the TSC is not constant (`constant_tsc` and `nonstop_tsc` in
 * /proc/cpuinfo), so a TCG guest's TSC would not tick at a fixed rate anyway.
 */
export async function hostTscKhz(launcher: string): Promise<number | null> {
  if (os.arch() !== 'x64') return null;
  const flags = /^flags\s*:(.*)$/m.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1].split(/\s+/) ?? [];
  if (!flags.includes('constant_tsc') || !flags.includes('nonstop_tsc')) return null;
  const r = await execa(launcher, ['--tsc-khz'], { reject: false });
  const khz = Number(String(r.stdout).trim());
  return r.exitCode === 0 && Number.isInteger(khz) && khz > 100_000 ? khz : null;
}

/** The verdict of {@link probeKvm}. */
export interface KvmVerdict {
  usable: boolean;
  /** Why (shown in `dsec host info`): what was tried and what happened. */
  reason: string;
}

/**
 * Where a KVM probe's verdict is kept for the rest of this host boot: /run is a tmpfs, so
 * the file goes with a reboot (KVM usability can change with the host's kernel or
 * firmware), and every dsecd instance on the host shares it. The record names the boot
 * (`/proc/sys/kernel/random/boot_id`) and the QEMU binary and guest kernel it was made
 * with (path, size, mtime); a different one probes again.
 */
export const KVM_VERDICT_FILE = '/run/dsec/kvm-probe.json';

/** The identity a cached KVM verdict is valid for (see {@link KVM_VERDICT_FILE}). */
async function probeKey(o: { qemu: string; kernel: string }): Promise<string> {
  const id = async (f: string) => {
    const st = await stat(f).catch(() => null);
    return st ? `${f}:${st.size}:${st.mtimeMs}` : `${f}:missing`;
  };
  const boot = (await readFile('/proc/sys/kernel/random/boot_id', 'utf8').catch(() => '')).trim();
  return `${boot}|${await id(o.qemu)}|${await id(o.kernel)}`;
}

/** The verdict cached for this boot, QEMU and kernel, or null (see {@link KVM_VERDICT_FILE}). */
export async function cachedKvmVerdict(o: { qemu: string; kernel: string }, file = KVM_VERDICT_FILE): Promise<KvmVerdict | null> {
  try {
    const j = JSON.parse(await readFile(file, 'utf8')) as { key: string; verdict: KvmVerdict };
    return j.key === (await probeKey(o)) && typeof j.verdict?.usable === 'boolean' ? j.verdict : null;
  } catch {
    return null;
  }
}

/**
 * {@link probeKvm}, once per host boot: a verdict cached in {@link KVM_VERDICT_FILE} for
 * the same QEMU and guest kernel (`guestKernel`: the configured `[vm] kernel`, which
 * `kernel`, the image actually booted, is derived from) is returned as is (the probe boot costs up to `timeoutMs` of a
 * core under TCG), otherwise the probe runs and its verdict is cached (written
 * atomically; a failure to write only costs a later probe).
 */
export async function probeKvmCached(o: { qemu: string; kernel: string; initrd: string; timeoutMs: number; guestKernel: string }, file = KVM_VERDICT_FILE): Promise<KvmVerdict> {
  const ident = { qemu: o.qemu, kernel: o.guestKernel };
  const cached = await cachedKvmVerdict(ident, file);
  if (cached) return { ...cached, reason: `${cached.reason} (probed earlier this boot)` };
  const verdict = await probeKvm(o);
  try {
    await mkdir(path.dirname(file), { recursive: true });
    const tmp = `${file}.${process.pid}.tmp`;
    await writeFile(tmp, JSON.stringify({ key: await probeKey(ident), verdict }));
    await rename(tmp, file);
  } catch { /* uncached: the next dsecd probes again */ }
  return verdict;
}

/**
 * Boots the guest kernel and initramfs once under KVM (`dsec.probe=1`: /init loads its
 * modules, prints `dsec-init: probe ok` and reboots, which ends QEMU) and reports whether
 * that worked within `timeoutMs`. On hosts where stock guest kernels hang under KVM (such
 * as nested setups without the needed features) the probe times out and its QEMU is
 * killed by pid. Leaves nothing behind (its temp dir is removed).
 */
export async function probeKvm(o: { qemu: string; kernel: string; initrd: string; timeoutMs: number }): Promise<KvmVerdict> {
  if (!existsSync('/dev/kvm')) return { usable: false, reason: 'no /dev/kvm on this host: microVMs run under TCG (software emulation)' };
  const dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-kvm-probe-'));
  const con = path.join(dir, 'console.log');
  const args = [
    '-M', MICROVM_MACHINE, '-accel', 'kvm', '-cpu', 'host', '-m', '256', '-smp', '1',
    '-nodefaults', '-no-user-config', '-display', 'none', '-no-reboot',
    '-kernel', o.kernel, '-initrd', o.initrd, '-append', `console=ttyS0 reboot=t panic=-1 loglevel=4 edd=off dsec.probe=1`,
    '-chardev', `file,id=con,path=${con}`, '-serial', 'chardev:con',
  ];
  const t0 = Date.now();
  const child = spawn(o.qemu, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (b: Buffer) => { if (stderr.length < 4096) stderr += b.toString(); });
  const exited = new Promise<number | null>((resolve) => {
    child.once('exit', (code) => resolve(code));
    child.once('error', () => resolve(-1));
  });
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<'timeout'>((resolve) => { timer = setTimeout(() => resolve('timeout'), o.timeoutMs); });
  const r = await Promise.race([exited, timedOut]);
  clearTimeout(timer);
  if (r === 'timeout' && child.pid) {
    try { process.kill(child.pid, 'SIGKILL'); } catch { /* already gone */ }
    await exited;
  }
  const out = await readFile(con, 'utf8').catch(() => '');
  await rm(dir, { recursive: true, force: true });
  const ms = Date.now() - t0;
  if (out.includes('dsec-init: probe ok')) return { usable: true, reason: `a probe boot under KVM reached the guest's init in ${ms} ms: microVMs run under KVM` };
  if (r === 'timeout') return { usable: false, reason: `a probe boot under KVM did not reach the guest's init within ${o.timeoutMs} ms (the guest kernel hangs under KVM on this host): microVMs run under TCG` };
  return { usable: false, reason: `a probe boot under KVM failed (QEMU exit ${r}${stderr.trim() ? `: ${stderr.trim().split('\n').pop()}` : ''}): microVMs run under TCG` };
}
