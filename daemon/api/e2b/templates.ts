/**
 * E2B templates as dsec sees them: a template name is an alias for a dsec image and a
 * backend (`dsec image alias base IMAGE --backend container`). Aliases are kept in one
 * JSON file, `<root>/e2b/templates.json`, written whole to a temp file and renamed over
 * the old one, so a crash leaves the old set or the new one.
 *
 * Resolution of the `templateID` of an E2B create ({@link TemplateStore.resolve}):
 * 1. an alias of that name;
 * 2. the built-in `base`, when no alias named `base` exists: the `e2b-base` image
 *    (daemon/image/e2b-base.ts) on the container backend;
 * 3. the name itself as a dsec image ref on the container backend, so any image in the
 *    store is a template without an alias (`Sandbox.create('busybox')`).
 */
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { Backend } from '../wire/common.js';
import type { Template } from '../wire/templates.js';
import { internal, invalidArgument, notFound } from '../../errors.js';
import { E2B_BASE_IMAGE } from '../../image/e2b-base.js';

/** Template (alias) names: what E2B allows in a template id, lowercase, at most 64 characters. */
export const TEMPLATE_NAME_RE = /^[a-z0-9][a-z0-9._-]{0,63}$/;

/** The default template of E2B's SDKs. */
export const DEFAULT_TEMPLATE = 'base';


const FileShape = z.record(z.string(), z.object({ image: z.string(), backend: Backend }).strict());

/** The alias file and its in-memory copy. */
export class TemplateStore {
  private aliases: Record<string, { image: string; backend: Backend }>;

  /** @param file the JSON file (created at the first set) */
  constructor(private readonly file: string) {
    this.aliases = this.load();
  }

  private load(): Record<string, { image: string; backend: Backend }> {
    let text: string;
    try {
      text = readFileSync(this.file, 'utf8');
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return {};
      throw e;
    }
    const r = FileShape.safeParse(JSON.parse(text));
    if (!r.success) throw internal(`${this.file} is not a template alias file: ${r.error.issues[0]?.message}`);
    return r.data;
  }

  private save(): void {
    mkdirSync(path.dirname(this.file), { recursive: true, mode: 0o700 });
    const tmp = `${this.file}.${process.pid}.tmp`;
    writeFileSync(tmp, JSON.stringify(this.aliases, null, 2) + '\n', { mode: 0o600 });
    renameSync(tmp, this.file);
  }

  /** Every alias, by name, plus the built-in `base` when no alias replaces it. */
  list(): Template[] {
    const out: Template[] = Object.entries(this.aliases).map(([name, a]) => ({ name, ...a, builtin: false }));
    if (!this.aliases[DEFAULT_TEMPLATE]) out.push({ name: DEFAULT_TEMPLATE, image: E2B_BASE_IMAGE, backend: 'container', builtin: true });
    return out.sort((a, b) => (a.name < b.name ? -1 : 1));
  }

  /**
   * Sets alias `name` (replacing one of that name). The caller checks that the image exists.
   * @throws DsecError InvalidArgument for a malformed name.
   */
  set(name: string, image: string, backend: Backend): Template {
    if (!TEMPLATE_NAME_RE.test(name)) throw invalidArgument(`template name ${JSON.stringify(name)}: 1-64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit`);
    this.aliases = { ...this.aliases, [name]: { image, backend } };
    this.save();
    return { name, image, backend, builtin: false };
  }

  /**
   * Removes alias `name` (the built-in `base` comes back when `base` is removed).
   * @throws DsecError NotFound when there is no such alias.
   */
  remove(name: string): Template {
    const a = this.aliases[name];
    if (!a) throw notFound(`template alias ${name} not found`);
    const { [name]: _gone, ...rest } = this.aliases;
    this.aliases = rest;
    this.save();
    return { name, ...a, builtin: false };
  }

  /**
   * What an E2B `templateID` creates (see the module comment for the order).
   * @throws DsecError InvalidArgument for a name that is neither an alias nor an image ref.
   */
  resolve(templateId: string): { image: string; backend: Backend } {
    const a = this.aliases[templateId];
    if (a) return a;
    if (templateId === DEFAULT_TEMPLATE) return { image: E2B_BASE_IMAGE, backend: 'container' };
    return { image: templateId, backend: 'container' };
  }
}
