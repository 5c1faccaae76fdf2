/**
 * The attack suite against the microvm tier (real QEMU `-M microvm`, TCG here): the attacks
 * of test/attacks/*.test.ts that apply to a VM, run as root inside the guest.
 *
 * Policy (docs/SECURITY.md "The microvm tier"): two boundaries. Inside the guest, every
 * command is confined like a container sandbox's process (the guest agent applies it at
 * boot, before any command runs): the image's system paths are read-only mounts
 * (readonly_paths; writable_paths stay writable), the capability sets are Docker's
 * default, no_new_privs is set, the seccomp profile's denials answer EPERM, and Landlock
 * restricts writes where the guest kernel has it. The agent itself stays guest root with
 * every capability. Below that, the guest kernel is the boundary: nothing a command does
 * reaches the host: the image's layers (shared by every VM as read-only persistent
 * memory) stay byte for byte what they were, no host file, socket, process or address is
 * reachable, the VM's memory, disk and threads stay within what its cgroup and disk file
 * allow, QEMU stays confined, and a neighbouring microVM keeps working after each attack.
 *
 * Each containment is shown to depend on its limit where a limit is what stops it (a
 * larger disk takes more), so the assertions can fail. No wall-clock bounds: TCG is slow
 * and the host is shared.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { GUEST_KERNEL, IS_ROOT, REPO, TestDaemon } from '../integration/harness.js';

const HAS_QEMU = existsSync('/usr/bin/qemu-system-x86_64');
const HAS_KERNEL = existsSync(GUEST_KERNEL);
const MiB = 1024 * 1024;

/** sha256 (hex) of a file's bytes. */
function sha256(file: string): string {
  return createHash('sha256').update(readFileSync(file)).digest('hex');
}

/** Mount points of the host's (this process's) mount table. */
function hostMounts(): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')[4]).filter(Boolean);
}

describe.skipIf(!IS_ROOT || !HAS_QEMU || !HAS_KERNEL)('attacks against a microvm sandbox', () => {
  let d: TestDaemon;
  let neighbour: string;
  let attacker: string;
  let sentinelDir: string;

  /** Runs `script` with sh in sandbox `id`; stdout+stderr and the exit code. */
  async function sh(id: string, script: string, timeoutMs = 120_000): Promise<{ out: string; rc: number | null; err: string; signal: unknown }> {
    const r = await d.client.exec(id, { argv: ['sh', '-c', `{ ${script}\n} 2>&1`], timeoutMs });
    return { out: r.stdout.toString(), rc: r.exit_code, err: r.stderr.toString(), signal: (r as { signal?: unknown }).signal ?? null };
  }

  /** The neighbour microVM still runs commands (asserted after every attack). */
  async function neighbourAlive(): Promise<void> {
    expect((await sh(neighbour, 'echo alive; cat /root/neighbour-mark')).out).toBe('alive\nmine\n');
  }

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 93, config: '[vm]\naccel = "tcg"\n' });
    neighbour = (await d.client.createSandbox({ image: 'busybox', backend: 'microvm', memory_bytes: 192 * MiB })).id;
    await sh(neighbour, 'echo mine > /root/neighbour-mark');
    attacker = (await d.client.createSandbox({ image: 'busybox', backend: 'microvm', memory_bytes: 192 * MiB })).id;
    sentinelDir = mkdtempSync('/tmp/dsec-microvm-attack-');
    writeFileSync(path.join(sentinelDir, 'secret'), 'host secret\n');
  }, 600_000);
  afterAll(async () => {
    await d?.cleanup();
    if (sentinelDir) rmSync(sentinelDir, { recursive: true, force: true });
  });

  it('the layers are shared read-only persistent memory: /bin/busybox cannot be replaced (read-only in the guest); writing /dev/pmem0 changes nothing on the host', async () => {
    const pmemDir = path.join(d.root, 'vm', 'pmem');
    const copies = readdirSync(pmemDir).filter((f) => f.endsWith('.img')).map((f) => path.join(pmemDir, f));
    expect(copies.length).toBeGreaterThan(0);
    const before = new Map(copies.map((f) => [f, sha256(f)]));
    const neighbourSum = (await sh(neighbour, 'sha256sum /bin/busybox')).out;
    const blobs = (await d.client.listImages()).find((im) => im.ref.startsWith('busybox'))!.layers;
    // The layer copy is the blob padded to 2 MiB and mode 0644, shared by both VMs: one file per digest, not per VM.
    expect(copies.length).toBe(blobs.length);
    for (const f of copies) expect(statSync(f).size % (2 * MiB)).toBe(0);
    // Inside: one DAX-capable /dev/pmemN per layer (the guest's /init mounted them erofs `dax=always` under the
    // overlay, then detached the mounts, so /proc/mounts shows only the overlay).
    const inside = await sh(attacker, 'ls -d /sys/block/pmem* | wc -l; cat /sys/block/pmem0/queue/dax; grep -c "^overlay / overlay" /proc/mounts');
    expect(inside.out).toBe(`${blobs.length}\n1\n1\n`);

    // Guest root tries to replace the shell, mount the layer rw, and writes the raw device.
    const r = await sh(attacker, [
      // The running busybox cannot be written in place (ETXTBSY): move it aside and put a changed copy at its path.
      'mv /bin/busybox /bin/busybox.old && cat /bin/busybox.old > /bin/busybox && echo evil >> /bin/busybox && chmod 755 /bin/busybox; echo replace=$?',
      'mkdir -p /tmp/l && mount -t erofs /dev/pmem0 /tmp/l && echo pwned > /tmp/l/pwned; echo lowerwrite=$?',
      'dd if=/dev/zero of=/dev/pmem0 bs=4096 count=16 conv=notrunc 2>/dev/null; echo dd=$?',
      'sync; dd if=/dev/pmem0 bs=4096 count=1 iflag=direct 2>/dev/null | md5sum',
      'sync',
    ].join('; '));
    // /bin is a read-only mount in the guest (readonly_paths): even guest root cannot move or replace it.
    expect(r.out).toMatch(/replace=[1-9]/);
    expect(r.out).toMatch(/Read-only file system/);
    // mount is denied (no CAP_SYS_ADMIN, seccomp), and EROFS has no write support anyway.
    expect(r.out).toMatch(/lowerwrite=[1-9]/);
    // Whether or not the raw write "succeeds" in the guest, the range is ROM to it: the first block reads back as the layer's.
    expect(r.out).toMatch(/dd=\d/);
    const first = createHash('md5').update(readFileSync(copies.find((f) => f.includes(blobs[0].replace(/^sha256:/, '')))!).subarray(0, 4096)).digest('hex');
    expect(r.out).toContain(`${first}  -`);
    // The host's layer copies are byte for byte what they were.
    for (const f of copies) expect(sha256(f)).toBe(before.get(f));
    // Both guests, mapping the same pages, still have the real busybox.
    expect((await sh(attacker, 'sha256sum /bin/busybox')).out).toBe(neighbourSum);
    expect((await sh(neighbour, 'sha256sum /bin/busybox')).out).toBe(neighbourSum);
    await neighbourAlive();
  }, 900_000);

  it('host files, logs, the dsecd socket and host processes are absent from the guest (its own kernel and root)', async () => {
    const sock = path.join(d.root, 'dsecd.sock');
    expect(existsSync(sock)).toBe(true);
    const r = await sh(attacker, [
      `cat ${sentinelDir}/secret; echo secret=$?`,
      `ls ${d.root}; echo root=$?`,
      `ls -la ${sock}; echo sock=$?`,
      'ls /var/log/syslog /var/log/journal /proc/1/root/etc/hostname.host 2>/dev/null | wc -l',
      'ps -o pid,comm | grep -cE "dsecd|qemu|systemd|node"',
      'cat /proc/1/cmdline | tr "\\0" " "; echo',
      'uname -r',
    ].join('; '));
    expect(r.out).toMatch(/secret=1/);
    expect(r.out).not.toContain('host secret');
    expect(r.out).toMatch(/root=1/);
    expect(r.out).toMatch(/sock=1/);
    const lines = r.out.trim().split('\n');
    expect(lines.at(-4)).toBe('0');
    expect(lines.at(-3)).toBe('0');
    expect(lines.at(-2)).toMatch(/dsec-agent --vmux/); // guest pid 1 is the agent, not the host's init
    expect(lines.at(-1)).not.toBe(os.release());
    await neighbourAlive();
  });

  it('guest root can neither mount nor set sysctls: the host\'s mount table and sysctls are unchanged, QEMU stays confined', async () => {
    const mountsBefore = hostMounts();
    const overcommit = readFileSync('/proc/sys/vm/overcommit_memory', 'utf8');
    const swappiness = readFileSync('/proc/sys/vm/swappiness', 'utf8');
    const r = await sh(attacker, [
      'mkdir -p /tmp/x && mount -t tmpfs t /tmp/x; echo mount=$?',
      'mount -t proc p /tmp/x 2>/dev/null; echo proc=$?',
      `v=$(cat /proc/sys/vm/overcommit_memory); echo $(( (v + 1) % 3 )) > /proc/sys/vm/overcommit_memory; echo sysctl=$?`,
      'echo 7 > /proc/sys/vm/swappiness; echo swap=$?',
    ].join('; '));
    // Confined like a container: no CAP_SYS_ADMIN, mount denied by seccomp, /proc/sys a read-only mount.
    expect(r.out).toMatch(/mount=[1-9]/);
    expect(r.out).toMatch(/proc=[1-9]/);
    expect(r.out).toMatch(/sysctl=[1-9]/);
    expect(r.out).toMatch(/swap=[1-9]/);
    expect(readFileSync('/proc/sys/vm/overcommit_memory', 'utf8')).toBe(overcommit);
    expect(readFileSync('/proc/sys/vm/swappiness', 'utf8')).toBe(swappiness);
    const after = hostMounts();
    expect(after.filter((m) => m.startsWith('/tmp/x'))).toEqual([]);
    expect(after.filter((m) => !mountsBefore.includes(m) && m.startsWith('/mnt'))).toEqual([]);
    // The VMM: its own mount namespace, an unprivileged uid, seccomp filters, as the kernel reports them.
    const got = await d.client.getSandbox(attacker);
    expect(got.defences).toMatchObject({ vmm_mount_namespace: { enforced: true }, vmm_unprivileged: { enforced: true }, vmm_seccomp: { enforced: true } });
    const status = readFileSync(`/proc/${got.init_pid}/status`, 'utf8');
    expect(/^Uid:\s+(\d+)/m.exec(status)![1]).not.toBe('0');
    expect(/^CapEff:\s+(\S+)/m.exec(status)![1]).toBe('0000000000000000');
    // What QEMU can see: only its runtime, boot files and layer copies, and its own dir (no other sandbox, no dsecd socket).
    const root = `/proc/${got.init_pid}/root`;
    expect(existsSync(`${root}${path.join(d.root, 'sandboxes', neighbour)}`)).toBe(false);
    expect(existsSync(`${root}${path.join(d.root, 'dsecd.sock')}`)).toBe(false);
    expect(existsSync(`${root}${path.join(sentinelDir, 'secret')}`)).toBe(false);
    await neighbourAlive();
  });

  it('network mode none: the guest has no NIC, so no host or outside address is reachable', async () => {
    const hits: string[] = [];
    const srv = net.createServer((s) => { hits.push('connected'); s.destroy(); });
    await new Promise<void>((r) => srv.listen(0, '0.0.0.0', r));
    const port = (srv.address() as net.AddressInfo).port;
    try {
      // Every host address a guest could aim at: loopback (the guest's own), the host's own addresses, QEMU's user-net gateway.
      const targets = ['127.0.0.1', '10.0.2.2', ...Object.values(os.networkInterfaces()).flat().filter((a) => a && a.family === 'IPv4').map((a) => a!.address)];
      const r = await sh(attacker, [
        'ls /sys/class/net',
        ...[...new Set(targets)].map((t) => `timeout 10 nc ${t} ${port} </dev/null; echo "${t}=$?"`),
      ].join('; '));
      expect(r.out.split('\n')[0]).toBe('lo');
      for (const t of new Set(targets)) expect(r.out).toMatch(new RegExp(`${t.replace(/\./g, '\\.')}=[1-9]`));
      expect(hits).toEqual([]);
    } finally {
      srv.close();
    }
    await neighbourAlive();
  });

  it('system paths are read-only in the guest: overwriting /bin/sh and /etc/passwd fails, a later command runs the real /bin/sh', async () => {
    const r = await sh(attacker, [
      'printf "#!/bin/busybox sh\\necho HIJACKED\\n" > /tmp/evil && chmod 755 /tmp/evil; echo evil=$?',
      'cp /tmp/evil /bin/sh; echo cp=$?',
      'rm -f /bin/sh; echo rm=$?',
      'mv /tmp/evil /bin/sh; echo mv=$?',
      'echo "evil::0:0::/:/bin/sh" >> /etc/passwd; echo passwd=$?',
      'touch /usr/bin/x; echo usr=$?',
      'mkdir /newtop; echo top=$?',
      'echo mine > /root/x && cat /root/x; echo root=$?',
      'grep -c evil /etc/passwd',
    ].join('; '));
    expect(r.out).toMatch(/evil=0/);
    for (const k of ['cp', 'rm', 'mv', 'passwd', 'usr', 'top']) expect(r.out).toMatch(new RegExp(`${k}=[1-9]`));
    expect(r.out).toMatch(/Read-only file system/);
    expect(r.out).toMatch(/mine\nroot=0/); // /root: a writable top-level directory
    expect(r.out.trim().split('\n').at(-1)).toBe('0');
    // A later "grader" command gets the image's shell.
    const later = await d.client.exec(attacker, { argv: ['/bin/sh', '-c', 'echo real-shell'] });
    expect(later.stdout.toString()).toBe('real-shell\n');
    const got = await d.client.getSandbox(attacker);
    expect(got.defences).toMatchObject({ readonly_paths: { enforced: true }, capabilities: { enforced: true }, no_new_privileges: { enforced: true }, seccomp: { enforced: true } });
    expect(got.defences!.readonly_paths.detail).toMatch(/read-write binds: .*\/root/);
    await neighbourAlive();
  });

  it('guest commands run with Docker\'s default capabilities, no_new_privs and the seccomp profile: mount, unshare, bpf, io_uring fail with EPERM', async () => {
    const tmp = mkdtempSync(path.join(os.tmpdir(), 'dsec-microvm-probe-'));
    try {
      await execa('gcc', ['-static', '-O1', '-o', path.join(tmp, 'probe'), path.join(REPO, 'test/attacks/seccomp-probe.c')]);
      const probe = readFileSync(path.join(tmp, 'probe'));
      const probes = ['mount', 'umount2', 'bpf', 'unshare_user', 'clone_user', 'setns', 'io_uring_setup', 'userfaultfd', 'keyctl', 'perf_event_open', 'ptrace', 'TIOCSTI', 'init_module', 'kexec_load'];
      const r = await d.client.exec(attacker, {
        argv: ['sh', '-c', [
          'cat > /tmp/probe && chmod +x /tmp/probe || exit 99',
          `for n in ${probes.join(' ')} getpid clone3; do /tmp/probe $n; done`,
          'grep -E "^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs|Seccomp):" /proc/self/status',
          'unshare -m true; echo unshare_m=$?',
          'unshare -U true; echo unshare_u=$?',
          'mknod /tmp/sda b 8 0; echo mknod=$?',
          // The guest agent (pid 1, every capability, non-dumpable) is out of reach without CAP_SYS_PTRACE.
          'cat /proc/1/environ >/dev/null; echo environ=$?',
          'readlink /proc/1/fd/0; echo agentfd=$?',
        ].join('\n')],
        stdin: probe,
      });
      const out = r.stdout.toString() + r.stderr.toString();
      const lines = new Map(out.split('\n').map((l) => l.split(/\s+/)).filter((p) => p.length >= 2).map((p) => [p[0], p[1]]));
      expect(probes.filter((n) => lines.get(n) !== 'EPERM').map((n) => `${n}=${lines.get(n)}`), out).toEqual([]);
      expect(lines.get('getpid')).toBe('ok');
      expect(lines.get('clone3')).toBe('ENOSYS');
      // Docker's default set (CAP_CHOWN ... CAP_SETFCAP, without CAP_SYS_ADMIN and the rest): a80425fb.
      for (const k of ['CapEff:', 'CapPrm:', 'CapBnd:']) expect(lines.get(k), out).toBe('00000000a80425fb');
      expect(lines.get('CapAmb:')).toBe('0000000000000000');
      expect(lines.get('NoNewPrivs:')).toBe('1');
      expect(lines.get('Seccomp:')).toBe('2');
      expect(out).toMatch(/unshare_m=[1-9]/);
      expect(out).toMatch(/unshare_u=[1-9]/);
      expect(out).toMatch(/mknod=0/); // CAP_MKNOD is in Docker's set, as in a container
      expect(out).toMatch(/environ=[1-9]/);
      expect(out).toMatch(/agentfd=[1-9]/);
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
    await neighbourAlive();
  }, 300_000);

  it('writable_paths are writable in the guest, below a read-only path too; Landlock applies where the guest kernel has it', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', backend: 'microvm', memory_bytes: 160 * MiB, filesystem: { writable_paths: ['/work', '/usr/local'] } });
    try {
      const r = await sh(sb.id, [
        'echo w > /work/f && cat /work/f; echo work=$?',
        'mkdir -p /usr/local/bin && echo l > /usr/local/bin/t; echo local=$?',
        'echo u > /usr/bin/t; echo usr=$?',
        'touch /dev/evil; echo devnode=$?',
        // The guest kernel's Landlock ABI, asked independently of dsec's record (the agent binary's probe mode).
        '/dev/.dsec-agent --landlock-abi; echo',
      ].join('; '));
      expect(r.out).toMatch(/w\nwork=0/);
      expect(r.out).toMatch(/local=0/);
      expect(r.out).toMatch(/usr=[1-9]/);
      const got = await d.client.getSandbox(sb.id);
      expect(got.defences!.readonly_paths.detail).toMatch(/\/work/);
      expect(got.defences!.readonly_paths.detail).toMatch(/\/usr\/local/);
      // Landlock: only file writes under /dev, no new entries there (devtmpfs is a writable mount otherwise).
      console.log(`microvm guest landlock: ${got.defences!.landlock.detail}`);
      // Where the guest kernel has Landlock, commands must run under it: the devnode write shows it acts.
      const abi = Number(/\{"abi":(\d+)/.exec(r.out)?.[1] ?? 'NaN');
      expect(abi, r.out).toBeGreaterThanOrEqual(0);
      if (abi > 0) {
        expect(r.out).toMatch(/devnode=[1-9]/);
        expect(got.defences!.landlock.enforced).toBe(true);
      } else {
        expect(got.defences!.landlock).toMatchObject({ enforced: false });
        expect(got.defences!.landlock.detail).toMatch(/no Landlock/);
      }
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
    await neighbourAlive();
  }, 600_000);

  it('network allow and open are refused for a microvm (the guest has only loopback)', async () => {
    for (const mode of ['allow', 'open'] as const) {
      await expect(d.client.createSandbox({ image: 'busybox', backend: 'microvm', network: { mode } })).rejects.toThrow(/no network yet.*mode none/);
      // Nor can a running microVM be switched to it (the update path of the same check).
      await expect(d.client.setNetwork(attacker, { mode })).rejects.toThrow(/no network yet.*mode none/);
    }
    expect((await d.client.getSandbox(attacker)).network ?? null).toBeNull();
  });

  it('a memory bomb and a fork bomb stay inside the guest: QEMU keeps within its cgroup, the neighbour keeps working, a restart recovers the guest', async () => {
    const limit = (await d.client.sandboxStats(attacker)).memory_limit_bytes!;
    // Memory bomb: `tail -c N` holds N bytes; 400 MB in a 192 MiB guest. The guest's OOM killer ends it; the guest lives on.
    const mem = await sh(attacker, 'head -c 400000000 /dev/zero | tail -c 399999999 >/dev/null; echo survived $?', 300_000);
    expect(mem.out).not.toMatch(/survived 0/);
    let st = await d.client.sandboxStats(attacker);
    expect(st.memory_bytes!).toBeLessThanOrEqual(limit);
    expect(st.oom_kills).toBe(0); // the guest's OOM killer acted; QEMU was never killed by the host
    expect((await sh(attacker, 'echo guest-ok')).out).toBe('guest-ok\n');
    await neighbourAlive();

    // Fork bomb (busybox sh; each process forks two more and sleeps): the guest kernel has no pids limit, so it fills
    // the guest's pid space and memory; the exec's timeout kills its process group, but processes forked meanwhile go
    // on. That wedges the guest, which is the guest's own business: the host sees only QEMU's threads.
    await d.client.exec(attacker, { argv: ['sh', '-c', '(b() { b & b & sleep 6; }; b) >/dev/null 2>&1'], timeoutMs: 60_000 }).catch(() => null);
    st = await d.client.sandboxStats(attacker);
    expect(st.pids!).toBeLessThanOrEqual(256); // host tasks: QEMU's threads only (the cgroup's pids limit is 256)
    expect(st.memory_bytes!).toBeLessThanOrEqual(limit);
    expect(st.oom_kills).toBe(0);
    await neighbourAlive();
    // Stop (SIGTERM to every guest process, then QEMU quits) and start: a fresh guest on the same disk answers.
    await d.client.stopSandbox(attacker, { timeoutMs: 10_000 });
    await d.client.startSandbox(attacker);
    expect((await sh(attacker, 'echo guest-ok')).out).toBe('guest-ok\n');
    await neighbourAlive();
  }, 900_000);

  it('disk fill stops at the writable disk\'s size; the host file never grows past it; a larger disk takes more', async () => {
    const fill = async (diskMiB: number) => {
      const sb = await d.client.createSandbox({ image: 'busybox', backend: 'microvm', memory_bytes: 160 * MiB, disk_bytes: diskMiB * MiB });
      // Random bytes: zeros would be punched out by detect-zeroes and never take host disk.
      const r = await sh(sb.id, 'dd if=/dev/urandom of=/root/fill bs=1M count=300; echo rc=$?; sync; stat -c %s /root/fill', 600_000);
      const file = path.join(d.root, 'sandboxes', sb.id, 'disk.raw');
      const st = statSync(file);
      const out = { out: r.out, size: Number(r.out.trim().split('\n').pop()), apparent: st.size, allocated: st.blocks * 512 };
      await d.client.deleteSandbox(sb.id, { force: true });
      return out;
    };
    const small = await fill(96);
    expect(small.out).toMatch(/No space left on device/);
    expect(small.out).toMatch(/rc=[1-9]/);
    expect(small.size).toBeLessThan(96 * MiB);
    expect(small.apparent).toBe(96 * MiB);
    expect(small.allocated).toBeLessThanOrEqual(96 * MiB);
    // The disk size is what stopped it: a 192 MiB disk takes more than the small one could hold.
    const big = await fill(192);
    expect(big.size).toBeGreaterThan(small.size + 64 * MiB);
    await neighbourAlive();
  }, 900_000);

  it('[vm] pmem = false: the layers are read-only virtio-blk disks; raw writes to them fail and the host blob stays as it was', async () => {
    const b = await TestDaemon.start({ slot: 94, config: '[vm]\naccel = "tcg"\npmem = false\n' });
    try {
      const sb = await b.client.createSandbox({ image: 'busybox', backend: 'microvm', memory_bytes: 160 * MiB });
      const layers = (await b.client.listImages()).find((im) => im.ref.startsWith('busybox'))!.layers;
      const blob = path.join(b.root, 'images', 'blobs', 'sha256', layers[0].replace(/^sha256:/, ''));
      const before = sha256(blob);
      const r = await b.client.exec(sb.id, { argv: ['sh', '-c', '{ ls /sys/block | grep -c pmem; for d in /sys/block/vd*; do [ "$(cat $d/serial)" = l0 ] && dev=/dev/${d##*/}; done; dd if=/dev/zero of=$dev bs=4096 count=16 conv=notrunc,fsync; echo dd=$?; } 2>&1'] });
      const out = r.stdout.toString();
      expect(out.split('\n')[0]).toBe('0'); // no pmem here
      expect(out).toMatch(/dd=[1-9]/);
      expect(out).toMatch(/Operation not permitted|Read-only file system|I\/O error/);
      expect(sha256(blob)).toBe(before);
      expect(existsSync(path.join(b.root, 'vm', 'pmem'))).toBe(false); // no aligned copies made
    } finally {
      await b.cleanup();
    }
    await neighbourAlive();
  }, 900_000);
});
