"""What the tests connect to: the dsecd the environment names (as ``dsec.Client()`` reads
it: DSEC_SOCKET, or DSEC_HOST + DSEC_TOKEN + DSEC_CA), started by
test/integration/python-client.test.ts. Tokens of other tenants and roles for the
refusal tests come in DSEC_TEST_OTHER_TOKEN (a ``user`` of another tenant) and
DSEC_TEST_READER_TOKEN (a ``reader``); they are set only for the TCP door's run.
"""
from __future__ import annotations

import os
import sys
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dsec  # noqa: E402

#: Distinct per test process, so label selectors never match another run's sandboxes.
RUN = uuid.uuid4().hex[:8]

#: Whether this run goes through the TCP door (TLS and a token).
REMOTE = bool(os.environ.get("DSEC_HOST"))

#: Image every test sandbox uses.
IMAGE = os.environ.get("DSEC_TEST_IMAGE", "busybox")

#: Directory writable in a busybox sandbox (its top level is read-only).
WORK = "/root"


def client(**kw: object) -> dsec.Client:
    """A synchronous client from the environment, with a generous deadline (a loaded CI host)."""
    return dsec.Client(timeout=300, **kw)  # type: ignore[arg-type]


def aclient(**kw: object) -> dsec.AsyncClient:
    """An asyncio client from the environment."""
    return dsec.AsyncClient(timeout=300, **kw)  # type: ignore[arg-type]
