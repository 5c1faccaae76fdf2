"""Keep-alive pooling against a local HTTP server that never closes idle connections: a
pooled connection is reused only within a second of the server's announced
``Keep-Alive: timeout=N`` (dsecd closes at N; a send that races that close would fail a
call that cannot be resent), so reuse is decided by the client's clock and not by whether
the server's close has already arrived. No dsecd needed."""
from __future__ import annotations

import asyncio
import os
import socketserver
import tempfile
import threading
import unittest
from http.server import BaseHTTPRequestHandler
from typing import List

from dsec._atransport import AsyncTransport
from dsec._endpoint import Endpoint
from dsec._transport import DEFAULT_IDLE_S, MAX_IDLE_S, Transport, idle_deadline


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    keep_alive = "timeout=5"
    connections: List[int] = []


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.server.connections.append(1)  # type: ignore[attr-defined]

    def address_string(self) -> str:
        return "unix"

    def log_message(self, *_: object) -> None:
        pass

    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Keep-Alive", self.server.keep_alive)  # type: ignore[attr-defined]
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer
    do_POST = _answer


class KeepAlive(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.sock = os.path.join(self.dir.name, "s")
        self.srv = _Server(self.sock, _Handler)
        self.srv.connections = []
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def tearDown(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
        self.dir.cleanup()

    def test_the_deadline_follows_the_servers_hint(self) -> None:
        self.assertEqual(idle_deadline("timeout=5", 100.0), 104.0)
        self.assertEqual(idle_deadline("max=100, timeout=3", 100.0), 102.0)
        self.assertEqual(idle_deadline("timeout=1", 100.0), 100.0)
        self.assertEqual(idle_deadline("timeout=3600", 100.0), 100.0 + MAX_IDLE_S)
        self.assertEqual(idle_deadline(None, 100.0), 100.0 + DEFAULT_IDLE_S)
        self.assertEqual(idle_deadline("timeout=soon", 100.0), 100.0 + DEFAULT_IDLE_S)

    def test_sync_reuses_within_the_hint(self) -> None:
        self.srv.keep_alive = "timeout=30"
        t = Transport(Endpoint(socket=self.sock), 5.0)
        try:
            for _ in range(3):
                self.assertEqual(t.call("POST", "/x", {}), {"ok": True})
        finally:
            t.close()
        self.assertEqual(len(self.srv.connections), 1)

    def test_sync_does_not_reuse_past_the_hint_though_the_server_kept_it_open(self) -> None:
        # timeout=1: the deadline is the moment the answer arrived; the server has not
        # closed, and a client that trusted the socket alone would send on it.
        self.srv.keep_alive = "timeout=1"
        t = Transport(Endpoint(socket=self.sock), 5.0)
        try:
            self.assertEqual(t.call("POST", "/x", {}), {"ok": True})
            self.assertEqual(t.call("POST", "/x", {}), {"ok": True})
        finally:
            t.close()
        self.assertEqual(len(self.srv.connections), 2)

    def test_async_follows_the_hint_too(self) -> None:
        async def run(hint: str) -> int:
            self.srv.keep_alive = hint
            before = len(self.srv.connections)
            t = AsyncTransport(Endpoint(socket=self.sock), 5.0)
            try:
                for _ in range(3):
                    self.assertEqual(await t.call("POST", "/x", {}), {"ok": True})
            finally:
                await t.aclose()
            return len(self.srv.connections) - before

        self.assertEqual(asyncio.run(run("timeout=30")), 1)
        self.assertEqual(asyncio.run(run("timeout=1")), 3)


if __name__ == "__main__":
    unittest.main()
