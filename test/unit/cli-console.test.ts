// `dsec console --tail N` counts lines (as `tail -n` and `docker logs --tail` do): the
// CLI asks for tail_lines, and dsecd's tailLines returns the last N lines of a log file.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ConsoleQuery, tailLines } from '../../daemon/api/routes/console.js';
import { runCli, startFakeDsecd, type FakeDsecd } from '../fixtures/fake-dsecd.js';

const ID = '0123456789abcdef';

describe('console log tail in lines (dsecd)', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-tail-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));
  const file = (text: string | Buffer) => {
    const f = join(dir, 'console.log');
    writeFileSync(f, text);
    return f;
  };

  it('returns the last N lines; a last line without a newline counts; \\r\\n lines too', async () => {
    const f = file('boot\r\nlogin: root\r\n# ls\r\nbin etc\r\n# ');
    expect((await tailLines(f, 1)).toString()).toBe('# ');
    expect((await tailLines(f, 2)).toString()).toBe('bin etc\r\n# ');
    expect((await tailLines(f, 5)).toString()).toBe('boot\r\nlogin: root\r\n# ls\r\nbin etc\r\n# ');
    expect((await tailLines(f, 50)).toString()).toBe('boot\r\nlogin: root\r\n# ls\r\nbin etc\r\n# ');
    const g = file('a\nb\nc\n');
    expect((await tailLines(g, 1)).toString()).toBe('c\n');
    expect((await tailLines(g, 2)).toString()).toBe('b\nc\n');
    expect((await tailLines(g, 0)).length).toBe(0);
    expect((await tailLines(join(dir, 'missing'), 3)).length).toBe(0);
    expect((await tailLines(file(''), 3)).length).toBe(0);
    expect((await tailLines(file('\n\n'), 1)).toString()).toBe('\n');
  });

  it('walks back across read steps in a large log (lines longer than a step, too)', async () => {
    const long = 'x'.repeat(200_000);
    const lines = Array.from({ length: 30_000 }, (_, i) => `line ${i}`);
    const f = file(lines.join('\n') + '\n' + long + '\nlast\n');
    expect((await tailLines(f, 2)).toString()).toBe(long + '\nlast\n');
    expect((await tailLines(f, 3)).toString()).toBe('line 29999\n' + long + '\nlast\n');
    expect((await tailLines(f, 1000)).toString().split('\n').slice(0, 2)).toEqual(['line 29002', 'line 29003']);
  });

  it('the query takes tail_lines or tail_bytes, not both', () => {
    expect(ConsoleQuery.safeParse({ tail_lines: '20' }).success).toBe(true);
    expect(ConsoleQuery.safeParse({ tail_bytes: '20' }).success).toBe(true);
    expect(ConsoleQuery.safeParse({ tail_lines: '20', tail_bytes: '20' }).success).toBe(false);
  });
});

describe('dsec console --tail (against the fake dsecd)', () => {
  let fake: FakeDsecd;
  const queries: URLSearchParams[] = [];
  beforeEach(async () => {
    fake = await startFakeDsecd();
    queries.length = 0;
    fake.wsRoutes['GET /v1/sandboxes/:id/console'] = (ws, req) => {
      queries.push(req.query);
      ws.send(JSON.stringify({ type: 'exit', reason: 'the VM stopped' }), () => ws.close(1000));
    };
  });
  afterEach(async () => {
    await fake.close();
  });

  it('asks dsecd for the last N lines (not bytes); 50 lines by default without a terminal', async () => {
    const r = await runCli(['console', '--tail', '20', ID], { socket: fake.socketPath });
    expect(r.code).toBe(0);
    expect(r.err).toBe(`dsec: console of ${ID} closed: the VM stopped\n`);
    expect(Object.fromEntries(queries[0])).toEqual({ tail_lines: '20' });
    await runCli(['console', ID], { socket: fake.socketPath });
    expect(Object.fromEntries(queries[1])).toEqual({ tail_lines: '50' });
    const bad = await runCli(['console', '--tail', '100001', ID], { socket: fake.socketPath });
    expect(bad.code).toBe(125);
    expect(bad.err).toMatch(/^dsec: invalid --tail "100001"\nhint: a number of lines from 0 to 100000/);
  });
});
