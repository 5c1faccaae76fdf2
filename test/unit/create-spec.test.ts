/**
 * Resolution of a create into its spec (daemon/sandbox/resolve.ts): every default applied
 * in one place, the tier's capabilities deciding what it accepts, and the filesystem
 * options' precedence; and the create steps' errors (daemon/sandbox/create.ts), which name
 * the step and keep what the API answers.
 */
import { describe, expect, it } from 'vitest';
import { SpecResolver } from '../../daemon/sandbox/resolve.js';
import { Backends } from '../../daemon/sandbox/backends.js';
import { CreateStepError } from '../../daemon/sandbox/create.js';
import { DsecError, failedPrecondition } from '../../daemon/errors.js';
import type { Backend } from '../../daemon/model/backend.js';
import type { SandboxInput } from '../../daemon/model/sandbox.js';

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

/** A driver that only answers capabilities: `io` and the network modes as its tier has them. */
function fakeDriver(io: boolean, networkModes: readonly ('none' | 'allow' | 'open')[]) {
  return {
    capabilities: (backend: Backend) => ({
      id: `test.${backend}`, backend, available: true, reason: null, isolation: io ? 'container' : 'vm', pause: true, snapshot: null,
      networkModes, io, storeDisk: io, pool: io, console: false,
    }),
  };
}

function resolver(opts: { enforcesQuota?: boolean; capacityBytes?: number | null } = {}) {
  const drivers = new Map<Backend, never>([
    ['container', fakeDriver(true, ['none', 'allow', 'open']) as never],
    ['microvm', fakeDriver(false, ['none']) as never],
  ]);
  return new SpecResolver({
    config: {
      defaults: { cpus: 1, memoryBytes: 512 * MiB, pids: 1024, diskBytes: 10 * GiB, io: { weight: 100, readBps: null, writeBps: 8 * MiB, readIops: null, writeIops: null } },
      filesystem: { readonly_paths: ['/usr'], writable_paths: [], landlock: true },
    },
    images: { get: async () => { throw new Error('not used'); } } as never,
    backends: new Backends(drivers),
    storage: {
      enforcesQuota: opts.enforcesQuota ?? true,
      capacityBytes: () => (opts.capacityBytes === undefined ? 4 * GiB : opts.capacityBytes),
      status: () => ({ enforced: false, detail: 'no quota on the host filesystem' }),
      imagePath: '/var/lib/dsec/storage/upper.img',
    },
  });
}

const input = (over: Partial<SandboxInput> = {}): SandboxInput => ({ backend: 'container', image: 'busybox', ...over });

describe('SpecResolver.resources', () => {
  it('applies [defaults] to what the request leaves out, and the store caps the default quota', () => {
    expect(resolver().resources(input())).toEqual({
      cpus: 1, memoryBytes: 512 * MiB, pids: 1024, diskBytes: 4 * GiB,
      io: { weight: 100, readBps: null, writeBps: 8 * MiB, readIops: null, writeIops: null },
    });
    expect(resolver().resources(input({ cpus: 2, memoryBytes: 64 * MiB, pids: 64, diskBytes: GiB })))
      .toMatchObject({ cpus: 2, memoryBytes: 64 * MiB, pids: 64, diskBytes: GiB });
  });

  it('takes a restore\'s inherited quota when the request names none, and refuses one the store cannot hold', () => {
    expect(resolver().resources(input(), 2 * GiB).diskBytes).toBe(2 * GiB);
    expect(() => resolver().resources(input({ diskBytes: 8 * GiB }))).toThrow(expect.objectContaining({ kind: 'InvalidArgument', message: expect.stringMatching(/^disk_bytes 8589934592 is more than/) }));
    expect(() => resolver().resources(input(), 8 * GiB)).toThrow(expect.objectContaining({ kind: 'InvalidArgument', message: expect.stringMatching(/^the snapshot's disk_bytes/) }));
  });

  it('has no quota where the store enforces none, and refuses an explicit one there', () => {
    expect(resolver({ enforcesQuota: false }).resources(input()).diskBytes).toBeNull();
    expect(() => resolver({ enforcesQuota: false }).resources(input({ diskBytes: GiB }))).toThrow(expect.objectContaining({ kind: 'FailedPrecondition' }));
  });

  it('an io_max given replaces the default limits as a whole; a tier without I/O settings refuses them and gets none', () => {
    expect(resolver().resources(input({ ioWeight: 500, ioMax: { readIops: 100 } })).io).toEqual({ weight: 500, readBps: null, writeBps: null, readIops: 100, writeIops: null });
    expect(resolver().resources(input({ backend: 'microvm' })).io).toBeNull();
    expect(() => resolver().resources(input({ backend: 'microvm', ioWeight: 10 }))).toThrow(expect.objectContaining({ kind: 'InvalidArgument', message: expect.stringContaining('backend microvm') }));
  });
});

describe('SpecResolver.network and spec', () => {
  it('refuses a network mode the tier does not have, before settling it', async () => {
    await expect(resolver().network({ mode: 'allow' }, 'microvm')).rejects.toMatchObject({ kind: 'InvalidArgument', message: expect.stringContaining('network mode allow is not available for backend microvm') });
    await expect(resolver().network({ mode: 'none' }, 'microvm')).resolves.toBeNull();
    await expect(resolver().network(undefined, 'container')).resolves.toBeNull();
  });

  it('resolves the filesystem options field by field: request > image > config, and fills the remaining defaults', () => {
    const r = resolver();
    const source = { image: 'busybox:latest', layers: ['sha256:aa'], config: { env: [], cwd: '/', user: '0', cmd: [], security: { writable_paths: ['/work'], landlock: false } } };
    const spec = r.spec(input({ filesystem: { landlock: true } }), r.resources(input()), source, null, null);
    expect(spec.filesystem).toEqual({ readonly_paths: ['/usr'], writable_paths: ['/work'], landlock: true });
    expect(spec).toMatchObject({ image: 'busybox:latest', imageLayers: ['sha256:aa'], labels: {}, env: {}, ttlS: null, priority: 'latency', idleTimeoutS: null, seccomp: null, network: null, snapshotId: null });
  });
});

describe('CreateStepError', () => {
  it('keeps the kind, message and reason of a DsecError cause and names the step', () => {
    const cause = new DsecError('FailedPrecondition', 'sandbox x: /work resolves through a symlink', { reason: 'writable_path_refused' });
    const e = new CreateStepError('start', cause, 'create sandbox x');
    expect(e).toBeInstanceOf(DsecError);
    expect(e).toMatchObject({ kind: 'FailedPrecondition', message: cause.message, reason: 'writable_path_refused', step: 'start', cause });
  });

  it('makes anything else Internal, with the step in its message', () => {
    const e = new CreateStepError('prepare', new Error('EIO'), 'create sandbox x');
    expect(e).toMatchObject({ kind: 'Internal', message: 'create sandbox x: prepare: EIO', step: 'prepare' });
    expect(new CreateStepError('admit', failedPrecondition('no'), 'create sandbox').message).toBe('no');
  });
});
