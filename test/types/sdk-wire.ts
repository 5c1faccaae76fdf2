/**
 * Compile-time check that the SDK's generated wire types (sdk/types.gen.ts, from
 * docs/api/openapi.json) say exactly what the daemon's zod schemas say: for every type the
 * SDK names (sdk/types.ts), the generated type and zod's inferred type (output for
 * responses, input for requests) are assignable to each other. Compiled by the main build
 * (tsconfig.json lists this file), so a schema feature the JSON Schema route cannot
 * carry (a transform, a custom type) fails the build at the line naming the schema.
 *
 * Not checked: ErrorBody, whose `code` zod infers as `string` (an enum of a runtime list)
 * while the generated type lists the kinds, which is what the SDK wants.
 */
import type { z } from 'zod';
import type * as W from '../../daemon/api/schema.js';
import type * as J from '../../daemon/api/schema.js';
import type * as F from '../../daemon/api/routes/files.js';
import type { components } from '../../sdk/types.gen.js';
type S = components['schemas'];
/** True when A and B are assignable to each other. */
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
type Check<T extends true> = T;
/** The generated component K against zod's output (response) type of Z. */
type O<K extends keyof S, Z extends z.ZodType> = Same<S[K], z.output<Z>>;
/** The generated component K against zod's input (request) type of Z. */
type I<K extends keyof S, Z extends z.ZodType> = Same<S[K], z.input<Z>>;
/** One entry per type the SDK names; each must be `true`. */
export type Checks = [
  Check<O<'Sandbox', typeof W.Sandbox>>,
  Check<O<'Event', typeof W.Event>>,
  Check<O<'ExecResult', typeof W.ExecResult>>,
  Check<O<'ExecInfo', typeof W.ExecInfo>>,
  Check<O<'HostInfo', typeof W.HostInfo>>,
  Check<O<'VersionInfo', typeof W.VersionInfo>>,
  Check<O<'SandboxNetwork', typeof W.SandboxNetwork>>,
  Check<O<'NetworkPolicyView', typeof W.NetworkPolicyView>>,
  Check<O<'PolicyReloadResult', typeof W.PolicyReloadResult>>,
  Check<O<'SeccompProfileInfo', typeof W.SeccompProfileInfo>>,
  Check<O<'Image', typeof W.Image>>,
  Check<O<'ImageConfig', typeof W.ImageConfig>>,
  Check<O<'Layer', typeof W.Layer>>,
  Check<O<'PruneResult', typeof W.PruneResult>>,
  Check<O<'CommitResult', typeof W.CommitResult>>,
  Check<O<'Snapshot', typeof W.Snapshot>>,
  Check<O<'StepState', typeof W.StepState>>,
  Check<O<'TrajectoryStep', typeof W.TrajectoryStep>>,
  Check<O<'TrajectorySummary', typeof W.TrajectorySummary>>,
  Check<O<'TrajectoryDetail', typeof W.TrajectoryDetail>>,
  Check<O<'TrajectoryRecord', typeof W.TrajectoryRecord>>,
  Check<O<'TrajectoryRemoved', typeof W.TrajectoryRemoved>>,
  Check<O<'SandboxStatsView', typeof W.SandboxStatsView>>,
  Check<O<'StatsResponse', typeof W.StatsResponse>>,
  Check<O<'Reclaim', typeof J.Reclaim>>,
  Check<O<'PauseResult', typeof J.PauseResult>>,
  Check<O<'BulkResponse', typeof J.BulkResponse>>,
  Check<O<'LeaseView', typeof J.LeaseView>>,
  Check<O<'FileStat', typeof F.FileStat>>,
  Check<I<'CreateSandboxRequest', typeof W.CreateSandboxRequest>>,
  Check<I<'NetworkSpec', typeof W.NetworkSpec>>,
  Check<I<'ImportRequest', typeof W.ImportRequest>>,
  Check<I<'ComposeRequest', typeof W.ComposeRequest>>,
  Check<I<'BootstrapRequest', typeof W.BootstrapRequest>>,
  Check<I<'RestoreRequest', typeof W.RestoreRequest>>,
  Check<I<'ForkRequest', typeof W.ForkRequest>>,
  Check<I<'RunRequest', typeof W.RunRequest>>,
  Check<I<'BulkRequest', typeof J.BulkRequest>>,
];
