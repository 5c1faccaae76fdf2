/**
 * Parsing of request bodies and queries with the wire schemas (daemon/api/schema.ts):
 * every zod issue becomes part of one InvalidArgument message.
 */
import type { z } from 'zod';
import { invalidArgument } from '../errors.js';

/**
 * Parses `input` with `schema`, turning zod issues into one InvalidArgument message
 * such as `memory_bytes: Too small: expected number to be >=4194304; unknown field "foo"`.
 * An absent body (`undefined`: the request had none) parses as `{}`; a JSON `null` is
 * parsed as given, so a route whose schema is an object refuses it.
 * @param what names the input in the message (e.g. `create request`, `query`).
 * @throws DsecError InvalidArgument.
 */
export function parseWith<S extends z.ZodType>(schema: S, input: unknown, what: string): z.infer<S> {
  const r = schema.safeParse(input === undefined ? {} : input);
  if (r.success) return r.data;
  const msg = r.error.issues
    .map((i) => {
      if (i.code === 'unrecognized_keys') return `unknown field${i.keys.length > 1 ? 's' : ''} ${i.keys.map((k) => `"${k}"`).join(', ')}`;
      return `${i.path.length ? i.path.join('.') + ': ' : ''}${i.message}`;
    })
    .join('; ');
  throw invalidArgument(`invalid ${what}: ${msg}`);
}

/**
 * `JSON.parse` of a request body or message that refuses `__proto__` keys: object
 * handling downstream (zod's records, spreads) would drop them silently or set a
 * prototype. The key check is a reviver, which costs tens of µs on a small body, so it
 * runs only when the text could spell that key: literally, or through a `\u` escape
 * (no other JSON escape yields a letter or `_`).
 * @throws DsecError InvalidArgument for a `__proto__` key; SyntaxError (or RangeError,
 *   nesting too deep for the reviver) for text that is not JSON.
 */
export function parseJson(text: string): unknown {
  if (!text.includes('__proto__') && !text.includes('\\u')) return JSON.parse(text);
  return JSON.parse(text, (k, v) => {
    if (k === '__proto__') throw invalidArgument('"__proto__" is not allowed as a key');
    return v;
  });
}
