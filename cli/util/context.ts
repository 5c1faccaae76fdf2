/**
 * Per-run state shared by the verbs: the injected I/O, the global options and a lazily
 * created API client.
 */
import type { Command } from 'commander';
import { DsecClient } from '../../sdk/index.js';
import type { CliIO } from './io.js';
import { useColor } from './output.js';

/** Global options, defined on the root command. */
export interface GlobalOptions {
  /** `--socket PATH`: the dsecd socket. */
  socket?: string;
  /** `--json`: machine-readable output. */
  json?: boolean;
}

/** State of one `main()` run; one instance per run, never shared. */
export class Ctx {
  /** The verb being run, e.g. `ls` or `host info`; set before its action starts, used in hints. */
  verb = '';
  /** Exit code the run returns unless an error is thrown; verbs set it. */
  exitCode = 0;
  private clientInstance?: DsecClient;

  /**
   * @param io streams, environment and interrupt hook of this run
   * @param program the root command, whose options are the global ones
   */
  constructor(
    /** Streams, environment and interrupt hook of this run. */
    readonly io: CliIO,
    private readonly program: Command,
  ) {}

  /** The parsed global options. */
  get globals(): GlobalOptions {
    return this.program.opts<GlobalOptions>();
  }

  /** True when `--json` was given. */
  get json(): boolean {
    return this.globals.json === true;
  }

  /** True when stdout is a terminal and NO_COLOR is unset. */
  get color(): boolean {
    return useColor(this.io.stdout, this.io.env);
  }

  /** True when DSEC_DEBUG is set to something other than `0` or empty. */
  get debug(): boolean {
    const d = this.io.env.DSEC_DEBUG;
    return d !== undefined && d !== '' && d !== '0';
  }

  /** The API client for `--socket`, else `$DSEC_SOCKET` (from this run's env), else the default; created on first use. */
  client(): DsecClient {
    this.clientInstance ??= new DsecClient({ socketPath: this.globals.socket || this.io.env.DSEC_SOCKET || undefined });
    return this.clientInstance;
  }

  /** Writes text to stdout. */
  out(text: string): void {
    this.io.stdout.write(text);
  }

  /** Writes text to stderr. */
  err(text: string): void {
    this.io.stderr.write(text);
  }

  /** Releases the client's pooled connections. Safe to call twice. */
  close(): void {
    this.clientInstance?.close();
  }
}
