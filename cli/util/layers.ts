/**
 * Naming layers on the command line: a full digest `sha256:<64 hex>`, or a unique prefix
 * of the hex (with or without `sha256:`), like the 12-digit short digests `dsec layer ls`
 * prints. A prefix is resolved by listing the layers once.
 */
import type { DsecClient, Layer } from '../../sdk/index.js';
import { UserError } from './errors.js';

/** Hex digits of a sha256 digest. */
const DIGEST_HEX_LENGTH = 64;

/** Most candidates an "ambiguous prefix" error names. */
const MAX_CANDIDATES_SHOWN = 5;

/** The lowercase hex (1-64 digits) of a digest or digest prefix; UserError otherwise. */
export function parseDigestPrefix(text: string): string {
  const hex = text.trim().toLowerCase().replace(/^sha256:/, '');
  if (!/^[0-9a-f]{1,64}$/.test(hex)) {
    throw new UserError(`invalid layer digest ${JSON.stringify(text)}`, 'write sha256:<64 hex digits>, or a unique prefix of the hex as `dsec layer ls` shows it');
  }
  return hex;
}

/** The one layer of `layers` whose digest hex starts with `hex`; UserError when none or several do. */
export function pickLayer(layers: Layer[], hex: string, text: string): Layer {
  const matches = layers.filter((l) => l.digest.replace(/^sha256:/, '').startsWith(hex));
  if (matches.length === 0) throw new UserError(`no layer matches ${JSON.stringify(text)}`, 'list layers with `dsec layer ls`');
  if (matches.length > 1) {
    const shown = matches.slice(0, MAX_CANDIDATES_SHOWN).map((l) => l.digest.replace(/^sha256:/, '').slice(0, hex.length + 4));
    const more = matches.length > shown.length ? ', …' : '';
    throw new UserError(`layer prefix ${JSON.stringify(text)} is ambiguous: it matches ${matches.length} layers (${shown.join(', ')}${more})`, 'give more hex digits of the digest');
  }
  return matches[0];
}

/** The layer `text` names (full digest: fetched directly; prefix: resolved by listing). */
export async function resolveLayer(client: DsecClient, text: string): Promise<Layer> {
  const hex = parseDigestPrefix(text);
  if (hex.length === DIGEST_HEX_LENGTH) return client.getLayer(`sha256:${hex}`);
  return pickLayer(await client.listLayers(), hex, text);
}

/**
 * Full digests for `texts`, in order. Full digests are passed through without a request
 * (dsecd checks they exist); prefixes are resolved with one listing.
 */
export async function resolveLayerDigests(client: DsecClient, texts: string[]): Promise<string[]> {
  const hexes = texts.map(parseDigestPrefix);
  let listed: Layer[] | undefined;
  const out: string[] = [];
  for (let i = 0; i < texts.length; i++) {
    if (hexes[i].length === DIGEST_HEX_LENGTH) {
      out.push(`sha256:${hexes[i]}`);
      continue;
    }
    listed ??= await client.listLayers();
    out.push(pickLayer(listed, hexes[i], texts[i]).digest);
  }
  return out;
}
