"""The synchronous transport: HTTP/1.1 over dsecd's Unix socket or HTTPS to its TCP door,
on the standard library's ``http.client``, with a keep-alive connection pool that many
threads share.

Every failure is a :class:`dsec.DsecError` subclass: an error answer by its code
(``dsec._errors.error_from_response``), a socket or door that cannot be reached
:class:`Unavailable`, no answer within the deadline :class:`DeadlineExceeded`.
"""
from __future__ import annotations

import http.client
import json
import select
import socket
import ssl
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from ._endpoint import Endpoint
from ._errors import DeadlineExceeded, DsecError, Internal, Unavailable, error_from_response

#: Methods resent once when a pooled keep-alive connection turns out to be closed.
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})

#: How long a pooled connection may sit idle when the server announced no keep-alive
#: timeout, seconds: a second under dsecd's default ``keep_alive_timeout_s`` (5 s).
DEFAULT_IDLE_S = 4.0

#: The most a pooled connection sits idle whatever the server announced, seconds.
MAX_IDLE_S = 30.0


def idle_deadline(keep_alive: Optional[str], now: float) -> float:
    """When a connection going idle at ``now`` (``time.monotonic()`` seconds) must no longer
    be reused: a second before the ``timeout=N`` of the answer's ``Keep-Alive`` header (the
    server closes it at N; a request sent just then would meet the close, and one that is
    not safe to resend would fail), capped at MAX_IDLE_S, DEFAULT_IDLE_S without a hint.

    Polling the socket for the server's end of stream is not enough alone: the server's
    close and the client's send race when they fall within the same instant."""
    idle = DEFAULT_IDLE_S
    if keep_alive:
        for part in keep_alive.split(","):
            k, _, v = part.strip().partition("=")
            if k.strip().lower() == "timeout":
                try:
                    idle = float(v.strip()) - 1.0
                except ValueError:
                    pass
    return now + max(0.0, min(idle, MAX_IDLE_S))


#: Bytes read from a streamed body at a time.
CHUNK = 64 * 1024

Body = Union[None, bytes, Any]


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket: ``http.client`` with ``connect`` pointed at a path."""

    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except BaseException:
            s.close()
            raise
        self.sock = s


def _readable(sock: socket.socket) -> bool:
    """Whether an idle socket polls readable (closed by the peer, or unexpected bytes)."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(r)


def connection_error(ep: Endpoint, exc: BaseException, method: str, path: str) -> DsecError:
    """The Unavailable (or DeadlineExceeded) error for a failed connection, naming where and what to check."""
    where = ep.where
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return DeadlineExceeded(f"no answer from {where} to {method} {path} within the deadline")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return Unavailable(
            f"TLS: {where} presented a certificate this client does not trust ({exc.verify_message}); "
            "pass dsecd's CA certificate (ca=, DSEC_CA: <root>/tls/ca.crt on its host)"
        )
    if isinstance(exc, ssl.SSLError):
        return Unavailable(f"TLS: the handshake with {where} failed ({exc}); a port that requires client certificates needs one of its CA")
    if isinstance(exc, FileNotFoundError):
        return Unavailable(f"cannot connect to {where}: no such file; is dsecd running?")
    if isinstance(exc, ConnectionRefusedError):
        return Unavailable(f"cannot connect to {where}: connection refused; is dsecd running?")
    if isinstance(exc, PermissionError):
        return Unavailable(f"cannot connect to {where}: permission denied (run as root or a member of the socket's group)")
    return Unavailable(f"{method} {path} to {where} failed: {exc}")


class Transport:
    """Sends API calls to one dsecd; safe to share between threads.

    Args:
        endpoint: where dsecd is (``dsec._endpoint.resolve_endpoint``).
        timeout: default deadline of a call, seconds (socket inactivity: no byte for this
            long fails the call with DeadlineExceeded); None waits forever.
    """

    def __init__(self, endpoint: Endpoint, timeout: Optional[float]) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._idle: List[Tuple[http.client.HTTPConnection, float]] = []
        self._lock = threading.Lock()
        self._ssl = endpoint.ssl_context() if endpoint.is_remote else None

    def _new(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        ep = self.endpoint
        if ep.socket is not None:
            return _UnixConnection(ep.socket, timeout)
        return http.client.HTTPSConnection(ep.host or "", ep.port, timeout=timeout, context=self._ssl)

    def _take(self, timeout: Optional[float]) -> Tuple[http.client.HTTPConnection, bool]:
        """A pooled connection dsecd has not closed (and whether it was pooled), else a new one.

        dsecd closes connections idle longer than its keep-alive timeout (5 s by default),
        announced in each answer's ``Keep-Alive`` header: a connection past its
        ``idle_deadline`` is not reused, and one that polls readable has seen the server's
        end of stream (it has no answer pending); sending on either would fail a call that
        is not safe to resend."""
        while True:
            with self._lock:
                c, deadline = self._idle.pop() if self._idle else (None, 0.0)
            if c is None:
                return self._new(timeout), False
            if time.monotonic() < deadline and c.sock is not None and not _readable(c.sock):
                c.sock.settimeout(timeout)
                return c, True
            c.close()

    def _give_back(self, c: http.client.HTTPConnection, keep_alive: Optional[str]) -> None:
        with self._lock:
            self._idle.append((c, idle_deadline(keep_alive, time.monotonic())))

    def close(self) -> None:
        """Closes pooled connections; later calls open new ones."""
        with self._lock:
            idle, self._idle = self._idle, []
        for c, _ in idle:
            c.close()

    def open(
        self,
        method: str,
        path: str,
        body: Body = None,
        content_type: Optional[str] = None,
        timeout: Union[float, None, str] = "default",
        accept: str = "application/json",
    ) -> Tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
        """Sends a request and returns the response once its headers arrived (its body unread).

        ``timeout``: seconds, None for none, ``"default"`` for the transport's. A failure on a
        reused keep-alive connection before any answer is retried once for idempotent methods.
        """
        t = self.timeout if timeout == "default" else timeout
        headers: Dict[str, str] = {"Accept": accept, **self.endpoint.auth_headers()}
        if content_type is not None:
            headers["Content-Type"] = content_type
        for attempt in (0, 1):
            conn, reused = self._take(t)  # type: ignore[arg-type]
            try:
                # http.client sends a file object without a known length chunked.
                conn.request(method, path, body=body, headers=headers)
                return conn.getresponse(), conn
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                conn.close()
                if attempt == 0 and reused and method in IDEMPOTENT:
                    continue
                raise connection_error(self.endpoint, e, method, path) from e
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise connection_error(self.endpoint, e, method, path) from e
        raise AssertionError("unreachable")

    def _finish(self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection, method: str, path: str) -> bytes:
        try:
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise connection_error(self.endpoint, e, method, path) from e
        if resp.will_close:
            conn.close()
        else:
            self._give_back(conn, resp.getheader("Keep-Alive"))
        return data

    def call(self, method: str, path: str, body: Any = None, timeout: Union[float, None, str] = "default") -> Any:
        """One JSON call: sends ``body`` as JSON (when not None) and returns the parsed answer
        (None when empty). Raises the DsecError of an error answer."""
        payload = None if body is None else json.dumps(body).encode()
        resp, conn = self.open(method, path, payload, "application/json" if payload is not None else None, timeout)
        return self._parse(resp.status, self._finish(resp, conn, method, path), method, path)

    def upload(self, method: str, path: str, data: Any, content_type: str, timeout: Union[float, None, str] = "default") -> Any:
        """Sends raw bytes (or a binary file object, streamed) and returns the parsed JSON answer."""
        resp, conn = self.open(method, path, data, content_type, timeout)
        return self._parse(resp.status, self._finish(resp, conn, method, path), method, path)

    def download(self, method: str, path: str) -> bytes:
        """The whole raw body of a 2xx answer."""
        resp, conn = self.open(method, path, accept="*/*")
        data = self._finish(resp, conn, method, path)
        if not 200 <= resp.status < 300:
            raise error_from_response(resp.status, data)
        return data

    def _parse(self, status: int, data: bytes, method: str, path: str) -> Any:
        if not 200 <= status < 300:
            raise error_from_response(status, data)
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError as e:
            raise Internal(f"dsecd answered {method} {path} with a body that is not JSON (status {status})", status) from e

    def stream(self, method: str, path: str, body: Any = None, accept: str = "application/x-ndjson") -> Iterator[bytes]:
        """The raw chunks of a streamed answer, as they arrive; no deadline. Closing the
        iterator (``break``, garbage collection) closes the connection."""
        payload = None if body is None else json.dumps(body).encode()
        resp, conn = self.open(method, path, payload, "application/json" if payload is not None else None, None, accept)
        if not 200 <= resp.status < 300:
            raise error_from_response(resp.status, self._finish(resp, conn, method, path))
        return self._chunks(resp, conn, method, path)

    def _chunks(self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection, method: str, path: str) -> Iterator[bytes]:
        done = False
        try:
            while True:
                try:
                    b = resp.read1(CHUNK)
                except (OSError, http.client.HTTPException) as e:
                    raise Unavailable(f"stream {method} {path} from {self.endpoint.where} broke: {e}") from e
                if not b:
                    done = True
                    return
                yield b
        finally:
            if done and not resp.will_close:
                self._give_back(conn, resp.getheader("Keep-Alive"))
            else:
                conn.close()


def lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The lines of a chunked body without their newline (a final unterminated line counts)."""
    pending = b""
    try:
        for c in chunks:
            pending += c
            if b"\n" not in pending:
                continue
            parts = pending.split(b"\n")
            pending = parts.pop()
            yield from parts
        if pending:
            yield pending
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
