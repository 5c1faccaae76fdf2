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
/** Request, response and option types of the client (see sdk/client.ts). */
export type {
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
  ExecOptions,
  ExecOutput,
  ExecResult,
  HostInfo,
  Image,
  ImageConfig,
  ImageInfo,
  ImageProgress,
  ImportImageInput,
  Layer,
  ListSandboxesQuery,
  LongOperationOptions,
  PruneOptions,
  PruneResult,
  RequestOptions,
  Sandbox,
  SandboxState,
  StopSandboxOptions,
  VersionInfo,
} from './client.js';
