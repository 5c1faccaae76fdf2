/**
 * The E2B front's state and the rules shared by its control plane (control.ts) and its
 * envd (envd.ts, process.ts, filesystem.ts): who owns a sandbox, who sees it, users and
 * homes inside it, and the processes started through it.
 *
 * Mapping (docs/E2B.md "From E2B to dsec"):
 * - a sandbox the front creates is an ordinary dsec sandbox; its labels are the E2B
 *   metadata plus `dsec.e2b.template` (the templateID asked for) and `dsec.e2b.tenant`
 *   (the tenant of the API key that created it);
 * - E2B's timeout is dsec's TTL (`ttl_s`, seconds from creation), pause and connect are
 *   dsec's pause and resume (a pause drops the TTL: a paused E2B sandbox waits to be
 *   resumed; connect sets it again);
 * - the API key is a dsec token (daemon/remote/tokens.ts): a `user` or `reader` token sees
 *   the sandboxes of its tenant only, an `admin` token every sandbox;
 * - envd requests carry no API key: a per-sandbox access token (tokens.ts) is the proof.
 */
import path from 'node:path';
import type { Logger } from 'pino';
import type { Principal } from '../../remote/door.js';
import type { Sandbox } from '../wire/sandboxes.js';
import { invalidArgument } from '../../errors.js';
import type { E2bHost, HostProcess } from './host.js';
import type { EnvdTokens } from './tokens.js';
import type { TemplateStore } from './templates.js';

/** Label naming the tenant that created a sandbox through the E2B front. */
export const TENANT_LABEL = 'dsec.e2b.tenant';
/** Label naming the E2B templateID a sandbox was created from. */
export const TEMPLATE_LABEL = 'dsec.e2b.template';

/**
 * The envd version dsecd reports (`envdVersion`). The SDKs gate features on it; 0.5.7 is
 * what dsecd implements: a default user (0.4.0: no user sent means the template's),
 * stdin control (0.3.0) and closing stdin (0.5.2), octet-stream uploads (0.5.7). File
 * metadata (0.6.2) is not offered, so the SDKs refuse it up front instead of dsecd
 * dropping it.
 */
export const ENVD_VERSION = '0.5.7';

/** The E2B SDKs' default user inside a sandbox. */
export const DEFAULT_E2B_USER = 'user';

/** Settings of the E2B front (`[e2b]`, daemon/config.ts). */
export interface E2bSettings {
  /** Timeout of a create or connect that names none, seconds (default 300: what E2B's SDKs have sent by default). */
  defaultTimeoutS: number;
  /**
   * Network mode of a sandbox whose create allows internet access (E2B's default),
   * `none` unless the operator opens egress (`[e2b] internet`); `allow_internet_access:
   * false` is always mode none.
   */
  internet: 'none' | 'allow' | 'open';
}

/** One account of a sandbox's /etc/passwd. */
export interface Account {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

/** A sandbox's accounts and groups, read once a while. */
interface Accounts {
  at: number;
  users: Account[];
  groups: Map<number, string>;
}

/** How long a sandbox's /etc/passwd and /etc/group are trusted once read: 5 s. */
const ACCOUNTS_TTL_MS = 5000;
/** Cached sandboxes past which stale entries are swept at the next read: 256 (a few KiB each at most). */
const ACCOUNTS_SWEEP_AT = 256;

/** A process started through envd: the process, how it was asked for, its tag. */
export interface E2bProcessEntry {
  proc: HostProcess;
  config: { cmd: string; args: string[]; envs: Record<string, string>; cwd?: string };
  tag?: string;
  tty: boolean;
}

/** The user a request acts as inside a sandbox, resolved. */
export interface ActingUser {
  /** Name (or uid) given to the agent; undefined: the image's default. */
  user: string | undefined;
  /** Home directory: relative paths and the default cwd. */
  home: string;
  account: Account | null;
}

/** The E2B front (see the module comment). */
export class E2bFront {
  private readonly accounts = new Map<string, Accounts>();
  private readonly procs = new Map<string, Map<number, E2bProcessEntry>>();

  constructor(
    readonly host: E2bHost,
    readonly tokens: EnvdTokens,
    readonly templates: TemplateStore,
    readonly settings: E2bSettings,
    readonly log: Logger,
  ) {}

  /**
   * The tenant that owns `sb`: the one whose key created it through the E2B front; null
   * for sandboxes made otherwise (`dsec create`, a restore), which only admins see here.
   * When sandboxes carry a tenant of their own (issue 19's tenancy), read it here.
   */
  ownerOf(sb: Sandbox): string | null {
    return sb.labels[TENANT_LABEL] ?? null;
  }

  /** Whether `p` may see and act on `sb` through the E2B front: its owner's tenant, or an admin. */
  visible(p: Principal, sb: Sandbox): boolean {
    return p.role === 'admin' || this.ownerOf(sb) === p.tenant;
  }

  /** The E2B state of a dsec sandbox: running, paused (paused, stopped, failed: connect brings them back), or null (not listed: creating, destroyed). */
  stateOf(sb: Sandbox): 'running' | 'paused' | null {
    if (sb.state === 'running') return 'running';
    if (sb.state === 'paused' || sb.state === 'stopped' || sb.state === 'failed') return 'paused';
    return null;
  }

  /** The sandbox's metadata as E2B shows it: its labels outside the reserved `dsec.` namespace. */
  metadataOf(sb: Sandbox): Record<string, string> {
    return Object.fromEntries(Object.entries(sb.labels).filter(([k]) => !k.startsWith('dsec.')));
  }

  /** The templateID E2B shows: the one it was created from, else its image. */
  templateOf(sb: Sandbox): string {
    return sb.labels[TEMPLATE_LABEL] ?? sb.image;
  }

  /**
   * The accounts of a running sandbox (its /etc/passwd and /etc/group, as root), cached
   * {@link ACCOUNTS_TTL_MS}; empty when they cannot be read (an image without them).
   */
  async accountsOf(id: string): Promise<Accounts> {
    const now = Date.now();
    const hit = this.accounts.get(id);
    if (hit && now - hit.at < ACCOUNTS_TTL_MS) return hit;
    const files = await this.host.files(id);
    const read = async (p: string): Promise<string> => {
      try {
        const f = files.readFile(p, { user: '0' });
        const chunks: Buffer[] = [];
        for await (const c of f.stream) chunks.push(c as Buffer);
        await f.done;
        return Buffer.concat(chunks).toString('utf8');
      } catch {
        return '';
      }
    };
    const [passwd, group] = await Promise.all([read('/etc/passwd'), read('/etc/group')]);
    const users: Account[] = [];
    for (const line of passwd.split('\n')) {
      const f = line.split(':');
      if (f.length >= 7 && /^\d+$/.test(f[2]) && /^\d+$/.test(f[3])) users.push({ name: f[0], uid: Number(f[2]), gid: Number(f[3]), home: f[5] || '/' });
    }
    const groups = new Map<number, string>();
    for (const line of group.split('\n')) {
      const f = line.split(':');
      if (f.length >= 3 && /^\d+$/.test(f[2])) groups.set(Number(f[2]), f[0]);
    }
    const a = { at: now, users, groups };
    // Entries of sandboxes gone by other means (a TTL, `dsec rm`) are dropped once stale.
    if (this.accounts.size >= ACCOUNTS_SWEEP_AT) for (const [k, v] of this.accounts) if (now - v.at >= ACCOUNTS_TTL_MS) this.accounts.delete(k);
    this.accounts.set(id, a);
    return a;
  }

  /**
   * Who a request acts as: `requested` (E2B's `username`, from Basic authorization or a
   * query) when given, else the SDKs' default `user` when the sandbox has that account,
   * else the image's default user.
   * @throws DsecError InvalidArgument for a malformed user name.
   */
  async actingUser(id: string, requested: string | undefined): Promise<ActingUser> {
    if (requested !== undefined && requested !== '' && !/^[A-Za-z0-9_.-]+$/.test(requested)) {
      throw invalidArgument(`user ${JSON.stringify(requested)}: a name or uid of the sandbox (letters, digits, '.', '_', '-')`);
    }
    const { users } = await this.accountsOf(id);
    const want = requested || DEFAULT_E2B_USER;
    const account = users.find((u) => u.name === want || (/^\d+$/.test(want) && u.uid === Number(want))) ?? null;
    if (!requested && !account) {
      // No `user` account (an image not made for E2B): the image's own default user, and root's home.
      const root = users.find((u) => u.uid === 0) ?? null;
      return { user: undefined, home: root?.home ?? '/', account: root };
    }
    return { user: want, home: account && account.home !== '/nonexistent' ? account.home : '/', account };
  }

  /**
   * An E2B path as an absolute sandbox path: `~` and `~/x` are under `home`, a relative
   * path is relative to `home` (envd's rule), an absolute one is normalised.
   * @throws DsecError InvalidArgument for an empty path or one with a NUL.
   */
  resolvePath(p: string, home: string): string {
    if (p === '' || p.includes('\0')) throw invalidArgument(`path ${JSON.stringify(p)}: a path is required (absolute, or relative to the user's home)`);
    if (p === '~') return home;
    if (p.startsWith('~/')) return path.posix.join(home, p.slice(2));
    return path.posix.resolve(home, p);
  }

  /** Name of uid `uid` in the sandbox, else the number. */
  async userName(id: string, uid: number): Promise<string> {
    return (await this.accountsOf(id)).users.find((u) => u.uid === uid)?.name ?? String(uid);
  }

  /** Name of gid `gid` in the sandbox, else the number. */
  async groupName(id: string, gid: number): Promise<string> {
    return (await this.accountsOf(id)).groups.get(gid) ?? String(gid);
  }

  /** The processes of sandbox `id` started through envd, by pid. */
  processes(id: string): Map<number, E2bProcessEntry> {
    let m = this.procs.get(id);
    if (!m) {
      m = new Map();
      this.procs.set(id, m);
    }
    return m;
  }

  /** Remembers a started process until it ends. */
  track(id: string, e: E2bProcessEntry): void {
    const pid = e.proc.pid;
    if (pid === null) return;
    const m = this.processes(id);
    m.set(pid, e);
    void e.proc.wait().catch(() => {}).then(() => {
      if (m.get(pid) === e) m.delete(pid);
      if (m.size === 0 && this.procs.get(id) === m) this.procs.delete(id);
    });
  }

  /** Forgets what the front cached of sandbox `id` (it was destroyed). */
  forget(id: string): void {
    this.accounts.delete(id);
  }
}

/**
 * E2B's timeout as a dsec TTL: the TTL (seconds from creation) that ends the sandbox
 * `timeoutS` seconds from `now`.
 */
export function ttlFor(createdAt: number, timeoutS: number, now = Date.now()): number {
  return Math.max(1, Math.ceil((now - createdAt) / 1000) + timeoutS);
}
