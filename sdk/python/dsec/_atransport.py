"""The asyncio transport: a small HTTP/1.1 client on ``asyncio`` streams, over dsecd's Unix
socket or TLS to its TCP door, with a keep-alive connection pool, so one event loop can
have hundreds of calls in flight without threads.

It speaks only what dsecd answers: ``Content-Length`` or ``chunked`` bodies, keep-alive
unless ``Connection: close``. Errors are those of the synchronous transport
(dsec/_transport.py).
"""
from __future__ import annotations

import asyncio
import json
import ssl
import time
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple, Union

from ._endpoint import Endpoint
from ._errors import DeadlineExceeded, DsecError, Internal, Unavailable, error_from_response
from ._transport import CHUNK, IDEMPOTENT, connection_error, idle_deadline

#: Longest status line plus headers accepted, bytes (the stream reader's limit).
HEADER_LIMIT = 1 << 20


class _Conn:
    """One connection: its stream pair."""

    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class Response:
    """An answer whose headers arrived: ``status``, ``headers`` (lower-case names), and its
    body read with :meth:`read` or :meth:`chunks`."""

    def __init__(self, status: int, headers: Dict[str, str], conn: _Conn, transport: "AsyncTransport", method: str) -> None:
        self.status = status
        self.headers = headers
        self._conn: Optional[_Conn] = conn
        self._t = transport
        te = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        cl = headers.get("content-length")
        self._left: Optional[int] = int(cl) if cl is not None and not self._chunked else None
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            self._left = 0
        self._keep = headers.get("connection", "").lower() != "close" and (self._chunked or self._left is not None)
        self._done = False

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive. The connection goes back to the pool once the
        body was read to its end, and is closed if the reader stops early."""
        conn = self._conn
        assert conn is not None, "body already read"
        r = conn.reader
        try:
            if self._chunked:
                while True:
                    size_line = await r.readuntil(b"\r\n")
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                    if size == 0:
                        # Trailers (none from dsecd) end with an empty line.
                        while (await r.readuntil(b"\r\n")) != b"\r\n":
                            pass
                        break
                    left = size
                    while left > 0:
                        b = await r.read(min(left, CHUNK))
                        if not b:
                            raise asyncio.IncompleteReadError(b"", left)
                        left -= len(b)
                        yield b
                    await r.readexactly(2)
            elif self._left is not None:
                left = self._left
                while left > 0:
                    b = await r.read(min(left, CHUNK))
                    if not b:
                        raise asyncio.IncompleteReadError(b"", left)
                    left -= len(b)
                    yield b
            else:
                while True:
                    b = await r.read(CHUNK)
                    if not b:
                        break
                    yield b
            self._done = True
        finally:
            self._conn = None
            if self._done and self._keep:
                self._t._give_back(conn, self.headers.get("keep-alive"))
            else:
                conn.close()

    async def read(self) -> bytes:
        """The whole body."""
        parts = [b async for b in self.chunks()]
        return b"".join(parts)

    def close(self) -> None:
        """Drops the connection of a body not read to its end."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class AsyncTransport:
    """Sends API calls to one dsecd from one event loop.

    Args:
        endpoint: where dsecd is.
        timeout: default deadline of a whole call (connect, send, answer), seconds; None: none.
    """

    def __init__(self, endpoint: Endpoint, timeout: Optional[float]) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._idle: List[Tuple[_Conn, float]] = []
        self._ssl: Optional[ssl.SSLContext] = endpoint.ssl_context() if endpoint.is_remote else None
        host = endpoint.host or "localhost"
        self._host_header = (f"[{host}]" if ":" in host else host) + ("" if endpoint.socket else f":{endpoint.port}")

    async def _new(self) -> _Conn:
        ep = self.endpoint
        if ep.socket is not None:
            r, w = await asyncio.open_unix_connection(ep.socket, limit=HEADER_LIMIT)
        else:
            r, w = await asyncio.open_connection(ep.host, ep.port, ssl=self._ssl, server_hostname=ep.host, limit=HEADER_LIMIT)
        return _Conn(r, w)

    def _give_back(self, c: _Conn, keep_alive: Optional[str]) -> None:
        self._idle.append((c, idle_deadline(keep_alive, time.monotonic())))

    def _take_idle(self) -> Optional[_Conn]:
        """A pooled connection dsecd has not closed, or None. dsecd closes connections idle
        longer than its keep-alive timeout (5 s by default, announced in each answer's
        ``Keep-Alive`` header): a connection past its ``idle_deadline`` is not reused, nor
        one whose end of stream has reached the reader; sending on either would fail a
        call that is not safe to resend."""
        while self._idle:
            c, deadline = self._idle.pop()
            if time.monotonic() >= deadline or c.reader.at_eof() or c.writer.is_closing() or c.reader.exception() is not None:
                c.close()
                continue
            return c
        return None

    async def aclose(self) -> None:
        """Closes pooled connections; later calls open new ones."""
        idle = [c for c, _ in self._idle]
        self._idle = []
        for c in idle:
            c.close()
        for c in idle:
            try:
                await c.writer.wait_closed()
            except (OSError, ssl.SSLError):
                pass

    def _head(self, method: str, path: str, length: Optional[int], content_type: Optional[str], accept: str) -> bytes:
        h = [f"{method} {path} HTTP/1.1", f"Host: {self._host_header}", f"Accept: {accept}"]
        for k, v in self.endpoint.auth_headers().items():
            h.append(f"{k}: {v}")
        if content_type is not None:
            h.append(f"Content-Type: {content_type}")
        if length is not None:
            h.append(f"Content-Length: {length}")
        elif method in ("POST", "PUT"):
            h.append("Content-Length: 0")
        return ("\r\n".join(h) + "\r\n\r\n").encode("latin-1")

    async def _exchange(self, conn: _Conn, head: bytes, body: Optional[bytes], method: str) -> Response:
        conn.writer.write(head + (body or b""))
        await conn.writer.drain()
        raw = await conn.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise Internal(f"{self.endpoint.where} sent no HTTP answer: {lines[0][:80]!r}")
        headers: Dict[str, str] = {}
        for ln in lines[1:]:
            if ":" in ln:
                k, v = ln.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        return Response(int(parts[1]), headers, conn, self, method)

    async def open(
        self,
        method: str,
        path: str,
        body: Optional[bytes] = None,
        content_type: Optional[str] = None,
        accept: str = "application/json",
    ) -> Response:
        """Sends a request; returns once the answer's headers arrived. No deadline here: the
        callers bound the whole call. A reused connection that turns out closed before any
        answer is retried once for idempotent methods."""
        head = self._head(method, path, None if body is None else len(body), content_type, accept)
        for attempt in (0, 1):
            conn = self._take_idle()
            reused = conn is not None
            try:
                if conn is None:
                    conn = await self._new()
            except (OSError, ssl.SSLError, asyncio.TimeoutError) as e:
                raise connection_error(self.endpoint, e, method, path) from e
            try:
                return await self._exchange(conn, head, body, method)
            except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as e:
                conn.close()
                if attempt == 0 and reused and method in IDEMPOTENT:
                    continue
                raise connection_error(self.endpoint, e, method, path) from e
            except (OSError, ssl.SSLError, asyncio.LimitOverrunError) as e:
                conn.close()
                raise connection_error(self.endpoint, e, method, path) from e
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")

    async def _call_raw(self, method: str, path: str, body: Optional[bytes], content_type: Optional[str], accept: str) -> Tuple[int, bytes]:
        resp = await self.open(method, path, body, content_type, accept)
        try:
            return resp.status, await resp.read()
        except (asyncio.IncompleteReadError, OSError, ssl.SSLError) as e:
            raise Unavailable(f"connection to {self.endpoint.where} lost during {method} {path}: {e}") from e
        finally:
            resp.close()

    async def _bounded(self, coro: Any, timeout: Union[float, None, str], method: str, path: str) -> Any:
        t = self.timeout if timeout == "default" else timeout
        if t is None:
            return await coro
        try:
            return await asyncio.wait_for(coro, t)
        except asyncio.TimeoutError as e:
            raise DeadlineExceeded(f"no answer from {self.endpoint.where} to {method} {path} within {t} s") from e

    async def call(self, method: str, path: str, body: Any = None, timeout: Union[float, None, str] = "default") -> Any:
        """One JSON call (see ``Transport.call``); ``timeout`` bounds the whole call, seconds."""
        payload = None if body is None else json.dumps(body).encode()
        status, data = await self._bounded(
            self._call_raw(method, path, payload, "application/json" if payload is not None else None, "application/json"), timeout, method, path
        )
        return _parse(status, data, method, path)

    async def upload(self, method: str, path: str, data: Any, content_type: str, timeout: Union[float, None, str] = "default") -> Any:
        """Sends raw bytes (a binary file object is read whole first) and returns the parsed JSON answer."""
        raw = data.read() if hasattr(data, "read") else bytes(data)
        status, body = await self._bounded(self._call_raw(method, path, raw, content_type, "application/json"), timeout, method, path)
        return _parse(status, body, method, path)

    async def download(self, method: str, path: str) -> bytes:
        """The whole raw body of a 2xx answer."""
        status, data = await self._bounded(self._call_raw(method, path, None, None, "*/*"), "default", method, path)
        if not 200 <= status < 300:
            raise error_from_response(status, data)
        return data

    async def stream(self, method: str, path: str, body: Any = None, accept: str = "application/x-ndjson") -> AsyncIterator[bytes]:
        """The raw chunks of a streamed answer as they arrive; no deadline. Raises the error of
        an error answer on the first iteration."""
        payload = None if body is None else json.dumps(body).encode()
        resp = await self._bounded(self.open(method, path, payload, "application/json" if payload is not None else None, accept), "default", method, path)
        try:
            if not 200 <= resp.status < 300:
                raise error_from_response(resp.status, await resp.read())
            try:
                async for b in resp.chunks():
                    yield b
            except (asyncio.IncompleteReadError, OSError, ssl.SSLError) as e:
                raise Unavailable(f"stream {method} {path} from {self.endpoint.where} broke: {e}") from e
        finally:
            resp.close()


def _parse(status: int, data: bytes, method: str, path: str) -> Any:
    if not 200 <= status < 300:
        raise error_from_response(status, data)
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError as e:
        raise Internal(f"dsecd answered {method} {path} with a body that is not JSON (status {status})", status) from e


async def alines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The lines of a streamed body without their newline (a final unterminated line counts)."""
    pending = b""
    try:
        async for c in chunks:
            pending += c
            if b"\n" not in pending:
                continue
            parts = pending.split(b"\n")
            pending = parts.pop()
            for p in parts:
                yield p
        if pending:
            yield pending
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()


__all__ = ["AsyncTransport", "Response", "alines", "DsecError"]
