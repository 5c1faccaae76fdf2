/**
 * Sandbox networking for one dsecd: the one object the container driver, the lifecycle
 * and the API talk to. It ties together
 *   - the instance netns and its uplink (daemon/net/instance.ts),
 *   - each sandbox's veth, address and resolv.conf (daemon/net/veth.ts),
 *   - the egress programs and their maps (native/bpf/egress.bpf.c through
 *     daemon/host/bpf.ts), compiled from the sandbox's rules (daemon/security/egress.ts),
 *   - host-rule names resolved by dsecd (daemon/net/hostnames.ts) and addresses learned
 *     from the sandbox resolver's answers ("pins"),
 *   - the resolver (daemon/net/resolver.ts) and its decisions,
 *   - denial counters turned into `network.denied` / `network.dns_refused` events.
 *
 * State. The store's `network` column is the record of intent (the settled spec: mode,
 * policy name, inline rules). The kernel is the truth: veths in the instance netns,
 * program attachments on sandbox cgroups, and entries in maps pinned in `<root>/bpf/egress`,
 * which keep enforcing while dsecd is down. In memory: one {@link Live} per attached
 * sandbox (rebuilt by {@link SandboxNetworking.adopt} after a restart). Learned DNS pins
 * and the resolver's refusal counts are kept on disk across restarts (./records.ts); the
 * egress counters live in the kernel's pinned map. The destinations every sandbox is
 * denied and the resolver's decision per name are pure (./decisions.ts).
 *
 * Concurrency. Every map change for a sandbox is computed and written synchronously
 * (compile, diff, bpf(2) calls) inside one turn of the event loop, so a DNS pin, a
 * refresh and a live update never interleave half-applied. Lifecycle calls (attach,
 * detach, adopt, update) are serialised per sandbox by the lifecycle's locks
 * (daemon/sandbox/locks.ts).
 */
import { existsSync, mkdirSync, readdirSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';
import type { Logger } from 'pino';
import type { NetworkConfig } from '../config.js';
import { failedPrecondition, internal, invalidArgument } from '../errors.js';
import { BpfObject, ensureBpffs } from '../host/bpf.js';
import {
  cgroupKey, compileEgress, confValue, COUNTERS_BYTES, effectiveNetwork, exactHosts, parseCounters, parseTrieKey, portsetValue, trieKey,
  PROTO_ANY, type CompiledEgress, type DenialCounters, type EffectiveNetwork, type PortRange,
} from '../security/egress.js';
import type { PolicySet } from '../security/egress-policy.js';
import { addressForSlot, formatAddr, parseAddr, parsePrefix, parseSubnet, type Prefix, type Subnet } from './addr.js';
import { HostNames } from './hostnames.js';
import { InstanceNetwork } from './instance.js';
import { SandboxResolver } from './resolver.js';
import { attachVeth, detachVeth, listVeths, sandboxLinkOk, vethName } from './veth.js';
import { typeName } from './dnswire.js';
import { builtinDeny, dnsDecision } from './decisions.js';
import { NetworkRecords, prunePins } from './records.js';
import type { SandboxFiles } from '../host/sandbox-files.js';
import type { NetworkSpec } from '../model/network.js';
import type { SandboxRecord } from '../model/sandbox.js';

/** Programs of egress.bpf.o, attached together to every allow/open sandbox. */
export const EGRESS_PROGRAMS = ['egress_connect4', 'egress_connect6', 'egress_sendmsg4', 'egress_sendmsg6', 'egress_sock_create'] as const;
/** The tries, by the compiled field that fills them. */
const TRIES = { allow4: 'egress_allow4', deny4: 'egress_deny4', allow6: 'egress_allow6', deny6: 'egress_deny6' } as const;
/** How often denial counters are read for events: every 2 s (a sandbox hammering a denied address yields one event per interval, not one per attempt). */
const POLL_MS = 2000;
/** Learned addresses stay allowed this long past their TTL: 60 s, for clients that cache an answer a little beyond it. */
const PIN_GRACE_S = 60;
/** A pin never lives longer than this past its answer: 1 h (the TTL clamp's default ceiling), whatever TTL the upstream gave. */
const PIN_MAX_S = 3600;
/** Pins files are written at most once per this interval per sandbox: 1 s. */
const PIN_WRITE_MS = 1000;

/** What the driver passes to the OCI spec for an allow/open sandbox. */
export interface SpecNetwork {
  /** Host path of the generated resolv.conf (on the instance's sandbox-files tmpfs), bind-mounted read-only at /etc/resolv.conf. */
  resolvConf: string;
}

/** Dependencies of {@link SandboxNetworking}. */
export interface NetworkingDeps {
  config: NetworkConfig;
  root: string;
  instance: string;
  uidPool: { base: number; size: number; rangeSize: number };
  policies: PolicySet;
  /** Where the generated resolv.conf is kept (daemon/host/sandbox-files.ts): bound from there, its mount entry names no host path. */
  sandboxFiles: SandboxFiles;
  /** The cgroup2 directory of a sandbox's cgroup (where programs attach). */
  cgroup2Dir(id: string): string;
  /** Directory of the built BPF objects. */
  bpfBuildDir: string;
  /** Records an event for a sandbox, or for the host when `id` is null (the repo's event log). */
  event(id: string | null, type: string, message: string): void;
  log: Logger;
}

/** One attached sandbox. */
interface Live {
  id: string;
  slot: number;
  address: Buffer;
  cgroupDir: string;
  cgid: bigint;
  net: EffectiveNetwork;
  /** Learned addresses: host pattern -> address -> expiry (ms since the epoch). */
  pins: Map<string, Map<string, number>>;
  /** Keys (hex) written to each trie for this sandbox. */
  applied: Map<string, Set<string>>;
  /** Counters at the last poll, to turn increases into events. */
  seen: { connect: number; sendmsg: number; sockCreate: number };
  dnsRefused: number;
  dnsRefusedSeen: number;
  lastRefused: string | null;
  pinsDirty: boolean;
  /** dnsRefused or lastRefused changed since they were last written (see the module comment). */
  countersDirty: boolean;
}

/** A sandbox's network as GET /v1/sandboxes/{id}/network shows it. */
export interface NetworkView {
  mode: 'none' | 'allow' | 'open';
  policy: string | null;
  allow: EffectiveNetwork['allow'];
  deny: EffectiveNetwork['deny'];
  address: string | null;
  gateway: string | null;
  resolver: string | null;
  attached: boolean;
  hosts: Record<string, string[]>;
  learned: number;
  denied: { connect: number; sendmsg: number; sock_create: number; dns_refused: number; last: string | null };
}

/** Formats the last denied attempt: `10.0.0.9:80/tcp (connect)`, `raw socket (sock_create)`. */
export function describeLast(c: DenialCounters): string | null {
  if (!c.last) return null;
  if (c.last.kind === 'sock_create') return `${c.last.socketType === 3 ? 'raw' : `type ${c.last.socketType}`} ${c.last.protocol} socket (sock_create)`;
  const a = c.last.address && c.last.address.includes(':') ? `[${c.last.address}]` : c.last.address;
  return `${a}:${c.last.port}/${c.last.protocol} (${c.last.kind})`;
}

/** Sandbox networking; see the module comment. */
export class SandboxNetworking {
  readonly subnet: Subnet;
  readonly instanceNet: InstanceNetwork;
  private readonly stateDir: string;
  /** Pins and refusal counts kept across restarts. */
  private readonly records: NetworkRecords;
  private bpf: BpfObject | null = null;
  private bpfProblem: string | null = null;
  private resolver: SandboxResolver | null = null;
  private readonly names: HostNames;
  private readonly live = new Map<string, Live>();
  private readonly byAddress = new Map<string, Live>();
  /** Trie keys found at start, grouped by cgroup id (kernel state of a previous dsecd). */
  private readonly found = new Map<bigint, Map<string, Set<string>>>();
  private poll: NodeJS.Timeout | null = null;
  private pinWriter: NodeJS.Timeout | null = null;
  private ready = false;
  private problem: string | null = null;
  private upOnce: Promise<void> | null = null;
  private isUp = false;

  constructor(private readonly d: NetworkingDeps) {
    this.subnet = parseSubnet(d.config.subnet);
    const slots = Math.floor(d.uidPool.size / d.uidPool.rangeSize);
    if (slots > this.subnet.capacity) {
      throw invalidArgument(`[network] subnet ${d.config.subnet} holds ${this.subnet.capacity} sandbox addresses, fewer than the uid pool's ${slots} ranges; choose a larger subnet (e.g. a /16)`);
    }
    this.stateDir = path.join(d.root, 'net');
    this.records = new NetworkRecords(this.stateDir, d.log);
    this.instanceNet = new InstanceNetwork({ instance: d.instance, stateDir: this.stateDir, subnet: this.subnet, userMode: d.config.userMode, hostLoopback: d.config.hostLoopback, log: d.log });
    this.names = new HostNames({ servers: d.config.hostResolvers, ttlMinS: d.config.ttlMinS, ttlMaxS: d.config.ttlMaxS, log: d.log, onChange: (n) => this.nameChanged(n) });
  }

  /** Gateway (and resolver) address text. */
  get gateway(): string {
    return formatAddr(this.subnet.gateway);
  }

  /**
   * Loads the egress programs (cheap, so `dsec host info` is truthful from the start) and,
   * when `eager` (some sandbox of the store has a network) or the instance netns exists
   * already, brings up the namespace, uplink and resolver ({@link up}). Otherwise those
   * wait for the first allow/open sandbox: a dsecd whose sandboxes all have mode none
   * never runs slirp4netns or a resolver. A failure does not stop dsecd: allow/open
   * sandboxes are then refused with the reason ({@link available}); mode none works.
   */
  async init(opts: { eager: boolean }): Promise<void> {
    mkdirSync(path.join(this.stateDir, 'pins'), { recursive: true, mode: 0o700 });
    mkdirSync(path.join(this.stateDir, 'counters'), { recursive: true, mode: 0o700 });
    try {
      const pins = path.join(this.d.root, 'bpf');
      ensureBpffs(pins);
      // One conf and one counters entry per sandbox: size those maps for every slot of the uid pool (16,384 by default, the object's own size).
      const slots = Math.max(16384, Math.floor(this.d.uidPool.size / this.d.uidPool.rangeSize));
      this.bpf = BpfObject.load({
        objectPath: path.join(this.d.bpfBuildDir, 'egress.bpf.o'), pinDir: path.join(pins, 'egress'), replaceIncompatiblePins: true,
        maxEntries: { egress_conf: slots, egress_counters: slots },
      });
      this.scanMaps();
    } catch (e) {
      this.bpfProblem = `egress programs could not be loaded: ${(e as Error).message}`;
      this.d.log.error({ err: e }, 'egress programs unavailable; allow/open sandboxes will be refused');
    }
    this.names.start();
    this.poll = setInterval(() => this.pollCounters(), POLL_MS);
    this.poll.unref();
    this.pinWriter = setInterval(() => this.records.writePins(this.live.values()), PIN_WRITE_MS);
    this.pinWriter.unref();
    this.ready = true;
    if (opts.eager || this.instanceNet.exists()) await this.up();
  }

  /**
   * Brings up the instance netns, its uplink and the resolver, once; later calls wait for
   * the same attempt. A failure is kept (and reported by {@link available}) until dsecd
   * restarts, so a broken host does not make every create wait for the uplink timeout.
   */
  up(): Promise<void> {
    this.upOnce ??= (async () => {
      if (this.bpfProblem) return;
      try {
        const r = await this.instanceNet.ensure();
        this.d.log.info({ netns: this.instanceNet.name, ...r }, 'instance network namespace ready');
        if (r.slirp === 'restarted' || r.slirp === 'stopped') {
          this.d.event(null, 'network.uplink_restarted', `slirp4netns ${r.slirp === 'restarted' ? 'restarted' : 'stopped'}: its settings differed from [network] (${r.slirpChange})`);
        }
        this.resolver = new SandboxResolver(
          { netnsPath: this.instanceNet.path, gateway: this.gateway, upstreams: this.d.config.upstreamDns, stateDir: this.stateDir, log: this.d.log.child({ component: 'resolver' }) },
          { decide: (src, name, type) => this.decide(src, name, type), pin: async (src, name, addrs) => this.pinAnswer(src, name, addrs) },
        );
        await this.resolver.start();
        this.isUp = true;
        this.instanceNet.watch((e) => this.d.event(null, e.kind === 'restarted' ? 'network.uplink_restarted' : 'network.uplink_failed', e.message));
      } catch (e) {
        this.problem = `instance network namespace unavailable: ${(e as Error).message}`;
        this.d.log.error({ err: e }, 'sandbox networking unavailable; allow/open sandboxes will be refused until dsecd restarts');
      }
    })();
    return this.upOnce;
  }

  /** Null when allow/open sandboxes can be created here, else why not. */
  available(): string | null {
    if (!this.ready) return 'sandbox networking is not initialised';
    return this.bpfProblem ?? this.problem;
  }

  /**
   * Validates a requested network and settles it for the store: mode resolved (the
   * request's, else its policy's), the policy name checked; brings networking up on the
   * first allow/open sandbox.
   * @throws DsecError InvalidArgument (rules with mode none, unknown policy, bad rule),
   *   FailedPrecondition (allow/open while networking is unavailable on this host).
   */
  async settle(spec: NetworkSpec): Promise<NetworkSpec> {
    const policy = spec.policy ? this.d.policies.require(spec.policy) : undefined;
    const eff = effectiveNetwork(spec, policy);
    if (eff.mode !== 'none') {
      await this.up();
      const why = this.available();
      if (why) throw failedPrecondition(`network mode ${eff.mode} is not available on this host: ${why}; use mode none (the default) or see dsecd's log`);
      // Compile once now, so an impossible rule set (too many port ranges) is refused before the sandbox exists.
      compileEgress(eff, { addressesOf: () => [], infraDeny: this.infraDeny(), extraDeny: this.extraDeny(eff.mode) });
    }
    return { ...spec, mode: eff.mode };
  }

  /** The settled network of a record (mode none when it has none). */
  private effective(spec: NetworkSpec | null): EffectiveNetwork {
    if (!spec || (spec.mode ?? 'none') === 'none') return { mode: 'none', allow: [], deny: [] };
    const policy = spec.policy ? this.d.policies.get(spec.policy) : undefined;
    if (spec.policy && !policy) this.d.log.error({ policy: spec.policy }, 'a sandbox names a network policy that is not loaded; its inline rules alone apply');
    return effectiveNetwork(spec.policy && !policy ? { ...spec, policy: undefined } : spec, policy);
  }

  /** Whether a record has a network beyond loopback. */
  static hasNetwork(sb: SandboxRecord): boolean {
    return !!sb.network && (sb.network.mode ?? 'none') !== 'none';
  }

  /** Slot of a sandbox's uid range (its index in the pool). */
  private slotOf(sb: SandboxRecord): number {
    if (sb.uidBase === null) throw internal(`sandbox ${sb.id} has no uid range`);
    return Math.floor((sb.uidBase - this.d.uidPool.base) / this.d.uidPool.rangeSize);
  }

  /**
   * For the OCI spec of an allow/open sandbox: the resolv.conf naming the resolver on the
   * gateway (one content-addressed file on the sandbox-files tmpfs, shared by every
   * sandbox of the instance: its content is the same for all); null for mode none (the
   * spec is unchanged).
   */
  async prepareSpec(sb: SandboxRecord): Promise<SpecNetwork | null> {
    if (!SandboxNetworking.hasNetwork(sb)) return null;
    await this.up();
    const why = this.available();
    if (why) throw failedPrecondition(`sandbox ${sb.id} has network mode ${sb.network!.mode}, which is not available on this host: ${why}`);
    const text = `# written by dsecd: the sandbox resolver (docs/SECURITY.md, Networking and egress)\nnameserver ${this.gateway}\noptions ndots:1 timeout:2 attempts:2\n`;
    return { resolvConf: this.d.sandboxFiles.put('resolv', text, 0o644, '.conf') };
  }

  /** Infrastructure every allow/open sandbox is denied whatever its rules ({@link builtinDeny}); computed once. */
  private infra: Prefix[] | null = null;

  private infraDeny(): Prefix[] {
    this.infra ??= builtinDeny(this.subnet, this.d.config.hostLoopback).map((b) => b.prefix);
    return this.infra;
  }

  /**
   * Extra denials of open and allow mode: DNS (53) and DNS over TLS (853), TCP and UDP,
   * anywhere but the resolver (which the programs allow before any deny, and deny wins
   * over allow). Open mode: deny-host rules cannot be sidestepped by asking another
   * server. Allow mode: a broad rule (0.0.0.0/0) does not open DNS to other servers
   * either, so every name a sandbox looks up goes through the resolver, which forwards
   * only allowed names and only their question (daemon/net/resolver-child.ts): no
   * tunnel through queries to a server of the sandbox's choosing. A rule naming port 53
   * or 853 explicitly gets no exception: DNS is the resolver's.
   */
  private extraDeny(mode: 'none' | 'allow' | 'open'): { prefix: Prefix; ports: PortRange[] }[] {
    if (mode === 'none') return [];
    const ports = [{ lo: 53, hi: 53, protos: PROTO_ANY }, { lo: 853, hi: 853, protos: PROTO_ANY }];
    return ['0.0.0.0/0', '::/0'].map((p) => ({ prefix: parsePrefix(p), ports }));
  }

  /** Compiles a live sandbox's current rules, host addresses and learned addresses. */
  private compile(l: Live): CompiledEgress {
    const now = Date.now();
    return compileEgress(l.net, {
      addressesOf: (host) => {
        const learned = [...(l.pins.get(host)?.entries() ?? [])].filter(([, exp]) => exp > now).map(([a]) => a);
        return [...new Set([...this.names.addresses(host), ...learned])];
      },
      infraDeny: this.infraDeny(),
      extraDeny: this.extraDeny(l.net.mode),
    });
  }

  /**
   * Writes a live sandbox's compiled entries into the maps and removes the ones it no
   * longer has: inserts and changes first, then deletions, so an allow never lapses
   * in between and a deny never opens.
   */
  private apply(l: Live): void {
    const bpf = this.bpf!;
    const c = this.compile(l);
    for (const [field, mapName] of Object.entries(TRIES) as [keyof CompiledEgress, string][]) {
      const m = bpf.map(mapName);
      const next = new Set<string>();
      for (const e of c[field].values()) {
        const k = trieKey(l.cgid, e.prefix);
        m.update(k, portsetValue(e.ports));
        next.add(k.toString('hex'));
      }
      const prev = l.applied.get(mapName) ?? new Set<string>();
      for (const k of prev) if (!next.has(k)) m.delete(Buffer.from(k, 'hex'));
      l.applied.set(mapName, next);
    }
    bpf.map('egress_conf').update(cgroupKey(l.cgid), confValue(l.net.mode as 'allow' | 'open', this.subnet.gateway));
  }

  /** Reads every trie's keys once at start, grouped by cgroup id, so adopt and orphan cleanup know what a previous dsecd left. */
  private scanMaps(): void {
    for (const mapName of Object.values(TRIES)) {
      for (const k of this.bpf!.map(mapName).keys()) {
        const { cgid } = parseTrieKey(k);
        let byMap = this.found.get(cgid);
        if (!byMap) this.found.set(cgid, (byMap = new Map()));
        let set = byMap.get(mapName);
        if (!set) byMap.set(mapName, (set = new Set()));
        set.add(k.toString('hex'));
      }
    }
    for (const k of this.bpf!.map('egress_conf').keys()) {
      const cgid = k.readBigUInt64LE(0);
      if (!this.found.has(cgid)) this.found.set(cgid, new Map());
    }
  }

  /** cgroup id (inode of the cgroup2 directory) of a sandbox, or null when the directory is gone. */
  private cgroupId(dir: string): bigint | null {
    try {
      return BigInt(statSync(dir, { bigint: true }).ino);
    } catch {
      return null;
    }
  }

  /**
   * Plugs a freshly started allow/open sandbox in: veth and address, egress entries,
   * programs on its cgroup. Called after the runtime started its init and before the
   * create (or start) returns; nothing of the sandbox's own code has run yet.
   * @throws DsecError Internal (a command or bpf call failed; the caller destroys the sandbox).
   */
  async attach(sb: SandboxRecord, pid: number): Promise<void> {
    if (!SandboxNetworking.hasNetwork(sb)) return;
    const why = this.available();
    if (why) throw failedPrecondition(`sandbox ${sb.id}: ${why}`);
    const slot = this.slotOf(sb);
    const address = addressForSlot(this.subnet, slot);
    // A new container: its counters start at zero, as the kernel's do for its new cgroup.
    rmSync(this.records.countersFile(sb.id), { force: true });
    const l = this.register(sb, slot, address, new Map());
    await this.names.ensure(exactHosts(l.net));
    this.apply(l);
    for (const p of EGRESS_PROGRAMS) this.bpf!.attachCgroup(p, l.cgroupDir);
    await attachVeth(this.instanceNet.name, this.subnet, slot, address, pid);
  }

  /** Creates the in-memory record of an attached sandbox (and indexes it); an adopted one takes up its recorded refusal count. */
  private register(sb: SandboxRecord, slot: number, address: Buffer, pins: Map<string, Map<string, number>>, opts: { adopted?: boolean } = {}): Live {
    const cgroupDir = this.d.cgroup2Dir(sb.id);
    const cgid = this.cgroupId(cgroupDir);
    if (cgid === null) throw internal(`sandbox ${sb.id}: its cgroup2 directory ${cgroupDir} does not exist, so egress programs cannot attach`);
    const prev = this.live.get(sb.id);
    if (prev) this.unregister(prev);
    const found = this.found.get(cgid);
    this.found.delete(cgid);
    const dns = opts.adopted ? this.records.loadCounters(sb.id, cgid) : { dnsRefused: 0, lastRefused: null };
    const l: Live = {
      id: sb.id, slot, address, cgroupDir, cgid, net: this.effective(sb.network), pins, applied: found ?? new Map(),
      // Refusals counted before the restart were reported by then (they were written before they were shown).
      seen: { connect: 0, sendmsg: 0, sockCreate: 0 }, dnsRefused: dns.dnsRefused, dnsRefusedSeen: dns.dnsRefused, lastRefused: dns.lastRefused, pinsDirty: false, countersDirty: false,
    };
    const ctr = this.bpf!.map('egress_counters');
    const existing = ctr.lookup(cgroupKey(cgid));
    if (existing) {
      const c = parseCounters(existing);
      l.seen = { connect: c.connect, sendmsg: c.sendmsg, sockCreate: c.sockCreate };
    } else {
      ctr.update(cgroupKey(cgid), Buffer.alloc(COUNTERS_BYTES), 'noexist');
    }
    this.live.set(sb.id, l);
    this.byAddress.set(formatAddr(address), l);
    return l;
  }

  private unregister(l: Live): void {
    this.live.delete(l.id);
    if (this.byAddress.get(formatAddr(l.address)) === l) this.byAddress.delete(formatAddr(l.address));
  }

  /** Removes every map entry of a cgroup id (trie keys as recorded, the conf and counters). */
  private removeEntries(cgid: bigint, applied: Map<string, Set<string>>): void {
    if (!this.bpf) return;
    for (const [mapName, keys] of applied) {
      const m = this.bpf.map(mapName);
      for (const k of keys) m.delete(Buffer.from(k, 'hex'));
    }
    this.bpf.map('egress_conf').delete(cgroupKey(cgid));
    this.bpf.map('egress_counters').delete(cgroupKey(cgid));
  }

  /**
   * Takes a sandbox off the network: programs detached, map entries removed, veth
   * deleted. Called when its container is gone (stop, destroy, a dead init). Safe on any
   * partial state and twice; entries of a cgroup that vanished unseen are swept by
   * {@link cleanOrphans}.
   */
  async detach(sb: SandboxRecord, opts: { forget?: boolean } = {}): Promise<void> {
    const l = this.live.get(sb.id);
    if (l) {
      this.pollOne(l);
      if (this.bpf && existsSync(l.cgroupDir)) for (const p of EGRESS_PROGRAMS) this.bpf.detachCgroup(p, l.cgroupDir);
      this.removeEntries(l.cgid, l.applied);
      this.unregister(l);
    }
    if (SandboxNetworking.hasNetwork(sb) && sb.uidBase !== null && this.isUp) await detachVeth(this.instanceNet.name, this.slotOf(sb));
    // The container is gone: its counters go with it (as the kernel's do with its cgroup).
    if (SandboxNetworking.hasNetwork(sb)) rmSync(this.records.countersFile(sb.id), { force: true });
    if (opts.forget && SandboxNetworking.hasNetwork(sb)) rmSync(this.records.pinsFile(sb.id), { force: true });
  }

  /**
   * Re-establishes a live allow/open sandbox after a dsecd restart: its veth (redone
   * if it is missing), programs (re-attached: the new load replaces the old in place),
   * and entries (recompiled from the store, names and learned addresses; what the
   * previous dsecd wrote is diffed, not flushed, so enforcement never lapses).
   */
  async adopt(sb: SandboxRecord): Promise<void> {
    if (!SandboxNetworking.hasNetwork(sb) || !sb.initPid) return;
    const why = this.available();
    if (why) {
      this.d.log.error({ id: sb.id, why }, 'adopted sandbox has a network but networking is unavailable; its pinned policy stays as the kernel has it');
      return;
    }
    const slot = this.slotOf(sb);
    const address = addressForSlot(this.subnet, slot);
    const l = this.register(sb, slot, address, this.records.loadPins(sb.id), { adopted: true });
    await this.names.ensure(exactHosts(l.net));
    this.apply(l);
    for (const p of EGRESS_PROGRAMS) this.bpf!.attachCgroup(p, l.cgroupDir);
    if (!(await sandboxLinkOk(sb.initPid, address))) {
      this.d.log.warn({ id: sb.id }, 'adopted sandbox lost its veth; plugging it in again');
      await detachVeth(this.instanceNet.name, slot);
      await attachVeth(this.instanceNet.name, this.subnet, slot, address, sb.initPid);
    }
  }

  /**
   * Applies a new settled network to a running sandbox at once (allow <-> open and rule
   * changes; mode none <-> other is refused by the caller).
   */
  async update(sb: SandboxRecord, spec: NetworkSpec): Promise<void> {
    const l = this.live.get(sb.id);
    if (!l) return;
    l.net = this.effective(spec);
    await this.names.ensure(exactHosts(l.net));
    this.apply(l);
  }

  /**
   * Removes what no attached sandbox accounts for: bridge ports of other slots, map
   * entries of other cgroup ids, pins files of sandboxes that no longer exist. Called
   * after every adopt of a start.
   */
  async cleanOrphans(known: Set<string>): Promise<string[]> {
    const removed: string[] = [];
    if (this.isUp) {
      const slots = new Set([...this.live.values()].map((l) => l.slot));
      for (const v of await listVeths(this.instanceNet.name).catch(() => [])) {
        if (!slots.has(v.slot)) {
          await detachVeth(this.instanceNet.name, v.slot);
          removed.push(`veth ${vethName(v.slot)}`);
        }
      }
    }
    for (const [cgid, applied] of this.found) {
      this.removeEntries(cgid, applied);
      removed.push(`egress entries of cgroup ${cgid}`);
    }
    this.found.clear();
    const liveCg = new Set([...this.live.values()].map((l) => l.cgid));
    if (this.bpf) {
      for (const k of this.bpf.map('egress_counters').keys()) {
        const cg = k.readBigUInt64LE(0);
        if (!liveCg.has(cg)) this.bpf.map('egress_counters').delete(k);
      }
    }
    try {
      for (const f of readdirSync(path.join(this.stateDir, 'pins'))) {
        if (!known.has(f.replace(/\.json$/, ''))) rmSync(path.join(this.stateDir, 'pins', f), { force: true });
      }
    } catch { /* none */ }
    try {
      for (const f of readdirSync(path.join(this.stateDir, 'counters'))) {
        if (!this.live.has(f.replace(/\.json$/, ''))) rmSync(path.join(this.stateDir, 'counters', f), { force: true });
      }
    } catch { /* none */ }
    this.names.retain(new Set([...this.live.values()].flatMap((l) => exactHosts(l.net))));
    return removed;
  }

  /** A host-rule name's addresses changed: recompile every sandbox that names it. */
  private nameChanged(name: string): void {
    for (const l of this.live.values()) {
      if (exactHosts(l.net).includes(name)) {
        try {
          this.apply(l);
        } catch (e) {
          this.d.log.error({ err: e, id: l.id, name }, 'applying refreshed host addresses failed');
        }
      }
    }
  }

  /** The resolver's question from `src`: see daemon/net/resolver-child.ts. */
  private decide(src: string, name: string, type: number): { action: 'refuse' | 'forward'; report: boolean } {
    const l = this.byAddress.get(src);
    const refuse = (why: string) => {
      if (l) {
        l.dnsRefused++;
        l.lastRefused = `${name} ${typeName(type)} (${why})`;
        l.countersDirty = true;
      }
      return { action: 'refuse' as const, report: false };
    };
    if (!l) return refuse('unknown source');
    const d = dnsDecision(l.net, name);
    if (d.action === 'refuse') return refuse(d.reason);
    return { action: 'forward', report: d.patterns.length > 0 };
  }

  /** Puts the addresses the upstream answered for `name` into the maps of the sandbox at `src`, under every allow host rule the name matches. */
  private pinAnswer(src: string, name: string, addrs: { family: 4 | 6; address: string; ttl: number }[]): void {
    const l = this.byAddress.get(src);
    if (!l) throw internal(`no attached sandbox has address ${src}`);
    const d = dnsDecision(l.net, name);
    if (d.action !== 'forward') return;
    const now = Date.now();
    for (const pattern of d.patterns) {
      let m = l.pins.get(pattern);
      if (!m) l.pins.set(pattern, (m = new Map()));
      for (const a of addrs) {
        const parsed = parseAddr(a.address);
        if (!parsed) continue;
        m.set(formatAddr(parsed.bytes), now + Math.min(PIN_MAX_S, a.ttl + PIN_GRACE_S) * 1000);
      }
    }
    prunePins(l.pins, now);
    l.pinsDirty = true;
    this.apply(l);
  }

  /** Reads one sandbox's counters and emits events for what increased since the last read. */
  private pollOne(l: Live): void {
    if (!this.bpf) return;
    const v = this.bpf.map('egress_counters').lookup(cgroupKey(l.cgid));
    if (v) {
      const c = parseCounters(v);
      const dc = c.connect - l.seen.connect, ds = c.sendmsg - l.seen.sendmsg, dk = c.sockCreate - l.seen.sockCreate;
      if (dc > 0 || ds > 0 || dk > 0) {
        this.d.event(l.id, 'network.denied', `connect=${dc} sendmsg=${ds} sock_create=${dk} last=${describeLast(c) ?? 'none'}`);
        l.seen = { connect: c.connect, sendmsg: c.sendmsg, sockCreate: c.sockCreate };
      }
    }
    if (l.dnsRefused > l.dnsRefusedSeen) {
      this.records.saveCounters(l);
      this.d.event(l.id, 'network.dns_refused', `refused=${l.dnsRefused - l.dnsRefusedSeen} last=${l.lastRefused}`);
      l.dnsRefusedSeen = l.dnsRefused;
    }
    // Expired learned addresses leave the maps.
    const now = Date.now();
    let expired = false;
    for (const m of l.pins.values()) for (const [a, exp] of m) if (exp <= now) { m.delete(a); expired = true; }
    if (expired) {
      l.pinsDirty = true;
      try { this.apply(l); } catch (e) { this.d.log.error({ err: e, id: l.id }, 'removing expired DNS addresses failed'); }
    }
  }

  private pollCounters(): void {
    for (const l of this.live.values()) {
      try {
        this.pollOne(l);
      } catch (e) {
        this.d.log.warn({ err: e, id: l.id }, 'reading egress counters failed');
      }
    }
  }

  /** The network of a sandbox as the API shows it (live counters when attached). */
  view(sb: SandboxRecord): NetworkView {
    const l = this.live.get(sb.id);
    if (l) this.pollOne(l);
    const eff = (() => {
      try { return this.effective(sb.network); } catch { return { mode: 'none' as const, allow: [], deny: [] }; }
    })();
    const counters = l && this.bpf ? this.bpf.map('egress_counters').lookup(cgroupKey(l.cgid)) : null;
    const c = counters ? parseCounters(counters) : null;
    if (l) this.records.saveCounters(l);
    const has = eff.mode !== 'none';
    return {
      mode: eff.mode,
      policy: eff.policy ?? null,
      allow: eff.allow,
      deny: eff.deny,
      address: has && sb.uidBase !== null ? formatAddr(addressForSlot(this.subnet, this.slotOf(sb))) : null,
      gateway: has ? this.gateway : null,
      resolver: has ? `${this.gateway}:53` : null,
      attached: !!l,
      hosts: Object.fromEntries(exactHosts(eff).map((h) => [h, [...this.names.addresses(h)]])),
      learned: l ? [...l.pins.values()].reduce((n, m) => n + m.size, 0) : 0,
      denied: { connect: c?.connect ?? 0, sendmsg: c?.sendmsg ?? 0, sock_create: c?.sockCreate ?? 0, dns_refused: l?.dnsRefused ?? 0, last: c ? describeLast(c) : null },
    };
  }

  /** Denial counters of an attached sandbox (per-sandbox stats), or null when it has no network attached. */
  denials(sb: SandboxRecord): NetworkView['denied'] | null {
    const l = this.live.get(sb.id);
    const v = l && this.bpf ? this.bpf.map('egress_counters').lookup(cgroupKey(l.cgid)) : null;
    if (!l || !v) return null;
    const c = parseCounters(v);
    this.records.saveCounters(l);
    return { connect: c.connect, sendmsg: c.sendmsg, sock_create: c.sockCreate, dns_refused: l.dnsRefused, last: describeLast(c) };
  }

  /** Sandboxes attached now (ids), for tests and host info. */
  attachedIds(): string[] {
    return [...this.live.keys()];
  }

  /** Whether the resolver child is serving. */
  resolverRunning(): boolean {
    return !!this.resolver?.running;
  }

  /** Host-level `defences` entries: network_namespace, egress_policy, dns_policy. */
  hostDefences(): Record<string, { enforced: boolean; detail: string }> {
    const why = this.available();
    return {
      network_namespace: { enforced: true, detail: `every sandbox has its own network namespace: mode none has loopback only; allow/open sandboxes get a veth on an isolated port of bridge ${this.gateway} in instance netns ${this.instanceNet.name} (never the host's), NAT and ${this.d.config.userMode === 'slirp4netns' ? `slirp4netns uplink${this.d.config.hostLoopback ? ' with host loopback reachable' : ', host loopback off'}` : 'operator-provided routing'}${why ? `; allow/open unavailable here: ${why}` : ''}` },
      egress_policy: why
        ? { enforced: false, detail: `allow/open sandboxes are refused: ${why}` }
        : { enforced: true, detail: 'cgroup eBPF connect4/6, sendmsg4/6 and sock_create programs per allow/open sandbox: allow-list or deny-list by prefix, port and protocol (host rules resolved by dsecd), bridge and host addresses always denied, raw and non-TCP/UDP sockets denied, CAP_NET_RAW dropped; denials counted into events' },
      dns_policy: why
        ? { enforced: false, detail: `no sandbox resolver: ${why}` }
        : { enforced: true, detail: `resolver on ${this.gateway}:53 in the instance netns: allow mode answers only names of allow host rules (their addresses enter the egress maps before the answer), refuses the rest without forwarding; open mode forwards all but deny host rules; DNS to other servers is denied in open mode` },
    };
  }

  /** Per-sandbox `defences` entries. */
  sandboxDefences(sb: SandboxRecord): Record<string, { enforced: boolean; detail: string }> {
    if (!SandboxNetworking.hasNetwork(sb)) {
      return {
        network_namespace: { enforced: true, detail: 'mode none: own network namespace with loopback only, no route out' },
        egress_policy: { enforced: true, detail: 'mode none: nothing leaves the sandbox (no interface but loopback)' },
        dns_policy: { enforced: true, detail: 'mode none: no resolver; no name resolves outside the sandbox' },
      };
    }
    const l = this.live.get(sb.id);
    const attached = !!l && !!this.bpf && this.bpf.attachedTo(EGRESS_PROGRAMS[0], l.cgroupDir).length > 0;
    const mode = sb.network!.mode;
    return {
      network_namespace: { enforced: true, detail: `mode ${mode}: own network namespace, veth on an isolated bridge port in ${this.instanceNet.name}, no CAP_NET_ADMIN or CAP_NET_RAW` },
      egress_policy: attached
        ? { enforced: true, detail: `mode ${mode}: egress programs attached to the sandbox's cgroup (${mode === 'allow' ? 'only allow rules, minus deny' : 'everything but deny rules'}; bridge and host addresses denied)` }
        : { enforced: false, detail: sb.state === 'running' || sb.state === 'paused' ? 'egress programs are not attached (see dsecd\'s log)' : `sandbox is ${sb.state}; programs are attached when it starts` },
      dns_policy: { enforced: this.resolverRunning(), detail: this.resolverRunning() ? `resolver ${this.gateway}:53: ${mode === 'allow' ? 'answers only allow host rules' : 'refuses deny host rules'}` : 'the sandbox resolver is not running; DNS questions go unanswered' },
    };
  }

  /** Stops timers and the resolver (dsecd shutdown); attachments and pinned maps stay in force. */
  async close(): Promise<void> {
    if (this.poll) clearInterval(this.poll);
    if (this.pinWriter) clearInterval(this.pinWriter);
    this.instanceNet.unwatch();
    this.records.writePins(this.live.values());
    for (const l of this.live.values()) this.records.saveCounters(l);
    this.names.close();
    await this.resolver?.close();
    this.bpf?.close();
  }

  /**
   * `dsecd --purge`: after every sandbox was destroyed, removes the instance netns,
   * slirp4netns, the resolver, the egress pins and learned addresses.
   */
  async purge(): Promise<void> {
    await this.close();
    await this.instanceNet.remove();
    rmSync(path.join(this.d.root, 'bpf', 'egress'), { recursive: true, force: true });
    rmSync(this.stateDir, { recursive: true, force: true });
  }
}

