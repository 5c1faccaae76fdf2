/**
 * The serial console of a vm sandbox (daemon/drivers/vm/console.ts holds QEMU's end):
 *
 * WebSocket `GET /v1/sandboxes/{id}/console` (?tail_bytes=N replays the last N bytes of the
 * console log first, at most 1 MiB; default 0):
 * - server -> client, binary: channel byte 1 + console output;
 * - server -> client, text: `{"type":"exit","reason":...}` when the console ends (the VM
 *   stopped; then close 1000), or `{"type":"error","error":{code,message}}` (then close
 *   1011, or 1008 when the client broke the protocol);
 * - client -> server, binary: channel byte 0 + input bytes for the guest.
 * Text from the client is a protocol violation. Several clients may attach at once: all
 * see the output, the input of each goes to the guest. Closing the WebSocket detaches; the
 * VM is never affected.
 *
 * `GET /v1/sandboxes/{id}/console/log` returns the console log (the kept tail, bounded by
 * `[vm] console_log_bytes`) as raw bytes.
 */
import { open, stat } from 'node:fs/promises';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { WebSocket } from 'ws';
import { z } from 'zod';
import { DsecError, failedPrecondition, invalidArgument } from '../../errors.js';
import { parseWith } from '../server.js';
import type { ApiDeps } from '../server.js';
import { route } from './table.js';

/** Query of the console WebSocket. */
export const ConsoleQuery = z.object({
  tail_bytes: z.coerce.number().int().min(0).max(1 << 20).optional().describe('Replay the last this many bytes of the console log before live output (default 0, at most 1 MiB).'),
}).strict();

const P = '/v1/sandboxes/:id/console';
const attachRoute = route({ method: 'GET', url: P, summary: 'WebSocket: the serial console of a vm sandbox, interactively (see daemon/api/routes/console.ts for the message format).', query: ConsoleQuery, status: 101, response: null, errors: ['NotFound', 'FailedPrecondition', 'Unavailable'] });
const logRoute = route({ method: 'GET', url: `${P}/log`, summary: 'The serial console log of a vm sandbox (raw bytes; the last [vm] console_log_bytes at most).', status: 200, response: null, errors: ['NotFound', 'FailedPrecondition'] });

/** The last `n` bytes of `file` (fewer when it is shorter; empty when missing). */
async function tail(file: string, n: number): Promise<Buffer> {
  if (n <= 0) return Buffer.alloc(0);
  const st = await stat(file).catch(() => null);
  if (!st) return Buffer.alloc(0);
  const fh = await open(file, 'r');
  try {
    const len = Math.min(n, st.size);
    const b = Buffer.alloc(len);
    await fh.read(b, 0, len, st.size - len);
    return b;
  } finally {
    await fh.close();
  }
}

/** Registers the console routes; must run inside a context where @fastify/websocket is registered. */
export function registerConsoleRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const m = deps.manager;
  type R = FastifyRequest<{ Params: { id: string } }>;

  app.get(logRoute.url, async (req, reply) => {
    const sb = m.get((req as R).params.id);
    if (sb.backend !== 'vm') throw failedPrecondition(`sandbox ${sb.id} is a ${sb.backend} sandbox: only vm sandboxes have a serial console`);
    const b = await tail(m.consoleLogPath(sb.id), 1 << 30);
    return reply.type('application/octet-stream').send(b);
  });

  app.get(attachRoute.url, { websocket: true }, (socket: WebSocket, req: FastifyRequest) => {
    const r = req as R;
    const fail = (e: unknown, code = 1011) => {
      const err = e instanceof DsecError ? e : new DsecError('Internal', (e as Error).message);
      if (socket.readyState === socket.OPEN) {
        socket.send(JSON.stringify({ type: 'error', error: { code: err.kind, message: err.message } }));
        socket.close(code, err.kind);
      }
    };
    let q: z.infer<typeof ConsoleQuery>;
    let att: ReturnType<typeof m.attachConsole>;
    // Output that arrives while the replay is being sent waits behind it.
    let replaying = true;
    const held: Buffer[] = [];
    const send = (b: Buffer) => {
      if (socket.readyState === socket.OPEN) socket.send(Buffer.concat([Buffer.from([1]), b]), { binary: true });
    };
    try {
      q = parseWith(ConsoleQuery, req.query, 'query');
      att = m.attachConsole(r.params.id, {
        onData: (b) => (replaying ? held.push(b) : send(b)),
        onEnd: (reason) => {
          if (socket.readyState !== socket.OPEN) return;
          socket.send(JSON.stringify({ type: 'exit', reason }), () => socket.close(1000, 'console ended'));
        },
      });
    } catch (e) {
      fail(e, e instanceof DsecError && e.kind === 'InvalidArgument' ? 1008 : 1011);
      return;
    }
    socket.on('close', () => att.detach());
    socket.on('error', () => att.detach());
    socket.on('message', (data: Buffer, isBinary: boolean) => {
      try {
        if (!isBinary) throw invalidArgument('the console takes binary messages only: channel byte 0 + input bytes');
        if (data.length < 1 || data[0] !== 0) throw invalidArgument('binary messages must start with channel byte 0 (input)');
        if (!att.write(data.subarray(1))) {
          socket.pause();
          void att.drained().then(() => socket.resume());
        }
      } catch (e) {
        att.detach();
        fail(e, 1008);
      }
    });
    void tail(m.consoleLogPath(r.params.id), q.tail_bytes ?? 0).then((b) => {
      if (b.length) send(b);
    }, () => {}).finally(() => {
      replaying = false;
      for (const b of held.splice(0)) send(b);
    });
  });
}
