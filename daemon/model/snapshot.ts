/**
 * Snapshots: a `filesystem` snapshot (containers) is a sandbox's writable layer packed
 * as an EROFS layer; a `vm` snapshot (microVMs) is the whole machine, its migration
 * stream and writable disk in `<root>/snapshots/<id>/` with its configuration here. Both
 * keep what a restore needs to recreate the sandbox.
 */
import type { Backend } from './backend.js';
import type { FilesystemOptions, ResolvedFilesystem } from './filesystem.js';
import type { ImageConfig, SeccompOverride } from './image.js';
import type { NetworkSpec } from './network.js';
import type { Priority } from './resources.js';

/**
 * What a machine snapshot (`kind: vm`, the microvm tier) captured and how to boot it
 * again: the machine's QEMU configuration, which a restore must repeat exactly (the
 * migration stream carries RAM and device state, not the device set), and the two files
 * in the snapshot's directory ({@link MACHINE_STATE_FILE}, {@link MACHINE_DISK_FILE}).
 * Stored as JSON in the snapshot row; field names are part of the store format.
 */
export interface MachineSnapshot {
  /** QEMU that wrote the state, `major.minor.micro` (from the QMP greeting). */
  qemuVersion: string;
  accel: 'kvm' | 'tcg';
  /** Guest RAM, MiB (`-m`). */
  memoryMiB: number;
  /** vCPUs (`-smp`). */
  vcpus: number;
  /** Host paths of the boot kernel and initramfs the source booted (both content-addressed under `<root>/vm`). */
  kernel: string;
  initrd: string;
  /** `tsc_early_khz` of the source's command line (TCG), or null. */
  tscKhz: number | null;
  /** Layer digests attached as read-only disks, lowest first (virtio-mmio slot order). */
  layers: string[];
  /** Bytes of the migration stream file and its sha256 (hex), checked before a restore. */
  stateBytes: number;
  stateSha256: string;
  /** Apparent size of the writable disk copy, bytes (the guest's ext4 size). */
  diskBytes: number;
  /** Host bytes the disk copy takes (allocated blocks; 0 extra where it is a reflink). */
  diskAllocatedBytes: number;
  /** Whether the disk copy shares its blocks with the source (`cp --reflink=auto` made a reflink). */
  diskReflinked: boolean;
  /** How long the source's vCPUs were stopped for the capture, ms. */
  pausedMs: number;
}

/** File of a machine snapshot's migration stream (QEMU's savevm format), in its directory. */
export const MACHINE_STATE_FILE = 'state.qemu';
/** File of a machine snapshot's writable-disk copy, in its directory. */
export const MACHINE_DISK_FILE = 'disk.raw';

/** Where a create restores a machine snapshot from (microvm restores and forks). */
export interface MachineRestore {
  /** Snapshot id, for messages. */
  snapshotId: string;
  /** The snapshot's directory, holding {@link MACHINE_STATE_FILE} and {@link MACHINE_DISK_FILE}. */
  dir: string;
  machine: MachineSnapshot;
}

/** A snapshot as the store records it. Times in ms since the epoch; sizes in bytes; cpus in cores. */
export interface SnapshotRecord {
  /** `snap-` and 16 lowercase hex characters. */
  id: string;
  /** The tenant it belongs to: its source sandbox's; names are unique per tenant. */
  tenant: string;
  name: string | null;
  /** `filesystem`: the writable layer ({@link layer}); `vm`: the machine ({@link machine}). */
  kind: 'filesystem' | 'vm';
  sandboxId: string;
  backend: Backend;
  image: string;
  /** Layers a restore mounts (filesystem: the last is {@link layer}) or attaches as disks (vm), lowest first. */
  imageLayers: string[];
  imageConfig: ImageConfig;
  /** Digest of the snapshot layer (filesystem), or `sha256:` of the machine's state file (vm). */
  layer: string;
  sizeBytes: number;
  cpus: number;
  memoryBytes: number;
  pids: number;
  priority: Priority;
  labels: Record<string, string>;
  env: Record<string, string>;
  createdAt: number;
  /** The source's network, disk quota and filesystem options: a restore's defaults. */
  network: NetworkSpec | null;
  diskBytes: number | null;
  filesystem: ResolvedFilesystem | null;
  /** The captured machine of a `vm` snapshot, else null. */
  machine: MachineSnapshot | null;
}

/** A snapshot to take. */
export interface SnapshotInput {
  /** Name to restore by, unique within the sandbox's tenant; absent: none (use the id). */
  name?: string;
  /** Containers: also checkpoint processes (answered Unimplemented); microVMs: ignored. */
  process?: boolean;
}

/** Overrides of a restore; every absent field is the snapshot's source sandbox's. */
export interface RestoreInput {
  labels?: Record<string, string>;
  /** Merged over the source's sandbox env. */
  env?: Record<string, string>;
  cpus?: number;
  memoryBytes?: number;
  pids?: number;
  ttlS?: number;
  priority?: Priority;
  idleTimeoutS?: number;
  seccomp?: SeccompOverride;
  network?: NetworkSpec;
  diskBytes?: number;
  /** Field by field over the source's resolved options. */
  filesystem?: FilesystemOptions;
}

/** A fork: `count` independent restores of one snapshot, all or nothing. */
export interface ForkInput extends RestoreInput {
  count: number;
}
