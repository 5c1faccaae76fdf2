/**
 * The microvm tier's boot pieces that need no VM: the newc cpio writer, kernel module
 * dependency resolution from `.modinfo` sections (synthetic ELF objects, plus the real
 * guest kernel's when it is unpacked here), the initramfs builder's contents and cache,
 * the bzImage release parser, and the QEMU command line.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import {
  S_IFCHR, S_IFDIR, S_IFLNK, S_IFREG, buildInitramfs, cpioNewc, initScript, isStaticElf, parseCpioNewc,
} from '../../daemon/drivers/vmm/initramfs.js';
import { builtinModules, indexModules, kernelRelease, moduleName, parseModinfo, parseSoftdepPre, resolveModules } from '../../daemon/drivers/vmm/kmod.js';
import { guestCmdline, pmemLayout, qemuArgs } from '../../daemon/drivers/microvm/qemu.js';
import { pmemFileBytes } from '../../daemon/drivers/microvm/driver.js';
import { DsecError } from '../../daemon/errors.js';

const tmp = mkdtempSync(path.join(os.tmpdir(), 'dsec-initramfs-test-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** A minimal ELF64 LE object whose only content is a `.modinfo` section with these `key=value` entries. */
function fakeKo(modinfo: string[]): Buffer {
  const info = Buffer.from(modinfo.map((kv) => `${kv}\0`).join(''));
  const shstr = Buffer.from('\0.modinfo\0.shstrtab\0');
  const infoOff = 64;
  const strOff = infoOff + info.length;
  const shoff = (strOff + shstr.length + 7) & ~7;
  const b = Buffer.alloc(shoff + 3 * 64);
  b.writeUInt32BE(0x7f454c46, 0);
  b[4] = 2; // ELFCLASS64
  b[5] = 1; // little endian
  b[6] = 1;
  b.writeBigUInt64LE(BigInt(shoff), 0x28);
  b.writeUInt16LE(64, 0x3a);
  b.writeUInt16LE(3, 0x3c);
  b.writeUInt16LE(2, 0x3e);
  info.copy(b, infoOff);
  shstr.copy(b, strOff);
  const sh = (i: number, name: number, off: number, size: number) => {
    const o = shoff + i * 64;
    b.writeUInt32LE(name, o);
    b.writeUInt32LE(1, o + 4);
    b.writeBigUInt64LE(BigInt(off), o + 24);
    b.writeBigUInt64LE(BigInt(size), o + 32);
  };
  sh(1, 1, infoOff, info.length);
  sh(2, 10, strOff, shstr.length);
  return b;
}

/** A modules dir (`kernel/**.ko`) with these modules: name -> modinfo entries (vermagic added). */
function fakeModulesDir(mods: Record<string, string[]>, opts: { release?: string; builtin?: string[]; gz?: string[] } = {}): string {
  const dir = mkdtempSync(path.join(tmp, 'mods-'));
  mkdirSync(path.join(dir, 'kernel', 'drivers'), { recursive: true });
  for (const [name, info] of Object.entries(mods)) {
    const ko = fakeKo([...info, `name=${name}`, `vermagic=${opts.release ?? '6.1.0-test'} SMP mod_unload`]);
    const file = path.join(dir, 'kernel', 'drivers', `${name.replace(/_/g, '-')}.ko`);
    if (opts.gz?.includes(name)) writeFileSync(`${file}.gz`, gzipSync(ko));
    else writeFileSync(file, ko);
  }
  writeFileSync(path.join(dir, 'modules.builtin'), (opts.builtin ?? []).map((m) => `kernel/x/${m}.ko\n`).join(''));
  return dir;
}

describe('cpio newc', () => {
  it('round-trips files, directories, symlinks and device nodes, 4-byte aligned, with a trailer', () => {
    const entries = [
      { name: 'dev', mode: S_IFDIR | 0o755 },
      { name: 'dev/console', mode: S_IFCHR | 0o600, rdev: { major: 5, minor: 1 } },
      { name: 'bin', mode: S_IFDIR | 0o755 },
      { name: 'bin/busybox', mode: S_IFREG | 0o755, data: Buffer.from('odd length!') },
      { name: 'bin/sh', mode: S_IFLNK | 0o777, data: Buffer.from('busybox') },
    ];
    const a = cpioNewc(entries);
    expect(a.length % 4).toBe(0);
    expect(a.toString('latin1', 0, 6)).toBe('070701');
    expect(a.includes(Buffer.from('TRAILER!!!\0'))).toBe(true);
    const back = parseCpioNewc(a);
    expect(back.map((e) => [e.name, e.mode.toString(8), e.data?.toString(), e.rdev])).toEqual([
      ['dev', '40755', '', undefined],
      ['dev/console', '20600', '', { major: 5, minor: 1 }],
      ['bin', '40755', '', undefined],
      ['bin/busybox', '100755', 'odd length!', undefined],
      ['bin/sh', '120777', 'busybox', undefined],
    ]);
    // Deterministic: the same entries give the same bytes.
    expect(cpioNewc(entries).equals(a)).toBe(true);
  });
});

describe('kernel modules', () => {
  it('parses .modinfo (repeated keys in order), names and softdep lists', () => {
    const info = parseModinfo(fakeKo(['alias=crypto-crc32c', 'alias=crc32c', 'depends=a,b', 'softdep=pre: x y post: z']));
    expect(info.get('alias')).toEqual(['crypto-crc32c', 'crc32c']);
    expect(info.get('depends')).toEqual(['a,b']);
    expect(parseSoftdepPre('pre: x y post: z')).toEqual(['x', 'y']);
    expect(moduleName('/lib/modules/x/kernel/arch/crc32c-intel.ko.xz')).toBe('crc32c_intel');
    expect(() => parseModinfo(Buffer.from('not an elf at all, but long enough to have a header of sixty-four bytes'))).toThrow(DsecError);
  });

  it('resolves depends= transitively and orders every module after its dependencies and in-set softdeps', async () => {
    const dir = fakeModulesDir({
      virtio_ring: ['depends='],
      virtio: ['depends=virtio_ring'],
      virtio_mmio: ['depends=virtio,virtio_ring'],
      virtio_blk: ['depends=virtio,virtio_ring'],
      libcrc32c: ['depends=', 'softdep=pre: crc32c'],
      crc32c_generic: ['depends=', 'alias=crypto-crc32c', 'alias=crc32c'],
      erofs: ['depends=libcrc32c'],
      ext4: ['depends=jbd2,mbcache', 'softdep=pre: crypto-crc32c'],
      jbd2: ['depends='],
      mbcache: ['depends='],
      unused: ['depends='],
    }, { gz: ['jbd2'] });
    const index = await indexModules(dir);
    expect(index.get('jbd2')).toMatch(/jbd2\.ko\.gz$/);
    const order = (await resolveModules(index, ['virtio_mmio', 'virtio_blk', 'erofs', 'crc32c_generic', 'ext4'])).map((m) => m.name);
    expect(new Set(order)).toEqual(new Set(['virtio_ring', 'virtio', 'virtio_mmio', 'virtio_blk', 'libcrc32c', 'crc32c_generic', 'erofs', 'ext4', 'jbd2', 'mbcache']));
    const before = (a: string, b: string) => expect(order.indexOf(a)).toBeLessThan(order.indexOf(b));
    before('virtio_ring', 'virtio');
    before('virtio', 'virtio_mmio');
    before('virtio', 'virtio_blk');
    before('libcrc32c', 'erofs');
    before('crc32c_generic', 'libcrc32c'); // softdep by alias, in the set
    before('crc32c_generic', 'ext4');
    before('jbd2', 'ext4');
    before('mbcache', 'ext4');
    // Deterministic.
    expect((await resolveModules(index, ['ext4', 'erofs', 'virtio_blk', 'virtio_mmio', 'crc32c_generic'])).map((m) => m.name)).toEqual(order);
  });

  it('drops built-in modules, names a missing one and who needs it, refuses cycles', async () => {
    const dir = fakeModulesDir({ a: ['depends=b,c'], c: ['depends='], x: ['depends=y'], y: ['depends=x'] }, { builtin: ['b'] });
    const index = await indexModules(dir);
    expect((await resolveModules(index, ['a'], new Set(['b']))).map((m) => m.name)).toEqual(['c', 'a']);
    const missing = await resolveModules(index, ['a']).catch((e) => e);
    expect(missing).toMatchObject({ kind: 'FailedPrecondition' });
    expect(missing.message).toMatch(/module b \(needed by a\)/);
    expect(await resolveModules(index, ['x']).catch((e) => e)).toMatchObject({ kind: 'FailedPrecondition', message: expect.stringMatching(/cycle: x -> y -> x/) });
    expect(await indexModules(path.join(tmp, 'nope')).catch((e) => e)).toMatchObject({ kind: 'FailedPrecondition', message: expect.stringMatching(/\[vm\] modules/) });
  });

  const REAL = '/usr/local/lib/dsec/guest/modules';
  it.skipIf(!existsSync(REAL))('resolves the guest modules of the real Debian kernel: each after its dependencies, built-ins left out', async () => {
    // Which drivers are modules differs by release (6.12 builds virtio and virtio_console
    // in; 6.1 has them as modules), so the check is the order rule itself.
    const builtin = await builtinModules(REAL);
    const wanted = ['virtio_mmio', 'virtio_console', 'virtio_blk', 'erofs', 'overlay', 'crc32c_generic', 'ext4'];
    const order = await resolveModules(await indexModules(REAL), wanted, builtin);
    const at = new Map(order.map((m, i) => [m.name, i]));
    for (const w of wanted) expect(builtin.has(w) || at.has(w), `${w} resolved or built in`).toBe(true);
    for (const m of order) {
      expect(builtin.has(m.name)).toBe(false);
      for (const d of m.depends) expect(builtin.has(d) || at.get(d)! < at.get(m.name)!, `${d} before ${m.name}`).toBe(true);
    }
    // ext4 always needs jbd2 and mbcache, as modules or built in.
    for (const d of ['jbd2', 'mbcache']) expect(builtin.has(d) || at.get(d)! < at.get('ext4')!).toBe(true);
  });
});

describe('kernel release and static binaries', () => {
  it('reads the release from a bzImage setup header', () => {
    const b = Buffer.alloc(0x400);
    b.write('HdrS', 0x202, 'latin1');
    b.writeUInt16LE(0x100, 0x20e); // version string at 0x300
    b.write('6.1.0-57-amd64 (debian-kernel@lists.debian.org) #1 SMP\0', 0x300, 'latin1');
    expect(kernelRelease(b)).toBe('6.1.0-57-amd64');
    expect(kernelRelease(Buffer.alloc(0x400))).toBeNull();
  });

  it.skipIf(!existsSync('/usr/local/lib/dsec/guest/vmlinuz'))('reads the real guest kernel release, matching its modules dir', () => {
    const rel = kernelRelease(readFileSync('/usr/local/lib/dsec/guest/vmlinuz'));
    expect(rel).toMatch(/^\d+\.\d+\.\d+[-+][0-9a-z+.-]*amd64$/);
    expect(existsSync(`/usr/local/lib/dsec/guest/modules/../${rel}`)).toBe(true);
  });

  it('tells static from dynamic executables', () => {
    expect(isStaticElf(readFileSync('/bin/busybox'))).toBe(true);
    expect(isStaticElf(readFileSync(process.execPath))).toBe(false);
  });
});

describe('initramfs builder', () => {
  const mods = { virtio_ring: ['depends='], virtio: ['depends=virtio_ring'], virtio_mmio: ['depends=virtio'], extra: ['depends=virtio'] };

  it('packs busybox, the agent, the modules in load order and an /init that loads them; cached by content', async () => {
    const dir = fakeModulesDir(mods);
    const agent = path.join(tmp, 'agent-a');
    writeFileSync(agent, readFileSync('/bin/busybox'));
    const cacheDir = path.join(tmp, 'cache');
    const inp = { busybox: '/bin/busybox', agent, modulesDir: dir, modules: ['virtio_mmio', 'extra'], cacheDir };
    const a = await buildInitramfs(inp, '6.1.0-test');
    expect(a.built).toBe(true);
    expect(a.modules).toEqual(['virtio_ring', 'virtio', 'extra', 'virtio_mmio']);
    const entries = parseCpioNewc(readFileSync(a.path));
    const byName = new Map(entries.map((e) => [e.name, e]));
    expect([...byName.keys()]).toEqual(expect.arrayContaining([
      'init', 'bin/busybox', 'bin/sh', 'bin/switch_root', 'bin/insmod', 'dsec-agent', 'dev/console', 'newroot',
      'lib/modules/virtio_ring.ko', 'lib/modules/virtio.ko', 'lib/modules/extra.ko', 'lib/modules/virtio_mmio.ko',
    ]));
    expect(byName.get('dev/console')!.rdev).toEqual({ major: 5, minor: 1 });
    expect(byName.get('bin/sh')!.data!.toString()).toBe('busybox');
    // Parents come before children (the kernel does not create missing directories).
    for (const e of entries) {
      const parent = path.dirname(e.name);
      if (parent !== '.') expect(entries.findIndex((x) => x.name === parent)).toBeLessThan(entries.indexOf(e));
    }
    const init = byName.get('init')!.data!.toString();
    expect((byName.get('init')!.mode & 0o777).toString(8)).toBe('755');
    const insmods = [...init.matchAll(/^insmod \/lib\/modules\/(\S+)\.ko/gm)].map((m) => m[1]);
    expect(insmods).toEqual(['virtio_ring', 'virtio', 'extra', 'virtio_mmio']);
    // virtio_mmio gets the device= parameters from the command line; modprobe is not there to do it.
    expect(init).toMatch(/insmod \/lib\/modules\/virtio_mmio\.ko \$mmio/);
    expect(init).toContain('virtio_mmio.device=*) mmio="$mmio device=');
    expect(init).toContain('exec switch_root /newroot /dev/.dsec-agent --vmux /dev/virtio-ports/dsec.agent');
    // Same inputs: the cached archive; another agent: a new one.
    const again = await buildInitramfs(inp, '6.1.0-test');
    expect(again).toMatchObject({ path: a.path, key: a.key, built: false });
    writeFileSync(agent, Buffer.concat([readFileSync('/bin/busybox'), Buffer.from('x')]));
    const other = await buildInitramfs(inp, '6.1.0-test');
    expect(other.built).toBe(true);
    expect(other.path).not.toBe(a.path);
  });

  it('refuses modules of another kernel release, a dynamic busybox, a missing agent', async () => {
    const dir = fakeModulesDir(mods, { release: '6.9.9-other' });
    const inp = { busybox: '/bin/busybox', agent: '/bin/busybox', modulesDir: dir, modules: ['virtio_mmio'], cacheDir: path.join(tmp, 'c2') };
    expect(await buildInitramfs(inp, '6.1.0-test').catch((e) => e)).toMatchObject({ kind: 'FailedPrecondition', message: expect.stringMatching(/built for 6\.9\.9-other/) });
    expect(await buildInitramfs({ ...inp, busybox: process.execPath }).catch((e) => e)).toMatchObject({ kind: 'FailedPrecondition', message: expect.stringMatching(/busybox-static/) });
    expect(await buildInitramfs({ ...inp, agent: path.join(tmp, 'none') }).catch((e) => e)).toMatchObject({ kind: 'FailedPrecondition', message: expect.stringMatching(/make -C native/) });
  });

  it('the init script fails loudly and reboots (ending QEMU) on any error', () => {
    const s = initScript(['virtio_mmio']);
    expect(s.startsWith('#!/bin/sh\n')).toBe(true);
    expect(s).toMatch(/fail\(\) \{\n {2}echo "dsec-init: FATAL: \$\*"\n {2}sync\n {2}reboot -f/);
    expect(s).toContain('mount -t overlay overlay -o "lowerdir=$lower,upperdir=/rw/upper,workdir=/rw/work,index=off,redirect_dir=off,metacopy=off" /newroot');
    // dsec.pmem=1: layer i is /dev/pmem<i>, mounted erofs with DAX; otherwise the disk with serial l<i>.
    expect(s).toContain('dsec.pmem=1) pmem=1 ;;');
    expect(s).toContain('mount -t erofs -o ro,dax=always "/dev/pmem$i" "/l/$i"');
    expect(s).toContain('mount -t erofs -o ro "$dev" "/l/$i"');
  });
});

describe('QEMU command line', () => {
  const spec = {
    id: 'abc', dir: '/r/sandboxes/abc', kernel: '/k/vmlinuz', initrd: '/r/vm/i.cpio', accel: 'tcg' as const, vcpus: 2, memoryMiB: 512,
    layers: ['/store/blobs/aa', '/store/blobs/bb'], tscKhz: 2_600_000, tcgTbMiB: 128,
  };
  it('describes a microvm with layers as read-only disks by serial, the writable disk, the mux and log ports, QMP', () => {
    const a = qemuArgs(spec);
    const after = (flag: string) => a.filter((_, i) => a[i - 1] === flag);
    expect(after('-M')).toEqual(['microvm,pit=on,pic=on,rtc=on,isa-serial=on']);
    expect(after('-accel')).toEqual(['tcg,tb-size=128']);
    expect(after('-m')).toEqual(['512']);
    expect(after('-smp')).toEqual(['2']);
    expect(a).toContain('-nodefaults');
    expect(a).toContain('-no-reboot');
    expect(after('-drive')).toEqual([
      'id=l0,file=/store/blobs/aa,format=raw,if=none,readonly=on,file.locking=off',
      'id=l1,file=/store/blobs/bb,format=raw,if=none,readonly=on,file.locking=off',
      'id=rw,file=/r/sandboxes/abc/disk.raw,format=raw,if=none,discard=unmap,detect-zeroes=unmap',
    ]);
    expect(after('-device')).toEqual(expect.arrayContaining(['virtio-blk-device,drive=l0,serial=l0', 'virtio-blk-device,drive=rw,serial=rw',
      'virtserialport,chardev=vmux,name=dsec.agent', 'virtserialport,chardev=alog,name=dsec.log']));
    expect(after('-chardev')).toContain('socket,id=vmux,path=/r/sandboxes/abc/vmux.sock,server=on,wait=off');
    expect(after('-qmp')).toEqual(['unix:/r/sandboxes/abc/qmp.sock,server=on,wait=off']);
    expect(a.some((x) => x.includes('-netdev') || x.includes('virtio-net'))).toBe(false);
    expect(after('-append')[0]).toBe(guestCmdline(spec));
    expect(guestCmdline(spec)).toContain('tsc_early_khz=2600000 tsc=reliable dsec.layers=2 dsec.hostname=abc');
  });
  it('pmem: layers as file-backed NUMA nodes between the RAM and a tail for the initramfs, memmap= ranges, pcie=on, no layer disks', () => {
    const MiB = 1024 * 1024;
    const layers = [{ file: '/r/vm/pmem/aa.img', sizeBytes: 4 * MiB }, { file: '/r/vm/pmem/bb.img', sizeBytes: 6 * MiB }];
    const pm = pmemLayout(512, layers, 7 * MiB)!;
    // Tail: initramfs rounded up to 2 MiB (8) plus 8 MiB; RAM 512 - 16 = 496 MiB.
    expect(pm.nodes).toEqual([
      { id: 'ram0', sizeBytes: 496 * MiB, file: null },
      { id: 'pm0', sizeBytes: 4 * MiB, file: '/r/vm/pmem/aa.img' },
      { id: 'pm1', sizeBytes: 6 * MiB, file: '/r/vm/pmem/bb.img' },
      { id: 'ram1', sizeBytes: 16 * MiB, file: null },
    ]);
    expect(pm.starts).toEqual([496 * MiB, 500 * MiB]);
    // Each layer's data as persistent memory, its last 2 MiB reserved (keeps the two regions apart).
    expect(pm.cmdline).toEqual(['memmap=2M!496M', 'memmap=2M$498M', 'memmap=4M!500M', 'memmap=2M$504M']);
    expect(pm.totalMiB).toBe(522);
    const a = qemuArgs({ ...spec, pmem: pm, balloon: true });
    const after = (flag: string) => a.filter((_, i) => a[i - 1] === flag);
    expect(after('-M')).toEqual(['microvm,pit=on,pic=on,rtc=on,isa-serial=on,pcie=on']);
    expect(after('-m')).toEqual(['522M']);
    expect(after('-object')).toContain(`memory-backend-file,id=pm0,size=${4 * MiB},mem-path=/r/vm/pmem/aa.img,share=on,readonly=on,discard-data=off`);
    expect(after('-numa')).toEqual(['node,nodeid=0,memdev=ram0', 'node,nodeid=1,memdev=pm0', 'node,nodeid=2,memdev=pm1', 'node,nodeid=3,memdev=ram1']);
    expect(after('-drive').map((x) => x.split(',')[0])).toEqual(['id=rw']);
    expect(after('-device')).toContain('virtio-balloon-device,free-page-reporting=on');
    expect(after('-append')[0]).toContain('memmap=2M!496M memmap=2M$498M memmap=4M!500M memmap=2M$504M dsec.pmem=1 dsec.layers=2');
    // Without pmem: no NUMA nodes, no pcie, no balloon unless asked.
    const plain = qemuArgs(spec);
    expect(plain).not.toContain('-numa');
    expect(plain.join(' ')).not.toMatch(/pcie|balloon|memmap/);
  });
  it('pmem does not fit: RAM plus layers past 3 GiB, a guest too small for the tail, an unaligned layer', () => {
    const MiB = 1024 * 1024;
    expect(pmemLayout(3000, [{ file: '/x', sizeBytes: 100 * MiB }], 7 * MiB)).toBeNull();
    expect(pmemLayout(2048, [{ file: '/x', sizeBytes: 100 * MiB }], 7 * MiB)).not.toBeNull();
    expect(pmemLayout(64, [{ file: '/x', sizeBytes: 4 * MiB }], 7 * MiB)).toBeNull();
    expect(pmemLayout(512, [{ file: '/x', sizeBytes: 3 * MiB }], 7 * MiB)).toBeNull();
    expect(pmemFileBytes(1)).toBe(4 * MiB);
    expect(pmemFileBytes(2 * MiB)).toBe(4 * MiB);
    expect(pmemFileBytes(2 * MiB + 1)).toBe(6 * MiB);
  });
  it('KVM: host CPU, no TSC hints', () => {
    const a = qemuArgs({ ...spec, accel: 'kvm' });
    expect(a.join(' ')).toContain('-accel kvm -cpu host');
    expect(guestCmdline({ ...spec, accel: 'kvm' })).not.toContain('tsc');
  });
});

describe('PVH kernel extraction', () => {
  it('finds the payload of a bzImage, decompresses gzip, and keeps only kernels with a PVH note', async () => {
    const { bzImagePayload, extractPvhKernel, hasPvhNote } = await import('../../daemon/drivers/vmm/kmod.js');
    // An ELF64 with one PT_NOTE segment holding a Xen note of type 18 (PHYS32_ENTRY).
    const elf = (type: number) => {
      const note = Buffer.alloc(12 + 4 + 4);
      note.writeUInt32LE(4, 0);
      note.writeUInt32LE(4, 4);
      note.writeUInt32LE(type, 8);
      note.write('Xen\0', 12, 'latin1');
      const b = Buffer.alloc(64 + 56 + note.length);
      b.writeUInt32BE(0x7f454c46, 0);
      b[4] = 2;
      b[5] = 1;
      b.writeBigUInt64LE(64n, 0x20);
      b.writeUInt16LE(56, 0x36);
      b.writeUInt16LE(1, 0x38);
      b.writeUInt32LE(4, 64);
      b.writeBigUInt64LE(BigInt(120), 64 + 8);
      b.writeBigUInt64LE(BigInt(note.length), 64 + 32);
      note.copy(b, 120);
      return b;
    };
    expect(hasPvhNote(elf(18))).toBe(true);
    expect(hasPvhNote(elf(5))).toBe(false);
    const bz = (payload: Buffer) => {
      const b = Buffer.alloc(0x1000 + payload.length);
      b.write('HdrS', 0x202, 'latin1');
      b[0x1f1] = 3; // protected-mode code at (3 + 1) * 512
      b.writeUInt32LE(0x1000 - 4 * 512, 0x248);
      b.writeUInt32LE(payload.length, 0x24c);
      payload.copy(b, 0x1000);
      return b;
    };
    const gz = gzipSync(elf(18));
    expect(bzImagePayload(bz(gz))).toMatchObject({ compression: 'gzip' });
    expect((await extractPvhKernel(bz(gz)))?.equals(elf(18))).toBe(true);
    expect(await extractPvhKernel(bz(gzipSync(elf(5))))).toBeNull();
    expect(await extractPvhKernel(Buffer.alloc(0x400))).toBeNull();
  });
});
