/**
 * Network flags of `dsec create`, `dsec run`, `dsec restore` and `dsec network set`:
 *
 *   --network MODE            none (default), allow or open
 *   --allow DEST[:PORTS][/PROTO]   repeatable; DEST is a CIDR, an address or a host name
 *   --deny  DEST[:PORTS][/PROTO]   (`*.example.org` for every name below); PORTS is a comma
 *                             list of ports and low-high ranges; PROTO is tcp or udp
 *                             (default both). IPv6 with ports: [2001:db8::/32]:443.
 *   --network-policy NAME     a named policy (`dsec network policies`)
 *
 * `--allow` without `--network` or a policy means `--network allow`; `--deny` alone needs
 * a mode, since deny rules mean something different in each.
 *
 * `dsec network add` and `dsec network rm` take `--allow`/`--deny` alone
 * ({@link addRuleOptions}) and change a sandbox's own rules one by one
 * ({@link addRules}, {@link removeRules}), read, changed and written back with
 * {@link changeNetwork}, which never overwrites a change made in between.
 */
import type { Command } from 'commander';
import { DsecApiError, type DsecClient, type NetworkInput, type SandboxNetwork } from '../../sdk/index.js';
import { formatRule } from '../ui/network.js';
import { UserError } from './errors.js';
import { flag } from './parse.js';

/** Network modes the API names. */
export const NETWORK_MODES = ['none', 'allow', 'open'] as const;

type Rule = NonNullable<NetworkInput['allow']>[number];

const RULE_HINT = 'rules are DEST[:PORTS][/tcp|/udp]: 10.0.0.0/8:443, pypi.org:443/tcp, *.pythonhosted.org, [2001:db8::/32]:443,8000-8080';

/** Parses one `--allow`/`--deny` value into an API egress rule (the daemon validates prefixes and names further). */
export function parseRule(text: string): Rule {
  let s = text.trim();
  let protocol: 'tcp' | 'udp' | undefined;
  const pm = /\/(tcp|udp)$/i.exec(s);
  if (pm) {
    protocol = pm[1].toLowerCase() as 'tcp' | 'udp';
    s = s.slice(0, -pm[0].length);
  }
  let dest = s;
  let portText: string | undefined;
  if (s.startsWith('[')) {
    const end = s.indexOf(']');
    if (end < 0) throw new UserError(`unclosed [ in rule ${JSON.stringify(text)}`, RULE_HINT);
    dest = s.slice(1, end);
    const rest = s.slice(end + 1);
    if (rest) {
      if (!rest.startsWith(':')) throw new UserError(`expected :PORTS after ] in rule ${JSON.stringify(text)}`, RULE_HINT);
      portText = rest.slice(1);
    }
  } else if ((s.match(/:/g) ?? []).length === 1) {
    [dest, portText] = s.split(':');
  }
  if (!dest) throw new UserError(`rule ${JSON.stringify(text)} names no destination`, RULE_HINT);
  const ports = portText === undefined ? undefined : portText.split(',').map((p) => {
    if (/^\d{1,5}$/.test(p) && Number(p) >= 1 && Number(p) <= 65535) return Number(p);
    if (/^\d{1,5}-\d{1,5}$/.test(p)) return p;
    throw new UserError(`invalid port ${JSON.stringify(p)} in rule ${JSON.stringify(text)}`, 'ports are 1-65535 or low-high ranges, comma-separated, e.g. :443 or :80,8000-8080');
  });
  const isAddress = /^[0-9.]+(\/\d+)?$/.test(dest) || dest.includes(':');
  return { ...(isAddress ? { cidr: dest } : { host: dest }), ...(ports ? { ports } : {}), ...(protocol ? { protocol } : {}) };
}

/** Parsed network flags. */
export interface NetworkFlags {
  network?: string;
  allow?: Rule[];
  deny?: Rule[];
  networkPolicy?: string;
}

/** Commander collector for repeatable rules. */
function collectRule(text: string, prev: Rule[] | undefined): Rule[] {
  return [...(prev ?? []), parseRule(text)];
}

/** Parses `--network`. */
function parseMode(text: string): string {
  if (!(NETWORK_MODES as readonly string[]).includes(text)) {
    throw new UserError(`unknown network mode ${JSON.stringify(text)}`, 'none (loopback only, the default), allow (only --allow destinations) or open (anything but --deny)');
  }
  return text;
}

/** Adds `--allow` and `--deny` (repeatable rules) to `cmd`; `verb` words their help (`allow egress to`, `stop allowing egress to`). */
export function addRuleOptions(cmd: Command, verb: { allow: string; deny: string }): Command {
  return cmd
    .option('--allow <rule>', `${verb.allow} DEST[:PORTS][/tcp|/udp] (CIDR, address or host name, *.name for every name below), repeatable`, flag('--allow', collectRule))
    .option('--deny <rule>', `${verb.deny} DEST[:PORTS][/tcp|/udp], repeatable`, flag('--deny', collectRule));
}

/**
 * The key two rules are compared by: the rule as the flags write it, with the host name
 * lower-cased (DNS names are case-insensitive), ports in the order given, and `any` as no
 * protocol. `pypi.org:443/tcp` and `PyPI.org:443/tcp` are the same rule; `pypi.org:443`
 * (both protocols) is not the same as `pypi.org:443/tcp`.
 */
export function ruleKey(r: Rule): string {
  const dest = r.host !== undefined ? `host ${r.host.toLowerCase()}` : `cidr ${r.cidr ?? ''}`;
  return `${dest} ${(r.ports ?? []).join(',')} ${r.protocol === undefined || r.protocol === 'any' ? '' : r.protocol}`;
}

/** A sandbox's own rules (its NetworkSpec's allow and deny, not its policy's). */
export interface OwnRules {
  allow: Rule[];
  deny: Rule[];
}

/**
 * `current` with `add`'s rules appended (each kind in the order given); a rule already
 * there is left where it is and reported in `present`.
 */
export function addRules(current: OwnRules, add: Partial<OwnRules>): { rules: OwnRules; present: Rule[] } {
  const present: Rule[] = [];
  const merge = (have: Rule[], more: Rule[] = []) => {
    const out = [...have];
    const keys = new Set(have.map(ruleKey));
    for (const r of more) {
      if (keys.has(ruleKey(r))) present.push(r);
      else {
        keys.add(ruleKey(r));
        out.push(r);
      }
    }
    return out;
  };
  return { rules: { allow: merge(current.allow, add.allow), deny: merge(current.deny, add.deny) }, present };
}

/**
 * `current` without `remove`'s rules (compared by {@link ruleKey}).
 * @throws UserError naming every rule that is not among the sandbox's own rules of its
 *   kind (a policy's rules cannot be removed one by one: `dsec network set` drops the policy).
 */
export function removeRules(current: OwnRules, remove: Partial<OwnRules>): OwnRules {
  const missing: string[] = [];
  const drop = (kind: 'allow' | 'deny') => {
    const gone = new Set((remove[kind] ?? []).map(ruleKey));
    for (const r of remove[kind] ?? []) if (!current[kind].some((c) => ruleKey(c) === ruleKey(r))) missing.push(`--${kind} ${formatRule(r)}`);
    return current[kind].filter((r) => !gone.has(ruleKey(r)));
  };
  const rules = { allow: drop('allow'), deny: drop('deny') };
  if (missing.length) {
    const own = [...current.allow.map((r) => `--allow ${formatRule(r)}`), ...current.deny.map((r) => `--deny ${formatRule(r)}`)];
    throw new UserError(
      `the sandbox has no such rule of its own: ${missing.join(', ')}`,
      own.length ? `its own rules are: ${own.join(' ')} (a policy's rules go with \`dsec network set ID --network-policy ...\`)` : 'it has no rules of its own; `dsec network show ID` shows the rules in force (its policy\'s)',
    );
  }
  return rules;
}

/** Adds `--network`, `--allow`, `--deny`, `--network-policy` to `cmd`. */
export function addNetworkOptions(cmd: Command): Command {
  return cmd
    .option('--network <mode>', `network: ${NETWORK_MODES.join(', ')} (default none: loopback only)`, flag('--network', parseMode))
    .option('--allow <rule>', 'allow egress to DEST[:PORTS][/tcp|/udp] (CIDR, address or host name, *.name for every name below), repeatable; implies --network allow', flag('--allow', collectRule))
    .option('--deny <rule>', 'deny egress to DEST[:PORTS][/tcp|/udp], repeatable; wins over --allow', flag('--deny', collectRule))
    .option('--network-policy <name>', 'merge a named network policy (`dsec network policies` lists them); its mode applies unless --network is given');
}

/** The API network for parsed flags, or undefined when none was given. @throws UserError for --deny without a mode. */
export function networkRequest(f: NetworkFlags): NetworkInput | undefined {
  if (f.network === undefined && !f.allow && !f.deny && f.networkPolicy === undefined) return undefined;
  let mode = f.network as NetworkInput['mode'];
  if (mode === undefined && f.networkPolicy === undefined) {
    if (f.allow) mode = 'allow';
    else throw new UserError('--deny needs a network mode', 'add --network open (everything but the denied destinations) or --network allow with --allow rules');
  }
  return {
    ...(mode !== undefined ? { mode } : {}),
    ...(f.networkPolicy !== undefined ? { policy: f.networkPolicy } : {}),
    ...(f.allow ? { allow: f.allow } : {}),
    ...(f.deny ? { deny: f.deny } : {}),
  };
}

/** Most times {@link changeNetwork} reads and writes again after a Conflict: a sandbox whose rules change that often is being fought over. */
export const NETWORK_CHANGE_ATTEMPTS = 20;

/**
 * Reads sandbox `id`'s own network spec, changes it with `change` and writes it back
 * only if nobody changed it in between (PUT .../network?if_revision=, optimistic
 * concurrency): on Conflict it reads again and calls `change` again, up to
 * {@link NETWORK_CHANGE_ATTEMPTS} times, so two `dsec network add`/`rm` racing on one
 * sandbox both take effect. The revision is read before the spec, so a change made after
 * it was read moves it on and the write is refused rather than losing that change. A
 * dsecd that answers no revision gets a plain write.
 * @returns the network as the successful write answered it.
 * @throws what `change` throws (e.g. UserError), and the API's errors (Conflict after the last attempt).
 */
export async function changeNetwork(client: DsecClient, id: string, change: (spec: NetworkInput) => NetworkInput): Promise<SandboxNetwork> {
  for (let attempt = 1; ; attempt++) {
    const { revision } = await client.getNetwork(id);
    const spec = (await client.getSandbox(id)).network ?? {};
    try {
      return await client.setNetwork(id, change(spec), { ifRevision: revision });
    } catch (e) {
      if (!(e instanceof DsecApiError && e.code === 'Conflict') || attempt >= NETWORK_CHANGE_ATTEMPTS) throw e;
    }
  }
}
