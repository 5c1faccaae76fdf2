"""dsec: Python client of dsecd, the sandbox runtime for agentic RL.

Standard library only, Python 3.9+. ``dsec.Client`` (synchronous, thread-safe) and
``dsec.AsyncClient`` (asyncio) speak dsecd's HTTP+JSON API (docs/api/openapi.json) over
its Unix socket or over TLS to its TCP door with a token. With no arguments they connect
where the ``dsec`` CLI would: ``DSEC_HOST`` + ``DSEC_TOKEN`` + ``DSEC_CA`` when DSEC_HOST
is set, else ``DSEC_SOCKET``, else ``/run/dsec/dsecd.sock``.

    import dsec
    c = dsec.Client()
    with c.sandboxes.create(image="busybox") as sb:
        r = sb.exec(["echo", "hi"])
        assert r.exit_code == 0 and r.stdout == b"hi\\n"

Errors are exceptions named after dsecd's error codes (``dsec.NotFound``,
``dsec.Conflict``, ...), all subclasses of ``dsec.DsecError``.
"""
from ._endpoint import DEFAULT_SOCKET, DEFAULT_TIMEOUT_S, Endpoint, resolve_endpoint
from ._errors import (
    ERROR_CLASSES,
    AlreadyExists,
    Conflict,
    DeadlineExceeded,
    DsecError,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from ._models import (
    BulkResult,
    Event,
    ExecInfo,
    ExecResult,
    FileStat,
    Lease,
    PauseResult,
    RunCodeResult,
    SandboxInfo,
    Snapshot,
    Token,
    Trajectory,
    TrajectoryRecord,
    TrajectoryStep,
)
from .aio import AsyncClient, AsyncExecSession, AsyncSandbox
from .client import Client, ExecSession, Sandbox

__version__ = "0.1.0"

__all__ = [
    "Client", "AsyncClient", "Sandbox", "AsyncSandbox", "ExecSession", "AsyncExecSession",
    "Endpoint", "resolve_endpoint", "DEFAULT_SOCKET", "DEFAULT_TIMEOUT_S",
    "DsecError", "InvalidArgument", "Unauthenticated", "PermissionDenied", "NotFound", "AlreadyExists",
    "Conflict", "FailedPrecondition", "ResourceExhausted", "Internal", "Unimplemented", "Unavailable",
    "DeadlineExceeded", "ERROR_CLASSES",
    "SandboxInfo", "ExecResult", "ExecInfo", "Snapshot", "BulkResult", "Lease", "Trajectory", "TrajectoryStep",
    "TrajectoryRecord", "Event", "FileStat", "PauseResult", "Token", "RunCodeResult",
]
