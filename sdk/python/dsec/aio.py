"""The asyncio client: ``dsec.AsyncClient``, the mirror of ``dsec.AsyncClient`` with ``await``.

    async with dsec.AsyncClient() as c:
        sb = await c.sandboxes.create(image="busybox")
        r = await sb.exec(["echo", "hi"])
        await sb.destroy()

One AsyncClient belongs to one event loop; calls run concurrently over a pool of
keep-alive connections (no threads). Streams are async iterators. Every method has the
arguments, units and errors of its synchronous namesake in dsec/client.py.
"""
from __future__ import annotations

import json
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Union

from . import _api as api
from ._endpoint import DEFAULT_TIMEOUT_S, Endpoint, resolve_endpoint
from ._errors import DsecError, Internal, error_from_body
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
)
from ._atransport import AsyncTransport, alines
from .client import _json_line

_OCTET = "application/octet-stream"
_TAR = "application/x-tar"




class AsyncExecSession:
    """An exec session: a command started in the background (:meth:`AsyncSandbox.start_exec`).

    Its output is spooled by dsecd (unless ``paced``) and can be read, streamed or re-read
    from any byte offset while dsecd keeps the session.
    """

    def __init__(self, client: "AsyncClient", info: ExecInfo) -> None:
        self._c = client
        self.info = info
        """The ExecInfo as last seen."""

    @property
    def id(self) -> str:
        """The session's id (128-bit random, hex)."""
        return self.info.exec_id

    @property
    def _path(self) -> str:
        return api.exec_path(self.info.sandbox_id, self.info.exec_id)

    async def refresh(self) -> ExecInfo:
        """GET the session's ExecInfo. Raises NotFound (forgotten, or another caller's)."""
        self.info = ExecInfo.from_dict(await self._c._t.call("GET", self._path))
        return self.info

    def output(self, stream: str = "stdout", offset: int = 0, follow: bool = True) -> AsyncIterator[bytes]:
        """The bytes of ``stream`` (``stdout`` or ``stderr``) from byte ``offset``, as chunks
        as they are produced. With ``follow`` the iterator ends when the command ends;
        without it, at what was produced so far. No deadline. Raises NotFound, InvalidArgument."""
        return self._c._t.stream("GET", self._path + "/output" + api.query(stream=stream, offset=offset or None, follow=follow), accept="*/*")

    async def write_stdin(self, data: api.Bytes, eof: bool = False) -> None:
        """Writes ``data`` to the command's stdin, closing it after when ``eof``. Raises
        FailedPrecondition (started without ``stdin=True``)."""
        await self._c._t.upload("POST", self._path + "/stdin" + api.query(eof=eof), api.to_bytes(data), _OCTET)

    async def wait(self, timeout_ms: Optional[int] = None) -> ExecInfo:
        """Blocks until the command ended and returns its ExecInfo (``exit_code``,
        ``signal``, ``timed_out``). With ``timeout_ms``, dsecd gives up after that many ms:
        DeadlineExceeded (the command keeps running)."""
        t = None if timeout_ms is None or self._c._t.timeout is None else self._c._t.timeout + timeout_ms / 1000
        self.info = ExecInfo.from_dict(await self._c._t.call("POST", self._path + "/wait" + api.query(timeout_ms=timeout_ms), timeout=t))
        return self.info

    async def signal(self, sig: Union[str, int] = "SIGTERM") -> ExecInfo:
        """Sends ``sig`` (``SIGTERM``, ``TERM`` or a number) to the command's process group."""
        self.info = ExecInfo.from_dict(await self._c._t.call("POST", self._path + "/signal", {"signal": sig}))
        return self.info

    async def remove(self) -> ExecInfo:
        """Kills the command if it runs and forgets the session and its output."""
        return ExecInfo.from_dict(await self._c._t.call("DELETE", self._path))


class AsyncFiles:
    """Files of one sandbox (``sandbox.files``): paths are absolute inside the sandbox;
    ``user`` (name or ``uid[:gid]``) acts as that user (permissions checked, new files owned)."""

    def __init__(self, client: "AsyncClient", sid: str) -> None:
        self._c = client
        self._sid = sid

    def _p(self, tail: str, **params: Any) -> str:
        return api.sandbox_path(self._sid) + tail + api.query(**params)

    async def read(self, path: str, user: Optional[str] = None) -> bytes:
        """The file's bytes. Raises NotFound, FailedPrecondition (a directory)."""
        return await self._c._t.download("GET", self._p("/files", path=path, user=user))

    async def write(self, path: str, data: Union[api.Bytes, Any], mode: Optional[int] = None, parents: bool = False, user: Optional[str] = None) -> Dict[str, Any]:
        """Writes ``data`` (bytes, str as UTF-8, or a binary file object, read whole) to ``path``,
        replacing it atomically; ``mode`` permission bits (default 0o644), ``parents``
        creates missing directories. Returns ``{path, bytes}``. Raises NotFound (parent
        missing), FailedPrecondition (a directory), ResourceExhausted (disk quota)."""
        body = api.to_bytes(data) if isinstance(data, (bytes, bytearray, memoryview, str)) else data
        m = None if mode is None else api.format_mode(mode)
        return await self._c._t.upload("PUT", self._p("/files", path=path, mode=m, parents=parents, user=user), body, _OCTET)

    async def stat(self, path: str, nofollow: bool = False, user: Optional[str] = None) -> FileStat:
        """What is at ``path`` (a final symlink followed unless ``nofollow``). Raises NotFound."""
        return FileStat.from_dict(await self._c._t.call("GET", self._p("/files/stat", path=path, nofollow=nofollow, user=user)))

    async def list(self, path: str, recursive: bool = False, user: Optional[str] = None) -> List[FileStat]:
        """The entries of directory ``path`` (each with ``extra['name']``). Raises NotFound, FailedPrecondition."""
        r = await self._c._t.call("GET", self._p("/files/list", path=path, recursive=recursive, user=user))
        return [FileStat.from_dict(e) for e in r["entries"]]

    async def mkdir(self, path: str, mode: Optional[int] = None, parents: bool = False, user: Optional[str] = None) -> FileStat:
        """Creates directory ``path``. Raises AlreadyExists, FailedPrecondition."""
        body = api.compact(path=path, mode=mode, parents=parents or None, user=user)
        return FileStat.from_dict(await self._c._t.call("POST", api.sandbox_path(self._sid) + "/files/mkdir", body))

    async def remove(self, path: str, recursive: bool = False, user: Optional[str] = None) -> None:
        """Removes a file, or with ``recursive`` a directory tree. Raises NotFound."""
        await self._c._t.call("DELETE", self._p("/files", path=path, recursive=recursive, user=user))

    async def get_archive(self, path: str, follow: bool = False, user: Optional[str] = None) -> bytes:
        """A tar archive of ``path`` (members named from its basename, as ``docker cp``)."""
        return await self._c._t.download("GET", self._p("/archive", path=path, follow=follow, user=user))

    async def put_archive(self, directory: str, tar: Union[bytes, Any], user: Optional[str] = None) -> Dict[str, Any]:
        """Extracts the tar ``tar`` (bytes, or a binary file object read whole) into existing ``directory``;
        returns ``{entries, bytes}``. Raises NotFound, InvalidArgument (unsafe member)."""
        return await self._c._t.upload("PUT", self._p("/archive", path=directory, user=user), tar, _TAR)


class AsyncSandbox:
    """A sandbox bound to its client. ``info`` is its SandboxInfo as last seen; ``id``,
    ``state`` and ``labels`` read from it. As a context manager it is destroyed on exit."""

    def __init__(self, client: "AsyncClient", info: SandboxInfo) -> None:
        self._c = client
        self.info = info
        self.files = AsyncFiles(client, info.id)
        """File and archive calls of this sandbox."""

    @property
    def id(self) -> str:
        """16 lowercase hex characters."""
        return self.info.id

    @property
    def state(self) -> str:
        """State as last seen (call :meth:`refresh` for dsecd's current one)."""
        return self.info.state

    @property
    def labels(self) -> Dict[str, str]:
        """Labels as last seen."""
        return self.info.labels

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r}, state={self.state!r}, image={self.info.image!r})"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.destroy()

    @property
    def _path(self) -> str:
        return api.sandbox_path(self.id)

    def _set(self, d: Dict[str, Any]) -> "AsyncSandbox":
        self.info = SandboxInfo.from_dict(d)
        return self

    async def refresh(self) -> "AsyncSandbox":
        """Re-reads the sandbox from dsecd. Raises NotFound."""
        return self._set(await self._c._t.call("GET", self._path))

    async def exec(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Optional[api.Bytes] = None,
        timeout_ms: Optional[int] = None,
        trajectory: Optional[str] = None,
        step: Optional[int] = None,
        truncate: Optional[bool] = None,
    ) -> ExecResult:
        """Runs ``argv`` to completion and returns its ExecResult (output whole, up to
        dsecd's ``max_output_bytes`` per stream).

        Args:
            argv: program and arguments; ``argv[0]`` is looked up in the sandbox's PATH.
            env: extra environment over the sandbox's.
            cwd: absolute working directory; user: name or ``uid[:gid]``.
            stdin: bytes (str as UTF-8) fed to stdin, at most 16 MiB.
            timeout_ms: SIGKILL the command's process group after this many ms; the result
                then has ``timed_out=True``. The HTTP deadline grows by as much.
            trajectory, step: record this as step ``step`` of trajectory ``trajectory``
                (docs/TRAJECTORIES.md). A rerun of a finished step with the same request is
                not executed: the recorded result comes back with ``replayed=True``.
            truncate: discard recorded steps from ``step`` on, then run this one.

        Raises:
            NotFound, FailedPrecondition (not running), InvalidArgument, Conflict (trajectory:
            see ``reason``), DeadlineExceeded.
        """
        body = api.exec_body(argv, env, cwd, user, stdin, timeout_ms, trajectory, step, truncate)
        return ExecResult.from_dict(await self._c._t.call("POST", self._path + "/exec", body, timeout=api.exec_timeout(self._c._t.timeout, timeout_ms)))

    async def start_exec(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: bool = False,
        tty: Optional[Mapping[str, int]] = None,
        timeout_ms: Optional[int] = None,
        paced: Optional[bool] = None,
    ) -> AsyncExecSession:
        """Starts ``argv`` as an exec session and returns it once the program started (or
        failed to: ``info.error``, exit code 127/126). ``stdin=True`` opens stdin for
        :meth:`AsyncExecSession.write_stdin`; ``tty`` ``{rows, cols}`` runs it under a PTY;
        ``timeout_ms`` kills it after that many ms; ``paced`` paces it by its readers
        instead of spooling (see the API). Raises NotFound, FailedPrecondition."""
        body = api.compact(argv=list(argv), env=dict(env) if env else None, cwd=cwd, user=user, stdin=stdin or None, tty=dict(tty) if tty else None, timeout_ms=timeout_ms, paced=paced)
        return AsyncExecSession(self._c, ExecInfo.from_dict(await self._c._t.call("POST", self._path + "/execs", body)))

    async def exec_stream(self, argv: Sequence[str], stream: str = "stdout", **kw: Any) -> AsyncIterator[bytes]:
        """Runs ``argv`` as an exec session and yields its ``stream`` output as it is
        produced, ending when the command ends (for the exit code use :meth:`start_exec`
        and ``wait``).
        Keyword arguments as :meth:`start_exec`."""
        s = await self.start_exec(argv, **kw)
        async for b in s.output(stream=stream, follow=True):
            yield b

    async def execs(self) -> List[ExecInfo]:
        """The caller's exec sessions in this sandbox (running, and exited ones dsecd keeps)."""
        return [ExecInfo.from_dict(e) for e in await self._c._t.call("GET", self._path + "/execs")["execs"]]

    async def logs(self, follow: bool = False) -> AsyncIterator[str]:
        """The sandbox's lifecycle and exec history, then its agent log, as text lines; with
        ``follow`` new lines as they come, until the sandbox is destroyed or the iterator is
        closed. No deadline. Raises NotFound."""
        async for ln in alines(self._c._t.stream("GET", self._path + "/logs" + api.query(follow=follow), accept="text/plain")):
            yield ln.decode("utf-8", "replace")

    async def stop(self, timeout_ms: Optional[int] = None) -> "AsyncSandbox":
        """Stops its processes (SIGTERM, SIGKILL after ``timeout_ms`` ms of grace; dsecd's
        default 10 s; 0 kills at once); the writable layer stays. Raises FailedPrecondition."""
        if timeout_ms is None:
            return self._set(await self._c._t.call("POST", self._path + "/stop"))
        t = None if self._c._t.timeout is None else self._c._t.timeout + timeout_ms / 1000
        return self._set(await self._c._t.call("POST", self._path + "/stop", {"timeout_ms": timeout_ms}, timeout=t))

    async def start(self) -> "AsyncSandbox":
        """Starts a stopped sandbox again. Raises Conflict, FailedPrecondition."""
        return self._set(await self._c._t.call("POST", self._path + "/start"))

    async def pause(self) -> PauseResult:
        """Freezes every process (cgroup freezer) and reclaims memory; ``reclaim`` None when
        it was already paused. Raises FailedPrecondition (not running)."""
        r = PauseResult.from_dict(await self._c._t.call("POST", self._path + "/pause"))
        self.info = SandboxInfo.from_dict(r.sandbox)
        return r

    async def resume(self) -> "AsyncSandbox":
        """Thaws a paused sandbox exactly where it stopped."""
        return self._set(await self._c._t.call("POST", self._path + "/resume"))

    async def snapshot(self, name: Optional[str] = None, process: Optional[bool] = None) -> Snapshot:
        """Captures the writable layer (a microVM: the whole machine) as a snapshot to restore
        or fork from, named ``name`` (``[a-z0-9][a-z0-9._-]{0,127}``) when given. No deadline.
        Raises AlreadyExists (name taken), FailedPrecondition, Unimplemented (``process``
        without CRIU)."""
        return Snapshot.from_dict(await self._c._t.call("POST", self._path + "/snapshot", api.compact(name=name, process=process), timeout=None))

    async def stats(self) -> Dict[str, Any]:
        """Resource usage now (cpu, memory bytes, pids, I/O), as dsecd reports it."""
        return await self._c._t.call("GET", self._path + "/stats")  # type: ignore[no-any-return]

    async def destroy(self, force: bool = True) -> "AsyncSandbox":
        """Destroys the sandbox (``force``: even when running). Destroying one already gone is
        not an error. Raises FailedPrecondition/Conflict when running and not ``force``."""
        from ._errors import NotFound

        try:
            return self._set(await self._c._t.call("DELETE", self._path + api.query(force=force)))
        except NotFound:
            self.info.state = "destroyed"
            return self


class AsyncSandboxes:
    """``client.sandboxes``: create, get, list, and act on all sandboxes of a label selector."""

    def __init__(self, client: "AsyncClient") -> None:
        self._c = client

    async def create(self, image: Optional[str] = None, **fields: Any) -> AsyncSandbox:
        """Creates a sandbox and returns it once it runs (or failed).

        Args:
            image: image reference, ``name`` or ``name:tag``; default busybox.
            **fields: any field of CreateSandboxRequest: ``backend`` (``container``,
                ``microvm``, ``vm``), ``cpus`` (cores), ``memory_bytes``, ``pids``,
                ``labels``, ``env``, ``ttl_s`` (seconds), ``priority`` (``latency`` or
                ``batch``), ``idle_timeout_s``, ``seccomp``, ``network``, ``disk_bytes``,
                ``filesystem``, ``io_weight``, ``io_max``. An unknown name raises TypeError.

        Raises:
            InvalidArgument, NotFound (image), Unimplemented (tier), ResourceExhausted (host full).
        """
        body = api.pick(api.CREATE_FIELDS, {"image": image, **fields}, "create")
        return AsyncSandbox(self._c, SandboxInfo.from_dict(await self._c._t.call("POST", "/v1/sandboxes", body)))

    async def create_many(self, count: int, image: Optional[str] = None, **fields: Any) -> List[Union[AsyncSandbox, DsecError]]:
        """Creates ``count`` sandboxes of one spec (1 to 1,000) in one batched request
        (POST /v1/sandboxes:batch) and returns, in order, each AsyncSandbox or the DsecError
        (e.g. ResourceExhausted: the host or the tenant quota was full) of one that was
        not made; each is made as :meth:`create` makes one. ``image`` and ``**fields`` as
        :meth:`create`. No deadline.

        Raises:
            InvalidArgument: a malformed batch (then nothing is made).
        """
        spec = api.pick(api.CREATE_FIELDS, {"image": image, **fields}, "create")
        r = await self._c._t.call("POST", "/v1/sandboxes:batch", {"count": count, "spec": spec}, timeout=None)
        return [AsyncSandbox(self._c, SandboxInfo.from_dict(x["sandbox"])) if x.get("sandbox") else error_from_body(x.get("error"), 200) for x in r["results"]]

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        """The sandbox ``sandbox_id``. Raises NotFound."""
        return AsyncSandbox(self._c, SandboxInfo.from_dict(await self._c._t.call("GET", api.sandbox_path(sandbox_id))))

    async def list(self, selector: Optional[str] = None, state: Optional[str] = None) -> List[AsyncSandbox]:
        """AsyncSandboxes matching a label ``selector`` (``k=v``, ``k!=v``, ``k`` terms, comma
        separated; all must match) and ``state``; all when both are None."""
        r = await self._c._t.call("GET", "/v1/sandboxes" + api.query(selector=selector, state=state))
        return [AsyncSandbox(self._c, SandboxInfo.from_dict(s)) for s in r["sandboxes"]]

    async def bulk(self, selector: str, action: str, ttl_s: Any = ..., timeout_ms: Optional[int] = None, timeout: Optional[float] = None) -> List[BulkResult]:
        """Applies ``action`` (``pause``, ``resume``, ``stop``, ``destroy``,
        ``set_ttl``) to every sandbox whose labels match ``selector`` (required: never
        "everything"); one BulkResult per matched sandbox, a failing one has ``ok=False``
        (not an exception). ``ttl_s`` for set_ttl (seconds from creation, None removes);
        ``timeout_ms`` the stop grace. ``timeout``: HTTP deadline, s (default none)."""
        body: Dict[str, Any] = {"selector": selector, "action": action}
        if ttl_s is not ...:
            body["ttl_s"] = ttl_s
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        r = await self._c._t.call("POST", "/v1/sandboxes/bulk", body, timeout=timeout)
        return [BulkResult.from_dict(x) for x in r["results"]]

    async def pause_all(self, selector: str) -> List[BulkResult]:
        """Pauses every sandbox matching ``selector`` (a round between rollouts)."""
        return await self.bulk(selector, "pause")

    async def resume_all(self, selector: str) -> List[BulkResult]:
        """Resumes every sandbox matching ``selector``."""
        return await self.bulk(selector, "resume")

    async def destroy_all(self, selector: str) -> List[BulkResult]:
        """Destroys every sandbox matching ``selector``, running or not."""
        return await self.bulk(selector, "destroy")


class AsyncSnapshots:
    """``client.snapshots``: list, get, delete, and make sandboxes from one (restore, fork)."""

    def __init__(self, client: "AsyncClient") -> None:
        self._c = client

    async def list(self) -> List[Snapshot]:
        """Every snapshot on this host, oldest first."""
        return [Snapshot.from_dict(s) for s in await self._c._t.call("GET", "/v1/snapshots")["snapshots"]]

    async def get(self, ref: str) -> Snapshot:
        """A snapshot by id (``snap-<16 hex>``) or name. Raises NotFound."""
        return Snapshot.from_dict(await self._c._t.call("GET", "/v1/snapshots/" + api.q(ref)))

    async def delete(self, ref: str) -> Snapshot:
        """Removes a snapshot (sandboxes made from it keep running). Raises NotFound."""
        return Snapshot.from_dict(await self._c._t.call("DELETE", "/v1/snapshots/" + api.q(ref)))

    async def restore(self, ref: str, **overrides: Any) -> AsyncSandbox:
        """One sandbox from the snapshot, running. ``overrides``: fields of RestoreRequest
        (``labels``, ``env``, ``cpus``, ``memory_bytes``, ``pids``, ``ttl_s``, ``priority``,
        ``idle_timeout_s``, ``seccomp``, ``network``, ``disk_bytes``, ``filesystem``); the
        rest default to the source's. Raises NotFound, ResourceExhausted."""
        body = api.pick(api.RESTORE_FIELDS, overrides, "restore")
        return AsyncSandbox(self._c, SandboxInfo.from_dict(await self._c._t.call("POST", f"/v1/snapshots/{api.q(ref)}/restore", body)))

    async def fork(self, ref: str, count: int, timeout: Optional[float] = None, **overrides: Any) -> List[AsyncSandbox]:
        """``count`` (1-256) sandboxes from the snapshot, running, in creation order; all or
        nothing. ``overrides`` as :meth:`restore`. No HTTP deadline unless ``timeout`` (s).
        Raises InvalidArgument, NotFound, ResourceExhausted (the group does not fit)."""
        body = {"count": count, **api.pick(api.RESTORE_FIELDS, overrides, "fork")}
        r = await self._c._t.call("POST", f"/v1/snapshots/{api.q(ref)}/fork", body, timeout=timeout)
        return [AsyncSandbox(self._c, SandboxInfo.from_dict(s)) for s in r["sandboxes"]]


class AsyncLeases:
    """``client.leases``: a job's heartbeat. When a lease lapses dsecd pauses the sandboxes
    labelled ``job=<job>`` and destroys them its ``destroy_grace_s`` later."""

    def __init__(self, client: "AsyncClient") -> None:
        self._c = client

    async def put(self, job: str, ttl_s: int) -> Lease:
        """Creates (or renews) the lease of ``job`` to expire ``ttl_s`` seconds from now
        (1 s to 30 days). Raises InvalidArgument, FailedPrecondition (lapsed: delete it first)."""
        return Lease.from_dict(await self._c._t.call("POST", "/v1/leases", {"job": job, "ttl_s": ttl_s}))

    async def renew(self, job: str, ttl_s: Optional[int] = None) -> Lease:
        """Extends the lease to expire ``ttl_s`` (default its own) seconds from now. Raises
        NotFound, FailedPrecondition (lapsed)."""
        return Lease.from_dict(await self._c._t.call("POST", f"/v1/leases/{api.q(job)}/renew", api.compact(ttl_s=ttl_s)))

    async def get(self, job: str) -> Lease:
        """One lease. Raises NotFound."""
        return Lease.from_dict(await self._c._t.call("GET", "/v1/leases/" + api.q(job)))

    async def list(self) -> List[Lease]:
        """Every lease."""
        return [Lease.from_dict(x) for x in await self._c._t.call("GET", "/v1/leases")["leases"]]

    async def delete(self, job: str) -> Lease:
        """Deletes the lease (the job's sandboxes stay as they are). Raises NotFound."""
        return Lease.from_dict(await self._c._t.call("DELETE", "/v1/leases/" + api.q(job)))


class AsyncTrajectories:
    """``client.trajectories``: the recorded steps of execs made with ``trajectory`` and ``step``."""

    def __init__(self, client: "AsyncClient") -> None:
        self._c = client

    async def list(self) -> List[Trajectory]:
        """Summaries of every trajectory, most recently updated first."""
        return [Trajectory.from_dict(t) for t in await self._c._t.call("GET", "/v1/trajectories")["trajectories"]]

    async def get(self, trajectory_id: str) -> Trajectory:
        """The summary and every step (without output), in step order. Raises NotFound."""
        return Trajectory.from_dict(await self._c._t.call("GET", "/v1/trajectories/" + api.q(trajectory_id)))

    async def export(self, trajectory_id: str) -> AsyncIterator[TrajectoryRecord]:
        """Every step with its request and recorded output, in step order, streamed (NDJSON).
        Raises NotFound; a malformed line is Internal."""
        what = f"the export of trajectory {trajectory_id}"
        async for ln in alines(self._c._t.stream("GET", f"/v1/trajectories/{api.q(trajectory_id)}/export")):
            if ln.strip():
                yield TrajectoryRecord.from_dict(_json_line(ln, what))

    async def delete(self, trajectory_id: str) -> Dict[str, Any]:
        """Discards the recorded steps (``{id, removed_steps}``); the id stays reserved.
        Raises NotFound, Conflict (reason ``in_progress``)."""
        return await self._c._t.call("DELETE", "/v1/trajectories/" + api.q(trajectory_id))  # type: ignore[no-any-return]


class AsyncTokens:
    """``client.tokens``: API tokens of the TCP door (admin only)."""

    def __init__(self, client: "AsyncClient") -> None:
        self._c = client

    async def create(self, tenant: str, role: str, ttl_s: Optional[int] = None, description: Optional[str] = None) -> Token:
        """A new token for ``tenant`` with ``role`` (``admin``, ``user``, ``reader``,
        ``metrics``), expiring after ``ttl_s`` seconds if given; its secret is ``token``
        (shown once). Raises PermissionDenied, InvalidArgument."""
        return Token.from_dict(await self._c._t.call("POST", "/v1/tokens", api.compact(tenant=tenant, role=role, ttl_s=ttl_s, description=description)))

    async def list(self) -> List[Token]:
        """Every token, without its secret. Raises PermissionDenied."""
        return [Token.from_dict(t) for t in await self._c._t.call("GET", "/v1/tokens")["tokens"]]

    async def revoke(self, token_id: str) -> Token:
        """Revokes a token (refused from now on). Raises NotFound, PermissionDenied."""
        return Token.from_dict(await self._c._t.call("DELETE", "/v1/tokens/" + api.q(token_id)))


class AsyncClient:
    """Client of one dsecd (or a gateway), for asyncio; one per event loop.

    Args:
        socket: path of dsecd's Unix socket.
        host: ``https://HOST:PORT`` of dsecd's TCP door or a gateway.
        token: API token for ``host``; ca: PEM CA file to trust; cert, key: client
            certificate and key files (mutual TLS).
        timeout: deadline of a call in seconds (default 60; None: none). Calls that run a
            command add its ``timeout_ms``; streams have none.

    With no arguments it connects where the CLI would: ``DSEC_HOST`` (+ ``DSEC_TOKEN``,
    ``DSEC_CA``) when set, else ``DSEC_SOCKET``, else ``/run/dsec/dsecd.sock``.
    """

    def __init__(
        self,
        socket: Optional[str] = None,
        host: Optional[str] = None,
        token: Optional[str] = None,
        ca: Optional[str] = None,
        cert: Optional[str] = None,
        key: Optional[str] = None,
        timeout: Optional[float] = DEFAULT_TIMEOUT_S,
        endpoint: Optional[Endpoint] = None,
    ) -> None:
        self.endpoint = endpoint or resolve_endpoint(socket, host, token, ca, cert, key)
        self._t = AsyncTransport(self.endpoint, timeout)
        self.sandboxes = AsyncSandboxes(self)
        """AsyncSandbox calls."""
        self.snapshots = AsyncSnapshots(self)
        """Snapshot, restore and fork calls."""
        self.leases = AsyncLeases(self)
        """Lease calls."""
        self.trajectories = AsyncTrajectories(self)
        """Trajectory calls."""
        self.tokens = AsyncTokens(self)
        """API token calls (admin)."""

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes pooled connections."""
        await self._t.aclose()

    async def version(self) -> Dict[str, Any]:
        """``{version, api, agent_protocol, node}`` of dsecd."""
        return await self._t.call("GET", "/v1/version")  # type: ignore[no-any-return]

    async def whoami(self) -> Dict[str, Any]:
        """The caller as dsecd sees it: ``{door, token_id, tenant, role, peer}``."""
        return await self._t.call("GET", "/v1/whoami")  # type: ignore[no-any-return]

    async def run(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        """Runs one command in a fresh environment and returns its ExecResult: ``backend``
        ``fncall`` on a pre-warmed worker, ``container`` (default) in a sandbox created and
        destroyed for it. Keywords: ``image``, ``backend``, ``env``, ``cwd``, ``user``,
        ``stdin``, ``timeout_ms``, ``memory_bytes``, ``cpus``, ``pids``.
        Raises InvalidArgument, NotFound (image), ResourceExhausted, Unimplemented."""
        body = api.run_body(argv, **kw)
        return ExecResult.from_dict(await self._t.call("POST", "/v1/run", body, timeout=api.exec_timeout(self._t.timeout, kw.get("timeout_ms"))))

    async def run_code(self, code: str, language: str, **kw: Any) -> RunCodeResult:
        """SandboxFusion's ``/run_code``: compile and run ``code`` (``python``, ``bash``,
        ``c``, ``cpp``) on the fncall tier. Keywords as SandboxFusion: ``stdin`` (str),
        ``compile_timeout``/``run_timeout`` (seconds, default 10), ``memory_limit_MB``,
        ``files`` (path -> base64), ``fetch_files``. Times in the answer are seconds."""
        t = None if self._t.timeout is None else self._t.timeout + float(kw.get("compile_timeout", 10)) + float(kw.get("run_timeout", 10))
        return RunCodeResult.from_dict(await self._t.call("POST", "/run_code", {"code": code, "language": language, **kw}, timeout=t))

    async def events(self, selector: Optional[str] = None, follow: bool = False, since: Optional[int] = None) -> AsyncIterator[Event]:
        """AsyncSandbox lifecycle events, oldest first, of sandboxes matching ``selector``, at or
        after ``since`` (ms since the epoch). Without ``follow`` it ends after the recorded
        ones; with it, it waits for new ones until closed. No deadline."""
        async for ln in alines(self._t.stream("GET", "/v1/events" + api.query(selector=selector, follow=follow, since=since))):
            if ln.strip():
                yield Event.from_dict(_json_line(ln, "the event stream"))

    async def stats(self) -> Dict[str, Any]:
        """Resource usage of every sandbox and the host's totals."""
        return await self._t.call("GET", "/v1/stats")  # type: ignore[no-any-return]
