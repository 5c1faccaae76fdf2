/** dsec's version (kept equal to package.json's by test/unit/openapi.test.ts). */
export const DSEC_VERSION = '0.1.0';
/** Version of the agent protocol this daemon speaks (docs/AGENT_PROTOCOL.md). */
export const AGENT_PROTOCOL_VERSION = 1;
