/**
 * Typed client of the dsecd HTTP+JSON API (docs/api/openapi.json), spoken over the
 * daemon's Unix socket.
 *
 * {@link DsecClient} is the transport (sdk/transport.ts: keep-alive connections, JSON
 * with no runtime schema validation on this side, streamed transfers, NDJSON, WebSocket
 * attachments) with the calls of each resource mixed in, one module per resource:
 * sdk/sandboxes.ts, sdk/exec.ts (exec, sessions, console), sdk/files.ts, sdk/images.ts
 * (images, layers, commit), sdk/snapshots.ts (snapshots, restore, fork), sdk/jobs.ts
 * (pause/resume, bulk, leases), sdk/trajectories.ts, sdk/run.ts, sdk/host.ts (host,
 * network, security), sdk/events.ts (events, logs, stats) and sdk/tokens.ts (API tokens), sdk/fleet.ts (a gateway's hosts), sdk/templates.ts (E2B templates). The types are in
 * sdk/types.ts, generated from the OpenAPI document: the SDK imports nothing of the daemon.
 *
 * Transfers stream: file contents, tar archives, exec output and exec stdin go through
 * node:http with backpressure in both directions (uploads are piped, downloads are
 * returned as Readables), so a multi-GB file never sits in memory here. Exec sessions
 * can be attached over a WebSocket ({@link DsecClient.attachExec}, sdk/attach.ts).
 *
 * Every failure is a {@link DsecApiError} whose `code` is one of the closed set of error
 * kinds, with three exceptions: a call aborted through an `AbortSignal` rejects with the
 * signal's reason (an `AbortError` by default), a long image operation whose
 * `onProgress` callback throws rejects with that error, and an upload whose source stream
 * fails rejects with that stream's error.
 */
import { withEventCalls } from './events.js';
import { withExecCalls } from './exec.js';
import { withFileCalls } from './files.js';
import { withHostCalls } from './host.js';
import { withImageCalls } from './images.js';
import { withJobCalls } from './jobs.js';
import { withRunCalls } from './run.js';
import { withSandboxCalls } from './sandboxes.js';
import { withSnapshotCalls } from './snapshots.js';
import { withTokenCalls } from './tokens.js';
import { withTemplateCalls } from './templates.js';
import { withFleetCalls } from './fleet.js';
import { withTrajectoryCalls } from './trajectories.js';
import { Transport, type DsecClientOptions } from './transport.js';

export { DsecApiError, isDsecApiError } from './errors.js';
export { DEFAULT_SOCKET_PATH, DEFAULT_TIMEOUT_MS } from './transport.js';
export type { DsecClientOptions, RequestOptions } from './transport.js';
export type * from './types.js';
export type { CreateOptions, CreateProgress, DeleteSandboxOptions, ListSandboxesQuery, StopSandboxOptions } from './sandboxes.js';
export type {
  AttachExecOptions,
  ConsoleAttachmentHandle,
  ConsoleEnd,
  ExecAttachmentHandle,
  ExecOptions,
  ExecOutput,
  ExecOutputQuery,
  StartExecOptions,
  WaitExecOptions,
  WriteStdinOptions,
} from './exec.js';
export type { ArchiveOptions, FileOptions, PutArchiveResult, StatFileOptions, WriteFileOptions, WriteFileResult } from './files.js';
export type { CommitOptions, ImageProgress, LongOperationOptions, PruneOptions } from './images.js';
export type { SnapshotOptions } from './snapshots.js';
export type { RenewLeaseOptions } from './jobs.js';
export type { ExportTrajectoryOptions } from './trajectories.js';
export type { RunBatchEntry } from './run.js';
export type { EventsQuery, LogsOptions } from './events.js';
export type { DrainResult, FleetHost, FleetHostList } from './fleet.js';

/**
 * Client of one dsecd. Cheap to keep for the life of a process; safe to use from many
 * concurrent callers (requests run in parallel over pooled connections). Every call is
 * documented where it is defined (the modules listed above).
 */
export class DsecClient extends withTemplateCalls(withFleetCalls(withTokenCalls(withEventCalls(
  withHostCalls(withRunCalls(withTrajectoryCalls(withJobCalls(withSnapshotCalls(withImageCalls(withFileCalls(withExecCalls(withSandboxCalls(Transport))))))))),
)))) {
  /** @param opts socket path and deadline; all optional. */
  constructor(opts: DsecClientOptions = {}) {
    super(opts);
  }
}
