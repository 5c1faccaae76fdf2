/** Batched creates on the wire: POST /v1/sandboxes:batch, its request and its per-sandbox answer. */
import { z } from 'zod';
import { LIMITS } from '../../model/resources.js';
import { CreateSandboxRequest, Sandbox } from './sandboxes.js';

/** Most sandboxes one batched create asks for (LIMITS.maxBatchSandboxes, daemon/model/resources.ts). */
export const MAX_BATCH_SANDBOXES = LIMITS.maxBatchSandboxes;

/** Idempotency keys, as the `Idempotency-Key` header takes them (daemon/sandbox/create-records.ts KEY_RE). */
const itemKey = z.string().regex(/^[\x21-\x7e]{1,255}$/, 'idempotency keys are 1 to 255 visible ASCII characters');

/**
 * POST /v1/sandboxes:batch request: `{count, spec}` (count sandboxes of one spec) or
 * `{items: [spec, ...]}` (one sandbox per spec, in order), 1 to {@link MAX_BATCH_SANDBOXES}.
 */
export const CreateSandboxesRequest = z
  .object({
    count: z.number().int().min(1).max(MAX_BATCH_SANDBOXES).optional().describe(`How many sandboxes of \`spec\`, 1-${MAX_BATCH_SANDBOXES}; with \`spec\`, instead of \`items\`.`),
    spec: CreateSandboxRequest.optional().describe('The create request of every sandbox of a `count` batch; default `{}` (busybox container).'),
    items: z.array(CreateSandboxRequest).min(1).max(MAX_BATCH_SANDBOXES).optional()
      .describe(`One create request (as POST /v1/sandboxes takes) per sandbox, 1-${MAX_BATCH_SANDBOXES}; instead of \`count\`.`),
    keys: z.array(itemKey).optional().describe(
      'An idempotency key per sandbox, in order (as many as the batch has sandboxes), instead of the `Idempotency-Key` header: the header `K` gives sandbox i the key `K/i`. '
      + 'A gateway sends each host the keys of the items it placed there.'),
  })
  .strict()
  .superRefine((b, ctx) => {
    if ((b.count === undefined) === (b.items === undefined)) ctx.addIssue({ code: 'custom', message: 'give either count (with an optional spec) or items, not both nor neither' });
    if (b.items !== undefined && b.spec !== undefined) ctx.addIssue({ code: 'custom', path: ['spec'], message: 'spec goes with count; with items each item is its own spec' });
    const n = b.count ?? b.items?.length ?? 0;
    if (b.keys !== undefined && b.keys.length !== n) ctx.addIssue({ code: 'custom', path: ['keys'], message: `keys has ${b.keys.length} entries for ${n} sandboxes; give one per sandbox` });
  });
export type CreateSandboxesRequest = z.infer<typeof CreateSandboxesRequest>;

/** One sandbox's outcome in a batched create: the sandbox, or why it was not made. */
export const BatchItemResult = z.object({
  sandbox: Sandbox.optional().describe('The running sandbox, when it was made (or, with a key seen before, was made by the first request).'),
  error: z.object({ code: z.string(), message: z.string() }).optional()
    .describe('When not made: the error a single create would have answered (e.g. ResourceExhausted when admission or the tenant quota is full).'),
});

/** POST /v1/sandboxes:batch response: one entry per sandbox asked for, in request order. */
export const CreateSandboxesResult = z.object({
  results: z.array(BatchItemResult),
  created: z.number().int().describe('How many entries have a sandbox.'),
  failed: z.number().int().describe('How many entries have an error.'),
});
