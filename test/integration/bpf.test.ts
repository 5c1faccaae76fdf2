/**
 * daemon/host/bpf.ts on the real kernel: an instance bpffs, loading an object, attaching a
 * cgroup program that really refuses a connect from a process in that cgroup, replacing
 * an earlier load's attachment instead of stacking a second copy, map access, and pinned
 * maps that keep their contents across a reload (what lets dsecd restart without
 * losing policy or counters).
 *
 * The fixture program (test/fixtures/bpf/deny-port.bpf.c) refuses one port and counts
 * refusals by cgroup id. The cgroup is a `dsec-test-<random>` dir in the cgroup2
 * hierarchy, removed at the end.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, rmdirSync, statSync, statfsSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import path from 'node:path';
import { execa } from 'execa';
import { IS_ROOT, REPO } from './harness.js';
import { BpfObject, ensureBpffs, BPF_FS_MAGIC } from '../../daemon/host/bpf.js';

/** The cgroup2 mount: the hybrid `unified` one here, /sys/fs/cgroup on pure v2 hosts. */
function cgroup2Root(): string {
  for (const l of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const f = l.split(' ');
    const sep = f.indexOf('-');
    if (sep > 0 && f[sep + 1] === 'cgroup2') return f[4];
  }
  throw new Error('no cgroup2 mount');
}

/** This process's own cgroup2 dir, so the test cgroup sits next to (not above) anything it owns. */
function ownCgroup2(): string {
  const line = readFileSync('/proc/self/cgroup', 'utf8').split('\n').find((l) => l.startsWith('0::'))!;
  return path.join(cgroup2Root(), line.slice(3));
}

describe.skipIf(!IS_ROOT)('BPF objects, cgroup attachment and pinned maps', () => {
  let work: string;
  let obj: string;
  let pins: string;
  let cg: string;
  let server: net.Server;
  let port: number;

  beforeAll(async () => {
    work = mkdtempSync('/tmp/dsec-bpf-');
    obj = path.join(work, 'deny-port.bpf.o');
    await execa('clang', ['-O2', '-g', '-target', 'bpf', '-I/usr/include/x86_64-linux-gnu', '-c', path.join(REPO, 'test/fixtures/bpf/deny-port.bpf.c'), '-o', obj]);
    pins = path.join(work, 'bpf');
    cg = path.join(ownCgroup2(), `dsec-test-${randomBytes(4).toString('hex')}`);
    mkdirSync(cg);
    server = net.createServer((c) => c.end('hi\n'));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    port = (server.address() as net.AddressInfo).port;
  });

  afterAll(async () => {
    server?.close();
    if (cg) rmdirSync(cg);
    await execa('umount', [pins], { reject: false });
    rmSync(work, { recursive: true, force: true });
  });

  /** Runs python3's connect to the test server from a process that first moves itself into `cg`; resolves with its output. */
  async function connectFromCgroup(): Promise<string> {
    const py = `import socket\ns=socket.socket()\ntry:\n  s.connect(("127.0.0.1", ${port})); print("connected", s.recv(3).decode().strip())\nexcept OSError as e:\n  print("errno", e.errno)`;
    const r = await execa('sh', ['-c', `echo $$ > ${cg}/cgroup.procs && exec python3 -c '${py}'`]);
    return r.stdout.trim();
  }

  it('mounts a bpffs of its own, once', () => {
    ensureBpffs(pins);
    ensureBpffs(pins);
    expect(statfsSync(pins).type).toBe(BPF_FS_MAGIC);
    const mounts = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.split(' ')[4] === pins);
    expect(mounts).toHaveLength(1);
  });

  it('a connect4 program refuses only the configured port, counted by cgroup id; a reload replaces it in place', async () => {
    const a = BpfObject.load({ objectPath: obj, pinDir: path.join(pins, 'deny') });
    expect(await connectFromCgroup()).toBe('connected hi');
    expect(a.attachCgroup('deny_port', cg)).toBe('attached');
    expect(a.attachCgroup('deny_port', cg)).toBe('present');
    // Nothing denied yet: the port map is zero.
    expect(await connectFromCgroup()).toBe('connected hi');
    const portKey = Buffer.alloc(4);
    const portVal = Buffer.alloc(4);
    portVal.writeUInt16BE(port, 0); // user_port is in network byte order in the low 16 bits
    a.map('denied').update(portKey, portVal);
    expect(await connectFromCgroup()).toBe('errno 1'); // EPERM
    const cgid = Buffer.alloc(8);
    cgid.writeBigUInt64LE(BigInt(statSync(cg).ino));
    expect(a.map('refusals').lookup(cgid)?.readBigUInt64LE()).toBe(1n);
    expect(a.map('refusals').keys().map((k) => k.toString('hex'))).toEqual([cgid.toString('hex')]);
    a.close();

    // A second load (as after a dsecd restart) reuses the pinned maps: the port is still
    // denied and the count goes on; attaching replaces the old program, so one copy runs.
    const b = BpfObject.load({ objectPath: obj, pinDir: path.join(pins, 'deny') });
    expect(b.map('denied').lookup(portKey)?.equals(portVal)).toBe(true);
    expect(b.attachCgroup('deny_port', cg)).toBe('replaced');
    expect(b.attachedTo('deny_port', cg)).toHaveLength(1);
    expect(await connectFromCgroup()).toBe('errno 1');
    expect(b.map('refusals').lookup(cgid)?.readBigUInt64LE()).toBe(2n);

    // Map edits take effect at once; detach removes enforcement.
    expect(b.map('refusals').delete(cgid)).toBe(true);
    expect(b.map('refusals').delete(cgid)).toBe(false);
    b.map('denied').update(portKey, Buffer.alloc(4));
    expect(await connectFromCgroup()).toBe('connected hi');
    b.map('denied').update(portKey, portVal);
    expect(b.detachCgroup('deny_port', cg)).toBe(1);
    expect(b.attachedTo('deny_port', cg)).toEqual([]);
    expect(await connectFromCgroup()).toBe('connected hi');
    b.close();
    b.close();
  });

  it('refuses bad input clearly', () => {
    expect(() => BpfObject.load({ objectPath: path.join(work, 'missing.o'), pinDir: path.join(pins, 'x') })).toThrow(/not built/);
    const b = BpfObject.load({ objectPath: obj, pinDir: path.join(pins, 'deny') });
    try {
      expect(() => b.map('nope')).toThrow(/no map nope/);
      expect(() => b.map('denied').update(Buffer.alloc(3), Buffer.alloc(4))).toThrow(/key is 3 bytes/);
      expect(() => b.attachCgroup('deny_port', path.join(cg, 'missing'))).toThrow(/ENOENT|no such file/i);
    } finally {
      b.close();
    }
  });
});
