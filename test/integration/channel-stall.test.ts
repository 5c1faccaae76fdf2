/**
 * A request channel's stall rule (daemon/api/channel.ts ANSWER_STALL_MS) against a real
 * dsecd: a client that reads nothing for that long is dropped, and a client that reads
 * some of its answers within each such period is not, even when its last answer waits
 * longer than that in all. Runs on the exec channel; the run channel shares the code.
 * Takes about 100 s (two pauses either side of the 60 s limit).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Socket } from 'node:net';
import WebSocket from 'ws';
import { ANSWER_STALL_MS } from '../../daemon/api/channel.js';
import { IS_ROOT, TestDaemon } from './harness.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Answers this test asks for, each ~2.7 MB (2 MB of output in base64): far beyond what the socket buffers hold. */
const ANSWERS = 8;

describe.skipIf(!IS_ROOT)('request channel stall rule', () => {
  let d: TestDaemon;
  let sb: string;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 49 });
    sb = (await d.client.createSandbox({ image: 'busybox' })).id;
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  /** Opens a raw channel, sends ANSWERS big-output requests and stops reading at once. */
  const stalledChannel = async () => {
    const ws = new WebSocket(`ws+unix://${d.socket}:/v1/sandboxes/${sb}/exec/channel`, { maxPayload: 64 * 1024 * 1024 });
    const got: unknown[] = [];
    ws.on('message', (m) => got.push(JSON.parse(String(m)).id));
    let closeCode: number | null = null;
    const closed = new Promise<void>((r) => ws.on('close', (code) => {
      closeCode = code;
      r();
    }));
    await new Promise((r, j) => {
      ws.once('open', r);
      ws.once('error', j);
    });
    const sock = (ws as unknown as { _socket: Socket })._socket;
    sock.pause();
    for (let i = 0; i < ANSWERS; i++) ws.send(JSON.stringify({ id: i, request: { argv: ['head', '-c', '2000000', '/dev/zero'] } }));
    return { ws, sock, got, closed, code: () => closeCode };
  };

  it('drops a client that reads nothing for the limit; keeps one that reads some before it, twice', async () => {
    const [stopped, slow] = await Promise.all([stalledChannel(), stalledChannel()]);
    const pause = ANSWER_STALL_MS * 0.75;
    await sleep(pause);
    // The slow client takes a few bytes, then stops again for as long.
    slow.sock.resume();
    await sleep(30);
    slow.sock.pause();
    await sleep(pause);
    // By now the stopped client has taken nothing for 1.5 × the limit, and the slow
    // one's last answers have waited that long too.
    stopped.sock.resume();
    slow.sock.resume();
    await stopped.closed;
    expect(stopped.code()).toBe(1006);
    expect(stopped.got.length).toBeLessThan(ANSWERS);
    for (let i = 0; i < 200 && slow.got.length < ANSWERS; i++) await sleep(100);
    expect(slow.got.sort()).toEqual(Array.from({ length: ANSWERS }, (_, i) => i));
    expect(slow.code()).toBeNull();
    slow.ws.close();
  }, 180_000);
});
