/**
 * Isolated execs (EXEC ISOLATE, docs/AGENT_PROTOCOL.md "Isolated execs") without
 * privileges: the wire encoding, and what an agent that cannot isolate (no CAP_SYS_ADMIN
 * in its user namespace: every ordinary sandbox) does with such a request. The agent runs
 * as a normal process (test/fixtures/agent.ts); when the test runner is root, it is
 * started through `setpriv` without CAP_SYS_ADMIN, as in an ordinary sandbox.
 *
 * What an isolated exec does (fresh namespaces, mounts, nothing surviving the call) needs
 * CAP_SYS_ADMIN and is tested in a real worker container:
 * test/integration/agent-isolated.test.ts.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import { AgentClient } from '../../daemon/agent/client.js';
import {
  ExecTag, FrameType, ISOLATE_MAX_SCRATCH, decodeExecError, decodeExecRequest, decodeTlv, encodeExecRequest, encodeTlv,
} from '../../daemon/agent/protocol.js';
import { AgentHarness, BB, buildAgent, waitFor } from '../fixtures/agent.js';

const ENV = ['PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin'];
const isRoot = process.getuid?.() === 0;
/** Run the agent without CAP_SYS_ADMIN (root: drop it from the bounding and inheritable sets first). */
const NO_SYS_ADMIN = isRoot ? ['setpriv', '--bounding-set', '-sys_admin', '--inh-caps', '-sys_admin', '--'] : [];
const ENOTSUP = 95;

const harness = new AgentHarness({ prefix: 'dsec-agent-iso-' });

beforeAll(() => buildAgent());
afterEach(() => harness.cleanup());
afterAll(() => harness.removeAll());

const u64 = (v: number) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(v));
  return b;
};

describe('ISOLATE and SCRATCH fields', () => {
  it('encode after the other fields and round-trip; defaults are zeros', () => {
    const req = {
      argv: ['/bin/true'], env: ['A=1'], timeoutMs: 100,
      isolate: { tmpBytes: 1 << 20, shmBytes: 2 << 20, scratch: [{ path: '/work', bytes: 3 << 20 }, { path: '/tmp/a b', bytes: 4096 }] },
    };
    const p = encodeExecRequest(req);
    expect(decodeExecRequest(p)).toEqual(req);
    const fields = decodeTlv(p);
    const iso = fields.find((f) => f.tag === ExecTag.ISOLATE)!;
    expect(iso.value).toEqual(Buffer.concat([u64(1 << 20), u64(2 << 20)]));
    expect(fields.filter((f) => f.tag === ExecTag.SCRATCH).map((f) => f.value)).toEqual([
      Buffer.concat([u64(3 << 20), Buffer.from('/work')]),
      Buffer.concat([u64(4096), Buffer.from('/tmp/a b')]),
    ]);
    // `isolate: {}`: one ISOLATE field of zeros (= 64 MiB each at the agent), no SCRATCH.
    const d = decodeTlv(encodeExecRequest({ argv: ['x'], env: [], isolate: {} }));
    expect(d.map((f) => f.tag)).toEqual([ExecTag.ARGV, ExecTag.ISOLATE]);
    expect(d[1].value).toEqual(Buffer.alloc(16));
    expect(decodeExecRequest(encodeExecRequest({ argv: ['x'], env: [], isolate: {} }))).toEqual({ argv: ['x'], env: [], isolate: {} });
    // No isolate: no field at all (what every older client sends).
    expect(decodeTlv(encodeExecRequest({ argv: ['x'], env: [] })).map((f) => f.tag)).toEqual([ExecTag.ARGV]);
  });

  it('rejects bad sizes and scratch paths before sending', () => {
    const bad = (isolate: unknown) => () => encodeExecRequest({ argv: ['x'], env: [], isolate: isolate as never });
    expect(bad({ tmpBytes: -1 })).toThrow(/tmpBytes/);
    expect(bad({ shmBytes: 1.5 })).toThrow(/shmBytes/);
    expect(bad({ tmpBytes: 2 ** 53 })).toThrow(/tmpBytes/);
    expect(bad({ scratch: [{ path: '/w', bytes: 0 }] })).toThrow(/bytes/);
    for (const path of ['w', '/', '//', '/a/../b', '/a/..', '/a\0b', '']) {
      expect(bad({ scratch: [{ path, bytes: 1 }] })).toThrow(/path/);
    }
    expect(bad({ scratch: Array.from({ length: ISOLATE_MAX_SCRATCH + 1 }, (_, i) => ({ path: `/s${i}`, bytes: 1 })) })).toThrow(/at most 8/);
    expect(bad({ scratch: Array.from({ length: ISOLATE_MAX_SCRATCH }, (_, i) => ({ path: `/s${i}`, bytes: 1 })) })).not.toThrow();
    expect(bad({ scratch: [{ path: '/a/..b/c..', bytes: 1 }] })).not.toThrow();
  });
});

describe('an agent without CAP_SYS_ADMIN (any ordinary sandbox)', () => {
  it('does not list "isolate", and the client refuses an isolated exec instead of running it unisolated', async () => {
    const a = await harness.start({ wrapper: NO_SYS_ADMIN });
    const c = await harness.connect(a);
    expect(c.info.features).toEqual(['tty', 'detached', 'files']);
    let err: unknown;
    try {
      c.startExec({ argv: [BB, 'true'], env: ENV, isolate: {} });
    } catch (e) {
      err = e;
    }
    expect(err).toMatchObject({ kind: 'Unimplemented', message: expect.stringMatching(/does not support "isolate"/) });
    // Plain execs are unaffected.
    expect(await c.exec({ argv: [BB, 'true'], env: ENV, maxOutputBytes: 10 })).toMatchObject({ kind: 'exit', exitCode: 0 });
    await waitFor('the start log', () => fs.readFileSync(a.logPath, 'utf8').includes('isolate=no'));
    expect(fs.readFileSync(a.logPath, 'utf8')).toMatch(/isolated execs unavailable: no CAP_SYS_ADMIN/);
  });

  it('answers a raw ISOLATE with EXEC_ERROR ENOTSUP, and malformed fields with ERROR', async () => {
    const a = await harness.start({ wrapper: NO_SYS_ADMIN });
    const r = harness.raw(a.socketPath);
    await r.hello();
    r.send(FrameType.EXEC, 1, encodeTlv([{ tag: ExecTag.ARGV, value: Buffer.from(BB) }, { tag: ExecTag.ISOLATE, value: Buffer.alloc(16) }]));
    const f = await r.next();
    expect(f.type).toBe(FrameType.EXEC_ERROR);
    expect(decodeExecError(f.payload)).toEqual({ errno: ENOTSUP, message: expect.stringMatching(/^isolate: unavailable in this sandbox: no CAP_SYS_ADMIN/) });
    const malformed: [Buffer, RegExp][] = [
      [encodeTlv([{ tag: ExecTag.ISOLATE, value: Buffer.alloc(8) }]), /ISOLATE must be 16 bytes/],
      [encodeTlv([{ tag: ExecTag.SCRATCH, value: Buffer.concat([u64(1), Buffer.from('/w')]) }]), /SCRATCH needs ISOLATE/],
      [encodeTlv([{ tag: ExecTag.ISOLATE, value: Buffer.alloc(16) }, { tag: ExecTag.SCRATCH, value: Buffer.concat([u64(0), Buffer.from('/w')]) }]), /size > 0/],
      [encodeTlv([{ tag: ExecTag.ISOLATE, value: Buffer.alloc(16) }, { tag: ExecTag.SCRATCH, value: Buffer.concat([u64(1), Buffer.from('w')]) }]), /absolute/],
      [encodeTlv([{ tag: ExecTag.ISOLATE, value: Buffer.alloc(16) }, { tag: ExecTag.SCRATCH, value: Buffer.concat([u64(1), Buffer.from('/a/../b')]) }]), /'\.\.'/],
      [encodeTlv([{ tag: ExecTag.ISOLATE, value: Buffer.alloc(16) }, { tag: ExecTag.SCRATCH, value: Buffer.concat([u64(1), Buffer.from('///')]) }]), /must not be \//],
      [encodeTlv([{ tag: ExecTag.ISOLATE, value: Buffer.alloc(16) }, ...Array.from({ length: 9 }, (_, i) => ({ tag: ExecTag.SCRATCH, value: Buffer.concat([u64(1), Buffer.from(`/s${i}`)]) }))]), /more than 8/],
    ];
    let stream = 2;
    for (const [fields, msg] of malformed) {
      r.send(FrameType.EXEC, stream, Buffer.concat([encodeTlv([{ tag: ExecTag.ARGV, value: Buffer.from(BB) }]), fields]));
      const e = await r.next();
      expect({ type: e.type, stream: e.stream }).toEqual({ type: FrameType.ERROR, stream });
      expect(e.payload.toString()).toMatch(msg);
      stream++;
    }
  });

  it('--worker without CAP_SYS_ADMIN is fatal: a worker must never serve without isolation', async () => {
    const a = await harness.start({ wrapper: [...NO_SYS_ADMIN, BB, 'sh', '-c', 'exec "$@" --worker', 'sh'] });
    await a.exited;
    expect(a.child.exitCode).toBe(1);
    expect(fs.readFileSync(a.logPath, 'utf8')).toMatch(/fatal: --worker: the agent has no CAP_SYS_ADMIN/);
    await expect(AgentClient.connect(a.socketPath, { timeoutMs: 2000 })).rejects.toThrow();
  });
});
