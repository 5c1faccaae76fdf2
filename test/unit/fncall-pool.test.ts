import { describe, expect, it } from 'vitest';
import pino from 'pino';
import { FncallPools, type FncallCall, type FncallPoolConfig, type WorkerHost } from '../../daemon/fncall/pool.js';
import { DsecError, notFound } from '../../daemon/errors.js';
import type { ExecResult } from '../../daemon/model/exec.js';
import type { SandboxRecord } from '../../daemon/model/sandbox.js';

const cfg = (over: Partial<FncallPoolConfig> = {}): FncallPoolConfig => ({
  maxWorkers: 2, minIdle: 0, idleMs: 1000, callsPerWorker: 1000, maxQueue: 100, memoryBytes: 256 << 20, cpus: 1, pids: 64, ...over,
});
const ok = (out = ''): ExecResult => ({
  exit_code: 0, signal: null, stdout_b64: Buffer.from(out).toString('base64'), stderr_b64: '', stdout_truncated: false, stderr_truncated: false,
  duration_ms: 1, oom: false, timed_out: false,
});

/** A host whose workers are plain objects; calls resolve when the test says so. */
class FakeHost implements WorkerHost {
  created: string[] = [];
  destroyed: string[] = [];
  limits: Array<[string, number]> = [];
  pending: Array<{ id: string; call: FncallCall; resolve: (r: ExecResult) => void; reject: (e: Error) => void }> = [];
  failCreate = false;
  private n = 0;
  dead = new Set<string>();
  async resolveImage(ref: string) {
    if (ref === 'missing') throw notFound('image missing not found');
    const r = ref.includes(':') ? ref : `${ref}:latest`;
    return { ref: r, key: `${r}@layers` };
  }
  alive(sb: SandboxRecord) {
    return !this.dead.has(sb.id);
  }
  async createWorker(image: string) {
    if (this.failCreate) throw new DsecError('Internal', 'runc failed');
    const id = `w${this.n++}`;
    this.created.push(id);
    return { id, image } as unknown as SandboxRecord;
  }
  async destroyWorker(id: string) {
    this.destroyed.push(id);
  }
  execIsolated(sb: SandboxRecord, call: FncallCall) {
    return new Promise<ExecResult>((resolve, reject) => this.pending.push({ id: sb.id, call, resolve, reject }));
  }
  async setMemoryLimit(id: string, bytes: number) {
    this.limits.push([id, bytes]);
  }
}

const tick = () => new Promise((r) => setTimeout(r, 0));
const call = (image = 'busybox', over: Partial<FncallCall> = {}): FncallCall => ({ image, argv: ['true'], ...over });

describe('FncallPools', () => {
  it('grows with demand up to the cap, queues beyond it in order, and reuses workers', async () => {
    const h = new FakeHost();
    const p = new FncallPools(h, cfg(), pino({ level: 'silent' }));
    const calls = [0, 1, 2, 3].map((i) => p.run(call('busybox', { argv: [`c${i}`] })));
    await tick();
    expect(h.created).toEqual(['w0', 'w1']);
    expect(h.pending.map((x) => x.call.argv[0])).toEqual(['c0', 'c1']);
    expect(p.stats()[0]).toMatchObject({ image: 'busybox:latest', busy: 2, queued: 2 });
    h.pending.shift()!.resolve(ok('r0'));
    await tick();
    expect(h.pending.map((x) => [x.id, x.call.argv[0]])).toEqual([['w1', 'c1'], ['w0', 'c2']]);
    for (let i = 0; i < 3; i++) {
      h.pending.shift()!.resolve(ok());
      await tick();
    }
    await Promise.all(calls);
    expect(h.created).toEqual(['w0', 'w1']);
    expect(p.stats()[0]).toMatchObject({ idle: 2, busy: 0, queued: 0, calls: 4, replaced: 0 });
  });

  it('replaces a worker after an OOM and after a lost agent, and after callsPerWorker calls', async () => {
    const h = new FakeHost();
    const p = new FncallPools(h, cfg({ maxWorkers: 1, callsPerWorker: 2 }), pino({ level: 'silent' }));
    const a = p.run(call());
    await tick();
    h.pending.shift()!.resolve({ ...ok(), oom: true, exit_code: null, signal: 'SIGKILL' });
    expect((await a).oom).toBe(true);
    expect(h.destroyed).toEqual(['w0']);
    const b = p.run(call());
    await tick();
    h.pending.shift()!.reject(new DsecError('Unavailable', 'agent lost'));
    await expect(b).rejects.toMatchObject({ kind: 'Unavailable' });
    expect(h.destroyed).toEqual(['w0', 'w1']);
    for (let i = 0; i < 2; i++) {
      const c = p.run(call());
      await tick();
      h.pending.shift()!.resolve(ok());
      await c;
    }
    expect(h.destroyed).toEqual(['w0', 'w1', 'w2']);
    expect(p.stats()[0].replaced).toBe(3);
  });

  it('skips a worker that died while idle, keeps one whose call was refused as a bad request', async () => {
    const h = new FakeHost();
    const p = new FncallPools(h, cfg({ maxWorkers: 1 }), pino({ level: 'silent' }));
    const a = p.run(call());
    await tick();
    h.pending.shift()!.resolve(ok());
    await a;
    h.dead.add('w0');
    const b = p.run(call());
    await tick();
    await tick();
    expect(h.pending.map((x) => x.id)).toEqual(['w1']);
    h.pending.shift()!.reject(new DsecError('InvalidArgument', 'chdir /nope: no such directory'));
    await expect(b).rejects.toMatchObject({ kind: 'InvalidArgument' });
    expect(h.destroyed).toEqual(['w0']);
    expect(p.stats()[0]).toMatchObject({ idle: 1, replaced: 1 });
  });

  it('bounds the wait for a worker by the call timeout, and drops a queued call whose caller went away', async () => {
    const h = new FakeHost();
    const p = new FncallPools(h, cfg({ maxWorkers: 1 }), pino({ level: 'silent' }));
    const busy = p.run(call());
    await tick();
    await expect(p.run(call('busybox', { timeoutMs: 20 }))).rejects.toMatchObject({ kind: 'DeadlineExceeded' });
    const gone = new AbortController();
    const q = p.run(call('busybox', { argv: ['abandoned'] }), gone.signal);
    await tick();
    gone.abort();
    await expect(q).rejects.toMatchObject({ kind: 'Unavailable' });
    expect(p.stats()[0].queued).toBe(0);
    h.pending.shift()!.resolve(ok());
    await busy;
    await tick();
    expect(h.pending).toEqual([]); // the abandoned call never ran
  });

  it('sets the memory limit only when a call asks for a different one', async () => {
    const h = new FakeHost();
    const p = new FncallPools(h, cfg({ maxWorkers: 1 }), pino({ level: 'silent' }));
    for (const mem of [undefined, 128 << 20, 128 << 20, undefined]) {
      const c = p.run(call('busybox', mem ? { memoryBytes: mem } : {}));
      await tick();
      h.pending.shift()!.resolve(ok());
      await c;
    }
    expect(h.limits).toEqual([['w0', 128 << 20], ['w0', 256 << 20]]);
  });

  it('fails waiting calls when no worker can start, refuses a full queue, and reports unknown images', async () => {
    const h = new FakeHost();
    h.failCreate = true;
    const p = new FncallPools(h, cfg({ maxQueue: 1 }), pino({ level: 'silent' }));
    await expect(p.run(call())).rejects.toMatchObject({ kind: 'Internal' });
    await expect(p.run(call('missing'))).rejects.toMatchObject({ kind: 'NotFound' });
    h.failCreate = false;
    const p2 = new FncallPools(h, cfg({ maxWorkers: 1, maxQueue: 1 }), pino({ level: 'silent' }));
    const a = p2.run(call());
    await tick();
    const b = p2.run(call());
    await expect(p2.run(call())).rejects.toMatchObject({ kind: 'ResourceExhausted' });
    h.pending.shift()!.resolve(ok());
    await tick();
    h.pending.shift()!.resolve(ok());
    await Promise.all([a, b]);
  });

  it('keeps pools per image and shrinks idle workers beyond minIdle after idleMs', async () => {
    const h = new FakeHost();
    const p = new FncallPools(h, cfg({ minIdle: 1, idleMs: 50 }), pino({ level: 'silent' }));
    const cs = [p.run(call('a')), p.run(call('a')), p.run(call('b'))];
    await tick();
    for (const x of h.pending.splice(0)) x.resolve(ok());
    await Promise.all(cs);
    expect(p.stats().map((s) => [s.image, s.idle])).toEqual([['a:latest', 2], ['b:latest', 1]]);
    expect(await p.shrink(Date.now())).toEqual([]);
    const gone = await p.shrink(Date.now() + 100);
    expect(gone).toHaveLength(1);
    expect(p.stats().map((s) => s.idle)).toEqual([1, 1]);
    await p.close();
    expect(h.destroyed.length).toBe(3);
    await expect(p.run(call('a'))).rejects.toMatchObject({ kind: 'Unavailable' });
  });
});
