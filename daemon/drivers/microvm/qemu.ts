/**
 * QEMU for the microvm tier: the command line of one microVM (pure, unit-tested), the
 * launch through `dsec-vmm-launch` (into the sandbox's cgroup, detached from dsecd), the
 * host TSC frequency for TCG guests, and the one KVM probe boot per dsecd.
 *
 * Host layout of one microVM (`<root>/sandboxes/<id>/`, root-only):
 *   disk.raw      the writable disk: sparse raw file, ext4 formatted by dsecd at create
 *   swap.raw      the guest's swap disk (`[vm.reclaim] swap = "disk"`): sparse raw file,
 *                 made at create, formatted by the guest's /init at every boot
 *   qmp.sock      QEMU's QMP monitor (server)
 *   vmux.sock     QEMU's chardev of the agent's virtio-serial port `dsec.agent` (server)
 *   agent.sock    dsecd's listener: every connection becomes one mux stream (vmux.ts)
 *   console.log   the serial console (kernel and /init), appended across boots
 *   agent.log     the agent's stderr, through the virtio-serial port `dsec.log`
 *   qemu.log      QEMU's own stderr
 *   qemu.pid      written by QEMU (-pidfile)
 *   machine.json  the machine QEMU was started with (memory, vCPUs, kernel, initramfs,
 *                 accelerator, layers): what a machine snapshot records
 *   migrate.sock  only during a machine snapshot (dsecd listens, QEMU sends its state) or
 *                 a restore (QEMU listens, dsecd sends the state)
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, openSync, closeSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { procStartTime } from '../../host/proc.js';
import { AGENT_PORT, LOG_PORT } from './initramfs.js';
import { SWAP_SERIAL, swapCmdline } from './reclaim.js';

/**
 * The machine: QEMU's microvm (virtio-mmio, no PCI, no firmware) with the legacy PIT, PIC
 * and RTC on. Without the PIT the Debian kernel cannot calibrate its TSC under TCG and
 * hangs in early boot; the RTC gives the guest the host's time at boot.
 */
export const MICROVM_MACHINE = 'microvm,pit=on,pic=on,rtc=on,isa-serial=on';

/**
 * virtio-mmio transports of QEMU's microvm: 24. One holds the virtio-serial device and
 * one the writable disk, so an image may have at most 22 layers in a microVM (each layer
 * is a read-only virtio-blk disk). Larger stacks need layer flattening or pmem (issue 9).
 */
export const MICROVM_MAX_LAYERS = 22;

/** Smallest guest memory dsec accepts: 128 MiB (the Debian kernel plus the initramfs unpacked need ~90 MiB to reach the agent). */
export const MICROVM_MIN_MEMORY_BYTES = 128 * 1024 * 1024;

/**
 * What QEMU itself needs beside the guest's RAM, charged to the sandbox's cgroup with it:
 * its own code, heap and I/O buffers (~40 MiB resident when measured here), the kernel
 * segments and initramfs it keeps for reset (~60 MiB for Debian's uncompressed kernel),
 * page cache of the layer and disk files it reads,
 * plus, under TCG, the translation cache ({@link VmConfig.tcgTbMiB}). 96 MiB plus the
 * translation cache leaves room for all of it; page cache beyond it is reclaimed, never
 * an OOM kill.
 */
export function vmmOverheadBytes(accel: Accel, tcgTbMiB: number): number {
  return (96 + (accel === 'tcg' ? tcgTbMiB : 0)) * 1024 * 1024;
}

/** Accelerator QEMU runs a guest with. */
export type Accel = 'kvm' | 'tcg';

/** Paths of one microVM's host files (see the module comment). */
export function vmPaths(dir: string) {
  return {
    disk: path.join(dir, 'disk.raw'),
    qmp: path.join(dir, 'qmp.sock'),
    vmux: path.join(dir, 'vmux.sock'),
    agentSock: path.join(dir, 'agent.sock'),
    console: path.join(dir, 'console.log'),
    agentLog: path.join(dir, 'agent.log'),
    qemuLog: path.join(dir, 'qemu.log'),
    pid: path.join(dir, 'qemu.pid'),
    machine: path.join(dir, 'machine.json'),
    migrate: path.join(dir, 'migrate.sock'),
    /** The guest's swap disk (reclaim.ts); absent: the guest has none. */
    swap: path.join(dir, 'swap.raw'),
    /** vm tier: the writable disk, a qcow2 overlay over the VM's base disk. */
    qcow: path.join(dir, 'disk.qcow2'),
    /** vm tier: QEMU's chardev of the serial port (server); dsecd holds the one connection (daemon/drivers/vm/console.ts). */
    consoleSock: path.join(dir, 'console.sock'),
    /** vm tier: the previous console log, once `console.log` reached its cap. */
    consoleOld: path.join(dir, 'console.log.1'),
  };
}

/** Everything that decides one microVM's QEMU command line. */
export interface MicrovmSpec {
  /** Sandbox id (QEMU's -name, the guest hostname). */
  id: string;
  /** The sandbox dir (see {@link vmPaths}). */
  dir: string;
  kernel: string;
  initrd: string;
  accel: Accel;
  /** vCPUs (-smp): the sandbox's cpus rounded up, at least 1. */
  vcpus: number;
  /** Guest RAM in MiB (-m). */
  memoryMiB: number;
  /** Layer blob files, lowest layer first: virtio-blk disks with serial l0, l1, … */
  layers: string[];
  /** The host TSC in kHz for a TCG guest (tsc_early_khz=), or null to let it calibrate. */
  tscKhz: number | null;
  /** TCG translation cache, MiB. */
  tcgTbMiB: number;
  /**
   * The layers as persistent memory instead of disks ({@link pmemLayout}); null: `layers`
   * are virtio-blk disks. When set, `layers` are not attached as disks.
   */
  pmem?: PmemLayout | null;
  /** A virtio-balloon device with free-page reporting (the guest returns pages it frees). */
  balloon?: boolean;
  /**
   * The guest's swap disk (reclaim.ts): attached as virtio-blk serial `swap` with O_DIRECT
   * (`direct`: no host page cache keeps what the guest swapped out; false where the
   * filesystem has no O_DIRECT) and discards; null or absent: none.
   */
  swapDisk?: { file: string; direct: boolean } | null;
  /** A zram swap device of this many bytes in the guest (reclaim.ts); 0 or absent: none. */
  zramBytes?: number;
}

/** Alignment QEMU and the guest need for a file-backed memory range: 2 MiB (a huge page; the kernel's memory-hotplug subsection, which `devm_memremap_pages` maps DAX pages in). */
export const PMEM_ALIGN_BYTES = 2 * 1024 * 1024;

/**
 * Guest RAM below 4 GiB on QEMU's microvm: 3 GiB (RAM past it is mapped above 4 GiB; the
 * pmem layout needs the whole RAM container below 4 GiB, so a VM whose RAM plus layers
 * exceeds it gets its layers as disks).
 */
export const MICROVM_LOW_RAM_BYTES = 3 * 1024 * 1024 * 1024;

/** One image layer to map as persistent memory: the 2 MiB-aligned copy of its blob. */
export interface PmemLayer {
  /** Host path of the aligned copy (read-only, shared by every VM of that layer). */
  file: string;
  /** Its size in bytes: a multiple of {@link PMEM_ALIGN_BYTES}, at least the blob's size, plus {@link PMEM_ALIGN_BYTES} of zeros the guest sees as reserved (it keeps two layers' ranges apart). */
  sizeBytes: number;
}

/**
 * How guest memory is composed when layers are persistent memory. QEMU's microvm has no
 * memory-device slots (virtio-pmem and nvdimm need a device-memory region that only the pc
 * and q35 machines have: a `virtio-pmem-pci` on `microvm,pcie=on` realizes but is never
 * mapped, memaddr 0), so the layers are made part of guest RAM instead: the guest's memory
 * is a container of NUMA-node backends in address order (`-numa node,memdev=`), and the
 * kernel command line turns each layer's range into legacy persistent memory
 * (`memmap=<size>!<start>`, e820 type 12, served by nd_e820 and nd_pmem as /dev/pmemN,
 * DAX-capable) and the zero tail of each layer's file into a reserved hole
 * (`memmap=2M$<start>`, so adjacent layers stay separate regions). The layer backends are
 * `memory-backend-file,share=on,readonly=on`: QEMU maps the file MAP_SHARED, PROT_READ;
 * the guest sees it as ROM (its writes are dropped), and every VM of the layer maps the same
 * host page-cache pages.
 *
 * Node order: guest RAM (`memoryMiB` minus the tail), the layers lowest first, then the
 * tail: ordinary RAM at the top of the container, because QEMU loads the initramfs at the
 * top of RAM below 4 GiB (the tail holds it; the guest frees it after unpacking).
 */
export interface PmemLayout {
  /** Memory backends in guest-physical order: RAM (`file` null) or a layer's file. */
  nodes: { id: string; sizeBytes: number; file: string | null }[];
  /** Guest-physical start of each layer's range, bytes, lowest layer first (/dev/pmem0, /dev/pmem1, …). */
  starts: number[];
  /** The `memmap=` kernel arguments. */
  cmdline: string[];
  /** Total of all nodes, MiB (`-m`). */
  totalMiB: number;
}

/**
 * The {@link PmemLayout} for a guest of `memoryMiB` RAM, these layers and an initramfs of
 * `initrdBytes`, or null when it does not fit below {@link MICROVM_LOW_RAM_BYTES}. Pure.
 * The tail RAM node is the initramfs rounded up to 2 MiB plus 8 MiB (QEMU's ACPI and
 * boot data sit below the top; measured need: initramfs + ~200 KiB).
 */
export function pmemLayout(memoryMiB: number, layers: readonly PmemLayer[], initrdBytes: number): PmemLayout | null {
  const MiB = 1024 * 1024;
  const tail = alignUp(initrdBytes, PMEM_ALIGN_BYTES) + 8 * MiB;
  const ram = memoryMiB * MiB - tail;
  if (ram < 64 * MiB || layers.some((l) => l.sizeBytes % PMEM_ALIGN_BYTES !== 0 || l.sizeBytes < 2 * PMEM_ALIGN_BYTES)) return null;
  const nodes: PmemLayout['nodes'] = [{ id: 'ram0', sizeBytes: ram, file: null }];
  const starts: number[] = [];
  const cmdline: string[] = [];
  let at = ram;
  layers.forEach((l, i) => {
    nodes.push({ id: `pm${i}`, sizeBytes: l.sizeBytes, file: l.file });
    starts.push(at);
    const data = l.sizeBytes - PMEM_ALIGN_BYTES;
    cmdline.push(`memmap=${data / MiB}M!${at / MiB}M`, `memmap=${PMEM_ALIGN_BYTES / MiB}M$${(at + data) / MiB}M`);
    at += l.sizeBytes;
  });
  nodes.push({ id: 'ram1', sizeBytes: tail, file: null });
  at += tail;
  if (at > MICROVM_LOW_RAM_BYTES) return null;
  return { nodes, starts, cmdline, totalMiB: at / MiB };
}

/** `n` rounded up to a multiple of `a`. */
export function alignUp(n: number, a: number): number {
  return Math.ceil(n / a) * a;
}

/**
 * The guest kernel command line. `console=ttyS0` is the console log; `reboot=t` and
 * `panic=-1` with QEMU's `-no-reboot` make any reboot or panic end QEMU at once;
 * `loglevel=4` keeps warnings and errors on the (slow, emulated) serial console;
 * `edd=off` skips BIOS disk probing microvm has no BIOS for; under TCG, `tsc_early_khz`
 * and `tsc=reliable` spare the kernel a TSC calibration and watchdog that fail when the
 * host is busy (the guest then hangs in early boot); `dsec.*` are read by /init.
 */
export function guestCmdline(spec: Pick<MicrovmSpec, 'id' | 'accel' | 'layers' | 'tscKhz' | 'pmem' | 'swapDisk' | 'zramBytes'>, extra: string[] = []): string {
  const args = ['console=ttyS0', 'reboot=t', 'panic=-1', 'loglevel=4', 'edd=off'];
  if (spec.accel === 'tcg' && spec.tscKhz) args.push(`tsc_early_khz=${spec.tscKhz}`, 'tsc=reliable');
  // dsec.pmem=1: /init mounts layer i from /dev/pmem<i> with DAX instead of the disk l<i>.
  if (spec.pmem) args.push(...spec.pmem.cmdline, 'dsec.pmem=1');
  args.push(...swapCmdline({ swapDisk: !!spec.swapDisk, zramBytes: spec.zramBytes ?? 0 }));
  args.push(`dsec.layers=${spec.layers.length}`, `dsec.hostname=${spec.id}`, ...extra);
  return args.join(' ');
}

/** The QEMU argument vector of one microVM (no shell anywhere: every value is one argument). */
export function qemuArgs(spec: MicrovmSpec): string[] {
  const p = vmPaths(spec.dir);
  const a: string[] = [
    '-name', `dsec-${spec.id}`,
    // pcie=on only for pmem: the guest kernel inserts e820 persistent-memory ranges into
    // /proc/iomem (where nd_e820 finds them) in its PCI resource survey, which a kernel
    // that finds no PCI config space skips.
    '-M', spec.pmem ? `${MICROVM_MACHINE},pcie=on` : MICROVM_MACHINE,
    ...(spec.accel === 'kvm' ? ['-accel', 'kvm', '-cpu', 'host'] : ['-accel', `tcg,tb-size=${spec.tcgTbMiB}`, '-cpu', 'max']),
    '-m', spec.pmem ? `${spec.pmem.totalMiB}M` : String(spec.memoryMiB),
    '-smp', String(Math.max(1, spec.vcpus)),
    '-nodefaults', '-no-user-config', '-display', 'none', '-no-reboot',
    // QEMU's own seccomp filter: no spawning, no privilege changes, no obsolete syscalls.
    '-sandbox', 'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny',
    '-kernel', spec.kernel,
    '-initrd', spec.initrd,
    '-append', guestCmdline(spec),
    '-chardev', `file,id=con,path=${p.console},append=on`,
    '-serial', 'chardev:con',
  ];
  if (spec.pmem) {
    for (const n of spec.pmem.nodes) {
      a.push('-object', n.file
        ? `memory-backend-file,id=${n.id},size=${n.sizeBytes},mem-path=${n.file},share=on,readonly=on,discard-data=off`
        : `memory-backend-ram,id=${n.id},size=${n.sizeBytes}`);
    }
    spec.pmem.nodes.forEach((n, i) => a.push('-numa', `node,nodeid=${i},memdev=${n.id}`));
  } else {
    spec.layers.forEach((blob, i) => {
      // Layers are immutable and content-addressed: no image locking (it fails on some shared filesystems).
      a.push('-drive', `id=l${i},file=${blob},format=raw,if=none,readonly=on,file.locking=off`,
        '-device', `virtio-blk-device,drive=l${i},serial=l${i}`);
    });
  }
  // Free-page reporting: the guest hands back 2 MiB blocks it frees; QEMU discards them (MADV_DONTNEED).
  if (spec.balloon) a.push('-device', 'virtio-balloon-device,free-page-reporting=on');
  if (spec.swapDisk) {
    a.push('-drive', `id=swap,file=${spec.swapDisk.file},format=raw,if=none,discard=unmap${spec.swapDisk.direct ? ',cache.direct=on' : ''}`,
      '-device', `virtio-blk-device,drive=swap,serial=${SWAP_SERIAL}`);
  }
  a.push(
    '-drive', `id=rw,file=${p.disk},format=raw,if=none,discard=unmap,detect-zeroes=unmap`,
    '-device', 'virtio-blk-device,drive=rw,serial=rw',
    '-device', 'virtio-serial-device,max_ports=4',
    '-chardev', `socket,id=vmux,path=${p.vmux},server=on,wait=off`,
    '-device', `virtserialport,chardev=vmux,name=${AGENT_PORT}`,
    '-chardev', `file,id=alog,path=${p.agentLog},append=on`,
    '-device', `virtserialport,chardev=alog,name=${LOG_PORT}`,
    '-qmp', `unix:${p.qmp},server=on,wait=off`,
    '-pidfile', p.pid,
  );
  return a;
}

/** Options of {@link spawnVmm}. */
export interface SpawnVmmOptions {
  /** dsec-vmm-launch binary. */
  launcher: string;
  /** QEMU binary (PATH search by the launcher). */
  qemu: string;
  args: string[];
  /** cgroup.procs files to join before exec (CgroupManager.procsFiles). */
  cgroupProcs: string[];
  /** SCHED_IDLE for the VMM (a batch sandbox). */
  schedIdle: boolean;
  /** Allow transparent huge pages for the VMM (guest RAM); false: PR_SET_THP_DISABLE (see native/vmm/launch.c). */
  thp: boolean;
  /** File for QEMU's stderr (and the launcher's). */
  logFile: string;
  /** Confinement beyond the cgroup (native/vmm/launch.c); absent: none. */
  confine?: VmmConfinement;
}

/**
 * How `dsec-vmm-launch` confines one VMM (see native/vmm/launch.c and docs/SECURITY.md
 * "VMM confinement"). Every path is a host path, bound at the same path in the VMM's
 * mount namespace.
 */
export interface VmmConfinement {
  /** An empty host directory the new root (a tmpfs) is mounted on; null: no mount namespace. */
  newRoot: string | null;
  /** Bound read-only: QEMU, its libraries and firmware, the kernel, initramfs, layer blobs and base disks. */
  ro: string[];
  /** Bound read-write: the sandbox dir (writable disk, sockets, logs). */
  rw: string[];
  /** Device nodes: /dev/null, /dev/zero, /dev/urandom, and /dev/kvm under KVM. */
  dev: string[];
  /** Host uid and gid QEMU runs as; null: it stays root (the host does not allow otherwise, or confinement is off). */
  uid: number | null;
  gid: number | null;
  /** Supplementary groups kept (the group of /dev/kvm). */
  groups: number[];
  /** dsec's own seccomp filter (below QEMU's `-sandbox`). */
  seccomp: boolean;
}

/** The launcher arguments of a {@link VmmConfinement}. Pure. */
export function confinementArgs(c: VmmConfinement): string[] {
  const a: string[] = [];
  if (c.newRoot) {
    a.push('--new-root', c.newRoot);
    for (const p of c.ro) a.push('--ro', p);
    for (const p of c.rw) a.push('--rw', p);
    for (const p of c.dev) a.push('--dev', p);
  }
  if (c.uid !== null && c.gid !== null) {
    a.push('--uid', String(c.uid), '--gid', String(c.gid));
    if (c.groups.length) a.push('--groups', c.groups.join(','));
  }
  if (c.seccomp) a.push('--seccomp');
  return a;
}

/**
 * Everything QEMU itself needs to run in a mount namespace of its own: the binary, the
 * shared libraries `ldd` lists for it (the dynamic loader included), its module directory
 * (the TCG accelerator is a loadable module in Debian's build) and its firmware
 * directories (SeaBIOS, option ROMs, the PVH loader), those that exist. Computed once per
 * QEMU binary (one `ldd`, ~10 ms) and cached.
 * @throws DsecError Internal when ldd fails on the binary.
 */
export async function qemuRuntimePaths(qemu: string): Promise<string[]> {
  let p = runtimePathsCache.get(qemu);
  if (!p) {
    p = (async () => {
      const r = await execa('ldd', [qemu], { reject: false });
      if (r.exitCode !== 0) throw new Error(`ldd ${qemu} failed: ${String(r.stderr).trim() || `exit ${r.exitCode}`}`);
      const libs = [...String(r.stdout).matchAll(/(\/[^\s]+) \(0x/g)].map((m) => m[1]);
      const dirs = ['/usr/lib/x86_64-linux-gnu/qemu', '/usr/share/qemu', '/usr/share/seabios', '/usr/lib/ipxe/qemu', '/usr/share/OVMF']
        .filter((d) => existsSync(d));
      return [...new Set([qemu, ...libs, ...dirs])];
    })();
    runtimePathsCache.set(qemu, p);
    p.catch(() => runtimePathsCache.delete(qemu));
  }
  return p;
}
const runtimePathsCache = new Map<string, Promise<string[]>>();

/**
 * Starts QEMU through the launcher, in its own session, with no tie to dsecd (unref'd; a
 * restart of dsecd leaves it running). Resolves once it is spawned; the caller watches
 * `child` for an early exit.
 * @returns the child (its pid is QEMU's: the launcher execs it).
 */
export function spawnVmm(o: SpawnVmmOptions): ChildProcess {
  const argv = [...o.cgroupProcs.flatMap((f) => ['--cgroup-procs', f]), ...(o.schedIdle ? ['--sched-idle'] : []), ...(o.thp ? [] : ['--no-thp']),
    ...(o.confine ? confinementArgs(o.confine) : []), '--', o.qemu, ...o.args];
  const log = openSync(o.logFile, 'a', 0o600);
  try {
    const child = spawn(o.launcher, argv, { detached: true, stdio: ['ignore', log, log] });
    child.unref();
    return child;
  } finally {
    closeSync(log);
  }
}

/** The last `maxLines` lines (at most `maxBytes` bytes) of a log file, or '' when unreadable. */
export function tailFile(file: string, maxLines = 20, maxBytes = 4096): string {
  try {
    const b = readFileSync(file);
    const text = b.subarray(Math.max(0, b.length - maxBytes)).toString('utf8');
    return text.split('\n').filter((l) => l.trim()).slice(-maxLines).join('\n');
  } catch {
    return '';
  }
}

/**
 * The QEMU process recorded in a microVM's dir: the pid QEMU wrote to qemu.pid, if that
 * process is alive and is the QEMU of this dir (its command line names this dir's QMP
 * socket), so a reused pid is never taken for it. null otherwise.
 */
export function vmmOfDir(dir: string): { pid: number; start: number } | null {
  let pid: number;
  try {
    pid = Number(readFileSync(vmPaths(dir).pid, 'utf8').trim());
  } catch {
    return null;
  }
  if (!Number.isInteger(pid) || pid <= 1) return null;
  return isVmmOf(pid, dir) ? { pid, start: procStartTime(pid)! } : null;
}

/** True when `pid` is alive (not a zombie) and its command line names `dir`'s QMP socket. */
export function isVmmOf(pid: number, dir: string): boolean {
  if (procStartTime(pid) === null) return false;
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').some((a) => a.includes(vmPaths(dir).qmp));
  } catch {
    return false;
  }
}

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
 * Boots the guest kernel and initramfs once under KVM (`dsec.probe=1`: /init loads its
 * modules, prints `dsec-init: probe ok` and reboots, which ends QEMU) and reports whether
 * that worked within `timeoutMs`. On hosts where stock guest kernels hang under KVM (such
 * as nested setups without the needed features) the probe times out and its QEMU is
 * killed by pid. Leaves nothing behind (its temp dir is removed).
 */
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
