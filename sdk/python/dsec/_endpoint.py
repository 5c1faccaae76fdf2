"""Where a client reaches dsecd, resolved as the dsec CLI and the TypeScript SDK do.

Explicit arguments win; then ``DSEC_HOST`` (``https://HOST:PORT`` of dsecd's TCP door
or a gateway) with ``DSEC_TOKEN`` and ``DSEC_CA`` (a PEM file) when no socket was
given; else the Unix socket ``DSEC_SOCKET``, else ``/run/dsec/dsecd.sock``
(sdk/transport.ts, sdk/remote.ts). The door speaks TLS 1.3 only and wants
``Authorization: Bearer <token>`` on every request (docs/SECURITY.md "The TCP door").
"""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Mapping, Optional
from urllib.parse import urlsplit

#: Socket path used when neither ``socket`` nor ``DSEC_SOCKET`` is given (dsecd's default).
DEFAULT_SOCKET = "/run/dsec/dsecd.sock"

#: Default deadline of one call, seconds: generous because a create under a burst queues
#: behind others on dsecd (the TypeScript SDK's DEFAULT_TIMEOUT_MS, 60,000 ms).
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Endpoint:
    """One way to dsecd: a Unix socket path, or an HTTPS door with a token and CA."""

    socket: Optional[str] = None
    """Path of dsecd's Unix socket (None for the TCP door)."""
    host: Optional[str] = None
    """Host name or address of the TCP door."""
    port: int = 443
    token: Optional[str] = None
    """API token (``e2b_...``), sent as ``Authorization: Bearer``."""
    ca: Optional[str] = None
    """Path of the PEM CA file to trust (dsecd's ``<root>/tls/ca.crt``); None: the system's."""
    cert: Optional[str] = None
    """Client certificate (PEM file) for a door that requires mutual TLS."""
    key: Optional[str] = None

    @property
    def is_remote(self) -> bool:
        """Whether this is the TCP door."""
        return self.socket is None

    @property
    def where(self) -> str:
        """``dsecd socket PATH`` or ``dsecd at https://HOST:PORT``, for messages."""
        if self.socket is not None:
            return f"dsecd socket {self.socket}"
        h = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"dsecd at https://{h}:{self.port}"

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context: TLS 1.3 only (dsecd refuses older), ``ca`` trusted, host name checked."""
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def auth_headers(self) -> dict:
        """The headers every request carries here (the token, on the door)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token and self.is_remote else {}


def resolve_endpoint(
    socket: Optional[str] = None,
    host: Optional[str] = None,
    token: Optional[str] = None,
    ca: Optional[str] = None,
    cert: Optional[str] = None,
    key: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
) -> Endpoint:
    """The endpoint for these arguments and the environment (see the module's rule).

    Raises:
        ValueError: ``host`` (or DSEC_HOST) is not ``https://HOST[:PORT]`` with no path.
    """
    e = os.environ if env is None else env
    if host is None and socket is None and e.get("DSEC_HOST"):
        host = e["DSEC_HOST"]
        token = token or e.get("DSEC_TOKEN") or None
        ca = ca or e.get("DSEC_CA") or None
    if host is None:
        return Endpoint(socket=socket or e.get("DSEC_SOCKET") or DEFAULT_SOCKET)
    u = urlsplit(host)
    if u.scheme != "https" or not u.hostname:
        raise ValueError(f"dsecd host {host}: want https://HOST:PORT (the TCP door speaks TLS only)")
    if u.path not in ("", "/"):
        raise ValueError(f"dsecd host {host}: no path after HOST:PORT")
    return Endpoint(host=u.hostname, port=u.port or 443, token=token, ca=ca, cert=cert, key=key)
