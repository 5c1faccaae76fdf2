/**
 * Reading a TOML config file against its zod schema, as dsecd (`/etc/dsec/dsecd.toml`)
 * and dsec-gateway (`/etc/dsec/gateway.toml`) both do.
 */
import { existsSync, readFileSync } from 'node:fs';
import { parse as parseToml } from 'smol-toml';
import type { z } from 'zod';
import { invalidArgument } from './errors.js';

/**
 * The parsed contents of `file`, or `{}` when it does not exist and was not named
 * explicitly (`explicit` false: a default path, which is optional).
 * @throws DsecError InvalidArgument naming the file: TOML that does not parse, every
 *   schema issue (`path: message`, joined by `; `), or an explicitly named file missing.
 */
export function readTomlFile<S extends z.ZodTypeAny>(file: string, schema: S, explicit: boolean): z.infer<S> | Record<string, never> {
  if (!existsSync(file)) {
    if (explicit) throw invalidArgument(`config file ${file} does not exist`);
    return {};
  }
  let raw: unknown;
  try {
    raw = parseToml(readFileSync(file, 'utf8'));
  } catch (e) {
    throw invalidArgument(`config ${file}: ${(e as Error).message}`);
  }
  const r = schema.safeParse(raw);
  if (!r.success) throw invalidArgument(`config ${file}: ${r.error.issues.map((i) => `${i.path.join('.') || '(top)'}: ${i.message}`).join('; ')}`);
  return r.data as z.infer<S>;
}
