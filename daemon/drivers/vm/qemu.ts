/**
 * The QEMU command line of one full VM (the `vm` tier): machine q35 (PCI Express, ACPI,
 * SeaBIOS, an emulated 16550 serial port), virtio-pci devices, the guest kernel booted
 * directly with dsec's initramfs, the VM's qcow2 writable disk as a virtio-blk-pci disk
 * (serial `root`), the serial port as a chardev socket dsecd holds (the console), and,
 * with the agent, the same virtio-serial ports as a microVM (now virtio-serial-pci).
 * Pure and unit-tested; the host layout is the microvm tier's (microvm/qemu.ts vmPaths).
 */
import { AGENT_PORT, LOG_PORT } from '../vmm/initramfs.js';
import { vmPaths, type Accel } from '../vmm/qemu.js';

/** The machine: q35 with its default firmware (SeaBIOS); the legacy PIT stays on (TSC calibration under TCG). */
export const VM_MACHINE = 'q35';

/** Everything that decides one VM's QEMU command line. */
export interface VmSpec {
  /** Sandbox id (QEMU's -name, the guest hostname). */
  id: string;
  /** The sandbox dir. */
  dir: string;
  accel: Accel;
  vcpus: number;
  memoryMiB: number;
  tcgTbMiB: number;
  /** The host TSC in kHz for a TCG guest, or null. */
  tscKhz: number | null;
  /** Guest kernel and dsec's initramfs. */
  kernel: string;
  initrd: string;
  /** Whether dsec's agent runs in the guest (its virtio-serial ports are attached). */
  agent: boolean;
  /** Root partition number on the disk (0: the whole disk is the filesystem). */
  rootPartition: number;
  rootFstype: string;
  /** With `agent` false: the disk's init program. */
  initPath: string;
  /** Extra kernel command line (a registered disk's `cmdline`). */
  cmdline: string;
}

/**
 * The guest kernel command line of a VM: the microvm tier's base (console on the serial
 * port, reboot and panic end QEMU, TSC rate under TCG) plus what dsec's /init reads to boot
 * from the root disk (`dsec.root=root`, its partition and fstype, `dsec.init=agent|disk`).
 */
export function vmCmdline(spec: Pick<VmSpec, 'id' | 'accel' | 'tscKhz' | 'agent' | 'rootPartition' | 'rootFstype' | 'initPath' | 'cmdline'>): string {
  const a = ['console=ttyS0', 'reboot=t', 'panic=-1', 'loglevel=4'];
  if (spec.accel === 'tcg' && spec.tscKhz) a.push(`tsc_early_khz=${spec.tscKhz}`, 'tsc=reliable');
  a.push('dsec.root=root', `dsec.rootfstype=${spec.rootFstype}`, `dsec.init=${spec.agent ? 'agent' : 'disk'}`, `dsec.hostname=${spec.id}`);
  if (spec.rootPartition > 0) a.push(`dsec.rootpart=${spec.rootPartition}`);
  if (!spec.agent) a.push(`dsec.initpath=${spec.initPath}`);
  if (spec.cmdline.trim()) a.push(...spec.cmdline.trim().split(/\s+/));
  return a.join(' ');
}

/**
 * The QEMU argument vector of one VM. QEMU starts with its vCPUs stopped (`-S`): dsecd
 * connects the console first, so no boot output is lost, then sends `cont`.
 */
export function vmQemuArgs(spec: VmSpec): string[] {
  const p = vmPaths(spec.dir);
  const a: string[] = [
    '-name', `dsec-${spec.id}`,
    '-M', VM_MACHINE,
    ...(spec.accel === 'kvm' ? ['-accel', 'kvm', '-cpu', 'host'] : ['-accel', `tcg,tb-size=${spec.tcgTbMiB}`, '-cpu', 'max']),
    '-m', String(spec.memoryMiB),
    '-smp', String(Math.max(1, spec.vcpus)),
    '-nodefaults', '-no-user-config', '-display', 'none', '-vga', 'none', '-no-reboot', '-S',
    // QEMU's own seccomp filter, as strict as this QEMU allows (every option denied).
    '-sandbox', 'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny',
    '-kernel', spec.kernel,
    '-initrd', spec.initrd,
    '-append', vmCmdline(spec),
    '-chardev', `socket,id=con,path=${p.consoleSock},server=on,wait=off`,
    '-serial', 'chardev:con',
    '-drive', `id=root,file=${p.qcow},format=qcow2,if=none,discard=unmap,detect-zeroes=unmap`,
    '-device', 'virtio-blk-pci,drive=root,serial=root',
  ];
  if (spec.agent) {
    a.push(
      '-device', 'virtio-serial-pci,max_ports=4',
      '-chardev', `socket,id=vmux,path=${p.vmux},server=on,wait=off`,
      '-device', `virtserialport,chardev=vmux,name=${AGENT_PORT}`,
      '-chardev', `file,id=alog,path=${p.agentLog},append=on`,
      '-device', `virtserialport,chardev=alog,name=${LOG_PORT}`,
    );
  }
  a.push('-qmp', `unix:${p.qmp},server=on,wait=off`, '-pidfile', p.pid);
  return a;
}
