// dsecd names what it refused by API field and unit (`memory_bytes: Too small: expected
// number to be >=4194304`); the CLI says it as the flag and in the flag's units. The fake
// dsecd validates with dsecd's own schemas (parseWith), so the messages are the real ones.
import type http from 'node:http';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { CreateSandboxRequest, ExecRequest, ForkRequest, NetworkSpec, StopRequest } from '../../daemon/api/schema.js';
import { parseWith } from '../../daemon/api/parse.js';
import { DsecError } from '../../daemon/errors.js';
import { inUnit, rewriteFieldMessage } from '../../cli/util/fields.js';
import { fakeSandbox, json, runCli, startFakeDsecd, type FakeDsecd, type Seen } from '../fixtures/fake-dsecd.js';
import type { ZodType } from 'zod';

const ID = '0123456789abcdef';

/** A route validating its body with `schema` as dsecd does, answering `ok` when it passes. */
const validated = (schema: ZodType, what: string, ok: unknown) => (req: Seen, res: http.ServerResponse) => {
  try {
    parseWith(schema, req.body, what);
    json(res, 200, ok);
  } catch (e) {
    const d = e as DsecError;
    json(res, d.status, { error: { code: d.kind, message: d.message } });
  }
};

describe('API field names in error messages said as flags', () => {
  let fake: FakeDsecd;
  beforeEach(async () => {
    fake = await startFakeDsecd();
    fake.routes['POST /v1/sandboxes'] = validated(CreateSandboxRequest, 'create request', fakeSandbox());
    fake.routes['POST /v1/sandboxes/:id/exec'] = validated(ExecRequest, 'exec request', {});
    fake.routes['POST /v1/sandboxes/:id/stop'] = validated(StopRequest, 'stop request', fakeSandbox());
    fake.routes['POST /v1/snapshots/:ref/fork'] = validated(ForkRequest, 'fork request', { sandboxes: [] });
    fake.routes['GET /v1/sandboxes/:id'] = (_req, res) => json(res, 200, fakeSandbox({ network: { mode: 'allow', allow: [] } }));
    fake.routes['PUT /v1/sandboxes/:id/network'] = validated(NetworkSpec, 'network', {});
  });
  afterEach(async () => {
    await fake.close();
  });
  const cli = (args: string[]) => runCli(args, { socket: fake.socketPath });

  it('create --memory 1K names --memory and the smallest value in MiB (stderr and --json)', async () => {
    const r = await cli(['create', '--memory', '1K']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: invalid create request: --memory is too small: the smallest is 4MiB (InvalidArgument)\nhint: see `dsec create --help`\n');
    const j = await cli(['--json', 'create', '--memory', '1K', '--disk', '1M']);
    expect(JSON.parse(j.out).error.message).toBe('invalid create request: --memory is too small: the smallest is 4MiB; --disk is too small: the smallest is 16MiB');
  });

  it('the verbs that build a request from flags: run, create, fork, network add', async () => {
    const run = await cli(['run', '--memory', '1K', '--', 'true']);
    expect(run.err).toMatch(/^dsec: invalid create request: --memory is too small: the smallest is 4MiB/);
    const many = await cli(['create', ...Array.from({ length: 65 }, (_, i) => ['--label', `k${i}=v`]).flat()]);
    expect(many.err).toMatch(/^dsec: invalid create request: --label: at most 64 labels \(InvalidArgument\)\n/);
    const pids = await cli(['create', '--pids', '99999999']);
    expect(pids.err).toMatch(/^dsec: invalid create request: --pids is too large: the largest is 4194304 /);
    // The CLI's own parsers refuse what they can before dsecd sees it; what passes them is dsecd's to refuse.
    const fork = await cli(['fork', 'snap', '-n', '2', '--cpus', '0.0001']);
    expect(fork.err).toMatch(/^dsec: invalid fork request: --cpus /);
    const allow = await cli(['network', 'add', ID, '--allow', '10.0.0.1/8']);
    expect(allow.err).toMatch(/^dsec: invalid network: --allow #1: /);
  });

  it('rewrites bounds in the unit of the flag, field names in sentences, and byte counts', () => {
    expect(rewriteFieldMessage('invalid exec request: timeout_ms: Too big: expected number to be <=86400000', 'exec')).toBe('invalid exec request: --timeout is too large: the largest is 24h');
    expect(rewriteFieldMessage('invalid stop request: timeout_ms: Too small: expected number to be >=0', 'stop')).toBe('invalid stop request: --time is too small: the smallest is 0ms');
    expect(rewriteFieldMessage('invalid create request: ttl_s: Too big: expected number to be <=2592000', 'create')).toBe('invalid create request: --ttl is too large: the largest is 720h');
    expect(rewriteFieldMessage('invalid create request: network.allow.1.ports.0: Too big: expected number to be <=65535', 'create')).toBe('invalid create request: --allow #2 is too large: the largest is 65535');
    expect(rewriteFieldMessage('invalid create request: labels: Too big: expected record to have <=64 entries', 'create')).toBe('invalid create request: --label: Too big: expected record to have <=64 entries');
    expect(rewriteFieldMessage("memory_bytes 99999999999999 is more than this host's 25769803776 bytes of memory", 'create')).toBe("--memory 90.9TiB (99999999999999 bytes) is more than this host's 24GiB of memory");
    expect(rewriteFieldMessage('a microvm needs at least 134217728 bytes of memory (the guest kernel and initramfs); memory_bytes is 67108864', 'create'))
      .toBe('a microvm needs at least 128MiB of memory (the guest kernel and initramfs); --memory is 64MiB');
    expect(rewriteFieldMessage('disk_bytes cannot be enforced on this host: no quota; leave disk_bytes out', 'restore')).toBe('--disk cannot be enforced on this host: no quota; leave --disk out');
    expect(rewriteFieldMessage("cpus 64 is more than this host's 2 cores", 'create')).toBe("--cpus 64 is more than this host's 2 cores");
    // Ordinary words are not fields, and a verb without a table keeps dsecd's words.
    expect(rewriteFieldMessage('the image has a symlink where /work is', 'create')).toBe('the image has a symlink where /work is');
    expect(rewriteFieldMessage('invalid create request: memory_bytes: Too small: expected number to be >=4194304', 'ls')).toBe('invalid create request: memory_bytes: Too small: expected number to be >=4194304');
    expect(inUnit(1536, 'bytes')).toBe('1.5KiB (1536 bytes)');
    expect(inUnit(90_000, 'ms')).toBe('1m30s');
  });
});
