/**
 * eBPF objects for dsecd: load an object file built by native/bpf (clang -target bpf),
 * attach its programs to sandbox cgroups (egress policy) or to kernel functions (denial
 * counters), and read and write its maps. A thin typed layer over the addon's libbpf
 * functions (native/addon/bpf.c).
 *
 * Lifetime contract, so that a dsecd restart neither loses enforcement nor doubles it:
 * - Maps declared with `LIBBPF_PIN_BY_NAME` are pinned in the instance's bpffs
 *   (`<root>/bpf`, see {@link ensureBpffs}) and reused by the next dsecd when compatible,
 *   so policies and counters survive a restart. When a new dsec version changes a map's
 *   layout, {@link BpfObject.load} with `replaceIncompatiblePins` removes the old pins and
 *   starts the maps empty; the caller rebuilds them from the store.
 * - Programs are loaded anew at each start. A cgroup attachment (BPF_F_ALLOW_MULTI)
 *   outlives the process that made it and ends with the cgroup, so
 *   {@link BpfObject.attachCgroup} replaces an older program of the same name in place.
 *   Tracing programs (fentry/fexit) hold a link pinned in bpffs.
 *
 * All calls are synchronous (one bpf(2) call each, about a microsecond; loading an object
 * takes milliseconds of verification, once per start).
 */
import { existsSync, mkdirSync, readdirSync, rmSync, statfsSync } from 'node:fs';
import path from 'node:path';
import { failedPrecondition, internal } from '../errors.js';
import { loadAddon } from './native.js';

/** f_type of a bpffs mount (BPF_FS_MAGIC, include/uapi/linux/magic.h). */
export const BPF_FS_MAGIC = 0xcafe4a11;

/** Attach types used by dsec (enum bpf_attach_type, include/uapi/linux/bpf.h). */
export const ATTACH_TYPE = {
  cgroupInetSockCreate: 2,
  cgroupInet4Connect: 10,
  cgroupInet6Connect: 11,
  cgroupUdp4Sendmsg: 14,
  cgroupUdp6Sendmsg: 15,
  traceFexit: 25,
} as const;

/** Update flags of {@link BpfMap.update} (BPF_ANY, BPF_NOEXIST, BPF_EXIST). */
const UPDATE_FLAGS = { any: 0, noexist: 1, exist: 2 } as const;

/** What the addon reports of one program of a loaded object. */
export interface BpfProgramInfo {
  name: string;
  /** ELF section, e.g. `cgroup/connect4`, `fexit/__seccomp_filter`. */
  section: string;
  fd: number;
  /** enum bpf_attach_type the program was loaded for. */
  attachType: number;
}

/** What the addon reports of one map of a loaded object. */
export interface BpfMapInfo {
  name: string;
  fd: number;
  /** enum bpf_map_type. */
  type: number;
  keySize: number;
  valueSize: number;
  maxEntries: number;
}

/** The addon's raw BPF functions (see native/addon/bpf.c for each). */
interface BpfAddon {
  bpfObjectOpen(path: string, pinRoot: string, maxEntries: Record<string, number>): { handle: number; programs: BpfProgramInfo[]; maps: BpfMapInfo[] };
  bpfObjectClose(handle: number): void;
  bpfCgroupAttach(progFd: number, cgroupPath: string, attachType: number, progName: string): 'present' | 'replaced' | 'attached';
  bpfCgroupDetach(cgroupPath: string, attachType: number, progName: string): number;
  bpfCgroupQuery(cgroupPath: string, attachType: number): { id: number; name: string }[];
  bpfTracingAttach(handle: number, progName: string, linkPinPath: string, force: boolean): 'present' | 'replaced' | 'attached';
  bpfMapUpdate(fd: number, key: Buffer, value: Buffer, flags: number): void;
  bpfMapLookup(fd: number, key: Buffer, valueSize: number): Buffer | null;
  bpfMapDelete(fd: number, key: Buffer): boolean;
  bpfMapNextKey(fd: number, key: Buffer | null, keySize: number): Buffer | null;
}

function addon(): BpfAddon {
  return loadAddon() as unknown as BpfAddon;
}

/**
 * Mounts a bpffs at `dir` (mode 0700) unless one is mounted there already, creating the
 * directory. The mount is the instance's own (under its root), never /sys/fs/bpf, so
 * instances never see each other's pins. Safe to call twice.
 * @throws Error from mount(2) (e.g. EPERM without CAP_SYS_ADMIN).
 */
export function ensureBpffs(dir: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  if (statfsSync(dir).type === BPF_FS_MAGIC) return;
  const a = loadAddon();
  a.mount('bpf', dir, 'bpf', a.constants.MS_NOSUID | a.constants.MS_NODEV | a.constants.MS_NOEXEC, 'mode=0700');
}

/** A map of a loaded object. Keys and values are raw little-endian structs as the program declares them. */
export class BpfMap {
  constructor(readonly info: BpfMapInfo) {}

  get keySize(): number {
    return this.info.keySize;
  }

  get valueSize(): number {
    return this.info.valueSize;
  }

  /**
   * Writes `key` -> `value`.
   * @throws Error E2BIG (map full), EEXIST/ENOENT (with noexist/exist), EINVAL (wrong sizes).
   */
  update(key: Buffer, value: Buffer, flags: keyof typeof UPDATE_FLAGS = 'any'): void {
    this.check(key, this.keySize, 'key');
    this.check(value, this.valueSize, 'value');
    addon().bpfMapUpdate(this.info.fd, key, value, UPDATE_FLAGS[flags]);
  }

  /** The value at `key`, or null when there is none. */
  lookup(key: Buffer): Buffer | null {
    this.check(key, this.keySize, 'key');
    return addon().bpfMapLookup(this.info.fd, key, this.valueSize);
  }

  /** Removes `key`; false when it was not there. */
  delete(key: Buffer): boolean {
    this.check(key, this.keySize, 'key');
    return addon().bpfMapDelete(this.info.fd, key);
  }

  /**
   * Every key, in the kernel's iteration order. For a map that changes meanwhile the
   * kernel restarts from the first key when the previous one is gone, so a key may be
   * reported twice; callers dedupe when that matters.
   */
  keys(): Buffer[] {
    const out: Buffer[] = [];
    const a = addon();
    let k: Buffer | null = null;
    // Bounded by max_entries plus slack for concurrent inserts, so a map churning under us cannot loop forever.
    for (let i = 0; i < this.info.maxEntries * 2 + 16; i++) {
      k = a.bpfMapNextKey(this.info.fd, k, this.keySize);
      if (!k) break;
      out.push(k);
    }
    return out;
  }

  private check(b: Buffer, size: number, what: string): void {
    if (b.length !== size) throw internal(`bpf map ${this.info.name}: ${what} is ${b.length} bytes, the map's ${what} size is ${size}`);
  }
}

/** Options of {@link BpfObject.load}. */
export interface BpfLoadOptions {
  /** Path of the `.bpf.o` file. */
  objectPath: string;
  /** bpffs directory where maps with LIBBPF_PIN_BY_NAME are pinned (and links, see attachTracing). */
  pinDir: string;
  /** max_entries overrides by map name (e.g. from config). */
  maxEntries?: Record<string, number>;
  /**
   * When a pinned map from an earlier load does not match the object's definition (a new
   * dsec version changed it), remove every pin in `pinDir` and load again with empty
   * maps; default false (the load fails with the libbpf message).
   */
  replaceIncompatiblePins?: boolean;
}

/** A loaded BPF object: its programs and maps by name. */
export class BpfObject {
  private closed = false;
  private readonly programs: Map<string, BpfProgramInfo>;
  private readonly maps: Map<string, BpfMap>;

  private constructor(private readonly handle: number, progs: BpfProgramInfo[], maps: BpfMapInfo[], readonly pinDir: string, readonly objectPath: string) {
    this.programs = new Map(progs.map((p) => [p.name, p]));
    this.maps = new Map(maps.map((m) => [m.name, new BpfMap(m)]));
  }

  /**
   * Opens and loads an object (the verifier runs here).
   * @throws DsecError FailedPrecondition when the object file is missing (not built);
   *   Error (errno code) with libbpf's log tail when the kernel refuses it.
   */
  static load(opts: BpfLoadOptions): BpfObject {
    if (!existsSync(opts.objectPath)) throw failedPrecondition(`BPF object ${opts.objectPath} is not built; run \`make -C native\``);
    mkdirSync(opts.pinDir, { recursive: true, mode: 0o700 });
    const a = addon();
    let r;
    try {
      r = a.bpfObjectOpen(opts.objectPath, opts.pinDir, opts.maxEntries ?? {});
    } catch (e) {
      if (!opts.replaceIncompatiblePins || !/reuse|pinned|incompatible|mismatch/i.test((e as Error).message)) throw e;
      for (const f of readdirSync(opts.pinDir)) rmSync(path.join(opts.pinDir, f), { force: true });
      r = a.bpfObjectOpen(opts.objectPath, opts.pinDir, opts.maxEntries ?? {});
    }
    return new BpfObject(r.handle, r.programs, r.maps, opts.pinDir, opts.objectPath);
  }

  /** Names of the object's programs. */
  programNames(): string[] {
    return [...this.programs.keys()];
  }

  private program(name: string): BpfProgramInfo {
    const p = this.programs.get(name);
    if (!p) throw internal(`BPF object ${this.objectPath} has no program ${name}`);
    return p;
  }

  /**
   * Attaches program `prog` to the cgroup2 directory `cgroupPath` with its own attach
   * type. An older program of the same name attached there (an earlier dsecd's load) is
   * replaced atomically; the same program is left as is. Safe to call twice.
   * @returns what happened: `attached`, `replaced` or `present`.
   * @throws Error ENOENT (no such cgroup), EPERM.
   */
  attachCgroup(prog: string, cgroupPath: string): 'attached' | 'replaced' | 'present' {
    const p = this.program(prog);
    return addon().bpfCgroupAttach(p.fd, cgroupPath, p.attachType, prog);
  }

  /** Detaches every program named `prog` (any load of it) from `cgroupPath`; returns how many. Safe when none is attached. */
  detachCgroup(prog: string, cgroupPath: string): number {
    const p = this.program(prog);
    return addon().bpfCgroupDetach(cgroupPath, p.attachType, prog);
  }

  /** Programs attached to `cgroupPath` for the attach type of `prog` (ids and kernel-truncated names). */
  attachedTo(prog: string, cgroupPath: string): { id: number; name: string }[] {
    return addon().bpfCgroupQuery(cgroupPath, this.program(prog).attachType);
  }

  /**
   * Attaches a tracing program (fentry/fexit) and pins its link at `<pinDir>/<prog>.link`,
   * so it stays attached while dsecd restarts. A pinned link to identical code is kept
   * (`present`) unless `force`.
   * @throws Error ESRCH/ENOENT when the traced kernel function does not exist (inlined or renamed),
   *   ENOTSUPP when the kernel lacks BPF trampolines.
   */
  attachTracing(prog: string, opts: { force?: boolean } = {}): 'attached' | 'replaced' | 'present' {
    this.program(prog);
    return addon().bpfTracingAttach(this.handle, prog, path.join(this.pinDir, `${prog}.link`), !!opts.force);
  }

  /** Removes the pinned link of a tracing program (the kernel detaches it when unused). Safe when absent. */
  detachTracing(prog: string): void {
    rmSync(path.join(this.pinDir, `${prog}.link`), { force: true });
  }

  /**
   * The map `name`.
   * @throws DsecError Internal when the object has no such map.
   */
  map(name: string): BpfMap {
    const m = this.maps.get(name);
    if (!m) throw internal(`BPF object ${this.objectPath} has no map ${name}`);
    return m;
  }

  /** Unloads the object from this process (attachments and pins stay). Safe to call twice. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    addon().bpfObjectClose(this.handle);
  }
}

/** Directory of the built BPF objects (native/bpf/build), relative to the repository root. */
export const BPF_BUILD_RELATIVE = 'native/bpf/build';
