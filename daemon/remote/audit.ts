/**
 * The audit log: one JSON line per mutating API call (anything but a plain GET; a
 * WebSocket attach counts, since it writes to a command), on both doors, including calls
 * refused for their credentials or role. Written to `<root>/audit.log` (mode
 * 0600) through pino's asynchronous file writer (sonic-boom); SIGHUP reopens the file, so logrotate can move it away.
 *
 * A line: `{"time":"<ISO 8601>","door":"unix"|"tcp","remote":ADDR|null,"token":ID|null,
 * "tenant":NAME|null,"role":ROLE|null,"peer":CN|null,"action":"POST /v1/sandboxes/:id/pause",
 * "object":{...route params, "created": ID?},"result":STATUS,"error":KIND|null}`.
 * A WebSocket attach is logged when it is allowed to start (`result` 101), since its
 * outcome is a stream; what it did is in the exec session's own record. A request channel
 * (daemon/api/channel.ts: the exec channel and the run channel) is logged when it opens
 * and again for each request sent on it (action `EXEC /v1/sandboxes/:id/exec/channel` or
 * `RUN /v1/run/channel`, the answer's status and error kind; `result` 499 and error
 * `ClientClosed` for one still running when the channel closes), since each is a command
 * run as POST .../exec or POST /v1/run would run it.
 */
import { chmodSync, closeSync, existsSync, openSync } from 'node:fs';
import pino from 'pino';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';

/** One audit record as written (see the module comment). */
export interface AuditRecord {
  door: 'unix' | 'tcp';
  remote: string | null;
  token: string | null;
  tenant: string | null;
  role: string | null;
  peer: string | null;
  action: string;
  object: Record<string, string> | null;
  result: number;
  error: string | null;
}

/** The audit log file of one dsecd. */
export class AuditLog {
  private readonly dest: pino.DestinationStream & { reopen(): void; flushSync(): void; end(): void };

  /** Opens (creating with mode 0600) `file` for appending. */
  constructor(readonly file: string) {
    if (!existsSync(file)) closeSync(openSync(file, 'a', 0o600));
    chmodSync(file, 0o600);
    this.dest = pino.destination({ dest: file, append: true, sync: false, mkdir: true }) as unknown as AuditLog['dest'];
  }

  private closed = false;
  private closing: Promise<void> | null = null;

  /**
   * Writes one record. After {@link close} a record is dropped: a response that finishes
   * while dsecd shuts down (its connection closed by the server's close) must not write
   * to the ended file stream, which throws (sonic-boom "destroyed") and would end dsecd
   * with an uncaught error instead of a clean stop.
   */
  write(r: AuditRecord): void {
    if (this.closed) return;
    this.dest.write(JSON.stringify({ time: new Date().toISOString(), ...r }) + '\n');
  }

  /** Reopens the file (after logrotate moved it); nothing after {@link close}. */
  reopen(): void {
    if (this.closed) return;
    this.dest.reopen();
  }

  /**
   * Writes out what is buffered and closes the file; resolves once it is closed (records
   * written before are on disk). Later writes are dropped. Safe to call twice.
   */
  close(): Promise<void> {
    if (this.closing) return this.closing;
    this.closed = true;
    const dest = this.dest as unknown as NodeJS.EventEmitter & AuditLog['dest'];
    this.closing = new Promise<void>((resolve) => {
      dest.once('close', () => resolve());
      dest.once('error', () => resolve());
    });
    dest.end();
    return this.closing;
  }
}

/** Whether a request changes something (the audit log's and the reader role's notion). */
export function isMutating(req: FastifyRequest): boolean {
  return !((req.method === 'GET' || req.method === 'HEAD') && !isUpgrade(req));
}

/** Whether the request asks to upgrade to a WebSocket. */
export function isUpgrade(req: FastifyRequest): boolean {
  return String(req.headers.upgrade ?? '').toLowerCase() === 'websocket';
}

declare module 'fastify' {
  interface FastifyRequest {
    /**
     * On an upgraded request that passed the door (a request channel): writes one audit line
     * for a request made over the WebSocket, with the upgrade's identity and parameters,
     * `action` (e.g. `EXEC /v1/sandboxes/:id/exec/channel`), HTTP-style `status` and error
     * kind. Unset where no audit log is kept.
     */
    auditMessage?: (action: string, status: number, error: string | null) => void;
  }
}

const created = new WeakMap<FastifyRequest, string>();

/**
 * Adds the audit hooks to `app`: every mutating request is written once its answer is
 * sent (or its connection closes), a WebSocket upgrade when it reaches its handler.
 * Must be installed before the door's authentication hook, so refused calls are logged too.
 */
export function installAudit(app: FastifyInstance, audit: AuditLog, door: 'unix' | 'tcp'): void {
  const record = (req: FastifyRequest, status: number, error: string | null): AuditRecord => {
    const p = req.principal;
    const params = (req.params ?? {}) as Record<string, string>;
    const object: Record<string, string> = { ...params };
    const c = created.get(req);
    if (c) object.created = c;
    return {
      door, remote: door === 'tcp' ? (req.socket.remoteAddress ?? null) : null,
      token: p?.tokenId ?? null, tenant: p?.tenant ?? null, role: p?.role ?? null, peer: p?.peer?.name ?? null,
      action: `${req.method} ${req.routeOptions.url ?? req.url.split('?')[0]}`,
      object: Object.keys(object).length ? object : null,
      result: status, error,
    };
  };
  app.addHook('onRequest', (req, reply, done) => {
    if (!isMutating(req) || isUpgrade(req)) return done();
    let written = false;
    const finish = () => {
      if (written) return;
      written = true;
      const status = reply.raw.statusCode;
      audit.write(record(req, status, errorKindOf(reply)));
    };
    reply.raw.once('finish', finish);
    reply.raw.once('close', finish);
    done();
  });
  // An upgrade that passed authentication: logged as it starts (a refused one answers
  // with an error status, which the onRequest listener does not see for upgrades).
  app.addHook('preHandler', (req, _reply, done) => {
    if (isUpgrade(req)) {
      audit.write(record(req, 101, null));
      req.auditMessage = (action, status, error) => audit.write({ ...record(req, status, error), action });
    }
    done();
  });
  app.addHook('onError', (req, reply, err, done) => {
    if (isUpgrade(req)) audit.write(record(req, (err as { status?: number }).status ?? reply.statusCode, (err as { kind?: string }).kind ?? null));
    done();
  });
  // The id a create answered with (`201 {"id": ...}`), so the line names what was made.
  app.addHook('onSend', (req, reply, payload, done) => {
    if (reply.statusCode === 201 && typeof payload === 'string' && payload.length < 65_536 && isMutating(req)) {
      // `sandboxID`: E2B's create answer (daemon/api/e2b/control.ts).
      const m = /"(?:id|ref|name|sandboxID)":"([^"]{1,256})"/.exec(payload);
      if (m) created.set(req, m[1]);
    }
    done(null, payload);
  });
}

const errorKinds = new WeakMap<FastifyReply, string>();

/** Records the error kind a reply answers with (sendError calls it), for the audit line. */
export function noteErrorKind(reply: FastifyReply, kind: string): void {
  errorKinds.set(reply, kind);
}

function errorKindOf(reply: FastifyReply): string | null {
  return errorKinds.get(reply) ?? null;
}
