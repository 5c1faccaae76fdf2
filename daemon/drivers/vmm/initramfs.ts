/**
 * The initramfs of every microVM, built by dsecd itself (no mkinitramfs, no cpio tool):
 * busybox-static, the static dsec agent, the guest kernel modules the boot needs (with
 * their dependencies, from kmod.ts) and a generated `/init` script, as one uncompressed
 * newc cpio archive.
 *
 * Uncompressed because the guest unpacks it under TCG, where decompressing costs more
 * than the few MiB it saves; the archive is cached on the host (one file per content
 * hash) and QEMU reads it once per boot.
 *
 * Cache: `<cacheDir>/initramfs-<sha256 of the archive's inputs>.cpio`, written to a temp
 * name and renamed, so a concurrent or interrupted build never leaves a partial file
 * under the final name. The inputs hashed are the builder version, the init script, the
 * bytes of busybox, the agent and every module, and their names — so a new agent binary or
 * kernel gives a new archive, and the same inputs always give the same bytes (entries
 * are written in a fixed order with mtime 0 and synthetic inode numbers).
 *
 * What `/init` does (guest side of docs/ARCHITECTURE.md "The microvm tier"):
 *   1. mounts /proc, /sys, devtmpfs on /dev;
 *   2. insmods the modules in dependency order; `virtio_mmio.device=` parameters from
 *      the kernel command line are passed to `insmod virtio_mmio` (module parameters on
 *      the command line are applied by modprobe, not by the kernel, for a module);
 *   3. waits for the disks by their virtio-blk serial: `l0`…`l<N-1>` the image's EROFS
 *      layers (read-only, lowest first) — or, with `dsec.pmem=1`, for `/dev/pmem0`…
 *      `/dev/pmem<N-1>` (the layers as persistent memory, qemu.ts pmemLayout) —, `rw` the
 *      writable disk (ext4, formatted by dsecd), and for the virtio-serial ports
 *      `dsec.agent` (the mux) and `dsec.log`;
 *   4. mounts every layer read-only (a pmem layer with `dax=always`: file reads and
 *      mappings go straight to the host's shared pages, no guest page cache), the
 *      writable disk, and an overlay of them on
 *      /newroot (upper/work dirs on the writable disk; the container tier's options);
 *   5. moves /dev, /proc, /sys into the new root, mounts devpts and /dev/shm, copies the
 *      agent to /dev/.dsec-agent (devtmpfs: never the writable layer, as in containers),
 *      lazily unmounts its own layer and disk mounts (the overlay holds private clones),
 *      brings up loopback, sets the hostname;
 *   6. `switch_root`s into /newroot and runs the agent as PID 1 of the guest's root:
 *      `/dev/.dsec-agent --vmux /dev/virtio-ports/dsec.agent --guest-confine`, its stderr
 *      on the `dsec.log` port (the host's agent.log). `--guest-confine` (microvm only, not
 *      a vm tier root disk): the agent runs no command until dsecd sent the confinement
 *      of commands (confine.ts: read-only paths, capabilities, seccomp, Landlock).
 * Between steps 2 and 3, the guest's swap (reclaim.ts swapCmdline): with `dsec.swap=<serial>`
 * the virtio-blk disk of that serial gets a fresh swap signature (`mkswap`; swap holds
 * nothing across boots) and is enabled with discards (`swapon -d`: freed slots are
 * discarded, so the host file stays sparse); with `dsec.zram=<bytes>` /dev/zram0 (the zram
 * module must be in the archive) gets that size and is swapped on. A swap that fails to
 * come up is reported on the console and the boot goes on without it.
 * Any failure prints `dsec-init: FATAL: …` on the console and reboots, which ends QEMU
 * (`-no-reboot`), so a broken boot fails fast with the reason in the console log.
 * With `dsec.probe=1` on the command line it stops after step 2 (the KVM probe boot).
 */
import { createHash } from 'node:crypto';
import { mkdir, readFile, rename, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { failedPrecondition } from '../../errors.js';
import { builtinModules, indexModules, moduleName, readModuleFile, resolveModules, type KernelModule } from './kmod.js';

/** Bumped whenever the archive layout or the init script's contract changes. */
export const INITRAMFS_BUILDER_VERSION = 5;

/**
 * Modules the guest needs, beyond what Debian's kernel has built in: the virtio-mmio
 * transport and rings, the console (virtio-serial ports: the agent mux and log), block
 * devices (layers and the writable disk), EROFS (layers), overlayfs (the rootfs), ext4
 * (the writable disk) and crc32c (ext4 and jbd2 metadata checksums; a soft dependency
 * that is not pulled in by `depends=`); then the layers as persistent memory (nd_e820 serves
 * the `memmap=…!…` ranges, nd_pmem makes them DAX-capable /dev/pmemN; libnvdimm comes as
 * their dependency; qemu.ts pmemLayout) and virtio_balloon (free-page reporting).
 */
export const GUEST_MODULES = ['virtio_mmio', 'virtio_console', 'virtio_blk', 'erofs', 'overlay', 'crc32c_generic', 'ext4', 'nd_e820', 'nd_pmem', 'virtio_balloon'] as const;

/** Busybox applets `/init` calls by name: symlinks to /bin/busybox in the archive. */
const APPLETS = ['sh', 'mount', 'umount', 'insmod', 'mkdir', 'ln', 'cp', 'chmod', 'sleep', 'switch_root', 'reboot', 'sync', 'hostname', 'ip', 'cat', 'mkswap', 'swapon'];

/** virtio-serial port names the guest looks for (`-device virtserialport,name=…`). */
export const AGENT_PORT = 'dsec.agent';
export const LOG_PORT = 'dsec.log';

/** One entry of a newc cpio archive. */
export interface CpioEntry {
  /** Path inside the archive, without a leading `/` (e.g. `bin/busybox`). */
  name: string;
  /** Full st_mode: file type bits and permission bits (e.g. `0o100755`, `0o040755`). */
  mode: number;
  /** Regular file contents, or the target of a symlink. */
  data?: Buffer;
  /** Device number of a character or block device node. */
  rdev?: { major: number; minor: number };
}

/** File type bits of st_mode. */
export const S_IFDIR = 0o040000;
export const S_IFREG = 0o100000;
export const S_IFLNK = 0o120000;
export const S_IFCHR = 0o020000;

/**
 * Encodes entries as a newc (`070701`) cpio archive followed by the `TRAILER!!!` entry:
 * owner 0:0, mtime 0, inode numbers 1…n in entry order, one link each, headers and
 * data padded to 4 bytes. Parents must come before their children (the kernel unpacks in
 * order and does not create missing directories).
 */
export function cpioNewc(entries: readonly CpioEntry[]): Buffer {
  const parts: Buffer[] = [];
  const pad4 = (n: number) => (4 - (n % 4)) % 4;
  const hex = (v: number) => v.toString(16).padStart(8, '0');
  const put = (name: string, ino: number, mode: number, data: Buffer, rdev = { major: 0, minor: 0 }) => {
    const nameBytes = Buffer.from(`${name}\0`);
    const fields = [ino, mode, 0, 0, (mode & 0o170000) === S_IFDIR ? 2 : 1, 0, data.length, 0, 0, rdev.major, rdev.minor, nameBytes.length, 0];
    const hdr = Buffer.from(`070701${fields.map(hex).join('')}`, 'latin1');
    parts.push(hdr, nameBytes, Buffer.alloc(pad4(hdr.length + nameBytes.length)), data, Buffer.alloc(pad4(data.length)));
  };
  entries.forEach((e, i) => put(e.name.replace(/^\/+/, ''), i + 1, e.mode, e.data ?? Buffer.alloc(0), e.rdev));
  put('TRAILER!!!', 0, 0, Buffer.alloc(0));
  return Buffer.concat(parts);
}

/**
 * Parses a newc archive (what {@link cpioNewc} writes) back into entries, for tests and
 * diagnostics. @throws Error on a malformed archive.
 */
export function parseCpioNewc(buf: Buffer): CpioEntry[] {
  const out: CpioEntry[] = [];
  let off = 0;
  const al4 = (n: number) => (n + 3) & ~3;
  for (;;) {
    if (buf.toString('latin1', off, off + 6) !== '070701') throw new Error(`bad cpio magic at ${off}`);
    const f = (i: number) => parseInt(buf.toString('latin1', off + 6 + i * 8, off + 14 + i * 8), 16);
    const mode = f(1);
    const size = f(6);
    const nameSize = f(11);
    const name = buf.toString('utf8', off + 110, off + 110 + nameSize - 1);
    const dataOff = al4(off + 110 + nameSize);
    if (name === 'TRAILER!!!') return out;
    out.push({ name, mode, data: buf.subarray(dataOff, dataOff + size), ...((mode & 0o170000) === S_IFCHR ? { rdev: { major: f(9), minor: f(10) } } : {}) });
    off = al4(dataOff + size);
  }
}

/** Inputs of {@link buildInitramfs}. */
export interface InitramfsInputs {
  /** A statically linked busybox (busybox-static's /bin/busybox). */
  busybox: string;
  /** The static dsec agent. */
  agent: string;
  /** The guest kernel's `lib/modules/<release>` directory. */
  modulesDir: string;
  /** Module names to include (with their dependencies); default {@link GUEST_MODULES}. */
  modules?: readonly string[];
  /** Where built archives are kept (`<root>/vm`). */
  cacheDir: string;
}

/** A built (or cached) initramfs. */
export interface Initramfs {
  /** Host path of the archive. */
  path: string;
  /** sha256 (hex) of the inputs: the cache key. */
  key: string;
  /** Modules in load order. */
  modules: string[];
  /** Archive size in bytes. */
  sizeBytes: number;
  /** True when this call wrote the archive (false: it was cached). */
  built: boolean;
}

/**
 * The guest's `/init` (busybox sh) for modules loaded in `order`. Pure; see the module
 * comment for what it does.
 */
export function initScript(order: readonly string[]): string {
  const insmods = order.map((m) => (m === 'virtio_mmio'
    ? `insmod /lib/modules/${m}.ko $mmio || fail "insmod ${m}"`
    : `insmod /lib/modules/${m}.ko || fail "insmod ${m}"`)).join('\n');
  return `#!/bin/sh
# dsec microVM init (generated by dsecd: daemon/drivers/vmm/initramfs.ts, builder ${INITRAMFS_BUILDER_VERSION}).
PATH=/bin
export PATH
fail() {
  echo "dsec-init: FATAL: $*"
  sync
  reboot -f
  exit 1
}
# Polls "$2" (a shell condition) every 50 ms, for at most 60 s.
wait_for() {
  n=0
  while ! eval "$2"; do
    n=$((n + 1))
    [ $n -gt 1200 ] && fail "$1 did not appear within 60 s"
    sleep 0.05
  done
}
# /dev path of the virtio-blk disk whose serial is $1, or nothing.
dev_by_serial() {
  for d in /sys/block/vd*; do
    [ -e "$d/serial" ] || continue
    read s < "$d/serial"
    [ "$s" = "$1" ] && { echo "/dev/\${d##*/}"; return 0; }
  done
  return 1
}
port_name_ok() {
  for p in /sys/class/virtio-ports/*; do
    [ -e "$p/name" ] || continue
    read s < "$p/name"
    [ "$s" = "$1" ] && return 0
  done
  return 1
}

mount -t proc -o nosuid,nodev,noexec proc /proc || fail "mount /proc"
mount -t sysfs -o nosuid,nodev,noexec sysfs /sys || fail "mount /sys"
mount -t devtmpfs -o nosuid devtmpfs /dev || fail "mount /dev"

mmio=""
layers=0
pmem=0
probe=0
host=dsec
root=""
rootpart=""
rootfstype=ext4
initmode=agent
initpath=/sbin/init
swap=""
zram=""
for a in $(cat /proc/cmdline); do
  case "$a" in
    virtio_mmio.device=*) mmio="$mmio device=\${a#virtio_mmio.device=}" ;;
    dsec.layers=*) layers="\${a#dsec.layers=}" ;;
    dsec.pmem=1) pmem=1 ;;
    dsec.hostname=*) host="\${a#dsec.hostname=}" ;;
    dsec.probe=1) probe=1 ;;
    dsec.root=*) root="\${a#dsec.root=}" ;;
    dsec.rootpart=*) rootpart="\${a#dsec.rootpart=}" ;;
    dsec.rootfstype=*) rootfstype="\${a#dsec.rootfstype=}" ;;
    dsec.init=*) initmode="\${a#dsec.init=}" ;;
    dsec.initpath=*) initpath="\${a#dsec.initpath=}" ;;
    dsec.swap=*) swap="\${a#dsec.swap=}" ;;
    dsec.zram=*) zram="\${a#dsec.zram=}" ;;
  esac
done

${insmods}

if [ -n "$swap" ]; then
  wait_for "swap disk $swap" "dev_by_serial $swap >/dev/null"
  dev=$(dev_by_serial "$swap")
  if mkswap "$dev" >/dev/null && swapon -d "$dev"; then
    echo "dsec-init: swap on $dev"
  else
    echo "dsec-init: swap on $dev failed; the guest runs without it"
  fi
fi
if [ -n "$zram" ]; then
  if [ -e /sys/block/zram0/disksize ] && echo "$zram" > /sys/block/zram0/disksize && mkswap /dev/zram0 >/dev/null && swapon /dev/zram0; then
    echo "dsec-init: swap on /dev/zram0 ($zram bytes)"
  else
    echo "dsec-init: swap on zram failed; the guest runs without it"
  fi
fi

if [ "$probe" = 1 ]; then
  echo "dsec-init: probe ok"
  reboot -f
  exit 0
fi

if [ -n "$root" ]; then
  # vm tier: the root is one disk (virtio-blk serial $root), or its partition $rootpart.
  wait_for "root disk $root" "dev_by_serial $root >/dev/null"
  dev=$(dev_by_serial "$root")$rootpart
  wait_for "root device $dev" "[ -b $dev ]"
  mount -t "$rootfstype" -o noatime "$dev" /newroot || fail "mount root disk $dev as $rootfstype"
  if [ "$initmode" = disk ]; then
    # The disk's own init, no dsec agent: only the serial console reaches this VM.
    for d in dev proc sys; do
      [ -d "/newroot/$d" ] || fail "the root disk has no /$d"
    done
    [ -e "/newroot$initpath" ] || fail "the root disk has no init program $initpath"
    mount --move /dev /newroot/dev || fail "move /dev"
    mount --move /proc /newroot/proc || fail "move /proc"
    mount --move /sys /newroot/sys || fail "move /sys"
    echo "dsec-init: starting $initpath of the disk"
    exec switch_root /newroot "$initpath" </newroot/dev/console >/newroot/dev/console 2>&1
  fi
else
  i=0
  lower=""
  while [ "$i" -lt "$layers" ]; do
    mkdir -p "/l/$i"
    if [ "$pmem" = 1 ]; then
      # Regions are numbered in address order, which is layer order (qemu.ts pmemLayout).
      wait_for "layer pmem$i" "[ -b /dev/pmem$i ]"
      mount -t erofs -o ro,dax=always "/dev/pmem$i" "/l/$i" || fail "mount layer $i (/dev/pmem$i) as erofs with dax"
    else
      wait_for "layer disk l$i" "dev_by_serial l$i >/dev/null"
      dev=$(dev_by_serial "l$i")
      mount -t erofs -o ro "$dev" "/l/$i" || fail "mount layer $i ($dev) as erofs"
    fi
    lower="/l/$i\${lower:+:$lower}"
    i=$((i + 1))
  done
  [ -n "$lower" ] || fail "no image layers (dsec.layers=$layers)"
  wait_for "writable disk rw" "dev_by_serial rw >/dev/null"
  dev=$(dev_by_serial rw)
  mount -t ext4 -o noatime "$dev" /rw || fail "mount writable disk $dev as ext4"
  mkdir -p /rw/upper /rw/work || fail "mkdir upper/work on the writable disk"
  mount -t overlay overlay -o "lowerdir=$lower,upperdir=/rw/upper,workdir=/rw/work,index=off,redirect_dir=off,metacopy=off" /newroot \\
    || fail "mount overlay (lowerdir=$lower)"
fi

wait_for "virtio-serial port ${AGENT_PORT}" "port_name_ok ${AGENT_PORT}"
mkdir -p /dev/virtio-ports
for p in /sys/class/virtio-ports/*; do
  read s < "$p/name"
  [ -n "$s" ] && ln -sf "../\${p##*/}" "/dev/virtio-ports/$s"
done

for d in dev proc sys tmp; do
  [ -d "/newroot/$d" ] || mkdir -p "/newroot/$d" || fail "mkdir /$d in the image"
done
mount --move /dev /newroot/dev || fail "move /dev"
mount --move /proc /newroot/proc || fail "move /proc"
mount --move /sys /newroot/sys || fail "move /sys"
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o nosuid,noexec,newinstance,ptmxmode=0666,mode=0620,gid=5 devpts /newroot/dev/pts || fail "mount devpts"
ln -sf pts/ptmx /newroot/dev/ptmx
mount -t tmpfs -o nosuid,nodev,mode=1777 shm /newroot/dev/shm || fail "mount /dev/shm"
cp /dsec-agent /newroot/dev/.dsec-agent && chmod 0555 /newroot/dev/.dsec-agent || fail "install the agent"
i=0
while [ "$i" -lt "$layers" ]; do
  umount -l "/l/$i"
  i=$((i + 1))
done
[ -n "$root" ] || umount -l /rw
# microvm: the agent refuses commands until dsecd sent their confinement (confine.ts); the vm tier's root disk is the guest's own.
confine=--guest-confine
[ -n "$root" ] && confine=""
hostname "$host"
ip link set lo up
echo "dsec-init: starting the agent"
log=/newroot/dev/virtio-ports/${LOG_PORT}
[ -e "$log" ] || log=/newroot/dev/console
exec switch_root /newroot /dev/.dsec-agent --vmux /dev/virtio-ports/${AGENT_PORT} $confine </newroot/dev/null >"$log" 2>&1
`;
}

/** Builds in flight, by cache key (one build per key at a time). */
const inflight = new Map<string, Promise<Initramfs>>();

/**
 * Returns the initramfs for these inputs, building it when the cache has none.
 * @throws DsecError FailedPrecondition when busybox, the agent or a module is missing
 *   (naming it and the fix), or the modules were built for another kernel release than
 *   `kernelRelease` (when given).
 */
export async function buildInitramfs(inp: InitramfsInputs, kernelRelease?: string | null): Promise<Initramfs> {
  const bb = await readFile(inp.busybox).catch((e) => {
    throw failedPrecondition(`busybox ${inp.busybox} is missing (${(e as Error).message}); install busybox-static (apt-get install busybox-static)`, e);
  });
  if (!isStaticElf(bb)) throw failedPrecondition(`${inp.busybox} is not a statically linked ELF; the guest has no libc. Install busybox-static`);
  const agent = await readFile(inp.agent).catch((e) => {
    throw failedPrecondition(`agent binary ${inp.agent} is missing (${(e as Error).message}); run make -C native`, e);
  });
  const index = await indexModules(inp.modulesDir);
  const mods = await resolveModules(index, inp.modules ?? GUEST_MODULES, await builtinModules(inp.modulesDir));
  if (kernelRelease) {
    const bad = mods.find((m) => m.vermagic.split(' ')[0] !== kernelRelease);
    if (bad) {
      throw failedPrecondition(`guest kernel module ${bad.file} was built for ${bad.vermagic.split(' ')[0] || 'an unknown release'}, but the guest kernel is ${kernelRelease}; point [vm] modules at that kernel's lib/modules/${kernelRelease}`);
    }
  }
  const modBytes = await Promise.all(mods.map((m) => readModuleFile(m.file)));
  const script = initScript(mods.map((m) => m.name));
  const h = createHash('sha256').update(`dsec-initramfs ${INITRAMFS_BUILDER_VERSION}\n`).update(script);
  for (const [name, b] of [['busybox', bb], ['agent', agent], ...mods.map((m, i) => [m.name, modBytes[i]] as const)] as const) {
    h.update(`${name} ${b.length}\n`).update(b);
  }
  const key = h.digest('hex');
  let p = inflight.get(key);
  if (!p) {
    p = writeArchive(inp.cacheDir, key, mods, modBytes, bb, agent, script).finally(() => inflight.delete(key));
    inflight.set(key, p);
  }
  return p;
}

async function writeArchive(cacheDir: string, key: string, mods: KernelModule[], modBytes: Buffer[], bb: Buffer, agent: Buffer, script: string): Promise<Initramfs> {
  const file = path.join(cacheDir, `initramfs-${key.slice(0, 32)}.cpio`);
  const modules = mods.map((m) => m.name);
  const have = await stat(file).catch(() => null);
  if (have?.isFile()) return { path: file, key, modules, sizeBytes: have.size, built: false };
  const dir = (n: string): CpioEntry => ({ name: n, mode: S_IFDIR | 0o755 });
  const entries: CpioEntry[] = [
    dir('bin'), dir('dev'), dir('proc'), dir('sys'), dir('newroot'), dir('l'), dir('rw'), dir('tmp'), dir('lib'), dir('lib/modules'),
    // The kernel opens /dev/console for init's stdio before /init runs (devtmpfs is not mounted yet).
    { name: 'dev/console', mode: S_IFCHR | 0o600, rdev: { major: 5, minor: 1 } },
    { name: 'bin/busybox', mode: S_IFREG | 0o755, data: bb },
    ...APPLETS.map((a) => ({ name: `bin/${a}`, mode: S_IFLNK | 0o777, data: Buffer.from('busybox') })),
    { name: 'dsec-agent', mode: S_IFREG | 0o755, data: agent },
    ...mods.map((m, i) => ({ name: `lib/modules/${moduleName(m.name)}.ko`, mode: S_IFREG | 0o644, data: modBytes[i] })),
    { name: 'init', mode: S_IFREG | 0o755, data: Buffer.from(script) },
  ];
  const archive = cpioNewc(entries);
  await mkdir(cacheDir, { recursive: true, mode: 0o700 });
  const tmp = `${file}.tmp${process.pid}`;
  // Readable by others: an unprivileged VMM opens it (docs/SECURITY.md "VMM confinement"); it holds nothing secret.
  await writeFile(tmp, archive, { mode: 0o644 });
  await rename(tmp, file);
  return { path: file, key, modules, sizeBytes: archive.length, built: true };
}

/** True for an ELF executable without a PT_INTERP program header (statically linked). */
export function isStaticElf(b: Buffer): boolean {
  if (b.length < 64 || b.readUInt32BE(0) !== 0x7f454c46 || b[4] !== 2) return false;
  const phoff = Number(b.readBigUInt64LE(0x20));
  const phentsize = b.readUInt16LE(0x36);
  const phnum = b.readUInt16LE(0x38);
  for (let i = 0; i < phnum; i++) {
    const o = phoff + i * phentsize;
    if (o + 4 > b.length) return false;
    if (b.readUInt32LE(o) === 3) return false; // PT_INTERP
  }
  return true;
}
