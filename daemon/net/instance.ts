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
 *   recorded process is adopted, a dead one restarted (its tap0 and default route go with
 *   it, and come back with the new one). It runs in a private mount namespace
 *   (`unshare --mount --propagation private`), because its `--enable-sandbox` unmounts
 *   the host's mounts it can see, and an unmount under the shared /run/netns would
 *   propagate and detach the instance netns itself (seen here).
 * - Sysctls (`ip_forward`, IPv6 off) and the nft table are written inside the namespace
 *   only; the host's sysctls, routes, interfaces and firewall are never read for writing.
 *
 * Every external command is one execa call with an argument array; `ip -batch` runs many
 * changes in one process.
 */
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { execa } from 'execa';
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
  const r = await execa(cmd, args, { reject: false, ...(input !== undefined ? { input } : { stdin: 'ignore' }) });
  if (r.failed) throw internal(`${cmd} ${args.join(' ')} failed: ${String(r.stderr || r.message).trim()}`);
  return String(r.stdout);
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

/** The instance netns and its user-mode uplink; see the module comment. */
export class InstanceNetwork {
  readonly name: string;
  readonly path: string;

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
   * Safe to call on every start: what exists is kept, a dead slirp4netns is restarted.
   * @throws DsecError Unavailable when a tool is missing or slirp4netns does not come up.
   */
  async ensure(): Promise<{ created: boolean; slirp: 'adopted' | 'started' | 'none' }> {
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
    if (!br?.flags.includes('UP')) batch.push(`link set ${BRIDGE} up`);
    if (batch.length) await run('ip', ['-n', this.name, '-batch', '-'], batch.join('\n') + '\n');
    // Forwarding for the bridge; no IPv6 (the plumbing is IPv4 only, so no link-local chatter either).
    await run('nsenter', [`--net=${this.path}`, '--', 'sysctl', '-q', '-w', 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.disable_ipv6=1', 'net.ipv6.conf.default.disable_ipv6=1']);
    await run('nsenter', [`--net=${this.path}`, '--', 'nft', '-f', '-'], nftRuleset(this.o.subnet));
    const slirp = this.o.userMode === 'slirp4netns' ? await this.ensureSlirp() : 'none';
    return { created, slirp };
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

  /** Adopts a live recorded slirp4netns or starts one and waits until it configured tap0. */
  private async ensureSlirp(): Promise<'adopted' | 'started'> {
    if (this.slirpAlive()) return 'adopted';
    const args = ['--mount', '--propagation', 'private', 'slirp4netns', '--configure', `--mtu=${SLIRP_MTU}`, '--enable-seccomp', '--enable-sandbox', '--ready-fd=3',
      '--netns-type=path', ...(this.o.hostLoopback ? [] : ['--disable-host-loopback']), this.path, TAP];
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
    this.o.log.info({ pid: child.pid, netns: this.name }, 'slirp4netns started');
    return 'started';
  }

  /**
   * Removes everything: stops the recorded slirp4netns (by its pid, after checking its
   * starttime) and deletes the namespace (its veths and nft table go with it). Safe to
   * call twice. Used by `dsecd --purge`.
   */
  async remove(): Promise<void> {
    const s = this.slirpAlive();
    if (s) {
      process.kill(s.pid, 'SIGTERM');
      for (let i = 0; i < 100 && procStartTime(s.pid) === s.start; i++) await new Promise((r) => setTimeout(r, 20));
      if (procStartTime(s.pid) === s.start) process.kill(s.pid, 'SIGKILL');
    }
    writeFileSync(this.slirpPidFile, '');
    if (existsSync(this.path)) await run('ip', ['netns', 'del', this.name]);
  }
}
