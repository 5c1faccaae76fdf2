/** Pieces of the wire format every resource uses: label and env syntax, ids and names, the tier and state enums, the error body, egress rules, filesystem options and defence statuses. */
import { z } from 'zod';
import { ERROR_KINDS } from '../../errors.js';
import { BACKENDS } from '../../model/backend.js';
import { SANDBOX_STATES } from '../../model/state.js';
import { EgressRuleSchema, PolicyNameSchema } from '../../security/egress.js';
import { FilesystemOptionsSchema } from '../../security/filesystem.js';

/** Bytes an env map takes in execve's argument space: keys, values, `=` and NUL. */
export const envSize = (e: Record<string, string>) => Object.entries(e).reduce((n, [k, v]) => n + k.length + v.length + 2, 0);

/** A label key. Label keys and values are Kubernetes-like, so selectors stay unambiguous (no `,` or `=`). */
export const labelKey = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$/, 'label key must match [A-Za-z0-9][A-Za-z0-9._/-]{0,62}')
  // dsecd's own labels (`dsec.pool` marks a warm-pool shell, kept out of listings and
  // admission; `dsec.fork` names a fork) mean something only when dsecd sets them.
  .refine((k) => !k.startsWith('dsec.'), 'label keys starting with "dsec." are reserved for dsecd');

/** A label value (see labelKey). */
export const labelValue = z.string().regex(/^[A-Za-z0-9._/-]{0,63}$/, 'label value must match [A-Za-z0-9._/-]{0,63}');

/** An environment variable name. */
export const envKey = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'env names must match [A-Za-z_][A-Za-z0-9_]*');

/** An environment variable value: anything but NUL. */
export const envValue = z.string().refine((s) => !s.includes('\0'), 'env values must not contain NUL');

/**
 * Trajectory ids: 1–128 characters from `A-Z a-z 0-9 . _ : @ -`, starting with a letter
 * or digit, so an id is safe in a URL path segment, a file name and a JSONL line as is.
 */
export const TrajectoryId = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$/, 'trajectory ids are 1-128 characters of [A-Za-z0-9._:@-], starting with a letter or digit');

/** Snapshot names: like image names, lowercase `[a-z0-9][a-z0-9._-]{0,127}`; unique per tenant on a host. */
export const SnapshotName = z.string().regex(/^[a-z0-9][a-z0-9._-]{0,127}$/, 'snapshot names are 1-128 characters of [a-z0-9._-], starting with a letter or digit')
  .refine((n) => !/^snap-[0-9a-f]{16}$/.test(n), 'snapshot names must not look like snapshot ids (snap- and 16 hex characters)');

/** Isolation tiers. Only `container` is built so far; the others answer Unimplemented. */
export const Backend = z.enum(BACKENDS).describe('Isolation tier.');
export type Backend = z.infer<typeof Backend>;

/** Lifecycle states; transitions are defined in daemon/model/state.ts. */
export const SandboxState = z.enum(SANDBOX_STATES);
export type SandboxState = z.infer<typeof SandboxState>;

/** Error body: `{ error: { code, message } }`. */
export const ErrorBody = z.object({
  error: z.object({
    code: z.enum(ERROR_KINDS as [string, ...string[]]).describe('Error kind; decides the HTTP status.'),
    message: z.string().describe('Human-readable description naming what failed.'),
    reason: z.string().optional().describe(
      'Machine-readable refinement of `code` where a caller must branch on it, e.g. for trajectory steps: '
      + '`outcome_unknown`, `step_mismatch`, `in_progress`, `out_of_order`, `trajectory_removed` (see docs/TRAJECTORIES.md).'),
  }),
});

/** Network policy names (daemon/security/egress.ts PolicyNameSchema). */
export const PolicyName = PolicyNameSchema;

/** One egress rule (daemon/security/egress.ts EgressRuleSchema: the same format as policy files). */
export const EgressRule = EgressRuleSchema;
export type EgressRule = z.infer<typeof EgressRule>;

/**
 * Filesystem hardening of a sandbox (docs/SECURITY.md "Filesystem" and "Landlock";
 * daemon/security/filesystem.ts): read-only system paths, writable exceptions, Landlock.
 * In a request every field defaults to the image's security defaults, then to
 * `[filesystem]` in dsecd's config; a sandbox returns the values resolved at create.
 */
export const FilesystemSpec = FilesystemOptionsSchema;
export type FilesystemSpec = z.infer<typeof FilesystemSpec>;

/** Whether one defence is in force for a sandbox or host, and what it does or why not. */
export const DefenceStatus = z.object({
  enforced: z.boolean(),
  detail: z.string(),
});
export type DefenceStatus = z.infer<typeof DefenceStatus>;
