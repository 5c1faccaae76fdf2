/**
 * What the envd routes know of a request once it is authenticated (envd.ts), handed to
 * the Connect services (process.ts, filesystem.ts) as a context value.
 */
import { createContextKey } from '@connectrpc/connect';
import type { Sandbox } from '../wire/sandboxes.js';

/** An authenticated envd request: its sandbox (running) and the user it asks to act as. */
export interface EnvdRequestContext {
  sandbox: Sandbox;
  /** E2B's user (Basic authorization `user:`), or undefined for the default. */
  username: string | undefined;
}

/** Context key of {@link EnvdRequestContext}; its default is never used (every envd route sets it). */
export const ENVD_CONTEXT = createContextKey<EnvdRequestContext>(null as unknown as EnvdRequestContext, { description: 'dsec envd request' });
