// Paced exec sessions (daemon/sandbox/exec-sessions.ts): output held for the readers, the
// command's output paused while a stream holds more than the window and resumed once the
// readers caught up; nothing dropped, nothing written to disk.
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { AgentExecHandle, AgentExecOutcome } from '../../daemon/agent/client.js';
import { ExecSession, PACED_WINDOW_BYTES } from '../../daemon/sandbox/exec-sessions.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(path.join(tmpdir(), 'dsec-paced-'));
});
afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

/** A handle that records pauseOutput/resumeOutput calls; `paused` is the connection's state. */
function fakeHandle() {
  const h = {
    paused: false,
    pauses: 0,
    resumes: 0,
    stream: 1,
    pid: Promise.resolve(2),
    done: new Promise<AgentExecOutcome>(() => {}),
    writeStdin() {},
    drained: async () => {},
    closeStdin() {},
    resize() {},
    signal() {},
    pauseOutput() {
      h.paused = true;
      h.pauses++;
    },
    resumeOutput() {
      h.paused = false;
      h.resumes++;
    },
  };
  return h;
}

const CHUNK = 64 * 1024;
const chunk = (i: number) => Buffer.alloc(CHUNK, i & 0xff);

/**
 * Plays the agent: sends chunks while the handle is not paused (as the paused connection
 * would deliver nothing), `total` chunks in all, then ends the session.
 */
async function produce(s: ExecSession, h: ReturnType<typeof fakeHandle>, total: number, onHeld: (n: number) => void): Promise<void> {
  for (let i = 0; i < total; i++) {
    while (h.paused) await new Promise((r) => setImmediate(r));
    s.output('stdout', chunk(i));
    onHeld(s.heldBytes().stdout);
  }
  s.finish({ kind: 'exit', exitCode: 0, signal: null, timedOut: false, durationMs: 1 }, null);
}

describe('paced exec sessions', () => {
  it('pause the command beyond the window, resume it as the reader catches up, and lose nothing', async () => {
    const h = fakeHandle();
    const s = new ExecSession('e1', 'sb', 0, ['yes'], false, false, dir, 1024, h as unknown as AgentExecHandle, true);
    const total = 200; // 12.5 MiB, against a 1 KiB spool budget that a spooled session would truncate to
    let maxHeld = 0;
    const producing = produce(s, h, total, (n) => { maxHeld = Math.max(maxHeld, n); });
    // No reader yet: the command is paused at the window, and what it wrote is kept for the reader.
    for (let i = 0; i < 1000 && !h.paused; i++) await new Promise((r) => setImmediate(r));
    expect(h.paused).toBe(true);
    expect(s.heldBytes().stdout).toBeGreaterThan(PACED_WINDOW_BYTES);
    expect(s.heldBytes().stdout).toBeLessThanOrEqual(PACED_WINDOW_BYTES + CHUNK);
    // A slow reader (each write settles on a later turn) gets every byte, in order.
    const got: Buffer[] = [];
    const end = await s.pipe('stdout', 0, true, async (b) => {
      got.push(Buffer.from(b));
      await new Promise((r) => setImmediate(r));
    });
    await producing;
    const all = Buffer.concat(got);
    expect(end).toBe(total * CHUNK);
    expect(all.length).toBe(total * CHUNK);
    for (let i = 0; i < total; i++) expect(all[i * CHUNK], `chunk ${i}`).toBe(i & 0xff);
    // Flow control, not buffering: never more than the window plus the chunk in flight.
    expect(maxHeld).toBeLessThanOrEqual(PACED_WINDOW_BYTES + CHUNK);
    expect(h.pauses).toBeGreaterThan(1);
    expect(h.resumes).toBe(h.pauses);
    expect(s.info()).toMatchObject({ paced: true, stdout_bytes: total * CHUNK, stdout_dropped_bytes: 0, state: 'exited' });
    // Nothing was written to disk.
    expect(existsSync(dir) ? readdirSync(dir) : []).toEqual([]);
  });

  it('a reader starts at the oldest byte still held; two readers both get everything that follows', async () => {
    const h = fakeHandle();
    const s = new ExecSession('e2', 'sb', 0, ['x'], false, false, dir, 1024, h as unknown as AgentExecHandle, true);
    s.output('stdout', Buffer.from('abc'));
    s.output('stdout', Buffer.from('def'));
    // A reader takes it all and leaves: it is let go.
    const first: Buffer[] = [];
    expect(await s.pipe('stdout', 0, false, async (b) => { first.push(Buffer.from(b)); })).toBe(6);
    expect(Buffer.concat(first).toString()).toBe('abcdef');
    expect(s.heldBytes().stdout).toBe(0);
    // Offset 0 is gone: readers start at 6, the oldest byte held, and each gets what follows.
    const a: Buffer[] = [];
    const b: Buffer[] = [];
    const ra = s.pipe('stdout', 0, true, async (x) => { a.push(Buffer.from(x)); });
    const rb = s.pipe('stdout', 2, true, async (x) => { b.push(Buffer.from(x)); });
    await new Promise((r) => setImmediate(r));
    s.output('stdout', Buffer.from('ghi'));
    s.output('stdout', Buffer.from('jk'));
    s.finish({ kind: 'exit', exitCode: 0, signal: null, timedOut: false, durationMs: 1 }, null);
    expect(await ra).toBe(11);
    expect(await rb).toBe(11);
    expect(Buffer.concat(a).toString()).toBe('ghijk');
    expect(Buffer.concat(b).toString()).toBe('ghijk');
    expect(s.heldBytes().stdout).toBe(0);
    // A reader that comes after everything was taken gets nothing more.
    expect(await s.pipe('stdout', 0, true, async () => { throw new Error('nothing to read'); })).toBe(11);
  });

  it('what the slowest reader passed is let go when it leaves, what nobody read stays', async () => {
    const h = fakeHandle();
    const s = new ExecSession('e4', 'sb', 0, ['x'], false, false, dir, 1024, h as unknown as AgentExecHandle, true);
    s.output('stdout', Buffer.from('0123'));
    s.output('stdout', Buffer.from('4567'));
    // Reads one chunk, then goes away (a WebSocket that closed).
    let gone = false;
    expect(await s.pipe('stdout', 0, true, async () => { gone = true; }, () => gone)).toBe(4);
    expect(s.heldBytes().stdout).toBe(4);
    const rest: Buffer[] = [];
    s.finish({ kind: 'exit', exitCode: 0, signal: null, timedOut: false, durationMs: 1 }, null);
    expect(await s.pipe('stdout', 0, true, async (x) => { rest.push(Buffer.from(x)); })).toBe(8);
    expect(Buffer.concat(rest).toString()).toBe('4567');
    expect(s.heldBytes().stdout).toBe(0);
  });

  it('stdout and stderr are held apart; either one past the window pauses the command', async () => {
    const h = fakeHandle();
    const s = new ExecSession('e3', 'sb', 0, ['x'], false, false, dir, 1024, h as unknown as AgentExecHandle, true);
    for (let i = 0; !h.paused; i++) s.output('stderr', chunk(i));
    expect(s.heldBytes()).toEqual({ stdout: 0, stderr: PACED_WINDOW_BYTES + CHUNK });
    const err: Buffer[] = [];
    s.finish({ kind: 'exit', exitCode: 0, signal: null, timedOut: false, durationMs: 1 }, null);
    await s.pipe('stderr', 0, true, async (x) => { err.push(Buffer.from(x)); });
    expect(Buffer.concat(err).length).toBe(PACED_WINDOW_BYTES + CHUNK);
  });
});
