/**
 * The exec channel (GET /v1/sandboxes/{id}/exec/channel, a WebSocket): commands run to
 * completion, as POST .../exec runs them, many over one connection. An agent loop that
 * runs thousands of short commands in one sandbox pays the door's authentication, the
 * tenancy check and the HTTP request machinery once per connection instead of once per
 * command (docs/BENCHMARKS.md "Exec p50" has what that saves).
 *
 * The protocol, limits and audit are daemon/api/channel.ts's: `{"id", "request":
 * ExecRequest}` in (trajectory steps included), `{"id", "result": ExecResult}` or
 * `{"id", "error"}` out. With messages of at most 1 MiB, `stdin_b64` is at most ~768 KiB
 * here (POST .../exec takes more). Commands whose answers have not gone out stay running
 * when the channel closes (as a POST .../exec's command does when its client leaves);
 * their results are dropped. A request the client stopped waiting for holds its place
 * among the channel's {@link MAX_IN_FLIGHT} until its command ends; each answer is at
 * most 2 × `[exec] max_output_bytes` (base64).
 *
 * Access: the channel is opened with the tenancy check of its sandbox id and the door's
 * authentication and role (a `write` route, as any upgrade), once; revoking the token
 * closes it (daemon/remote/door.ts). The channel's opening is an audit line (`result` 101)
 * and so is every request on it, with action {@link CHANNEL_AUDIT_ACTION}. Its commands
 * count in `dsec_exec_seconds` as POST .../exec's do.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { WebSocket } from 'ws';
import { ExecRequest } from '../schema.js';
import { execInput } from '../convert.js';
import { parseWith } from '../parse.js';
import { MAX_IN_FLIGHT, notUpgraded, serveChannel } from '../channel.js';
import type { ExecRouteDeps } from './execs.js';
import { route } from './table.js';

const channelRoute = route({
  method: 'GET', url: '/v1/sandboxes/:id/exec/channel',
  summary: 'WebSocket: run commands to completion, many on one connection, answers matched by request id (see daemon/api/routes/exec-channel.ts for the message format).',
  status: 101, response: null, errors: ['NotFound'],
});

/** Action of a channel request's audit line. */
export const CHANNEL_AUDIT_ACTION = 'EXEC /v1/sandboxes/:id/exec/channel';

/** What the exec channel uses: the exec route's own deps and the API logger. */
export type ExecChannelDeps = ExecRouteDeps & { log: Logger };

/** Registers the exec channel; must run inside a context where @fastify/websocket is registered. */
export function registerExecChannelRoute(app: FastifyInstance, deps: ExecChannelDeps): void {
  app.route<{ Params: { id: string } }>({ method: 'GET', url: channelRoute.url, handler: notUpgraded, wsHandler: (socket: WebSocket, req: FastifyRequest<{ Params: { id: string } }>) => {
    const sandboxId = req.params.id;
    serveChannel(socket, req, {
      auditAction: CHANNEL_AUDIT_ACTION,
      log: deps.log,
      logFields: { sandbox: sandboxId },
      run: async (request) => {
        const body = parseWith(ExecRequest, request, 'exec request');
        const end = deps.metrics.execSeconds.startTimer();
        const result = await deps.exec.exec(sandboxId, execInput(body));
        end();
        return result;
      },
    });
  } });
}
