/**
 * The sandbox resolver process: a small DNS server on `<gateway>:53` (UDP and TCP)
 * inside the instance netns, started by dsecd under `nsenter --net=<instance netns>`
 * with an IPC channel (daemon/net/resolver.ts). It holds no policy: for every question
 * it asks dsecd, which identifies the sandbox by the source address and answers refuse
 * or forward. A refused question is answered REFUSED here and never leaves the process,
 * so a name that is not allowed cannot carry data out. A forwarded one goes to the
 * upstream (UDP, or TCP for TCP clients) as a query rebuilt from the question alone
 * (new random id, lowercased name, no EDNS or other records: dnswire.upstreamQuery),
 * and the answer is mapped back to the client's id and question; and when dsecd asked for it, the answer's
 * addresses are reported and the answer is held until dsecd confirms they are in the
 * sandbox's egress maps: a client can never learn an address before it may connect.
 *
 * Why a child process and not a thread that setns-es: Node cannot create a socket in
 * another network namespace, and a worker thread would need native code to setns; a
 * process started in the namespace needs neither. It exits when the IPC channel closes
 * (dsecd gone), so at most one serves each instance; dsecd starts a new one at start.
 *
 * argv: <gateway> <upstreams JSON: ["10.0.2.3:53", ...]>
 */
import dgram from 'node:dgram';
import net from 'node:net';
import { randomInt } from 'node:crypto';
import { buildError, clientAnswer, parseAnswer, parseQuestion, RCODE, upstreamQuery } from './dnswire.js';
import type { ParentToChild, ChildToParent, VerdictMsg } from './resolver-ipc.js';

/** How long one upstream gets to answer before the next is tried: 2 s (libc's default timeout is 5 s per attempt). */
const UPSTREAM_TIMEOUT_MS = 2000;
/** How long dsecd gets to decide or to pin: 5 s; past it the client gets SERVFAIL. */
const PARENT_TIMEOUT_MS = 5000;
/** Largest DNS message over TCP: 65,535 bytes (two-byte length prefix). */
const MAX_TCP_MSG = 65535;

const gateway = process.argv[2];
const upstreams = (JSON.parse(process.argv[3] ?? '[]') as string[]).map((u) => {
  const [host, port] = u.includes(':') ? u.split(':') : [u, '53'];
  return { host, port: Number(port) };
});

function send(m: ChildToParent): void {
  process.send?.(m);
}

let seq = 0;
const waiting = new Map<number, (m: ParentToChild | null) => void>();

process.on('message', (m: ParentToChild) => {
  const w = waiting.get(m.n);
  if (w) {
    waiting.delete(m.n);
    w(m);
  }
});
// dsecd is gone: stop serving, so the next dsecd can bind the gateway address.
process.on('disconnect', () => process.exit(0));

/** Sends `m` and waits for dsecd's reply to its number, or null after PARENT_TIMEOUT_MS. */
function ask(m: ChildToParent & { n: number }): Promise<ParentToChild | null> {
  return new Promise((resolve) => {
    const t = setTimeout(() => { waiting.delete(m.n); resolve(null); }, PARENT_TIMEOUT_MS);
    waiting.set(m.n, (r) => { clearTimeout(t); resolve(r); });
    send(m);
  });
}

/** Forwards a query over UDP to the upstreams in turn; resolves with the first answer or null. */
async function forwardUdp(query: Buffer): Promise<Buffer | null> {
  for (const u of upstreams) {
    const r = await new Promise<Buffer | null>((resolve) => {
      const s = dgram.createSocket('udp4');
      const done = (v: Buffer | null) => { clearTimeout(t); s.close(); resolve(v); };
      const t = setTimeout(() => done(null), UPSTREAM_TIMEOUT_MS);
      s.on('error', () => done(null));
      s.on('message', (msg) => {
        if (msg.length >= 2 && msg.readUInt16BE(0) === query.readUInt16BE(0)) done(msg);
      });
      s.connect(u.port, u.host, () => s.send(query));
    });
    if (r) return r;
  }
  return null;
}

/** Forwards a query over TCP to the upstreams in turn. */
async function forwardTcp(query: Buffer): Promise<Buffer | null> {
  for (const u of upstreams) {
    const r = await new Promise<Buffer | null>((resolve) => {
      const c = net.connect(u.port, u.host);
      let buf = Buffer.alloc(0);
      const done = (v: Buffer | null) => { clearTimeout(t); c.destroy(); resolve(v); };
      const t = setTimeout(() => done(null), UPSTREAM_TIMEOUT_MS);
      c.on('error', () => done(null));
      c.on('connect', () => { const l = Buffer.alloc(2); l.writeUInt16BE(query.length); c.write(Buffer.concat([l, query])); });
      c.on('data', (d) => {
        buf = Buffer.concat([buf, d]);
        if (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) done(buf.subarray(2, 2 + buf.readUInt16BE(0)));
      });
    });
    if (r) return r;
  }
  return null;
}

/** The whole answer path for one query from `src`; resolves with the reply to send, or null to send nothing. */
async function handle(query: Buffer, src: string, tcp: boolean): Promise<Buffer | null> {
  let q;
  try {
    q = parseQuestion(query);
  } catch {
    return query.length >= 12 ? Buffer.concat([query.subarray(0, 2), Buffer.from([0x80, RCODE.FORMERR, 0, 0, 0, 0, 0, 0, 0, 0])]) : null;
  }
  if (q.response) return null;
  // Class IN only: other classes (CHAOS version.bind and the like) are no sandbox's
  // business, and each class value would be one more field a client picks.
  if (q.opcode !== 0 || q.qdcount !== 1 || q.qclass !== 1) return buildError(query, RCODE.REFUSED);
  let up;
  try {
    up = upstreamQuery(query, randomInt(0, 0x10000));
  } catch {
    return buildError(query, RCODE.REFUSED);
  }
  const n = ++seq;
  const v = (await ask({ t: 'query', n, src, name: q.name, type: q.type })) as VerdictMsg | null;
  if (!v) return buildError(query, RCODE.SERVFAIL);
  if (v.action === 'refuse') return buildError(query, RCODE.REFUSED);
  const raw = tcp ? await forwardTcp(up.msg) : await forwardUdp(up.msg);
  if (!raw) return buildError(query, RCODE.SERVFAIL);
  let ans: Buffer;
  try {
    ans = clientAnswer(raw, query, up);
  } catch {
    return buildError(query, RCODE.SERVFAIL);
  }
  if (v.report) {
    let parsed;
    try {
      parsed = parseAnswer(ans);
    } catch {
      return buildError(query, RCODE.SERVFAIL);
    }
    if (parsed.addresses.length) {
      const ok = await ask({ t: 'answer', n, addresses: parsed.addresses.map((a) => ({ family: a.family, address: a.address, ttl: a.ttl })) });
      if (!ok) return buildError(query, RCODE.SERVFAIL);
    }
  }
  return ans;
}

const udp = dgram.createSocket('udp4');
udp.on('message', (msg, rinfo) => {
  void handle(msg, rinfo.address, false).then((r) => { if (r) udp.send(r, rinfo.port, rinfo.address); });
});

const tcp = net.createServer((c) => {
  let buf = Buffer.alloc(0);
  c.setTimeout(10_000, () => c.destroy());
  c.on('error', () => c.destroy());
  c.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
    if (buf.length > MAX_TCP_MSG + 2) return c.destroy();
    while (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
      const msg = buf.subarray(2, 2 + buf.readUInt16BE(0));
      buf = buf.subarray(2 + msg.length);
      void handle(Buffer.from(msg), c.remoteAddress?.replace(/^::ffff:/, '') ?? '', true).then((r) => {
        if (!r || c.destroyed) return;
        const l = Buffer.alloc(2);
        l.writeUInt16BE(r.length);
        c.write(Buffer.concat([l, r]));
      });
    }
  });
});

let bound = 0;
const fail = (e: Error) => { send({ t: 'error', message: `cannot serve DNS on ${gateway}:53: ${e.message}` }); process.exit(1); };
const up = () => { if (++bound === 2) send({ t: 'ready', pid: process.pid }); };
udp.once('error', fail);
tcp.once('error', fail);
udp.bind(53, gateway, up);
tcp.listen(53, gateway, up);
