"""Exceptions of the dsec client: one class per error kind of dsecd's closed set.

dsecd answers every failed call with ``{"error": {"code": KIND, "message": TEXT,
"reason"?: TEXT}}`` and an HTTP status fixed per kind (daemon/errors.ts, the one place
the mapping lives; docs/api/openapi.json ``ErrorBody``). Each kind is a subclass of
:class:`DsecError` named exactly as the code, so ``except dsec.NotFound`` catches a
missing sandbox whatever call failed. Client-side failures use the same classes: a
socket or door that cannot be reached is :class:`Unavailable`, a client deadline
:class:`DeadlineExceeded`.
"""
from __future__ import annotations

import json
from typing import Dict, Optional, Type


class DsecError(Exception):
    """A failed call to dsecd.

    Attributes:
        code: the error kind, e.g. ``"NotFound"`` (the class name).
        message: dsecd's own message (it names what failed), or for client-side
            failures one written here that names the socket or URL.
        status: HTTP status of the answer; 0 when there was none (connection
            failure, client deadline).
        reason: machine-readable refinement dsecd sent for the few cases a caller
            branches on (trajectory execs: ``outcome_unknown``, ``step_mismatch``,
            ``in_progress``, ``out_of_order``, ``trajectory_removed``); else None.
    """

    code = "Internal"

    def __init__(self, message: str, status: int = 0, reason: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidArgument(DsecError):
    """HTTP 400: a malformed request (bad field, limit out of range, unknown field)."""

    code = "InvalidArgument"


class Unauthenticated(DsecError):
    """HTTP 401: no valid token on the TCP door (missing, unknown, revoked or expired)."""

    code = "Unauthenticated"


class PermissionDenied(DsecError):
    """HTTP 403: a valid token whose role may not do this (a reader's create, a user's token admin)."""

    code = "PermissionDenied"


class NotFound(DsecError):
    """HTTP 404: no such sandbox, image, snapshot, exec session, lease or trajectory."""

    code = "NotFound"


class AlreadyExists(DsecError):
    """HTTP 409: the name is taken (e.g. a snapshot name)."""

    code = "AlreadyExists"


class Conflict(DsecError):
    """HTTP 409: the object's state forbids it now (see ``reason`` for trajectory execs)."""

    code = "Conflict"


class FailedPrecondition(DsecError):
    """HTTP 412: the call needs another state (e.g. exec in a stopped sandbox)."""

    code = "FailedPrecondition"


class ResourceExhausted(DsecError):
    """HTTP 429: the host (or a queue of it) is full."""

    code = "ResourceExhausted"


class Internal(DsecError):
    """HTTP 500: dsecd failed; its message says where."""

    code = "Internal"


class Unimplemented(DsecError):
    """HTTP 501: a tier or feature this dsecd was not built or configured with."""

    code = "Unimplemented"


class Unavailable(DsecError):
    """HTTP 503, or the socket/door could not be reached or the connection dropped."""

    code = "Unavailable"


class DeadlineExceeded(DsecError):
    """HTTP 504, or no answer within the client's deadline."""

    code = "DeadlineExceeded"


#: Exception class per error code: the closed set of daemon/errors.ts.
ERROR_CLASSES: Dict[str, Type[DsecError]] = {
    c.code: c
    for c in (
        InvalidArgument,
        Unauthenticated,
        PermissionDenied,
        NotFound,
        AlreadyExists,
        Conflict,
        FailedPrecondition,
        ResourceExhausted,
        Internal,
        Unimplemented,
        Unavailable,
        DeadlineExceeded,
    )
}

# Kind for a status when the body carries no recognisable code (a proxy's page);
# 409 is ambiguous (AlreadyExists/Conflict) and taken as Conflict, as the TypeScript SDK does.
_KIND_BY_STATUS = {
    400: "InvalidArgument",
    401: "Unauthenticated",
    403: "PermissionDenied",
    404: "NotFound",
    409: "Conflict",
    412: "FailedPrecondition",
    429: "ResourceExhausted",
    500: "Internal",
    501: "Unimplemented",
    503: "Unavailable",
    504: "DeadlineExceeded",
}


def error_from_response(status: int, body: bytes) -> DsecError:
    """The exception for a non-2xx answer: the body's code and message when well-formed,
    else a kind derived from ``status`` and a message quoting a short body."""
    code: Optional[str] = None
    message: Optional[str] = None
    reason: Optional[str] = None
    text = body.decode("utf-8", "replace")
    try:
        err = json.loads(text).get("error") or {}
        if isinstance(err.get("code"), str) and err["code"] in ERROR_CLASSES:
            code = err["code"]
        if isinstance(err.get("message"), str):
            message = err["message"]
        if isinstance(err.get("reason"), str):
            reason = err["reason"]
    except (ValueError, AttributeError):
        pass  # not JSON: fall back to the status
    if code is None:
        code = _KIND_BY_STATUS.get(status, "Internal" if status >= 500 else "InvalidArgument")
    if message is None:
        t = text.strip()
        message = f"dsecd answered {status}: {t}" if t and len(t) <= 200 else f"dsecd answered HTTP {status}"
    return ERROR_CLASSES[code](message, status, reason)


def error_from_body(err: object, status: int) -> DsecError:
    """The exception for an ``{code, message, reason?}`` object inside a 2xx answer (an
    NDJSON ``error`` line, a failed bulk or batch entry)."""
    e = err if isinstance(err, dict) else {}
    code = e.get("code") if e.get("code") in ERROR_CLASSES else "Internal"
    message = e.get("message") if isinstance(e.get("message"), str) else "dsecd gave no message"
    reason = e.get("reason") if isinstance(e.get("reason"), str) else None
    return ERROR_CLASSES[str(code)](str(message), status, reason)
