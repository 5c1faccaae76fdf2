/**
 * Per-image security defaults: the optional `security` object of an image's config
 * (ImageManifest.config.security, daemon/image/layer-store.ts). A sandbox of the image gets
 * them unless its create request says otherwise, field by field:
 *   - `seccomp`: an override of the default seccomp profile, merged before the
 *     sandbox's own (buildSeccomp in daemon/security/seccomp.ts: profile < image <
 *     sandbox), e.g. `{"allow": ["ptrace"]}` for an image built for debugger tasks;
 *   - `readonly_paths`, `writable_paths`, `landlock`: the filesystem options
 *     (daemon/security/filesystem.ts), between the request and `[filesystem]` in dsecd's
 *     config, e.g. `{"writable_paths": ["/work"]}` for an image whose tasks live in /work.
 * A sandbox records the image config it was created from, so a later change of the
 * image never alters it. Set by `dsec image build|import|compose` and `dsec commit`
 * (flags --writable, --readonly, --no-readonly, --no-landlock, --seccomp-allow,
 * --seccomp-deny), shown by `dsec image inspect`.
 */
import { z } from 'zod';
import { FilesystemOptionsSchema } from '../security/filesystem.js';
import { SeccompOverrideSchema } from '../security/seccomp.js';

/** The `security` object of an image config; every field optional. */
export const ImageSecuritySchema = FilesystemOptionsSchema.extend({
  seccomp: SeccompOverrideSchema.optional().describe('Changes to the default seccomp profile for sandboxes of this image (`allow` lifts denials, `deny` adds EPERM denials); a sandbox\'s own override is applied after it.'),
}).strict();
export type ImageSecurity = z.infer<typeof ImageSecuritySchema>;

/**
 * Validates an image's `security` object.
 * @returns the parsed object, or an error message naming each bad field
 *   (`security.writable_paths.0: "work": paths are absolute`).
 */
export function checkImageSecurity(v: unknown): { ok: true; value: ImageSecurity } | { ok: false; message: string } {
  const r = ImageSecuritySchema.safeParse(v);
  if (r.success) return { ok: true, value: r.data };
  return { ok: false, message: r.error.issues.map((i) => `${['security', ...i.path].join('.')}: ${i.message}`).join('; ') };
}
