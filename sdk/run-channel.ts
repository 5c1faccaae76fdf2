/**
 * {@link RunChannel}: one WebSocket to dsecd's run channel (GET /v1/run/channel,
 * daemon/api/routes/run.ts) over which {@link RunChannel.run} makes one-shot runs as
 * {@link DsecClient.run} does, many in flight, with the door's authentication and the
 * HTTP request paid once for the connection instead of once per call: for reward loops
 * that make thousands of fncall calls. Lifecycle and errors are {@link RequestChannel}'s
 * (sdk/channel.ts). Closing the channel does to its calls what leaving a POST /v1/run
 * does: an fncall call still waiting for a worker is dropped, a running one ends by its
 * `timeout_ms` (60 s by default), a container call's sandbox is destroyed at once.
 */
import { RequestChannel } from './channel.js';
import { decodeExecResult, type ExecOutput } from './exec-types.js';
import type { AttachErrorFactory } from './attach.js';
import type { RunInput } from './types.js';

/** A WebSocket run channel; see the module comment. */
export class RunChannel extends RequestChannel {
  /**
   * @param url `ws+unix://SOCKET:/v1/run/channel` or the `wss://` URL of the TCP door
   * @param errors error constructors of the client
   * @param wsOptions extra options of the `ws` client (TLS trust and the token of the TCP door)
   */
  constructor(url: string, errors: AttachErrorFactory, wsOptions: Record<string, unknown> = {}) {
    super('run channel', url, errors, wsOptions);
  }

  /**
   * Runs one command in a fresh environment, as {@link DsecClient.run} does, and resolves
   * with its result (exit status, signal, timeout and OOM are fields, not errors).
   * `opts.signal` rejects the promise with its reason (the call keeps its place among the
   * 16 a channel runs at once until it ends). No client-side deadline: pass `timeout_ms`.
   * Errors: those of {@link DsecClient.run} (`InvalidArgument`, `NotFound` for an image,
   * `ResourceExhausted`, `Unimplemented`, `Unavailable`), a request over 1 MiB
   * (`InvalidArgument`, use client.run()), and the channel's own failure.
   */
  run(req: RunInput, opts: { signal?: AbortSignal } = {}): Promise<ExecOutput> {
    return this.send(req, opts.signal, decodeExecResult, 'client.run()');
  }
}
