/**
 * {@link ExecChannel}: one WebSocket to a sandbox's exec channel
 * (GET /v1/sandboxes/{id}/exec/channel, daemon/api/routes/exec-channel.ts) over which
 * {@link ExecChannel.exec} runs commands to completion as {@link DsecClient.exec} does,
 * with the door's authentication and the HTTP request paid once for the connection
 * instead of once per command. For agent loops that run many short commands in one
 * sandbox. Lifecycle and errors are {@link RequestChannel}'s (sdk/channel.ts); a refused
 * handshake is `NotFound` for an unknown sandbox or one of another tenant.
 */
import { RequestChannel } from './channel.js';
import { decodeExecResult, execRequestBody, type ExecOptions, type ExecOutput } from './exec-types.js';
import type { AttachErrorFactory } from './attach.js';

/** Options of {@link ExecChannel.exec}: those of {@link DsecClient.exec}. */
export type ChannelExecOptions = ExecOptions;

/** A WebSocket exec channel to one sandbox; see the module comment. */
export class ExecChannel extends RequestChannel {
  /**
   * @param url `ws+unix://SOCKET:/v1/sandboxes/ID/exec/channel` or the `wss://` URL of the TCP door
   * @param errors error constructors of the client
   * @param wsOptions extra options of the `ws` client (TLS trust and the token of the TCP door)
   */
  constructor(url: string, errors: AttachErrorFactory, wsOptions: Record<string, unknown> = {}) {
    super('exec channel', url, errors, wsOptions);
  }

  /**
   * Runs a command to completion in the channel's sandbox; resolves as
   * {@link DsecClient.exec} does (the command's exit status, signal, timeout and OOM are
   * fields of the result, not errors). `req.signal` rejects the promise with its reason;
   * the command keeps running (its answer is dropped) and holds its place among the 16 a
   * channel runs at once until it ends. There is no client-side deadline: pass
   * `timeoutMs` (dsecd kills the command then) or a `signal`. `req.stdin` is at most ~768 KiB here
   * (a message is at most 1 MiB); use {@link DsecClient.exec} for more.
   * Errors: those of {@link DsecClient.exec} (`NotFound` once the sandbox is gone,
   * `FailedPrecondition`, `InvalidArgument`, `Conflict`), and the channel's own failure
   * (see the module comment).
   */
  exec(req: ChannelExecOptions): Promise<ExecOutput> {
    return this.send(execRequestBody(req), req.signal, decodeExecResult, 'client.exec()');
  }
}
