/**
 * The serial console of a vm sandbox (daemon/drivers/vm/console.ts holds QEMU's end):
 *
 * WebSocket `GET /v1/sandboxes/{id}/console` (?tail_lines=N replays the last N lines of
 * the console log first, as `tail -n` counts them; ?tail_bytes=N the last N bytes, at most
 * 1 MiB; one of the two; default nothing):
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
import { DsecError, invalidArgument } from '../../errors.js';
import { parseWith } from '../parse.js';
import type { ExecService } from '../../sandbox/exec.js';
import { route } from './table.js';

/** Most lines `tail_lines` replays: 100,000 (the replay is also bounded by the log's size, `[vm] console_log_bytes`). */
const MAX_TAIL_LINES = 100_000;

/** Query of the console WebSocket. */
export const ConsoleQuery = z.object({
  tail_bytes: z.coerce.number().int().min(0).max(1 << 20).optional().describe('Replay the last this many bytes of the console log before live output (default 0, at most 1 MiB).'),
  tail_lines: z.coerce.number().int().min(0).max(MAX_TAIL_LINES).optional()
    .describe('Replay the last this many lines of the console log before live output, counted as `tail -n` does (a last line without a newline counts); at most 100000; not with tail_bytes.'),
}).strict().refine((q) => q.tail_bytes === undefined || q.tail_lines === undefined, 'give tail_lines or tail_bytes, not both');

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

/** Bytes read per step when {@link tailLines} walks a log backwards: 64 KiB. */
const TAIL_CHUNK_BYTES = 64 * 1024;

/**
 * The last `n` lines of `file`, as `tail -n` counts them: lines end with `\n` (a console's
 * `\r\n` too), and a last line without one counts as a line. Fewer when the file has
 * fewer; empty for n = 0 or a missing file. Reads backwards from the end in 64 KiB steps,
 * so only the bytes returned (plus one step) are read, however large the log.
 */
export async function tailLines(file: string, n: number): Promise<Buffer> {
  if (n <= 0) return Buffer.alloc(0);
  const fh = await open(file, 'r').catch(() => null);
  if (!fh) return Buffer.alloc(0);
  try {
    const size = (await fh.stat()).size;
    const chunks: Buffer[] = [];
    let pos = size;
    let newlines = 0;
    while (pos > 0) {
      const len = Math.min(TAIL_CHUNK_BYTES, pos);
      pos -= len;
      const b = Buffer.alloc(len);
      await fh.read(b, 0, len, pos);
      for (let i = len - 1; i >= 0; i--) {
        // A newline as the file's last byte ends the last line; it does not start another.
        if (b[i] !== 0x0a || pos + i === size - 1) continue;
        newlines += 1;
        if (newlines === n) {
          chunks.unshift(b.subarray(i + 1));
          return Buffer.concat(chunks);
        }
      }
      chunks.unshift(b);
    }
    return Buffer.concat(chunks);
  } finally {
    await fh.close();
  }
}

/** What the console routes use. */
export interface ConsoleRouteDeps {
  exec: Pick<ExecService, 'attachConsole' | 'consoleLogPath'>;
}

/** Registers the console routes; must run inside a context where @fastify/websocket is registered. */
export function registerConsoleRoutes(app: FastifyInstance, deps: ConsoleRouteDeps): void {
  const m = deps.exec;
  type R = FastifyRequest<{ Params: { id: string } }>;

  app.get(logRoute.url, async (req, reply) => {
    const b = await tail(m.consoleLogPath((req as R).params.id), 1 << 30);
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
    const file = m.consoleLogPath(r.params.id);
    void (q.tail_lines !== undefined ? tailLines(file, q.tail_lines) : tail(file, q.tail_bytes ?? 0)).then((b) => {
      if (b.length) send(b);
    }, () => {}).finally(() => {
      replaying = false;
      for (const b of held.splice(0)) send(b);
    });
  });
}
