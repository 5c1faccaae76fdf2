/**
 * One command in a fresh environment of any tier (POST /v1/run): `fncall` on a pre-warmed
 * pooled worker, `container` in a sandbox created and destroyed for it; and batches of
 * such calls run concurrently.
 */
import type { ErrorKind, ExecResult, RunInput } from './types.js';
import { decodeExecResult, type ExecOutput } from './exec-types.js';
import type { RequestOptions, TransportClass } from './transport.js';
import { RunChannel } from './run-channel.js';

/** One entry of a POST /v1/run:batch response. */
export interface RunBatchEntry {
  ok: boolean;
  /** When ok: the call's result (a failing command is ok, with its exit code). */
  result?: ExecResult;
  /** When not ok: why dsec could not run the call. */
  error?: { code: ErrorKind; message: string };
}

/** Mixes run and run:batch into a {@link Transport} class (composed into DsecClient by sdk/client.ts). */
export function withRunCalls<B extends TransportClass>(Base: B) {
  return class RunCalls extends Base {
    /**
     * POST /v1/run: runs one command in a fresh environment of any tier and returns its
     * result (the shape of {@link exec}). `backend: "fncall"` runs it on a pre-warmed
     * pooled worker in fresh namespaces (nothing survives the call); `"container"` (the
     * default) creates a sandbox of the caller's tenant, runs the command and destroys the
     * sandbox (also when the request is abandoned, e.g. `opts.signal`). The HTTP
     * deadline is the command's `timeout_ms` plus the client's timeout, none without one.
     * Errors: `InvalidArgument`, `NotFound` (image), `ResourceExhausted` (host full or the
     * fncall queue full), `Unimplemented` (tier not built), `Unavailable`.
     */
    async run(req: RunInput, opts: RequestOptions = {}): Promise<ExecOutput> {
      const deadline = req.timeout_ms !== undefined && this.timeoutMs > 0 ? req.timeout_ms + this.timeoutMs : 0;
      const res = await this.request<ExecResult>('POST', '/v1/run', req, { signal: opts.signal, timeoutMs: opts.timeoutMs ?? deadline });
      return decodeExecResult(res);
    }

    /**
     * Opens a run channel (GET /v1/run/channel, a WebSocket): {@link RunChannel.run}
     * then makes one-shot runs as {@link run} does, many in flight on one connection,
     * without an HTTP request and authentication per call (docs/BENCHMARKS.md "fncall").
     * Returns at once; `opened` settles with the handshake. Close it when done (calls
     * waiting for an fncall worker are dropped, running fncall calls end by their timeout,
     * container calls' sandboxes are destroyed). Errors (on `opened` and every call): `Unauthenticated`,
     * `PermissionDenied` (a reader token), `Unavailable` (dsecd unreachable, the
     * connection dropped), `NotFound` from a gateway (it does not carry this channel: a
     * fleet's calls go through run() and runBatch(), which it places).
     */
    runChannel(): RunChannel {
      const path = '/v1/run/channel';
      const ws = this.endpoint.webSocket(path);
      return new RunChannel(ws.url, this.webSocketErrors(path), ws.options);
    }

    /**
     * POST /v1/run:batch: runs up to 1,000 calls concurrently; one entry per call, in
     * order, each either `{ok: true, result}` or `{ok: false, error: {code, message}}`.
     * No HTTP deadline by default. Errors: `InvalidArgument` (a malformed call refuses the batch).
     */
    async runBatch(calls: RunInput[], opts: RequestOptions = {}): Promise<RunBatchEntry[]> {
      const res = await this.request<{ results: RunBatchEntry[] }>('POST', '/v1/run:batch', { calls }, { signal: opts.signal, timeoutMs: opts.timeoutMs ?? 0 });
      return res.results;
    }
  };
}
