/** E2B templates (docs/E2B.md): aliases from an E2B `templateID` to a dsec image and backend (daemon/api/e2b/templates.ts). */
import { z } from 'zod';
import { Backend } from './common.js';

/** One template: its name and what it creates. */
export const Template = z.object({
  name: z.string().describe('Template name E2B clients pass as templateID.'),
  image: z.string().describe('dsec image ref the sandbox is created from.'),
  backend: Backend.describe('Backend (isolation tier) of its sandboxes.'),
  builtin: z.boolean().describe('True for the built-in default (base -> e2b-base, container) that no alias overrides.'),
});
export type Template = z.infer<typeof Template>;

/** GET /v1/templates response. */
export const TemplateList = z.object({ templates: z.array(Template) });

/** PUT /v1/templates/{name} request. */
export const SetTemplateRequest = z
  .object({
    image: z.string().min(1).max(255).describe('Image the template creates sandboxes from; it must be in the store.'),
    backend: Backend.default('container').describe('Backend of its sandboxes; default container.'),
  })
  .strict();
