/**
 * Public entry point of the dsec SDK: the typed client of the dsecd API and its types.
 * See sdk/client.ts for the contract of each call.
 */
/** The client, its error class and defaults. */
export {
  DsecClient,
  DsecApiError,
  isDsecApiError,
  DEFAULT_SOCKET_PATH,
  DEFAULT_TIMEOUT_MS,
} from './client.js';
/** The exec-session attachment (WebSocket) and its options. */
export { ExecAttachment } from './attach.js';
export type { AttachOptions, AttachExecInfo, ExecAttachmentEvents } from './attach.js';
/** Request, response and option types of the client (see sdk/client.ts). */
export type {
  AttachExecOptions,
  Backend,
  BootstrapImageInput,
  CommitOptions,
  CommitResult,
  ComposeImageInput,
  CreateSandboxInput,
  DeleteSandboxOptions,
  DsecClientOptions,
  ErrorKind,
  Event,
  EventsQuery,
  ExecAttachmentHandle,
  ExecInfo,
  ExecOptions,
  ExecOutput,
  ExecOutputQuery,
  ExecResult,
  FileOptions,
  FileStat,
  HostInfo,
  Image,
  ImageConfig,
  ImageInfo,
  ImageProgress,
  ImportImageInput,
  Layer,
  ListSandboxesQuery,
  LogsOptions,
  LongOperationOptions,
  PruneOptions,
  PruneResult,
  PutArchiveResult,
  RequestOptions,
  Sandbox,
  SandboxState,
  SandboxStats,
  StartExecOptions,
  StatsResponse,
  StopSandboxOptions,
  VersionInfo,
  WaitExecOptions,
  WriteFileOptions,
  WriteFileResult,
  WriteStdinOptions,
} from './client.js';
