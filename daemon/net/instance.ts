/**
 * The instance network namespace: where every `allow`/`open` sandbox of one dsecd
 * attaches, so nothing of sandbox networking ever touches the host's namespace.
 *
 *   host netns                 instance netns `dsec-<instance>`           sandbox netns (runc's)
 *   ──────────                 ────────────────────────────────           ─────────────────────
 *   slirp4netns  ◄── tap0 ──►  tap0 10.0.2.100/24, default via 10.0.2.2
 *   (user mode)                bridge dsec0 <gateway>/<len>  ◄── v<slot> ═ eth0 ──►  eth0 <addr>, default via gateway
 *                              ip_forward=1, nft table `ip dsec`: NAT out of tap0,
 *                              no forwarding between bridge ports, only DNS to the gateway
 *                              resolver on <gateway>:53 (daemon/net/resolver.ts)
 *
 * - The namespace is a named netns (`ip netns add`, a bind mount under /run/netns), so it
 *   outlives dsecd restarts; it is removed by `dsecd --purge` only.
 * - slirp4netns runs detached (its own session, not a child that dies with dsecd). Its
 *   pid and /proc starttime are recorded in `<root>/net/slirp4netns.pid`; at start a live
 *   recorded process is adopted when its command line (/proc/<pid>/cmdline, the kernel's
 *   word on how it runs) is the one the current `[network]` settings give, else it is
 *   stopped and started with the current settings (a dead one is started again: its tap0
 *   and default route go with it, and come back with the new one). While dsecd runs,
 *   {@link InstanceNetwork.watch} restarts a slirp4netns that died (noticed at its exit
 *   when dsecd started it, else by a check every {@link SLIRP_CHECK_MS}); connections
 *   through the old one are lost, new ones work once tap0 is back. It runs in a private mount namespace
 *   (`unshare --mount --propagation private`), because its `--enable-sandbox` unmounts
 *   the host's mounts it can see, and an unmount under the shared /run/netns would
 *   propagate and detach the instance netns itself (seen here).
 * - Sysctls (`ip_forward`, IPv6 off) and the nft table are written inside the namespace
 *   only; the host's sysctls, routes, interfaces and firewall are never read for writing.
 *
 * Every external command is one call with an argument array (daemon/host/spawn.ts: no
 * fork of dsecd); `ip -batch` runs many changes in one process. slirp4netns, which
 * outlives the call and hands back a pipe, is started with child_process.
 */
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { spawnNative } from '../host/spawn.js';
import type { Logger } from 'pino';
import { internal, unavailable } from '../errors.js';
import { procStartTime } from '../host/proc.js';
import { formatAddr, formatPrefix, type Subnet } from './addr.js';

/** Bridge name inside the instance netns. */
export const BRIDGE = 'dsec0';
/** slirp4netns's tap device inside the instance netns. */
export const TAP = 'tap0';
/** slirp4netns's defaults (its `--cidr` default 10.0.2.0/24): our address, the host gateway, the DNS forwarder. */
export const SLIRP = { cidr: '10.0.2.0/24', self: '10.0.2.100', hostGateway: '10.0.2.2', dns: '10.0.2.3' } as const;
/** slirp4netns MTU: 65520, its documented maximum, so the user-mode hop is not the bottleneck (veths keep 1500). */
const SLIRP_MTU = 65520;
/** How long start waits for slirp4netns to say it configured tap0: 10 s. */
const SLIRP_READY_MS = 10_000;
/** How often {@link InstanceNetwork.watch} checks that the recorded slirp4netns is alive: 1 s (one read of /proc/<pid>/stat; an uplink that died is back within about this long plus its start). */
export const SLIRP_CHECK_MS = 1000;
/** Longest wait between attempts to restart a slirp4netns that will not come up: 60 s (doubling from {@link SLIRP_CHECK_MS}), so a broken host is not hammered. */
const SLIRP_RETRY_MAX_MS = 60_000;
/** How long a SIGTERMed slirp4netns gets to exit before SIGKILL: 2 s (it exits at once on SIGTERM; this only bounds a wedged one). */
const SLIRP_STOP_MS = 2000;

/** Name of an instance's network namespace (under /run/netns). */
export function netnsName(instance: string): string {
  return `dsec-${instance}`;
}

/** Path of a named netns. */
export function netnsPath(name: string): string {
  return path.join('/run/netns', name);
}

/** Runs a command, throwing Internal with its stderr on failure. */
export async function run(cmd: string, args: string[], input?: string): Promise<string> {
  const r = await spawnNative(cmd, args, { ...(input !== undefined ? { input } : {}), timeoutMs: 60_000 })
    .catch((e: Error) => ({ exitCode: null, signal: null, stdout: '', stderr: e.message, timedOut: false }));
  if (r.exitCode !== 0) throw internal(`${cmd} ${args.join(' ')} failed: ${(r.stderr || (r.timedOut ? 'timed out after 60 s' : `killed by ${r.signal}`)).trim()}`);
  return r.stdout.replace(/\n$/, '');
}

/** The nft ruleset of the instance netns (replaced whole, atomically, by {@link InstanceNetwork.ensure}). */
export function nftRuleset(subnet: Subnet): string {
  const gw = formatAddr(subnet.gateway);
  return [
    // `add` then `delete` then define: one transaction that replaces the table whether or not it existed.
    'add table ip dsec',
    'delete table ip dsec',
    'table ip dsec {',
    '  chain input {',
    '    type filter hook input priority filter; policy accept;',
    // From sandboxes, the namespace itself answers DNS on the gateway only (the resolver),
    // plus replies to connections it opened.
    `    iifname "${BRIDGE}" ip daddr ${gw} meta l4proto { tcp, udp } th dport 53 accept`,
    `    iifname "${BRIDGE}" ct state established,related accept`,
    `    iifname "${BRIDGE}" ip daddr { ${gw}, ${SLIRP.self} } drop`,
    '  }',
    '  chain forward {',
    '    type filter hook forward priority filter; policy drop;',
    // Never from one sandbox to another (bridge ports are isolated too), nor back into the bridge.
    `    iifname "${BRIDGE}" oifname "${BRIDGE}" drop`,
    `    iifname "${BRIDGE}" accept`,
    `    oifname "${BRIDGE}" ct state established,related accept`,
    '  }',
    '  chain postrouting {',
    '    type nat hook postrouting priority srcnat; policy accept;',
    `    ip saddr ${formatPrefix(subnet.prefix)} oifname != "${BRIDGE}" masquerade`,
    '  }',
    '}',
    '',
  ].join('\n');
}

/** Options of {@link InstanceNetwork}. */
export interface InstanceNetworkOptions {
  instance: string;
  /** `<root>/net`: pid files and logs. */
  stateDir: string;
  subnet: Subnet;
  userMode: 'slirp4netns' | 'none';
  hostLoopback: boolean;
  log: Logger;
}

/** A recorded detached process: pid and /proc starttime (so a reused pid is never taken for it). */
interface PidRecord { pid: number; start: number }

/** What {@link InstanceNetwork.ensure} did with the uplink: kept the live one, started one where none lived, replaced one whose settings differ from the config, stopped one the config no longer wants, or none is configured. */
export type SlirpOutcome = 'adopted' | 'started' | 'restarted' | 'stopped' | 'none';

/** An uplink change {@link InstanceNetwork.watch} reports: `restarted` (it had died and runs again), `failed` (it died and the restart did not come up; retried with backoff). */
export interface UplinkEvent {
  kind: 'restarted' | 'failed';
  /** Human-readable: old and new pid, or why the restart failed. */
  message: string;
}

/**
 * The argv of slirp4netns for a netns and settings (without the `unshare` prefix): what
 * dsecd runs and what it compares with a live process's /proc/<pid>/cmdline to decide
 * whether to adopt it. Pure.
 */
export function slirpArgv(netnsPath: string, hostLoopback: boolean): string[] {
  return ['slirp4netns', '--configure', `--mtu=${SLIRP_MTU}`, '--enable-seccomp', '--enable-sandbox', '--ready-fd=3',
    '--netns-type=path', ...(hostLoopback ? [] : ['--disable-host-loopback']), netnsPath, TAP];
}

/**
 * How a running slirp4netns's argv differs from the wanted one, in the config's words
 * (`host_loopback off -> on`, then any other flag added or removed), or null when they
 * are the same. Pure.
 */
export function slirpArgvDiff(running: readonly string[], wanted: readonly string[]): string | null {
  if (running.length === wanted.length && running.every((a, i) => a === wanted[i])) return null;
  const out: string[] = [];
  const hl = (a: readonly string[]) => (a.includes('--disable-host-loopback') ? 'off' : 'on');
  if (hl(running) !== hl(wanted)) out.push(`host_loopback ${hl(running)} -> ${hl(wanted)}`);
  const r = new Set(running.filter((a) => a !== '--disable-host-loopback')), w = new Set(wanted.filter((a) => a !== '--disable-host-loopback'));
  const removed = [...r].filter((a) => !w.has(a)), added = [...w].filter((a) => !r.has(a));
  if (removed.length || added.length) out.push(`arguments ${[...removed.map((a) => `-${a}`), ...added.map((a) => `+${a}`)].join(' ')}`);
  if (!out.length) out.push('argument order');
  return out.join(', ');
}

/** The argv of a live process (/proc/<pid>/cmdline split at NULs), or null when it cannot be read. */
function procArgv(pid: number): string[] | null {
  try {
    const raw = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    return raw.split('\0').filter((a, i, all) => i < all.length - 1 || a !== '');
  } catch {
    return null;
  }
}

/** The instance netns and its user-mode uplink; see the module comment. */
export class InstanceNetwork {
  readonly name: string;
  readonly path: string;
  private watcher: NodeJS.Timeout | null = null;
  private onUplink: ((e: UplinkEvent) => void) | null = null;
  /** The restart in progress (so an exit and a check never start two). */
  private restarting: Promise<void> | null = null;
  /** Earliest time (ms since the epoch) of the next restart attempt after failures, and the current backoff. */
  private retryAt = 0;
  private retryMs = SLIRP_CHECK_MS;

  constructor(private readonly o: InstanceNetworkOptions) {
    this.name = netnsName(o.instance);
    this.path = netnsPath(this.name);
  }

  private get slirpPidFile(): string {
    return path.join(this.o.stateDir, 'slirp4netns.pid');
  }

  /** True when the named netns exists (its bind mount is in place). */
  exists(): boolean {
    if (!existsSync(this.path)) return false;
    // An unmounted leftover file is not a namespace: compare with the mount table.
    return readFileSync('/proc/self/mountinfo', 'utf8').split('\n').some((l) => l.split(' ')[4] === this.path);
  }

  /**
   * Creates (or completes) the namespace, the bridge, sysctls, nft table and uplink.
   * Safe to call on every start: what exists is kept, a dead slirp4netns is restarted,
   * a live one whose settings differ from the config is restarted with the config's
   * (`slirpChange` says what differed), a bridge address of another subnet is removed.
   * @throws DsecError Unavailable when a tool is missing or slirp4netns does not come up.
   */
  async ensure(): Promise<{ created: boolean; slirp: SlirpOutcome; slirpChange: string | null }> {
    mkdirSync(this.o.stateDir, { recursive: true, mode: 0o700 });
    let created = false;
    if (!this.exists()) {
      if (existsSync(this.path)) await run('ip', ['netns', 'del', this.name]).catch(() => {});
      await run('ip', ['netns', 'add', this.name]);
      created = true;
    }
    const links = JSON.parse(await run('ip', ['-n', this.name, '-j', 'addr', 'show'])) as { ifname: string; operstate: string; flags: string[]; addr_info?: { local: string; prefixlen: number }[] }[];
    const br = links.find((l) => l.ifname === BRIDGE);
    const gw = `${formatAddr(this.o.subnet.gateway)}/${this.o.subnet.prefix.len}`;
    const batch: string[] = [];
    if (!links.find((l) => l.ifname === 'lo')?.flags.includes('UP')) batch.push('link set lo up');
    if (!br) batch.push(`link add ${BRIDGE} type bridge`);
    if (!br?.addr_info?.some((a) => `${a.local}/${a.prefixlen}` === gw)) batch.push(`addr add ${gw} dev ${BRIDGE}`);
    // A gateway of an earlier `[network] subnet`: the nft table below is for the current one only.
    for (const a of br?.addr_info ?? []) {
      if (`${a.local}/${a.prefixlen}` !== gw && !a.local.includes(':')) {
        this.o.log.warn({ netns: this.name, stale: `${a.local}/${a.prefixlen}`, subnet: gw }, 'removing a bridge address of another [network] subnet');
        batch.push(`addr del ${a.local}/${a.prefixlen} dev ${BRIDGE}`);
      }
    }
    if (!br?.flags.includes('UP')) batch.push(`link set ${BRIDGE} up`);
    if (batch.length) await run('ip', ['-n', this.name, '-batch', '-'], batch.join('\n') + '\n');
    // Forwarding for the bridge; no IPv6 (the plumbing is IPv4 only, so no link-local chatter either).
    await run('nsenter', [`--net=${this.path}`, '--', 'sysctl', '-q', '-w', 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.disable_ipv6=1', 'net.ipv6.conf.default.disable_ipv6=1']);
    await run('nsenter', [`--net=${this.path}`, '--', 'nft', '-f', '-'], nftRuleset(this.o.subnet));
    const r = await this.ensureSlirp();
    return { created, slirp: r.outcome, slirpChange: r.change };
  }

  /** The recorded slirp4netns when it is alive (pid with its recorded starttime), else null. */
  slirpAlive(): PidRecord | null {
    let rec: PidRecord;
    try {
      rec = JSON.parse(readFileSync(this.slirpPidFile, 'utf8'));
    } catch {
      return null;
    }
    return procStartTime(rec.pid) === rec.start ? rec : null;
  }

  /** The argv slirp4netns runs with under the current settings. */
  private wantedArgv(): string[] {
    return slirpArgv(this.path, this.o.hostLoopback);
  }

  /**
   * Adopts a live recorded slirp4netns whose argv is the wanted one; replaces one whose
   * argv differs; stops one when `[network] user_mode` is none; starts one where none lives.
   */
  private async ensureSlirp(): Promise<{ outcome: SlirpOutcome; change: string | null }> {
    const live = this.slirpAlive();
    if (this.o.userMode !== 'slirp4netns') {
      if (!live) return { outcome: 'none', change: null };
      await this.stopSlirp(live);
      this.o.log.warn({ pid: live.pid, netns: this.name }, 'slirp4netns stopped: [network] user_mode is none');
      return { outcome: 'stopped', change: 'user_mode slirp4netns -> none' };
    }
    if (live) {
      const running = procArgv(live.pid);
      const change = running ? slirpArgvDiff(running, this.wantedArgv()) : 'command line unreadable';
      if (!change) return { outcome: 'adopted', change: null };
      this.o.log.warn({ pid: live.pid, netns: this.name, change }, 'slirp4netns runs with other settings than the config: restarting it with the config\'s');
      await this.stopSlirp(live);
      await this.startSlirp();
      return { outcome: 'restarted', change };
    }
    await this.startSlirp();
    return { outcome: 'started', change: null };
  }

  /** Stops a recorded slirp4netns by pid (SIGTERM, then SIGKILL after {@link SLIRP_STOP_MS}), checking its starttime before each signal. */
  private async stopSlirp(s: PidRecord): Promise<void> {
    if (procStartTime(s.pid) !== s.start) return;
    process.kill(s.pid, 'SIGTERM');
    for (let i = 0; i < SLIRP_STOP_MS / 20 && procStartTime(s.pid) === s.start; i++) await new Promise((r) => setTimeout(r, 20));
    if (procStartTime(s.pid) === s.start) process.kill(s.pid, 'SIGKILL');
    for (let i = 0; i < 100 && procStartTime(s.pid) === s.start; i++) await new Promise((r) => setTimeout(r, 20));
  }

  /**
   * Starts slirp4netns with the wanted argv, waits until it configured tap0 and records it.
   * @returns its pid.
   * @throws DsecError Unavailable when it does not come up within {@link SLIRP_READY_MS}.
   */
  private async startSlirp(): Promise<number> {
    const args = ['--mount', '--propagation', 'private', ...this.wantedArgv()];
    const logFd = openSync(path.join(this.o.stateDir, 'slirp4netns.log'), 'a', 0o600);
    let child;
    try {
      // Detached: its own session, so it outlives dsecd (adopted by the next start).
      child = spawn('unshare', args, { detached: true, stdio: ['ignore', logFd, logFd, 'pipe'] });
    } finally {
      closeSync(logFd);
    }
    const ready = await new Promise<boolean>((resolve) => {
      const t = setTimeout(() => resolve(false), SLIRP_READY_MS);
      const pipe = child.stdio[3] as NodeJS.ReadableStream;
      pipe.on('data', () => { clearTimeout(t); resolve(true); });
      child.once('exit', () => { clearTimeout(t); resolve(false); });
      child.once('error', () => { clearTimeout(t); resolve(false); });
    });
    (child.stdio[3] as unknown as { destroy(): void }).destroy();
    child.unref();
    const start = child.pid ? procStartTime(child.pid) : null;
    if (!ready || !child.pid || start === null) {
      if (child.pid && start !== null) process.kill(child.pid, 'SIGKILL');
      throw unavailable(`slirp4netns did not come up in network namespace ${this.name}; see ${path.join(this.o.stateDir, 'slirp4netns.log')} (is the slirp4netns package installed?)`);
    }
    writeFileSync(this.slirpPidFile, JSON.stringify({ pid: child.pid, start }));
    // A child of this dsecd: its exit is seen at once (the periodic check covers adopted ones).
    child.once('exit', () => this.check());
    this.o.log.info({ pid: child.pid, netns: this.name }, 'slirp4netns started');
    return child.pid;
  }

  /**
   * Keeps the uplink alive while dsecd runs: when the recorded slirp4netns is found dead
   * (its exit, or the check every {@link SLIRP_CHECK_MS}), starts a new one and reports
   * it through `onUplink`; a restart that fails is reported once per run of failures and
   * retried with a doubling wait up to {@link SLIRP_RETRY_MAX_MS}. No-op when the config
   * has no slirp4netns. Safe to call twice (the later callback wins).
   */
  watch(onUplink: (e: UplinkEvent) => void): void {
    if (this.o.userMode !== 'slirp4netns') return;
    this.onUplink = onUplink;
    if (this.watcher) return;
    this.watcher = setInterval(() => this.check(), SLIRP_CHECK_MS);
    this.watcher.unref();
  }

  /** Stops {@link watch} (dsecd shutdown, purge); slirp4netns itself keeps running. Safe to call twice. */
  unwatch(): void {
    if (this.watcher) clearInterval(this.watcher);
    this.watcher = null;
    this.onUplink = null;
  }

  /** One liveness check of {@link watch}: restarts a dead slirp4netns unless a restart is running or backing off. */
  private check(): void {
    if (!this.onUplink || this.restarting || Date.now() < this.retryAt || this.slirpAlive()) return;
    let old: number | null = null;
    try {
      old = (JSON.parse(readFileSync(this.slirpPidFile, 'utf8')) as PidRecord).pid;
    } catch { /* none recorded */ }
    this.restarting = (async () => {
      const report = this.onUplink;
      try {
        this.o.log.warn({ pid: old, netns: this.name }, 'slirp4netns died; restarting it');
        const pid = await this.startSlirp();
        const failedBefore = this.retryMs > SLIRP_CHECK_MS;
        this.retryAt = 0;
        this.retryMs = SLIRP_CHECK_MS;
        report?.({ kind: 'restarted', message: `slirp4netns ${old ?? '?'} was not running; started ${pid}${failedBefore ? ' after failed attempts' : ''}` });
      } catch (e) {
        const first = this.retryMs === SLIRP_CHECK_MS;
        this.retryAt = Date.now() + this.retryMs;
        this.o.log.error({ err: e, netns: this.name, retryInMs: this.retryMs }, 'slirp4netns restart failed; sandboxes have no uplink until it comes up');
        this.retryMs = Math.min(SLIRP_RETRY_MAX_MS, this.retryMs * 2);
        if (first) report?.({ kind: 'failed', message: `slirp4netns ${old ?? '?'} was not running and a new one did not come up: ${(e as Error).message}; retrying` });
      } finally {
        this.restarting = null;
      }
    })();
  }

  /**
   * Removes everything: stops the recorded slirp4netns (by its pid, after checking its
   * starttime) and deletes the namespace (its veths and nft table go with it). Safe to
   * call twice. Used by `dsecd --purge`.
   */
  async remove(): Promise<void> {
    this.unwatch();
    await this.restarting;
    const s = this.slirpAlive();
    if (s) await this.stopSlirp(s);
    writeFileSync(this.slirpPidFile, '');
    if (existsSync(this.path)) await run('ip', ['netns', 'del', this.name]);
  }
}
