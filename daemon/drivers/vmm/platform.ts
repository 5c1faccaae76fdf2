/**
 * What every VM of one driver boots with, computed once: the QEMU binary, the kernel QEMU
 * boots (the uncompressed PVH kernel extracted from `[vm] kernel` where it has one), the
 * initramfs with the tier's guest modules, the accelerator verdict (KVM or TCG) and the
 * TSC rate a TCG guest is told. The work waits for the first boot: a dsecd that never runs
 * a VM never spends a probe boot's CPU on it.
 */
import { createHash } from 'node:crypto';
import { chmod, mkdir, readFile, rename, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from 'pino';
import type { VmConfig } from '../../config.js';
import { failedPrecondition } from '../../errors.js';
import { findExecutable, isFile } from './host.js';
import { buildInitramfs, type Initramfs } from './initramfs.js';
import { extractPvhKernel, kernelRelease } from './kmod.js';
import { cachedKvmVerdict, hostTscKhz, probeKvmCached, type KvmVerdict } from './kvm.js';
import type { Accel } from './qemu.js';

/** What every VM of a driver boots with. */
export interface Platform {
  initramfs: Initramfs;
  /** What QEMU boots: the uncompressed vmlinux (PVH entry) extracted from [vm] kernel, or that bzImage itself. */
  kernel: string;
  release: string | null;
  accel: Accel;
  kvm: KvmVerdict;
  tscKhz: number | null;
}

/** What the platform is built from. */
export interface PlatformOptions {
  /** Instance root: built kernels and initramfs archives live in `<root>/vm`. */
  root: string;
  vm: VmConfig;
  /** The installed static agent (goes into the initramfs). */
  agentBinary: string;
  /** The static `dsec-vmm-launch` binary (asked for the host's TSC rate). */
  launcher: string;
  /** Kernel modules of the tier's initramfs. */
  modules(): readonly string[];
  log: Logger;
}

/** One driver's platform; see the module comment. */
export class VmmPlatform {
  private built: Promise<Platform> | null = null;
  /** The QEMU binary found by {@link init}, or null. */
  qemuPath: string | null = null;

  constructor(private readonly o: PlatformOptions) {}

  /** Finds QEMU (`[vm] qemu`, a path or a PATH name). Never throws: what is missing is {@link missing}'s. */
  init(): void {
    this.qemuPath = findExecutable(this.o.vm.qemu);
  }

  /** What the host lacks for VMs, with the fix; null when nothing. Synchronous (capabilities are): one stat. */
  missing(): string | null {
    if (!this.qemuPath) return `QEMU (${this.o.vm.qemu}) is not installed: apt-get install qemu-system-x86 qemu-utils, or set [vm] qemu`;
    if (!isFile(this.o.vm.kernel)) {
      return `the guest kernel ${this.o.vm.kernel} is missing: run \`bash scripts/guest-kernel.sh\` (fetches Debian bookworm's 6.12 kernel package), or set [vm] kernel and [vm] modules`;
    }
    return null;
  }

  /**
   * The accelerator verdict for `dsec host info`: which one VMs use and why. Waits for the
   * probe when it is still running; never starts one.
   */
  async accelInfo(): Promise<{ available: boolean; reason: string }> {
    const missing = this.missing();
    if (missing) return { available: false, reason: `microvm backend unavailable: ${missing}` };
    if (!this.built) {
      // Not set up yet: report a verdict of this host boot if there is one, never start a probe from host info.
      if (this.o.vm.accel !== 'auto') return { available: this.o.vm.accel === 'kvm', reason: `[vm] accel = "${this.o.vm.accel}"` };
      const cached = await cachedKvmVerdict({ qemu: this.qemuPath!, kernel: this.o.vm.kernel });
      return cached ? { available: cached.usable, reason: `${cached.reason} (probed earlier this boot)` }
        : { available: false, reason: 'not probed yet: the first microvm create probes KVM (a boot of up to [vm] kvm_probe_timeout_s), TCG until then' };
    }
    try {
      const p = await this.get();
      return { available: p.accel === 'kvm', reason: p.kvm.reason };
    } catch (e) {
      return { available: false, reason: `microvm platform setup failed: ${(e as Error).message}` };
    }
  }

  /**
   * Builds (once) what every boot needs; a failure is not cached, so fixing the host and
   * retrying works.
   * @throws DsecError FailedPrecondition (what {@link missing} names; a modules dir without a needed module).
   */
  get(): Promise<Platform> {
    if (!this.built) {
      const p = (async (): Promise<Platform> => {
        const missing = this.missing();
        if (missing) throw failedPrecondition(missing);
        const vm = this.o.vm;
        const bz = await readFile(vm.kernel);
        const release = kernelRelease(bz);
        const kernel = await this.bootKernel(bz);
        const initramfs = await buildInitramfs({
          busybox: vm.busybox, agent: this.o.agentBinary, modulesDir: vm.modules, cacheDir: path.join(this.o.root, 'vm'), modules: this.o.modules(),
        }, release);
        if (initramfs.built) this.o.log.info({ path: initramfs.path, bytes: initramfs.sizeBytes, modules: initramfs.modules }, 'built the microvm initramfs');
        let kvm: KvmVerdict;
        if (vm.accel === 'tcg') kvm = { usable: false, reason: 'TCG forced by [vm] accel = "tcg"' };
        else if (vm.accel === 'kvm') kvm = { usable: true, reason: 'KVM forced by [vm] accel = "kvm" (no probe)' };
        else kvm = await probeKvmCached({ qemu: this.qemuPath!, kernel, initrd: initramfs.path, timeoutMs: vm.kvmProbeTimeoutMs, guestKernel: vm.kernel });
        const accel: Accel = kvm.usable ? 'kvm' : 'tcg';
        const tscKhz = accel === 'tcg' ? await hostTscKhz(this.o.launcher) : null;
        this.o.log.info({ accel, reason: kvm.reason, tscKhz, release, kernel }, 'microvm accelerator');
        return { initramfs, kernel, release, accel, kvm, tscKhz };
      })();
      this.built = p;
      p.catch(() => {
        if (this.built === p) this.built = null;
      });
    }
    return this.built;
  }

  /**
   * The kernel file QEMU boots: `<root>/vm/vmlinux-<hash of the bzImage>`, the bzImage's
   * uncompressed kernel when it has a PVH entry (kmod.ts extractPvhKernel: no
   * decompression in the guest at every boot), else the bzImage itself. Extracted once
   * per kernel and kept.
   */
  private async bootKernel(bz: Buffer): Promise<string> {
    const file = path.join(this.o.root, 'vm', `vmlinux-${createHash('sha256').update(bz).digest('hex').slice(0, 32)}`);
    if (await stat(file).catch(() => null)) {
      await chmod(file, 0o644);
      return file;
    }
    const elf = await extractPvhKernel(bz);
    if (!elf) {
      this.o.log.info({ kernel: this.o.vm.kernel }, 'guest kernel has no PVH entry (or an unknown compression): booting the bzImage, which decompresses itself at every boot');
      return this.o.vm.kernel;
    }
    await mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
    const tmp = `${file}.tmp${process.pid}`;
    // Readable by others: an unprivileged VMM opens it (docs/SECURITY.md "VMM confinement").
    await writeFile(tmp, elf, { mode: 0o644 });
    await rename(tmp, file);
    return file;
  }
}
