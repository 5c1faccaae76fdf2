/**
 * The `vm` backend: a full VM per sandbox on QEMU q35 (PCI: virtio-blk-pci, virtio-serial-pci;
 * an emulated 16550 serial port; SeaBIOS), booting the Debian guest kernel with dsec's
 * initramfs from a disk (docs/ARCHITECTURE.md "The vm tier"):
 *
 *   - image `NAME[:TAG]` (a dsec image): a base disk composed from the image's layers
 *     (disk.ts), the agent as PID 1 on it: exec, PTYs and files work exactly as for a
 *     microVM (the same vmux transport);
 *   - image `disk:NAME` (a disk registered in `[vm.disks.NAME]`): the operator's disk,
 *     either with the disk's own init and **only a serial console** (`init = "disk"`: the
 *     lifecycle works, exec answers FailedPrecondition, `dsec console` works), or with the
 *     agent on the disk's root (`init = "agent"`).
 *
 * Every VM's writable disk is a qcow2 overlay over its base (kept by stop). The serial
 * console is a chardev socket dsecd holds (console.ts), logged to a bounded file and
 * served to `dsec console` over a WebSocket.
 *
 * The life of its QEMU process (cgroup, launcher and confinement, QMP and its resync, the
 * agent endpoint and mux, stop/pause/resume, adopt, orphans) is the one both VM tiers
 * share (daemon/drivers/vmm/driver.ts); the machine, the disks and the boot steps are the
 * hooks implemented here.
 */
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, chmod, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { VmDiskConfig } from '../../config.js';
import type { Builder } from '../../host/builder.js';
import { failedPrecondition, invalidArgument, notFound } from '../../errors.js';
import type { AgentExecHandle } from '../../agent/client.js';
import type { StepObserver } from '../../model/steps.js';
import type { Backend } from '../../model/backend.js';
import type {
  AgentFiles, BackendCapabilities, DriverExecHandlers, DriverExecRequest, DriverExecResult, DriverStartExecRequest, OrphanReport, ResolvedImage,
} from '../types.js';
import { VmmDriver, type BootContext, type VmmDriverDeps } from '../vmm/driver.js';
import type { Platform } from '../vmm/platform.js';
import { GUEST_MODULES } from '../vmm/initramfs.js';
import { ConsoleHub, type ConsoleClient } from './console.js';
import { BASE_FILE, BaseDisks, createOverlay, type LayerSource } from './disk.js';
import { vmQemuArgs } from './qemu.js';
import type { DefenceStatus, SandboxRecord } from '../../model/sandbox.js';
import { effectiveLayers } from '../../model/image.js';
import { VM_MIN_MEMORY_BYTES, isVmmOf, vmPaths } from '../vmm/qemu.js';

/** The image reference prefix that names a registered disk: `disk:NAME`. */
export const DISK_REF_PREFIX = 'disk:';

/** Dependencies of the vm driver: the VM drivers' plus layer mounts and the builder (base disks). */
export interface VmDriverDeps extends VmmDriverDeps {
  layers: LayerSource;
  builder: Builder | null;
}

/** How often stop checks whether a VM without the agent powered off after the ACPI power-down, ms (it waits at most the grace period). */
const POWERDOWN_POLL_MS = 100;

/** The vm backend; see the module comment. */
export class VmDriver extends VmmDriver {
  readonly backend = 'vm' as const;
  readonly backends: readonly Backend[] = ['vm'];
  protected readonly machineName = 'VM';
  private readonly consoles = new Map<string, ConsoleHub>();
  private readonly bases: BaseDisks;

  constructor(private readonly v: VmDriverDeps) {
    super(v);
    this.bases = new BaseDisks({ root: v.root, layers: v.layers, builder: v.builder, log: v.log });
  }

  capabilities(_backend: Backend = 'vm'): BackendCapabilities {
    const missing = this.missing();
    return {
      id: 'dsec.driver.vm.v1', backend: 'vm', available: missing === null, reason: missing, isolation: 'vm', pause: true,
      snapshot: null, networkModes: ['none'], io: false, storeDisk: false, pool: false, console: true,
    };
  }

  /**
   * `disk:NAME` is a registered disk, answered here; anything else is a dsec image (null:
   * the image store resolves it).
   * @throws DsecError NotFound (no such disk registered), FailedPrecondition (its file is missing).
   */
  async resolveImage(ref: string): Promise<ResolvedImage | null> {
    if (!ref.startsWith(DISK_REF_PREFIX)) return null;
    this.registered(ref);
    return { image: ref, layers: [], config: { env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'], cwd: '/', user: '0:0', cmd: [] } };
  }

  /** The registered disk a `disk:NAME` reference names. @throws DsecError NotFound, FailedPrecondition. */
  private registered(ref: string): VmDiskConfig & { name: string } {
    const name = ref.slice(DISK_REF_PREFIX.length);
    const d = this.v.vm.disks[name];
    if (!d) {
      const known = Object.keys(this.v.vm.disks);
      throw notFound(`disk image ${name} is not registered with this dsecd (${known.length ? `registered: ${known.join(', ')}` : 'none are'}); add [vm.disks.${name}] path = "/path/to/disk" to dsecd.toml (docs/OPERATIONS.md "Disk images")`);
    }
    if (!existsSync(d.path)) throw failedPrecondition(`disk image ${name}: its file ${d.path} is missing; put the disk there or fix [vm.disks.${name}] path`);
    return { ...d, name };
  }

  /** The registered disk of a sandbox, or null for a VM of a dsec image. */
  private diskOf(sb: SandboxRecord): (VmDiskConfig & { name: string }) | null {
    return sb.image.startsWith(DISK_REF_PREFIX) ? this.registered(sb.image) : null;
  }

  /** Whether dsec's agent runs in the sandbox's guest. */
  hasAgent(sb: SandboxRecord): boolean {
    if (!sb.image.startsWith(DISK_REF_PREFIX)) return true;
    return this.v.vm.disks[sb.image.slice(DISK_REF_PREFIX.length)]?.init === 'agent';
  }

  protected override guestModules(): readonly string[] {
    return [...GUEST_MODULES, 'virtio_pci'];
  }

  protected override writableDisk(id: string): string {
    return vmPaths(this.dir(id)).qcow;
  }

  protected override writableDiskKind(id: string): string {
    return `qcow2 disk ${vmPaths(this.dir(id)).qcow}`;
  }

  /** Nothing inside a vm's guest is confined by dsec, and the defences say so. */
  protected override guestDefences(): Record<string, DefenceStatus> {
    const d: DefenceStatus = { enforced: false, detail: 'vm tier: commands run as root of the guest with every capability, no seccomp filter and a writable root; the guest kernel (and the VMM confinement) is the only boundary' };
    return Object.fromEntries(['readonly_paths', 'capabilities', 'no_new_privileges', 'seccomp', 'landlock'].map((n) => [n, d]));
  }

  protected override attachedLayers(): string[] {
    return [];
  }

  protected override check(sb: SandboxRecord): void {
    const missing = this.missing();
    if (missing) throw failedPrecondition(`cannot create vm sandbox ${sb.id}: ${missing}`);
    if (sb.memoryBytes < VM_MIN_MEMORY_BYTES) {
      throw invalidArgument(`a vm needs at least ${VM_MIN_MEMORY_BYTES} bytes of memory (the guest kernel and initramfs); memory_bytes is ${sb.memoryBytes}`);
    }
    const d = this.diskOf(sb);
    if (d?.ready) {
      try {
        new RegExp(d.ready);
      } catch (e) {
        throw failedPrecondition(`disk image ${d.name}: [vm.disks.${d.name}] ready is not a valid regular expression: ${(e as Error).message}`);
      }
    }
  }

  /**
   * The writable disk: a qcow2 overlay over the registered disk, or over the base disk
   * composed from the image's layers (made once per image and size), whose path is kept
   * in `<dir>/base` for later boots and for collection.
   */
  protected override async makeDisks(sb: SandboxRecord): Promise<void> {
    const dir = this.dir(sb.id);
    const d = this.diskOf(sb);
    if (d) {
      await writeFile(path.join(dir, BASE_FILE), d.path, { mode: 0o600 });
      await createOverlay(this.writableDisk(sb.id), d.path, d.format);
      return;
    }
    const size = sb.diskBytes ?? this.v.vm.diskBytes;
    const base = await this.bases.ensure(effectiveLayers(sb.imageLayers), size, (file) => writeFile(path.join(dir, BASE_FILE), file, { mode: 0o600 }));
    await chmod(base, 0o644);
    await createOverlay(this.writableDisk(sb.id), base, 'raw');
  }

  /** The base disk a sandbox's overlay is backed by (from `<dir>/base`). */
  private async baseOf(sb: SandboxRecord): Promise<string> {
    const b = (await readFile(path.join(this.dir(sb.id), BASE_FILE), 'utf8').catch(() => '')).trim();
    if (!b || !existsSync(b)) throw failedPrecondition(`sandbox ${sb.id}: the base disk of its writable disk (${b || 'unrecorded'}) is missing; destroy it and create a new one`);
    return b;
  }

  protected override async qemuCommand(sb: SandboxRecord, plat: Platform, _layers: string[], guestMiB: number): Promise<string[]> {
    const d = this.diskOf(sb);
    await this.baseOf(sb);
    return vmQemuArgs({
      id: sb.id, dir: this.dir(sb.id), accel: plat.accel, vcpus: Math.max(1, Math.ceil(sb.cpus)), memoryMiB: guestMiB,
      tcgTbMiB: this.v.vm.tcgTbMiB, tscKhz: plat.tscKhz, kernel: plat.kernel, initrd: plat.initramfs.path,
      agent: this.hasAgent(sb), rootPartition: d?.rootPartition ?? 0, rootFstype: d?.rootFstype ?? 'ext4',
      initPath: d?.initPath ?? '/sbin/init', cmdline: d?.cmdline ?? '',
    });
  }

  protected override bootFiles(sb: SandboxRecord, plat: Platform): string[] {
    // The base disk the qcow2 overlay names as its backing file (QEMU opens it by that path).
    let b: string | null = null;
    try {
      b = readFileSync(path.join(this.dir(sb.id), BASE_FILE), 'utf8').trim() || null;
    } catch { /* none recorded: qemuCommand has refused already */ }
    return [plat.kernel, plat.initramfs.path, ...(b ? [b] : [])];
  }

  /** The sandbox's console hub (created on first use). */
  private console(id: string): ConsoleHub {
    let h = this.consoles.get(id);
    if (!h) {
      const p = vmPaths(this.dir(id));
      h = new ConsoleHub({ socket: p.consoleSock, logFile: p.console, oldLogFile: p.consoleOld, logCapBytes: this.v.vm.consoleLogBytes, what: `sandbox ${id}` });
      this.consoles.set(id, h);
    }
    return h;
  }

  /**
   * Boot: the console connection (QEMU waits with its vCPUs stopped), `cont`, then the
   * agent (as for a microVM) or, for a disk's own init, its `ready` pattern on the console
   * when the disk has one.
   */
  protected override async bootGuest(sb: SandboxRecord, ctx: BootContext): Promise<void> {
    const hub = this.console(sb.id);
    await ctx.step(hub.connect(ctx.deadline));
    const d = this.diskOf(sb);
    const ready = !this.hasAgent(sb) && d?.ready ? hub.waitFor(new RegExp(d.ready)) : null;
    try {
      await ctx.step(ctx.qmp.execute('cont', undefined, { timeoutMs: this.v.vm.qmpTimeoutMs }));
      if (this.hasAgent(sb)) await super.bootGuest(sb, ctx);
      else if (ready) await ctx.step(ready.done);
    } finally {
      ready?.cancel();
    }
  }

  protected override async dropConnections(id: string): Promise<void> {
    await super.dropConnections(id);
    const h = this.consoles.get(id);
    this.consoles.delete(id);
    h?.close();
  }

  /** FailedPrecondition for a VM without the agent. */
  private needAgent(sb: SandboxRecord, what: string): void {
    if (this.hasAgent(sb)) return;
    throw failedPrecondition(`sandbox ${sb.id} is a vm booted from disk ${sb.image.slice(DISK_REF_PREFIX.length)} with the disk's own init and no dsec agent, so ${what} cannot run in it; its serial console is the way in: dsec console ${sb.id} (or register the disk with init = "agent")`);
  }

  override async exec(sb: SandboxRecord, req: DriverExecRequest): Promise<DriverExecResult> {
    this.needAgent(sb, 'exec');
    return super.exec(sb, req);
  }

  override async startExec(sb: SandboxRecord, req: DriverStartExecRequest, handlers: DriverExecHandlers): Promise<AgentExecHandle> {
    this.needAgent(sb, 'exec');
    return super.startExec(sb, req, handlers);
  }

  override async files(sb: SandboxRecord): Promise<AgentFiles> {
    this.needAgent(sb, 'file operations and other agent requests');
    return super.files(sb);
  }

  /**
   * Stop: a VM without the agent first gets an ACPI power-down (`system_powerdown`) and up
   * to the grace period to power off by itself; then the microvm tier's stop (agent: SIGTERM
   * to every process, guest sync; then QMP quit, SIGKILL after 5 s).
   */
  override async stop(sb: SandboxRecord, steps: StepObserver, opts: { graceMs?: number } = {}): Promise<void> {
    if (!this.hasAgent(sb) && sb.state === 'running' && opts.graceMs && opts.graceMs > 0 && sb.initPid !== null && isVmmOf(sb.initPid, this.dir(sb.id))) {
      try {
        await this.qmp.run(sb, 'system_powerdown');
        const until = Date.now() + opts.graceMs;
        while (Date.now() < until && isVmmOf(sb.initPid, this.dir(sb.id))) await new Promise((r) => setTimeout(r, POWERDOWN_POLL_MS));
      } catch (e) {
        this.v.log.warn({ err: e, id: sb.id }, 'ACPI power-down at stop failed');
      }
    }
    await super.stop(sb, steps, opts);
  }

  override async destroy(sb: SandboxRecord, steps: StepObserver): Promise<void> {
    await super.destroy(sb, steps);
    await this.bases.collect(path.join(this.v.root, 'sandboxes')).catch((e) => this.v.log.warn({ err: e }, 'collecting unused VM base disks failed'));
  }

  override async adopt(sb: SandboxRecord): Promise<void> {
    await super.adopt(sb);
    await this.console(sb.id).connect(Date.now() + 2000).catch((e) => this.v.log.warn({ err: e, id: sb.id }, 'reconnecting the serial console failed'));
  }

  override async cleanOrphans(known: Set<string>): Promise<OrphanReport> {
    const r = await super.cleanOrphans(known);
    const removed = await this.bases.collect(path.join(this.v.root, 'sandboxes')).catch(() => [] as string[]);
    return { removed: [...r.removed, ...removed.map((f) => `unused VM base disk ${f}`)] };
  }

  override logPath(sb: SandboxRecord): string {
    return this.hasAgent(sb) ? vmPaths(this.dir(sb.id)).agentLog : vmPaths(this.dir(sb.id)).console;
  }

  /**
   * Attaches a client to the sandbox's serial console (the caller checked it is a running
   * or paused vm); returns the input writer and the detach function.
   * @throws DsecError Unavailable when dsecd holds no console connection.
   */
  attachConsole(sb: SandboxRecord, c: ConsoleClient): { write(b: Buffer): boolean; detach(): void; drained(): Promise<void> } {
    return this.console(sb.id).attach(c);
  }

  /** Path of the console log (the last `console_log_bytes` at most, plus the rotated file). */
  consoleLog(sb: SandboxRecord): string {
    return vmPaths(this.dir(sb.id)).console;
  }

  override async close(): Promise<void> {
    await super.close();
    for (const h of this.consoles.values()) h.close();
    this.consoles.clear();
  }

  /** Ensures `<root>/vm` exists (base disks, the VMM's root mount point). */
  override async init(): Promise<void> {
    await super.init();
    await mkdir(path.join(this.v.root, 'vm'), { recursive: true, mode: 0o700 });
  }
}
