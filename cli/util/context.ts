/**
 * Per-run state shared by the verbs: the injected I/O, the global options and a lazily
 * created API client.
 */
import type { Command } from 'commander';
import { readFileSync } from 'node:fs';
import { DEFAULT_SOCKET_PATH, DsecClient } from '../../sdk/index.js';
import { readContexts } from './contexts.js';
import { UserError } from './errors.js';
import type { CliIO } from './io.js';
import { useColor } from './output.js';

/** Global options, defined on the root command. */
export interface GlobalOptions {
  /** `--socket PATH`: the dsecd socket. */
  socket?: string;
  /** `--host https://HOST:PORT`: dsecd's TCP door (or a gateway). */
  host?: string;
  /** `--token TOKEN`: the API token for the TCP door. */
  token?: string;
  /** `--ca FILE`: CA certificate to trust on the TCP door. */
  ca?: string;
  /** `--context NAME`: a saved context (cli/util/contexts.ts). */
  context?: string;
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
    this.clientInstance ??= new DsecClient(this.target());
    return this.clientInstance;
  }

  /**
   * Which dsecd this run talks to, first match wins: `--socket`; `--host` (with `--token`
   * or DSEC_TOKEN, `--ca` or DSEC_CA); `--context NAME`; DSEC_HOST (with DSEC_TOKEN,
   * DSEC_CA); DSEC_SOCKET; the current context (`dsec context use`); the default socket.
   * A context's token gives way to `--token`, its CA to `--ca`.
   * @throws UserError for an unknown context, an unreadable CA file, or an address that
   *   is not `https://HOST:PORT` (naming where it came from: --host, DSEC_HOST, a context).
   */
  target(): { socketPath: string; remote?: undefined } | { socketPath?: undefined; remote: { url: string; token?: string; ca?: Buffer } } {
    const g = this.globals;
    const env = this.io.env;
    const ca = (file: string | undefined, what: string): Buffer | undefined => {
      if (!file) return undefined;
      try {
        return readFileSync(file);
      } catch (e) {
        throw new UserError(`${what} ${file}: ${(e as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (e as Error).message}`, "copy dsecd's CA certificate (<root>/tls/ca.crt on its host, or the fleet CA) here");
      }
    };
    // The SDK's Endpoint would refuse a bad address with a TypeError (a bug's exit); say it as the user's mistake.
    const host = (url: string, what: string): string => {
      let u: URL | undefined;
      try {
        u = new URL(url);
      } catch { /* not a URL: refused below */ }
      const why = u?.protocol !== 'https:' ? 'want https://HOST:PORT (the TCP door speaks TLS only)' : u.pathname !== '/' && u.pathname !== '' ? 'no path after HOST:PORT' : null;
      if (why) throw new UserError(`${what} ${JSON.stringify(url)}: ${why}`, 'e.g. --host https://dsec1.example.org:8443 (the port of dsecd --listen)');
      return url;
    };
    const fromContext = (name: string) => {
      const c = readContexts(env).contexts[name];
      if (!c) throw new UserError(`no context ${JSON.stringify(name)}`, 'list them with `dsec context ls`; add one with `dsec context add`');
      return { remote: { url: host(c.host, `context ${name}: host`), token: g.token || c.token || env.DSEC_TOKEN || undefined, ca: g.ca ? ca(g.ca, '--ca') : ca(c.ca, `context ${name}: CA`) } };
    };
    if (g.socket) return { socketPath: g.socket };
    if (g.host) return { remote: { url: host(g.host, '--host'), token: g.token || env.DSEC_TOKEN || undefined, ca: ca(g.ca || env.DSEC_CA, g.ca ? '--ca' : 'DSEC_CA') } };
    if (g.context) return fromContext(g.context);
    if (env.DSEC_HOST) return { remote: { url: host(env.DSEC_HOST, 'DSEC_HOST'), token: g.token || env.DSEC_TOKEN || undefined, ca: ca(g.ca || env.DSEC_CA, g.ca ? '--ca' : 'DSEC_CA') } };
    if (env.DSEC_SOCKET) return { socketPath: env.DSEC_SOCKET };
    const current = readContexts(env).current;
    if (current) return fromContext(current);
    return { socketPath: DEFAULT_SOCKET_PATH };
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
