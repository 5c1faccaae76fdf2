/**
 * One sandbox's link to the instance bridge: a veth pair from the bridge (`v<slot>`, an
 * isolated bridge port) into the sandbox's runc-created network namespace (`eth0`), its
 * address, and its default route via the gateway.
 *
 * Two processes per attach, one per namespace (create latency matters): `ip -n <instance
 * netns> -batch` creates the pair with the peer already in the sandbox's netns (by its
 * init's pid) and plugs the host end into the bridge; `nsenter -t <pid> -n ip -batch`
 * configures the sandbox end. The sandbox's netns is owned by its user namespace, and
 * root of the host's user namespace may configure it; nothing in the sandbox can (it
 * has no CAP_NET_ADMIN).
 *
 * Addresses and MACs are derived from the sandbox's uid-range slot (daemon/net/addr.ts),
 * so a restarted sandbox gets the same ones and neighbour caches stay right. Deleting
 * the bridge end deletes the pair; the pair also dies with the sandbox's netns.
 */
import { spawnNative } from '../host/spawn.js';
import { internal } from '../errors.js';
import { formatAddr, type Subnet } from './addr.js';
import { BRIDGE, run } from './instance.js';

/** Interface name of a slot's bridge end: `v<slot>` (at most 6 characters for the 16,384 ranges of the default pool; IFNAMSIZ is 15). */
export function vethName(slot: number): string {
  return `v${slot}`;
}

/** Slot of a bridge-end name, or null when it is not one of ours. */
export function slotOfVeth(name: string): number | null {
  const m = /^v(\d{1,9})$/.exec(name);
  return m ? Number(m[1]) : null;
}

/** Locally administered MAC of a sandbox address: 02:00 and the four address bytes. */
export function macFor(addr: Buffer): string {
  return ['02', '00', ...[...addr].map((b) => b.toString(16).padStart(2, '0'))].join(':');
}

/** The commands of both batches, for a slot, address and init pid (pure; tested in unit tests). */
export function attachBatches(subnet: Subnet, slot: number, addr: Buffer, pid: number): { instance: string; sandbox: string } {
  const v = vethName(slot);
  return {
    instance: [
      `link add ${v} type veth peer name eth0 address ${macFor(addr)} netns ${pid}`,
      `link set ${v} master ${BRIDGE}`,
      `link set dev ${v} type bridge_slave isolated on`,
      `link set ${v} up`,
      '',
    ].join('\n'),
    sandbox: [
      'link set eth0 addrgenmode none',
      `addr add ${formatAddr(addr)}/${subnet.prefix.len} dev eth0`,
      'link set eth0 up',
      `route add default via ${formatAddr(subnet.gateway)}`,
      '',
    ].join('\n'),
  };
}

/**
 * Plugs a running sandbox into the bridge. A bridge end left over from a previous
 * container of the same slot (a dsecd crash between stop and cleanup) is replaced.
 * @throws DsecError Internal naming the failed command.
 */
export async function attachVeth(netns: string, subnet: Subnet, slot: number, addr: Buffer, pid: number): Promise<void> {
  const b = attachBatches(subnet, slot, addr, pid);
  const r = await spawnNative('ip', ['-n', netns, '-batch', '-'], { input: b.instance, timeoutMs: 60_000 });
  if (r.exitCode !== 0) {
    if (!/File exists/.test(r.stderr)) throw internal(`plugging sandbox veth ${vethName(slot)} into ${netns}: ${(r.stderr || `ip exited with ${r.exitCode ?? r.signal}`).trim()}`);
    await detachVeth(netns, slot);
    await run('ip', ['-n', netns, '-batch', '-'], b.instance);
  }
  await run('nsenter', ['-t', String(pid), '-n', '--', 'ip', '-batch', '-'], b.sandbox);
}

/**
 * Removes a slot's veth pair; a missing one is fine. Safe to call twice. The kernel also
 * removes the pair on its own once the sandbox's network namespace is gone (its init was
 * killed), asynchronously: `ip` may find the device by name and then be told ENODEV ("No
 * such device") by the delete, which is the same outcome.
 */
export async function detachVeth(netns: string, slot: number): Promise<void> {
  const r = await spawnNative('ip', ['-n', netns, 'link', 'del', vethName(slot)], { timeoutMs: 60_000 });
  if (r.exitCode !== 0 && !/Cannot find device|does not exist|No such device/.test(r.stderr)) throw internal(`removing sandbox veth ${vethName(slot)} from ${netns}: ${(r.stderr || `ip exited with ${r.exitCode ?? r.signal}`).trim()}`);
}

/** Bridge ports of the instance netns: slot and operational state of each `v<slot>`. */
export async function listVeths(netns: string): Promise<{ slot: number; up: boolean }[]> {
  const links = JSON.parse(await run('ip', ['-n', netns, '-j', 'link', 'show', 'master', BRIDGE]) || '[]') as { ifname: string; flags: string[] }[];
  return links.map((l) => ({ slot: slotOfVeth(l.ifname), up: l.flags.includes('UP') })).filter((l): l is { slot: number; up: boolean } => l.slot !== null);
}

/**
 * Whether the sandbox whose init is `pid` has its eth0 with `addr` (and is up): used at
 * adopt to decide whether the veth must be redone.
 */
export async function sandboxLinkOk(pid: number, addr: Buffer): Promise<boolean> {
  const r = await spawnNative('nsenter', ['-t', String(pid), '-n', '--', 'ip', '-j', 'addr', 'show', 'dev', 'eth0'], { timeoutMs: 60_000 });
  if (r.exitCode !== 0) return false;
  const l = (JSON.parse(r.stdout.trim() || '[]') as { flags: string[]; addr_info?: { local: string }[] }[])[0];
  return !!l && l.flags.includes('UP') && !!l.addr_info?.some((a) => a.local === formatAddr(addr));
}
