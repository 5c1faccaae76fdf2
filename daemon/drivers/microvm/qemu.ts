/**
 * The microvm tier's machine: QEMU's `-M microvm` (virtio-mmio, no PCI, no firmware), its
 * command line (pure, unit-tested) and the layout of image layers as persistent memory.
 * The VMM's launch and host files are the shared daemon/drivers/vmm/qemu.ts.
 */
import { vmPaths, MICROVM_MACHINE, type Accel } from '../vmm/qemu.js';
import { AGENT_PORT, LOG_PORT } from '../vmm/initramfs.js';
import { SWAP_SERIAL, swapCmdline } from './reclaim.js';

/**
 * virtio-mmio transports of QEMU's microvm: 24. One holds the virtio-serial device and
 * one the writable disk, so an image may have at most 22 layers in a microVM (each layer
 * is a read-only virtio-blk disk). Larger stacks need layer flattening or pmem (issue 9).
 */
export const MICROVM_MAX_LAYERS = 22;

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

