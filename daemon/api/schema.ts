/**
 * The dsecd HTTP API, defined once.
 *
 * Every request body and response body is a zod schema, defined by resource in
 * daemon/api/wire/ and exported here as one module: route handlers parse with them,
 * daemon/api/convert.ts turns what they parsed into the model (daemon/model/), and
 * docs/api/openapi.json is generated from them (daemon/api/openapi.ts). JSON
 * fields are snake_case, times are milliseconds (durations) or milliseconds since the
 * Unix epoch (`*_at`), sizes are bytes, CPU amounts are cores (fractional).
 * Request objects are strict: an unknown field is an InvalidArgument error.
 */
export * from './wire/common.js';
export * from './wire/network.js';
export * from './wire/sandboxes.js';
export * from './wire/batch.js';
export * from './wire/execs.js';
export * from './wire/snapshots.js';
export * from './wire/images.js';
export * from './wire/trajectories.js';
export * from './wire/host.js';
export * from './wire/templates.js';
