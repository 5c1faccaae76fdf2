/** Dumps what a crun sandbox and a runc sandbox show from inside, to /tmp/crun-attack/out-{crun,runc}.txt. */
import { writeFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, it } from 'vitest';
import { IS_ROOT, TestDaemon } from '../integration/harness.js';

const SCRIPT = `
echo ==status; grep -E 'Cap|Seccomp|NoNewPrivs|Speculation|Cpus_allowed_list|Mems_allowed_list|Umask' /proc/self/status
echo ==cgroup; cat /proc/self/cgroup; echo ==init-cgroup; cat /proc/1/cgroup
echo ==oom; cat /proc/self/oom_score_adj /proc/1/oom_score_adj
echo ==limits; cat /proc/1/limits
echo ==mountinfo; cat /proc/self/mountinfo | cut -d' ' -f3-
echo ==dev; ls -la /dev /dev/pts /dev/shm /dev/mqueue
echo ==devopen; for d in /dev/core /dev/kmsg /dev/mem /dev/full /dev/zero /dev/tty /dev/console /dev/ptmx /dev/net/tun /dev/null /dev/random; do (head -c1 $d >/dev/null 2>/tmp/e && echo $d READ) || echo $d no $(cat /tmp/e); done
echo ==mask; for f in /proc/kcore /proc/keys /proc/timer_list /proc/sched_debug /proc/latency_stats /proc/acpi /sys/firmware /proc/scsi /sys/devices/virtual/powercap /sys/devices/virtual/block /proc/timer_stats; do echo "$f: $(ls $f 2>&1 | head -3 | tr '\\n' ' ') $(head -c 50 $f 2>&1 | wc -c)"; done
echo ==sys; ls /sys/fs/cgroup 2>&1; ls /sys/fs 2>&1
echo ==rw; (echo x > /proc/sys/kernel/hostname) 2>&1; (echo h > /proc/sysrq-trigger) 2>&1; (echo 1 > /proc/sys/vm/drop_caches) 2>&1
echo ==attr; cat /proc/self/attr/current 2>&1
echo ==mknod; mknod /tmp/x c 1 11 2>&1; mknod /dev/y c 1 1 2>&1; ls -la /tmp/x /dev/y 2>&1
echo ==env; env | sort
echo ==fds; ls -l /proc/self/fd/ 2>&1 | cut -c 40-; ls /proc/1/fd 2>&1
echo ==ps; ps -o pid,user,group,comm,args
echo ==id; id; umask; ulimit -a
echo ==ns; for n in cgroup ipc mnt net pid pid_for_children time time_for_children user uts; do echo $n $(readlink /proc/self/ns/$n); done
echo ==hostns; echo none
echo ==sched; head -1 /proc/1/sched; cat /proc/1/stat | cut -d' ' -f18-19
echo ==personality; cat /proc/self/personality 2>&1
echo ==sysctl; cat /proc/sys/net/ipv4/ip_forward /proc/sys/kernel/hostname /proc/sys/kernel/domainname
echo ==cwd; pwd; ls -la /
echo ==proc1; cat /proc/1/status | grep -E 'Cap|Seccomp|NoNewPrivs|Uid|Gid|Groups'
`;

describe.skipIf(!IS_ROOT)('probe crun vs runc', () => {
  let c: TestDaemon;
  let r: TestDaemon;
  beforeAll(async () => {
    [c, r] = await Promise.all([
      TestDaemon.start({ slot: 81 }),
      TestDaemon.start({ slot: 82, config: '[runtime]\nname = "runc"\n' }),
    ]);
  }, 120_000);
  afterAll(async () => { await Promise.all([c?.cleanup(), r?.cleanup()]); }, 120_000);
  it('dumps', async () => {
    for (const [name, d] of [['crun', c], ['runc', r]] as const) {
      for (const spec of [{ image: 'busybox' }, { image: 'busybox', network: { mode: 'none' as const } }, { image: 'busybox', priority: 'batch' as const }]) {
        const sb = await d.client.createSandbox(spec as never);
        const x = await d.client.exec(sb.id, { argv: ['sh', '-c', SCRIPT] });
        const o = `${x.stdout.toString()}\n==stderr\n${x.stderr.toString()}`.replaceAll(sb.id, 'ID');
        writeFileSync(`/tmp/crun-attack/out-${name}-${JSON.stringify(spec).replace(/[^a-z]/g, '')}.txt`, o);
        const pid = sb.init_pid;
        writeFileSync(`/tmp/crun-attack/host-${name}-${JSON.stringify(spec).replace(/[^a-z]/g, '')}.txt`, JSON.stringify(sb, null, 1));
        await d.client.deleteSandbox(sb.id, { force: true });
      }
    }
  }, 300_000);
});
