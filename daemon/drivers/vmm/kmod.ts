/**
 * Kernel modules of the guest, read straight from the unpacked kernel package: Debian's
 * `linux-image-*` ships `lib/modules/<release>/kernel/**.ko` but no `modules.dep` (depmod
 * writes it at install time, and the guest kernel is never installed on the host), and
 * the host may have no kmod tools. So dependencies come from each module's own
 * `.modinfo` ELF section (`depends=a,b`, `softdep=pre: x`), parsed here.
 *
 * Module names follow the kernel's rule: a file `crc32c-intel.ko` is module
 * `crc32c_intel` ('-' and '_' are the same character in module names).
 */
import { readFile, readdir } from 'node:fs/promises';
import path from 'node:path';
import { gunzipSync } from 'node:zlib';
import { execa } from 'execa';
import { failedPrecondition, internal } from '../../errors.js';

/** One module with what the initramfs needs to know about it. */
export interface KernelModule {
  /** Module name (`virtio_mmio`), '-' normalised to '_'. */
  name: string;
  /** Absolute path of the `.ko` (possibly `.ko.gz`, `.ko.xz`, `.ko.zst`) file. */
  file: string;
  /** `depends=` of its modinfo: modules that must be loaded first. */
  depends: string[];
  /** `softdep=pre:` names (module names or aliases) to load first when they are part of the set. */
  softPre: string[];
  /** `alias=` values (e.g. `crypto-crc32c` for crc32c_generic). */
  aliases: string[];
  /** `vermagic=`: the kernel release and build flags the module was built for. */
  vermagic: string;
}

/** The normalised module name for a file or module name (`crc32c-intel.ko.xz` → `crc32c_intel`). */
export function moduleName(fileOrName: string): string {
  return path.basename(fileOrName).replace(/\.ko(\.(gz|xz|zst))?$/, '').replace(/-/g, '_');
}

/**
 * The `.modinfo` section of an ELF64 little-endian object (a `.ko`), as key → values in
 * file order (a key such as `alias` repeats).
 * @throws DsecError Internal when the bytes are not an ELF64 LE file or have no `.modinfo`.
 */
export function parseModinfo(elf: Buffer, what = 'module'): Map<string, string[]> {
  if (elf.length < 64 || elf.readUInt32BE(0) !== 0x7f454c46 || elf[4] !== 2 || elf[5] !== 1) {
    throw internal(`${what} is not an ELF64 little-endian object`);
  }
  const shoff = Number(elf.readBigUInt64LE(0x28));
  const shentsize = elf.readUInt16LE(0x3a);
  const shnum = elf.readUInt16LE(0x3c);
  const shstrndx = elf.readUInt16LE(0x3e);
  if (shoff + shnum * shentsize > elf.length || shstrndx >= shnum) throw internal(`${what}: truncated ELF section table`);
  const sec = (i: number) => {
    const o = shoff + i * shentsize;
    return { name: elf.readUInt32LE(o), offset: Number(elf.readBigUInt64LE(o + 24)), size: Number(elf.readBigUInt64LE(o + 32)) };
  };
  const strtab = sec(shstrndx);
  const nameAt = (off: number) => {
    const start = strtab.offset + off;
    const end = elf.indexOf(0, start);
    return elf.toString('latin1', start, end < 0 ? start : end);
  };
  for (let i = 0; i < shnum; i++) {
    const s = sec(i);
    if (nameAt(s.name) !== '.modinfo') continue;
    if (s.offset + s.size > elf.length) throw internal(`${what}: truncated .modinfo section`);
    const out = new Map<string, string[]>();
    for (const kv of elf.toString('utf8', s.offset, s.offset + s.size).split('\0')) {
      const eq = kv.indexOf('=');
      if (eq <= 0) continue;
      const k = kv.slice(0, eq);
      out.set(k, [...(out.get(k) ?? []), kv.slice(eq + 1)]);
    }
    return out;
  }
  throw internal(`${what} has no .modinfo section`);
}

/**
 * The bytes of a module file, decompressed (`.ko.gz` with zlib, `.ko.xz` with `xz -dc`,
 * `.ko.zst` with `zstd -dc`), so the initramfs holds plain `.ko` files that busybox
 * `insmod` loads without decompression support.
 */
export async function readModuleFile(file: string): Promise<Buffer> {
  if (file.endsWith('.ko')) return readFile(file);
  if (file.endsWith('.ko.gz')) return gunzipSync(await readFile(file));
  const tool = file.endsWith('.ko.xz') ? 'xz' : file.endsWith('.ko.zst') ? 'zstd' : null;
  if (!tool) throw internal(`${file} is not a kernel module file (.ko, .ko.gz, .ko.xz, .ko.zst)`);
  const r = await execa(tool, ['-dc', file], { encoding: 'buffer', reject: false });
  if (r.exitCode !== 0) throw internal(`${tool} -dc ${file} failed: ${Buffer.from(r.stderr).toString().trim()}`);
  return Buffer.from(r.stdout);
}

/**
 * Every module file under `<modulesDir>/kernel`, by module name.
 * @throws DsecError FailedPrecondition when the directory is missing.
 */
export async function indexModules(modulesDir: string): Promise<Map<string, string>> {
  const root = path.join(modulesDir, 'kernel');
  const out = new Map<string, string>();
  let entries: string[];
  try {
    entries = await readdir(root, { recursive: true });
  } catch (e) {
    throw failedPrecondition(`guest kernel modules directory ${root} is missing or unreadable (${(e as Error).message}); set [vm] modules to the kernel's lib/modules/<release> directory (scripts/guest-kernel.sh unpacks one)`, e);
  }
  for (const rel of entries.sort()) {
    if (/\.ko(\.(gz|xz|zst))?$/.test(rel)) out.set(moduleName(rel), path.join(root, rel));
  }
  return out;
}

/**
 * The modules `wanted` plus everything they depend on, in a load order: each module comes
 * after every module of its `depends=` and after its `softdep=pre:` modules that are in
 * the set (matched by name or alias; soft dependencies outside the set are not pulled in,
 * so name them in `wanted` when they matter, e.g. `crc32c_generic` for ext4's metadata
 * checksums). Modules compiled into the kernel (`modules.builtin`) are dropped silently.
 * Ties are broken by name, so the order is deterministic.
 * @param index from {@link indexModules}.
 * @param builtin module names built into the kernel.
 * @throws DsecError FailedPrecondition naming a module that is neither a file nor built in,
 *   or a dependency cycle.
 */
export async function resolveModules(index: ReadonlyMap<string, string>, wanted: readonly string[], builtin: ReadonlySet<string> = new Set()): Promise<KernelModule[]> {
  const mods = new Map<string, KernelModule>();
  const load = async (name: string, by: string | null): Promise<void> => {
    const n = moduleName(name);
    if (mods.has(n) || builtin.has(n)) return;
    const file = index.get(n);
    if (!file) {
      throw failedPrecondition(`guest kernel module ${n}${by ? ` (needed by ${by})` : ''} is neither in the modules directory nor built into the kernel; point [vm] modules at the guest kernel's lib/modules/<release>`);
    }
    const info = parseModinfo(await readModuleFile(file), file);
    const m: KernelModule = {
      name: n, file,
      depends: (info.get('depends') ?? []).flatMap((d) => d.split(',')).map((d) => d.trim()).filter(Boolean).map(moduleName),
      softPre: (info.get('softdep') ?? []).flatMap(parseSoftdepPre),
      aliases: info.get('alias') ?? [],
      vermagic: (info.get('vermagic') ?? [''])[0],
    };
    mods.set(n, m);
    for (const d of m.depends) await load(d, n);
  };
  for (const w of wanted) await load(w, null);

  // Edges: dependency -> dependent. softdep pre targets resolved by name or alias within the set.
  const byAlias = new Map<string, string>();
  for (const m of mods.values()) for (const a of m.aliases) byAlias.set(a, m.name);
  const before = new Map<string, Set<string>>();
  for (const m of mods.values()) {
    const deps = new Set(m.depends.filter((d) => mods.has(d)));
    for (const s of m.softPre) {
      const t = mods.has(moduleName(s)) ? moduleName(s) : byAlias.get(s);
      if (t && t !== m.name) deps.add(t);
    }
    before.set(m.name, deps);
  }
  const order: KernelModule[] = [];
  const state = new Map<string, 'visiting' | 'done'>();
  const visit = (n: string, trail: string[]) => {
    const s = state.get(n);
    if (s === 'done') return;
    if (s === 'visiting') throw failedPrecondition(`guest kernel modules have a dependency cycle: ${[...trail, n].join(' -> ')}`);
    state.set(n, 'visiting');
    for (const d of [...before.get(n)!].sort()) visit(d, [...trail, n]);
    state.set(n, 'done');
    order.push(mods.get(n)!);
  };
  for (const n of [...mods.keys()].sort()) visit(n, []);
  return order;
}

/** The `pre:` names of one `softdep=` value (`pre: a b post: c` → `[a, b]`). */
export function parseSoftdepPre(v: string): string[] {
  const out: string[] = [];
  let mode: string | null = null;
  for (const tok of v.split(/\s+/).filter(Boolean)) {
    if (tok.endsWith(':')) mode = tok.slice(0, -1);
    else if (mode === 'pre') out.push(tok);
  }
  return out;
}

/** Names listed in `<modulesDir>/modules.builtin` (`kernel/fs/ext4/ext4.ko` lines), normalised; empty when absent. */
export async function builtinModules(modulesDir: string): Promise<Set<string>> {
  const text = await readFile(path.join(modulesDir, 'modules.builtin'), 'utf8').catch(() => '');
  return new Set(text.split('\n').filter(Boolean).map(moduleName));
}

/**
 * The release of a bzImage kernel (`6.1.0-57-amd64`), from its setup header: "HdrS" at
 * 0x202 and the offset of the version string (minus 0x200) at 0x20E; null when the file
 * is not a bzImage with a version string.
 */
export function kernelRelease(bzImage: Buffer): string | null {
  if (bzImage.length < 0x210 || bzImage.toString('latin1', 0x202, 0x206) !== 'HdrS') return null;
  const off = bzImage.readUInt16LE(0x20e) + 0x200;
  if (off >= bzImage.length) return null;
  const end = bzImage.indexOf(0, off);
  const s = bzImage.toString('latin1', off, end < 0 ? Math.min(off + 256, bzImage.length) : end);
  return s.split(' ')[0] || null;
}

/** XEN_ELFNOTE_PHYS32_ENTRY: the note that makes a vmlinux bootable through PVH (QEMU's `-kernel` with an ELF). */
const PVH_NOTE_TYPE = 18;

/**
 * The compressed kernel inside a bzImage (the setup header's `payload_offset` and
 * `payload_length`, relative to the protected-mode code after `setup_sects`), and its
 * compression by magic; null when the file is no bzImage with a payload.
 */
export function bzImagePayload(b: Buffer): { data: Buffer; compression: 'xz' | 'gzip' | 'zstd' | 'other' } | null {
  if (b.length < 0x250 || b.toString('latin1', 0x202, 0x206) !== 'HdrS') return null;
  const setupSects = b[0x1f1] || 4;
  const start = (setupSects + 1) * 512 + b.readUInt32LE(0x248);
  const len = b.readUInt32LE(0x24c);
  if (len === 0 || start + len > b.length) return null;
  const data = b.subarray(start, start + len);
  const compression = data.subarray(0, 6).equals(Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00])) ? 'xz'
    : data[0] === 0x1f && data[1] === 0x8b ? 'gzip'
      : data.readUInt32LE(0) === 0xfd2fb528 ? 'zstd' : 'other';
  return { data, compression };
}

/** True for an ELF64 LE kernel with a Xen `PHYS32_ENTRY` note in a PT_NOTE segment (bootable by QEMU through PVH). */
export function hasPvhNote(elf: Buffer): boolean {
  if (elf.length < 64 || elf.readUInt32BE(0) !== 0x7f454c46 || elf[4] !== 2 || elf[5] !== 1) return false;
  const phoff = Number(elf.readBigUInt64LE(0x20));
  const phentsize = elf.readUInt16LE(0x36);
  const phnum = elf.readUInt16LE(0x38);
  for (let i = 0; i < phnum; i++) {
    const o = phoff + i * phentsize;
    if (o + 56 > elf.length || elf.readUInt32LE(o) !== 4) continue; // PT_NOTE
    const off = Number(elf.readBigUInt64LE(o + 8));
    const end = Math.min(elf.length, off + Number(elf.readBigUInt64LE(o + 32)));
    for (let p = off; p + 12 <= end;) {
      const namesz = elf.readUInt32LE(p);
      const descsz = elf.readUInt32LE(p + 4);
      const type = elf.readUInt32LE(p + 8);
      const name = elf.toString('latin1', p + 12, p + 12 + Math.max(0, namesz - 1));
      if (name === 'Xen' && type === PVH_NOTE_TYPE) return true;
      p += 12 + ((namesz + 3) & ~3) + ((descsz + 3) & ~3);
    }
  }
  return false;
}

/**
 * The uncompressed `vmlinux` inside a bzImage, if it can boot through PVH: under TCG the
 * guest otherwise spends seconds decompressing itself at every boot (measured here: the
 * agent answered after 2.6 s instead of 5.7 s), and the decompressor's buffer is guest RAM
 * the host keeps backing after boot. xz (Debian's choice) is decompressed with `xz -dc`,
 * gzip with zlib, zstd with `zstd -dc`. null when the payload is in another format, does not
 * decompress, or has no PVH note: the caller then boots the bzImage as it is.
 */
export async function extractPvhKernel(bzImage: Buffer): Promise<Buffer | null> {
  const p = bzImagePayload(bzImage);
  if (!p) return null;
  let elf: Buffer | null = null;
  try {
    if (p.compression === 'gzip') elf = gunzipSync(p.data);
    else if (p.compression === 'xz' || p.compression === 'zstd') {
      const tool = p.compression === 'xz' ? ['xz', ['-dc', '--single-stream']] as const : ['zstd', ['-dc']] as const;
      const r = await execa(tool[0], [...tool[1]], { input: p.data, encoding: 'buffer', reject: false, maxBuffer: 1024 * 1024 * 1024 });
      elf = r.exitCode === 0 ? Buffer.from(r.stdout) : null;
    }
  } catch {
    elf = null;
  }
  return elf && hasPvhNote(elf) ? elf : null;
}
