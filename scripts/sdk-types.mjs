/**
 * Generates sdk/types.gen.ts, the SDK's wire types, from the component schemas of the
 * OpenAPI document (docs/api/openapi.json, itself generated from daemon/api/schema.ts by
 * daemon/api/openapi.ts) with openapi-typescript. `npm run openapi` runs it after writing
 * the document; test/unit/sdk-types.test.ts fails when the committed file differs from a
 * fresh generation.
 *
 *   node scripts/sdk-types.mjs [openapi.json] [types.gen.ts]
 *
 * Only `components.schemas` is turned into types: the SDK names its calls itself (sdk/),
 * and every request and response shape it uses is a named component.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import openapiTS, { astToString } from 'openapi-typescript';

const HEADER = `/**
 * The dsecd API's wire types, generated from docs/api/openapi.json by scripts/sdk-types.mjs
 * (openapi-typescript). Do not edit: change daemon/api/schema.ts and run \`npm run openapi\`.
 * Friendly names and docs for SDK callers are in sdk/types.ts.
 */
`;

/**
 * The text of sdk/types.gen.ts for an OpenAPI document (the parsed JSON object).
 * Fields with a default are optional (a request may leave them out). Rejects when
 * openapi-typescript cannot read the document.
 */
export async function renderSdkTypes(doc) {
  const ast = await openapiTS({ ...doc, paths: {} }, { defaultNonNullable: false, silent: true });
  return HEADER + astToString(ast);
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const input = process.argv[2] ?? 'docs/api/openapi.json';
  const output = process.argv[3] ?? 'sdk/types.gen.ts';
  writeFileSync(output, await renderSdkTypes(JSON.parse(readFileSync(input, 'utf8'))));
  process.stdout.write(`wrote ${output}\n`);
}
