/**
 * Network policy files at run time: loaded at start (problems logged, the rest loaded)
 * and reloaded on SIGHUP or POST /v1/network/policies/reload (all or nothing), with every
 * sandbox naming a changed policy re-applied.
 */
import type { Logger } from 'pino';
import type { SandboxRepo } from '../db/sandboxes.js';
import type { PolicySet } from '../security/egress-policy.js';
import type { SandboxLifecycle } from '../sandbox/lifecycle.js';

/** What a reload did: the set's report, the sandboxes re-applied, and those whose policy's mode changed (whether each took it). */
export type PolicyReloadReport = ReturnType<PolicySet['reload']> & {
  reapplied: string[];
  modes: { id: string; policy: string; mode: 'allow' | 'open'; policy_mode: 'allow' | 'open'; changed: boolean }[];
};

/** Loads the policies at start, logging files skipped, shipped policies shadowed and allow rules that never take effect. */
export function loadPolicies(policies: PolicySet, log: Logger): void {
  for (const p of policies.loadInitial()) log.error({ file: p.file }, `network policy skipped: ${p.message}`);
  for (const sh of policies.report().shadowed) log.warn(sh, `network policy ${sh.name}: ${sh.file} shadows the shipped ${sh.shadows}`);
  for (const w of policies.report().warnings) log.warn({ policy: w.policy, file: w.file }, `network policy ${w.policy}: ${w.message}`);
}

/**
 * Reloads policy files (all or nothing) and re-applies changed ones to the sandboxes
 * naming them. Reports (log, events, result) shadowed shipped policies, allow rules
 * that never take effect, and every sandbox whose policy's mode changed: a sandbox
 * keeps the mode settled at its create (an allow sandbox never opens up by a reload);
 * only a stored network without a mode of its own takes the policy's new one.
 * @throws DsecError InvalidArgument (a malformed file: the previous set stays).
 */
export async function reloadPolicies(d: { policies: PolicySet; repo: SandboxRepo; lifecycle: Pick<SandboxLifecycle, 'setNetwork'>; log: Logger }): Promise<PolicyReloadReport> {
  const { policies, repo, log } = d;
  const inUse = new Set(repo.all().map((s) => s.network?.policy).filter((p): p is string => !!p));
  const modeBefore = new Map([...inUse].map((n) => [n, policies.get(n)?.mode]));
  const r = policies.reload(inUse);
  const reapplied: string[] = [];
  const modes: PolicyReloadReport['modes'] = [];
  for (const sb of repo.all()) {
    const name = sb.network?.policy;
    if (!name || !r.changed.includes(name)) continue;
    const before = sb.network!.mode ?? modeBefore.get(name);
    const done = await d.lifecycle.setNetwork(sb.id, sb.network!);
    reapplied.push(sb.id);
    const policyMode = policies.get(name)!.mode;
    if (modeBefore.get(name) !== policyMode) {
      const mode = done.network!.mode as 'allow' | 'open';
      const changed = before !== mode;
      modes.push({ id: sb.id, policy: name, mode, policy_mode: policyMode, changed });
      const msg = changed ? `policy ${name} now has mode ${policyMode}; the sandbox took it (its network names no mode of its own)`
        : `policy ${name} now has mode ${policyMode}; the sandbox keeps mode ${mode}, settled at its create (set its network to change it)`;
      repo.event('network.policy_mode_changed', done, msg);
      log.warn({ id: sb.id, policy: name, mode, policyMode }, msg);
    }
  }
  for (const sh of r.shadowed) log.warn(sh, `network policy ${sh.name}: ${sh.file} shadows the shipped ${sh.shadows}`);
  for (const w of r.warnings) log.warn({ policy: w.policy, file: w.file }, `network policy ${w.policy}: ${w.message}`);
  const list = (xs: string[]) => xs.join(',') || 'none';
  repo.event('network.policies_reloaded', null, `loaded=${list(r.loaded)} changed=${list(r.changed)} reapplied=${reapplied.length}`
    + ` shadowed=${list(r.shadowed.map((x) => x.name))} warnings=${r.warnings.length}${r.warnings.length ? ` (${[...new Set(r.warnings.map((w) => w.policy))].join(',')})` : ''}`
    + (modes.length ? ` mode_changed=${modes.map((m) => `${m.id}:${m.changed ? 'took' : 'kept'}-${m.mode}`).join(',')}` : ''));
  return { ...r, reapplied, modes };
}
