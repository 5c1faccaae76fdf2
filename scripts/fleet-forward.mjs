#!/usr/bin/env node
// A byte-for-byte TCP/Unix-socket forwarder: `node fleet-forward.mjs LISTEN TARGET`, each
// `unix:PATH` or `HOST:PORT`. scripts/fleet-demo.sh and test/fixtures/fleet.ts use two of
// them to reach a gateway that lives in a network namespace from the host's loopback
// (127.0.0.1:PORT -> unix:DIR/gateway.sock, then inside the namespace unix -> ADDR:PORT),
// without adding an interface or a route to the host's namespace. TLS passes through
// untouched. Stops on SIGTERM/SIGINT.
import net from 'node:net';
import { rmSync } from 'node:fs';

const [listen, target] = process.argv.slice(2);
if (!listen || !target) {
  process.stderr.write('usage: fleet-forward.mjs LISTEN TARGET (each unix:PATH or HOST:PORT)\n');
  process.exit(2);
}
const addr = (s) => {
  if (s.startsWith('unix:')) return { path: s.slice(5) };
  const i = s.lastIndexOf(':');
  return { host: s.slice(0, i), port: Number(s.slice(i + 1)) };
};
const to = addr(target);
const server = net.createServer((c) => {
  const u = net.connect(to);
  c.pipe(u).pipe(c);
  const close = () => { c.destroy(); u.destroy(); };
  c.on('error', close);
  u.on('error', close);
  c.on('close', close);
  u.on('close', close);
});
const from = addr(listen);
if (from.path) rmSync(from.path, { force: true });
server.listen(from.path ? from.path : { host: from.host, port: from.port }, () => {
  const a = server.address();
  process.stdout.write(`${typeof a === 'string' ? a : `${a.address}:${a.port}`}\n`);
});
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => { server.close(); if (from.path) rmSync(from.path, { force: true }); process.exit(0); });
