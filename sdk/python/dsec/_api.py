"""Paths, query strings and request bodies of dsecd's API (docs/api/openapi.json), shared
by the synchronous and the asyncio clients so both send exactly the same requests.

Every path parameter is percent-escaped (ids, refs and jobs may hold ``/``, ``:``, ``@``).
Fields left as None are not sent, so dsecd applies its own defaults.
"""
from __future__ import annotations

import base64
from typing import Any, Dict, Mapping, Optional, Sequence, Union
from urllib.parse import quote, urlencode

Bytes = Union[bytes, bytearray, memoryview, str]


def q(v: str) -> str:
    """One path segment, percent-escaped (``/`` too)."""
    return quote(v, safe="")


def sandbox_path(sid: str) -> str:
    """``/v1/sandboxes/{id}``."""
    return f"/v1/sandboxes/{q(sid)}"


def exec_path(sid: str, eid: str) -> str:
    """``/v1/sandboxes/{id}/execs/{exec_id}``."""
    return f"{sandbox_path(sid)}/execs/{q(eid)}"


def query(**params: Any) -> str:
    """A query string (with ``?``) of the params that are not None; booleans as ``true``
    (False is left out); ``''`` when none."""
    items = []
    for k, v in params.items():
        if v is None or v is False:
            continue
        items.append((k, "true" if v is True else str(v)))
    return "?" + urlencode(items) if items else ""


def compact(**fields: Any) -> Dict[str, Any]:
    """The fields that are not None, as a JSON body."""
    return {k: v for k, v in fields.items() if v is not None}


def b64(data: Optional[Bytes]) -> Optional[str]:
    """Bytes (a str as UTF-8) as base64, or None."""
    if data is None:
        return None
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return base64.b64encode(raw).decode("ascii")


def to_bytes(data: Bytes) -> bytes:
    """Bytes of ``data`` (a str as UTF-8)."""
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def exec_body(
    argv: Sequence[str],
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    user: Optional[str] = None,
    stdin: Optional[Bytes] = None,
    timeout_ms: Optional[int] = None,
    trajectory: Optional[str] = None,
    step: Optional[int] = None,
    truncate: Optional[bool] = None,
) -> Dict[str, Any]:
    """Body of POST /v1/sandboxes/{id}/exec (ExecRequest)."""
    if isinstance(argv, str):
        raise TypeError("argv is a list of strings (program and arguments), not one string")
    return compact(
        argv=list(argv),
        env=dict(env) if env is not None else None,
        cwd=cwd,
        user=user,
        stdin_b64=b64(stdin),
        timeout_ms=timeout_ms,
        trajectory=trajectory,
        step=step,
        truncate=truncate,
    )


def exec_timeout(client_timeout: Optional[float], timeout_ms: Optional[int]) -> Union[float, None, str]:
    """The HTTP deadline of a call that runs a command for up to ``timeout_ms``: the command's
    limit plus the client's deadline; the client's alone when the command has none."""
    if timeout_ms is None:
        return "default"
    if client_timeout is None:
        return None
    return client_timeout + timeout_ms / 1000.0


def format_mode(mode: int) -> str:
    """Permission bits as the files API takes them: 4 octal digits (``0o644`` -> ``0644``)."""
    if not 0 <= mode <= 0o7777:
        raise ValueError(f"mode {mode} is not a permission mode (0 to 0o7777)")
    return format(mode, "04o")


#: Fields of CreateSandboxRequest, in the API's order (docs/api/openapi.json).
CREATE_FIELDS = (
    "backend", "image", "cpus", "memory_bytes", "pids", "labels", "env", "ttl_s", "priority",
    "idle_timeout_s", "seccomp", "network", "disk_bytes", "filesystem", "io_weight", "io_max",
)

#: Fields of RestoreRequest (and ForkRequest besides ``count``).
RESTORE_FIELDS = (
    "labels", "env", "cpus", "memory_bytes", "pids", "ttl_s", "priority", "idle_timeout_s",
    "seccomp", "network", "disk_bytes", "filesystem",
)


def pick(fields: Sequence[str], values: Mapping[str, Any], what: str) -> Dict[str, Any]:
    """The body of ``values`` restricted to ``fields`` (None dropped).

    Raises:
        TypeError: a key that is not one of ``fields`` (a typo is refused here, not sent).
    """
    unknown = set(values) - set(fields)
    if unknown:
        raise TypeError(f"{what}: unknown field(s) {', '.join(sorted(unknown))}; known: {', '.join(fields)}")
    return {k: v for k, v in values.items() if v is not None}


def run_body(
    argv: Sequence[str],
    image: Optional[str] = None,
    backend: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    user: Optional[str] = None,
    stdin: Optional[Bytes] = None,
    timeout_ms: Optional[int] = None,
    memory_bytes: Optional[int] = None,
    cpus: Optional[float] = None,
    pids: Optional[int] = None,
) -> Dict[str, Any]:
    """Body of POST /v1/run (RunRequest)."""
    if isinstance(argv, str):
        raise TypeError("argv is a list of strings (program and arguments), not one string")
    return compact(
        argv=list(argv), image=image, backend=backend, env=dict(env) if env is not None else None, cwd=cwd, user=user,
        stdin_b64=b64(stdin), timeout_ms=timeout_ms, memory_bytes=memory_bytes, cpus=cpus, pids=pids,
    )
