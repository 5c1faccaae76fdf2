/**
 * The QMP client (daemon/drivers/vmm/qmp.ts) against a scripted QMP server on a Unix
 * socket: greeting and capabilities, replies matched by id (out of order), error replies,
 * events, a monitor that stops answering, and a connection that is lost.
 */
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { QmpClient, QmpCommandError, type QmpEvent } from '../../daemon/drivers/vmm/qmp.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'dsec-qmp-test-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;
const servers: net.Server[] = [];
const clients: QmpClient[] = [];
afterEach(() => {
  for (const c of clients.splice(0)) c.close();
  for (const s of servers.splice(0)) s.close();
});

type Handler = (cmd: { execute: string; arguments?: unknown; id?: number }, send: (o: unknown) => void, sock: net.Socket) => void;

/** A QMP server that greets, accepts qmp_capabilities, and hands every other command to `on`. */
async function server(on: Handler, opts: { greet?: boolean } = {}): Promise<string> {
  const p = path.join(dir, `qmp${n++}.sock`);
  const srv = net.createServer((sock) => {
    const send = (o: unknown) => sock.write(`${JSON.stringify(o)}\r\n`);
    if (opts.greet !== false) send({ QMP: { version: { qemu: { major: 7, minor: 2, micro: 22 }, package: '' }, capabilities: ['oob'] } });
    let buf = '';
    sock.on('data', (d) => {
      buf += d.toString();
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const cmd = JSON.parse(buf.slice(0, i));
        buf = buf.slice(i + 1);
        if (cmd.execute === 'qmp_capabilities') send({ return: {}, ...(cmd.id !== undefined ? { id: cmd.id } : {}) });
        else on(cmd, send, sock);
      }
    });
  });
  await new Promise<void>((r) => srv.listen(p, r));
  servers.push(srv);
  return p;
}

const connect = async (p: string, timeoutMs?: number) => {
  const c = await QmpClient.connect(p, { timeoutMs });
  clients.push(c);
  return c;
};

describe('QMP client', () => {
  it('negotiates, matches replies to commands by id even out of order, and delivers events', async () => {
    const held: Array<() => void> = [];
    const p = await server((cmd, send) => {
      if (cmd.execute === 'query-status') held.push(() => send({ return: { status: 'running', running: true }, id: cmd.id }));
      if (cmd.execute === 'stop') {
        send({ event: 'STOP', data: {}, timestamp: { seconds: 1700000000, microseconds: 5000 } });
        send({ return: {}, id: cmd.id });
        for (const h of held.splice(0)) h(); // the earlier command answers last
      }
    });
    const c = await connect(p);
    expect(c.version).toEqual({ major: 7, minor: 2, micro: 22 });
    const events: QmpEvent[] = [];
    c.onEvent((e) => events.push(e));
    const status = c.execute<{ running: boolean }>('query-status');
    const stop = c.execute('stop');
    expect(await stop).toEqual({});
    expect(await status).toEqual({ status: 'running', running: true });
    expect(events).toEqual([{ event: 'STOP', data: {}, timeMs: 1700000000005 }]);
  });

  it('an error reply rejects with its class and description', async () => {
    const p = await server((cmd, send) => send({ error: { class: 'CommandNotFound', desc: `The command ${cmd.execute} has not been found` }, id: cmd.id }));
    const c = await connect(p);
    const e = await c.execute('nope').catch((x) => x);
    expect(e).toBeInstanceOf(QmpCommandError);
    expect(e).toMatchObject({ kind: 'Internal', errorClass: 'CommandNotFound', command: 'nope' });
    expect(e.message).toBe('QMP nope: CommandNotFound: The command nope has not been found');
  });

  it('a monitor that stops answering: DeadlineExceeded, and the connection is closed', async () => {
    const p = await server(() => { /* never answers */ });
    const c = await connect(p);
    const lost: Error[] = [];
    c.onClose((e) => lost.push(e));
    const e = await c.execute('query-status', undefined, { timeoutMs: 100 }).catch((x) => x);
    expect(e).toMatchObject({ kind: 'DeadlineExceeded', message: expect.stringMatching(/QMP query-status: no reply within 100 ms .*stopped answering/) });
    expect(c.closed).toBe(true);
    await expect(c.execute('query-status')).rejects.toMatchObject({ kind: 'Unavailable' });
    // An explicit close (this timeout) is not reported as a loss.
    expect(lost).toEqual([]);
  });

  it('no greeting in time is DeadlineExceeded; no socket is Unavailable', async () => {
    const p = await server(() => {}, { greet: false });
    await expect(QmpClient.connect(p, { timeoutMs: 100 })).rejects.toMatchObject({ kind: 'DeadlineExceeded', message: expect.stringMatching(/no greeting within 100 ms/) });
    await expect(QmpClient.connect(path.join(dir, 'missing.sock'))).rejects.toMatchObject({ kind: 'Unavailable' });
  });

  it('a lost connection fails pending commands with Unavailable and calls onClose once', async () => {
    const p = await server((_cmd, _send, sock) => sock.destroy());
    const c = await connect(p);
    const lost: Error[] = [];
    c.onClose((e) => lost.push(e));
    await expect(c.execute('quit')).rejects.toMatchObject({ kind: 'Unavailable' });
    expect(lost).toHaveLength(1);
    expect(c.closed).toBe(true);
  });
});
