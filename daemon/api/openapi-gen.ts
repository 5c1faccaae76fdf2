/** `npm run openapi`: writes docs/api/openapi.json from the schemas. */
import { writeFileSync } from 'node:fs';
import { renderOpenApi } from './openapi.js';

const out = process.argv[2] ?? 'docs/api/openapi.json';
writeFileSync(out, renderOpenApi());
process.stdout.write(`wrote ${out}\n`);
