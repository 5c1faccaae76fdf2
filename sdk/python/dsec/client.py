"""The synchronous client: ``dsec.Client`` and the objects it hands out.

    c = dsec.Client()                      # where the CLI would connect (see dsec._endpoint)
    sb = c.sandboxes.create(image="busybox", labels={"job": "j1"})
    r = sb.exec(["echo", "hi"])            # ExecResult: r.exit_code, r.stdout (bytes), r.stderr
    sb.destroy()

A Client is safe to share between threads (a pool of keep-alive connections). Every
failed call raises a subclass of :class:`dsec.DsecError` named after dsecd's error code
(``dsec.NotFound``, ``dsec.Conflict``, ...), carrying dsecd's message.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

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
from ._transport import Transport, lines

_OCTET = "application/octet-stream"
_TAR = "application/x-tar"


def _json_line(line: bytes, what: str) -> Dict[str, Any]:
    try:
        v = json.loads(line)
    except ValueError as e:
        raise Internal(f"dsecd sent a malformed line in {what}: {line[:80]!r}") from e
    if not isinstance(v, dict):
        raise Internal(f"dsecd sent a line that is not an object in {what}: {line[:80]!r}")
    return v


class ExecSession:
    """An exec session: a command started in the background (:meth:`Sandbox.start_exec`).

    Its output is spooled by dsecd (unless ``paced``) and can be read, streamed or re-read
    from any byte offset while dsecd keeps the session.
    """

    def __init__(self, client: "Client", info: ExecInfo) -> None:
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

    def refresh(self) -> ExecInfo:
        """GET the session's ExecInfo. Raises NotFound (forgotten, or another caller's)."""
        self.info = ExecInfo.from_dict(self._c._t.call("GET", self._path))
        return self.info

    def output(self, stream: str = "stdout", offset: int = 0, follow: bool = True) -> Iterator[bytes]:
        """The bytes of ``stream`` (``stdout`` or ``stderr``) from byte ``offset``, as chunks
        as they are produced. With ``follow`` the iterator ends when the command ends;
        without it, at what was produced so far. No deadline. Raises NotFound, InvalidArgument."""
        return self._c._t.stream("GET", self._path + "/output" + api.query(stream=stream, offset=offset or None, follow=follow), accept="*/*")

    def write_stdin(self, data: api.Bytes, eof: bool = False) -> None:
        """Writes ``data`` to the command's stdin, closing it after when ``eof``. Raises
        FailedPrecondition (started without ``stdin=True``)."""
        self._c._t.upload("POST", self._path + "/stdin" + api.query(eof=eof), api.to_bytes(data), _OCTET)

    def wait(self, timeout_ms: Optional[int] = None) -> ExecInfo:
        """Blocks until the command ended and returns its ExecInfo (``exit_code``,
        ``signal``, ``timed_out``). With ``timeout_ms``, dsecd gives up after that many ms:
        DeadlineExceeded (the command keeps running)."""
        t = None if timeout_ms is None or self._c._t.timeout is None else self._c._t.timeout + timeout_ms / 1000
        self.info = ExecInfo.from_dict(self._c._t.call("POST", self._path + "/wait" + api.query(timeout_ms=timeout_ms), timeout=t))
        return self.info

    def signal(self, sig: Union[str, int] = "SIGTERM") -> ExecInfo:
        """Sends ``sig`` (``SIGTERM``, ``TERM`` or a number) to the command's process group."""
        self.info = ExecInfo.from_dict(self._c._t.call("POST", self._path + "/signal", {"signal": sig}))
        return self.info

    def remove(self) -> ExecInfo:
        """Kills the command if it runs and forgets the session and its output."""
        return ExecInfo.from_dict(self._c._t.call("DELETE", self._path))


class Files:
    """Files of one sandbox (``sandbox.files``): paths are absolute inside the sandbox;
    ``user`` (name or ``uid[:gid]``) acts as that user (permissions checked, new files owned)."""

    def __init__(self, client: "Client", sid: str) -> None:
        self._c = client
        self._sid = sid

    def _p(self, tail: str, **params: Any) -> str:
        return api.sandbox_path(self._sid) + tail + api.query(**params)

    def read(self, path: str, user: Optional[str] = None) -> bytes:
        """The file's bytes. Raises NotFound, FailedPrecondition (a directory)."""
        return self._c._t.download("GET", self._p("/files", path=path, user=user))

    def write(self, path: str, data: Union[api.Bytes, Any], mode: Optional[int] = None, parents: bool = False, user: Optional[str] = None) -> Dict[str, Any]:
        """Writes ``data`` (bytes, str as UTF-8, or a binary file object, streamed) to ``path``,
        replacing it atomically; ``mode`` permission bits (default 0o644), ``parents``
        creates missing directories. Returns ``{path, bytes}``. Raises NotFound (parent
        missing), FailedPrecondition (a directory), ResourceExhausted (disk quota)."""
        body = api.to_bytes(data) if isinstance(data, (bytes, bytearray, memoryview, str)) else data
        m = None if mode is None else api.format_mode(mode)
        return self._c._t.upload("PUT", self._p("/files", path=path, mode=m, parents=parents, user=user), body, _OCTET)

    def stat(self, path: str, nofollow: bool = False, user: Optional[str] = None) -> FileStat:
        """What is at ``path`` (a final symlink followed unless ``nofollow``). Raises NotFound."""
        return FileStat.from_dict(self._c._t.call("GET", self._p("/files/stat", path=path, nofollow=nofollow, user=user)))

    def list(self, path: str, recursive: bool = False, user: Optional[str] = None) -> List[FileStat]:
        """The entries of directory ``path`` (each with ``extra['name']``). Raises NotFound, FailedPrecondition."""
        r = self._c._t.call("GET", self._p("/files/list", path=path, recursive=recursive, user=user))
        return [FileStat.from_dict(e) for e in r["entries"]]

    def mkdir(self, path: str, mode: Optional[int] = None, parents: bool = False, user: Optional[str] = None) -> FileStat:
        """Creates directory ``path``. Raises AlreadyExists, FailedPrecondition."""
        body = api.compact(path=path, mode=mode, parents=parents or None, user=user)
        return FileStat.from_dict(self._c._t.call("POST", api.sandbox_path(self._sid) + "/files/mkdir", body))

    def remove(self, path: str, recursive: bool = False, user: Optional[str] = None) -> None:
        """Removes a file, or with ``recursive`` a directory tree. Raises NotFound."""
        self._c._t.call("DELETE", self._p("/files", path=path, recursive=recursive, user=user))

    def get_archive(self, path: str, follow: bool = False, user: Optional[str] = None) -> bytes:
        """A tar archive of ``path`` (members named from its basename, as ``docker cp``)."""
        return self._c._t.download("GET", self._p("/archive", path=path, follow=follow, user=user))

    def put_archive(self, directory: str, tar: Union[bytes, Any], user: Optional[str] = None) -> Dict[str, Any]:
        """Extracts the tar ``tar`` (bytes or a binary file object) into existing ``directory``;
        returns ``{entries, bytes}``. Raises NotFound, InvalidArgument (unsafe member)."""
        return self._c._t.upload("PUT", self._p("/archive", path=directory, user=user), tar, _TAR)


class Sandbox:
    """A sandbox bound to its client. ``info`` is its SandboxInfo as last seen; ``id``,
    ``state`` and ``labels`` read from it. As a context manager it is destroyed on exit."""

    def __init__(self, client: "Client", info: SandboxInfo) -> None:
        self._c = client
        self.info = info
        self.files = Files(client, info.id)
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
        return f"Sandbox(id={self.id!r}, state={self.state!r}, image={self.info.image!r})"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    @property
    def _path(self) -> str:
        return api.sandbox_path(self.id)

    def _set(self, d: Dict[str, Any]) -> "Sandbox":
        self.info = SandboxInfo.from_dict(d)
        return self

    def refresh(self) -> "Sandbox":
        """Re-reads the sandbox from dsecd. Raises NotFound."""
        return self._set(self._c._t.call("GET", self._path))

    def exec(
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
        return ExecResult.from_dict(self._c._t.call("POST", self._path + "/exec", body, timeout=api.exec_timeout(self._c._t.timeout, timeout_ms)))

    def start_exec(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: bool = False,
        tty: Optional[Mapping[str, int]] = None,
        timeout_ms: Optional[int] = None,
        paced: Optional[bool] = None,
    ) -> ExecSession:
        """Starts ``argv`` as an exec session and returns it once the program started (or
        failed to: ``info.error``, exit code 127/126). ``stdin=True`` opens stdin for
        :meth:`ExecSession.write_stdin`; ``tty`` ``{rows, cols}`` runs it under a PTY;
        ``timeout_ms`` kills it after that many ms; ``paced`` paces it by its readers
        instead of spooling (see the API). Raises NotFound, FailedPrecondition."""
        body = api.compact(argv=list(argv), env=dict(env) if env else None, cwd=cwd, user=user, stdin=stdin or None, tty=dict(tty) if tty else None, timeout_ms=timeout_ms, paced=paced)
        return ExecSession(self._c, ExecInfo.from_dict(self._c._t.call("POST", self._path + "/execs", body)))

    def exec_stream(self, argv: Sequence[str], stream: str = "stdout", **kw: Any) -> Iterator[bytes]:
        """Runs ``argv`` as an exec session and yields its ``stream`` output as it is
        produced, ending when the command ends (then its ExecInfo is in the iterator's
        ``StopIteration.value``; for the exit code use :meth:`start_exec` and ``wait``).
        Keyword arguments as :meth:`start_exec`."""
        s = self.start_exec(argv, **kw)
        yield from s.output(stream=stream, follow=True)
        return s.wait()

    def execs(self) -> List[ExecInfo]:
        """The caller's exec sessions in this sandbox (running, and exited ones dsecd keeps)."""
        return [ExecInfo.from_dict(e) for e in self._c._t.call("GET", self._path + "/execs")["execs"]]

    def logs(self, follow: bool = False) -> Iterator[str]:
        """The sandbox's lifecycle and exec history, then its agent log, as text lines; with
        ``follow`` new lines as they come, until the sandbox is destroyed or the iterator is
        closed. No deadline. Raises NotFound."""
        for ln in lines(self._c._t.stream("GET", self._path + "/logs" + api.query(follow=follow), accept="text/plain")):
            yield ln.decode("utf-8", "replace")

    def stop(self, timeout_ms: Optional[int] = None) -> "Sandbox":
        """Stops its processes (SIGTERM, SIGKILL after ``timeout_ms`` ms of grace; dsecd's
        default 10 s; 0 kills at once); the writable layer stays. Raises FailedPrecondition."""
        if timeout_ms is None:
            return self._set(self._c._t.call("POST", self._path + "/stop"))
        t = None if self._c._t.timeout is None else self._c._t.timeout + timeout_ms / 1000
        return self._set(self._c._t.call("POST", self._path + "/stop", {"timeout_ms": timeout_ms}, timeout=t))

    def start(self) -> "Sandbox":
        """Starts a stopped sandbox again. Raises Conflict, FailedPrecondition."""
        return self._set(self._c._t.call("POST", self._path + "/start"))

    def pause(self) -> PauseResult:
        """Freezes every process (cgroup freezer) and reclaims memory; ``reclaim`` None when
        it was already paused. Raises FailedPrecondition (not running)."""
        r = PauseResult.from_dict(self._c._t.call("POST", self._path + "/pause"))
        self.info = SandboxInfo.from_dict(r.sandbox)
        return r

    def resume(self) -> "Sandbox":
        """Thaws a paused sandbox exactly where it stopped."""
        return self._set(self._c._t.call("POST", self._path + "/resume"))

    def snapshot(self, name: Optional[str] = None, process: Optional[bool] = None) -> Snapshot:
        """Captures the writable layer (a microVM: the whole machine) as a snapshot to restore
        or fork from, named ``name`` (``[a-z0-9][a-z0-9._-]{0,127}``) when given. No deadline.
        Raises AlreadyExists (name taken), FailedPrecondition, Unimplemented (``process``
        without CRIU)."""
        return Snapshot.from_dict(self._c._t.call("POST", self._path + "/snapshot", api.compact(name=name, process=process), timeout=None))

    def stats(self) -> Dict[str, Any]:
        """Resource usage now (cpu, memory bytes, pids, I/O), as dsecd reports it."""
        return self._c._t.call("GET", self._path + "/stats")  # type: ignore[no-any-return]

    def destroy(self, force: bool = True) -> "Sandbox":
        """Destroys the sandbox (``force``: even when running). Destroying one already gone is
        not an error. Raises FailedPrecondition/Conflict when running and not ``force``."""
        from ._errors import NotFound

        try:
            return self._set(self._c._t.call("DELETE", self._path + api.query(force=force)))
        except NotFound:
            self.info.state = "destroyed"
            return self


class Sandboxes:
    """``client.sandboxes``: create, get, list, and act on all sandboxes of a label selector."""

    def __init__(self, client: "Client") -> None:
        self._c = client

    def create(self, image: Optional[str] = None, **fields: Any) -> Sandbox:
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
        return Sandbox(self._c, SandboxInfo.from_dict(self._c._t.call("POST", "/v1/sandboxes", body)))

    def create_many(self, count: int, image: Optional[str] = None, **fields: Any) -> List[Union[Sandbox, DsecError]]:
        """Creates ``count`` sandboxes of one spec (1 to 1,000) in one batched request
        (POST /v1/sandboxes:batch) and returns, in order, each Sandbox or the DsecError
        (e.g. ResourceExhausted: the host or the tenant quota was full) of one that was
        not made; each is made as :meth:`create` makes one. ``image`` and ``**fields`` as
        :meth:`create`. No deadline.

        Raises:
            InvalidArgument: a malformed batch (then nothing is made).
        """
        spec = api.pick(api.CREATE_FIELDS, {"image": image, **fields}, "create")
        r = self._c._t.call("POST", "/v1/sandboxes:batch", {"count": count, "spec": spec}, timeout=None)
        return [Sandbox(self._c, SandboxInfo.from_dict(x["sandbox"])) if x.get("sandbox") else error_from_body(x.get("error"), 200) for x in r["results"]]

    def get(self, sandbox_id: str) -> Sandbox:
        """The sandbox ``sandbox_id``. Raises NotFound."""
        return Sandbox(self._c, SandboxInfo.from_dict(self._c._t.call("GET", api.sandbox_path(sandbox_id))))

    def list(self, selector: Optional[str] = None, state: Optional[str] = None) -> List[Sandbox]:
        """Sandboxes matching a label ``selector`` (``k=v``, ``k!=v``, ``k`` terms, comma
        separated; all must match) and ``state``; all when both are None."""
        r = self._c._t.call("GET", "/v1/sandboxes" + api.query(selector=selector, state=state))
        return [Sandbox(self._c, SandboxInfo.from_dict(s)) for s in r["sandboxes"]]

    def bulk(self, selector: str, action: str, ttl_s: Any = ..., timeout_ms: Optional[int] = None, timeout: Optional[float] = None) -> List[BulkResult]:
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
        r = self._c._t.call("POST", "/v1/sandboxes/bulk", body, timeout=timeout)
        return [BulkResult.from_dict(x) for x in r["results"]]

    def pause_all(self, selector: str) -> List[BulkResult]:
        """Pauses every sandbox matching ``selector`` (a round between rollouts)."""
        return self.bulk(selector, "pause")

    def resume_all(self, selector: str) -> List[BulkResult]:
        """Resumes every sandbox matching ``selector``."""
        return self.bulk(selector, "resume")

    def destroy_all(self, selector: str) -> List[BulkResult]:
        """Destroys every sandbox matching ``selector``, running or not."""
        return self.bulk(selector, "destroy")


class Snapshots:
    """``client.snapshots``: list, get, delete, and make sandboxes from one (restore, fork)."""

    def __init__(self, client: "Client") -> None:
        self._c = client

    def list(self) -> List[Snapshot]:
        """Every snapshot on this host, oldest first."""
        return [Snapshot.from_dict(s) for s in self._c._t.call("GET", "/v1/snapshots")["snapshots"]]

    def get(self, ref: str) -> Snapshot:
        """A snapshot by id (``snap-<16 hex>``) or name. Raises NotFound."""
        return Snapshot.from_dict(self._c._t.call("GET", "/v1/snapshots/" + api.q(ref)))

    def delete(self, ref: str) -> Snapshot:
        """Removes a snapshot (sandboxes made from it keep running). Raises NotFound."""
        return Snapshot.from_dict(self._c._t.call("DELETE", "/v1/snapshots/" + api.q(ref)))

    def restore(self, ref: str, **overrides: Any) -> Sandbox:
        """One sandbox from the snapshot, running. ``overrides``: fields of RestoreRequest
        (``labels``, ``env``, ``cpus``, ``memory_bytes``, ``pids``, ``ttl_s``, ``priority``,
        ``idle_timeout_s``, ``seccomp``, ``network``, ``disk_bytes``, ``filesystem``); the
        rest default to the source's. Raises NotFound, ResourceExhausted."""
        body = api.pick(api.RESTORE_FIELDS, overrides, "restore")
        return Sandbox(self._c, SandboxInfo.from_dict(self._c._t.call("POST", f"/v1/snapshots/{api.q(ref)}/restore", body)))

    def fork(self, ref: str, count: int, timeout: Optional[float] = None, **overrides: Any) -> List[Sandbox]:
        """``count`` (1-256) sandboxes from the snapshot, running, in creation order; all or
        nothing. ``overrides`` as :meth:`restore`. No HTTP deadline unless ``timeout`` (s).
        Raises InvalidArgument, NotFound, ResourceExhausted (the group does not fit)."""
        body = {"count": count, **api.pick(api.RESTORE_FIELDS, overrides, "fork")}
        r = self._c._t.call("POST", f"/v1/snapshots/{api.q(ref)}/fork", body, timeout=timeout)
        return [Sandbox(self._c, SandboxInfo.from_dict(s)) for s in r["sandboxes"]]


class Leases:
    """``client.leases``: a job's heartbeat. When a lease lapses dsecd pauses the sandboxes
    labelled ``job=<job>`` and destroys them its ``destroy_grace_s`` later."""

    def __init__(self, client: "Client") -> None:
        self._c = client

    def put(self, job: str, ttl_s: int) -> Lease:
        """Creates (or renews) the lease of ``job`` to expire ``ttl_s`` seconds from now
        (1 s to 30 days). Raises InvalidArgument, FailedPrecondition (lapsed: delete it first)."""
        return Lease.from_dict(self._c._t.call("POST", "/v1/leases", {"job": job, "ttl_s": ttl_s}))

    def renew(self, job: str, ttl_s: Optional[int] = None) -> Lease:
        """Extends the lease to expire ``ttl_s`` (default its own) seconds from now. Raises
        NotFound, FailedPrecondition (lapsed)."""
        return Lease.from_dict(self._c._t.call("POST", f"/v1/leases/{api.q(job)}/renew", api.compact(ttl_s=ttl_s)))

    def get(self, job: str) -> Lease:
        """One lease. Raises NotFound."""
        return Lease.from_dict(self._c._t.call("GET", "/v1/leases/" + api.q(job)))

    def list(self) -> List[Lease]:
        """Every lease."""
        return [Lease.from_dict(x) for x in self._c._t.call("GET", "/v1/leases")["leases"]]

    def delete(self, job: str) -> Lease:
        """Deletes the lease (the job's sandboxes stay as they are). Raises NotFound."""
        return Lease.from_dict(self._c._t.call("DELETE", "/v1/leases/" + api.q(job)))


class Trajectories:
    """``client.trajectories``: the recorded steps of execs made with ``trajectory`` and ``step``."""

    def __init__(self, client: "Client") -> None:
        self._c = client

    def list(self) -> List[Trajectory]:
        """Summaries of every trajectory, most recently updated first."""
        return [Trajectory.from_dict(t) for t in self._c._t.call("GET", "/v1/trajectories")["trajectories"]]

    def get(self, trajectory_id: str) -> Trajectory:
        """The summary and every step (without output), in step order. Raises NotFound."""
        return Trajectory.from_dict(self._c._t.call("GET", "/v1/trajectories/" + api.q(trajectory_id)))

    def export(self, trajectory_id: str) -> Iterator[TrajectoryRecord]:
        """Every step with its request and recorded output, in step order, streamed (NDJSON).
        Raises NotFound; a malformed line is Internal."""
        what = f"the export of trajectory {trajectory_id}"
        for ln in lines(self._c._t.stream("GET", f"/v1/trajectories/{api.q(trajectory_id)}/export")):
            if ln.strip():
                yield TrajectoryRecord.from_dict(_json_line(ln, what))

    def delete(self, trajectory_id: str) -> Dict[str, Any]:
        """Discards the recorded steps (``{id, removed_steps}``); the id stays reserved.
        Raises NotFound, Conflict (reason ``in_progress``)."""
        return self._c._t.call("DELETE", "/v1/trajectories/" + api.q(trajectory_id))  # type: ignore[no-any-return]


class Tokens:
    """``client.tokens``: API tokens of the TCP door (admin only)."""

    def __init__(self, client: "Client") -> None:
        self._c = client

    def create(self, tenant: str, role: str, ttl_s: Optional[int] = None, description: Optional[str] = None) -> Token:
        """A new token for ``tenant`` with ``role`` (``admin``, ``user``, ``reader``,
        ``metrics``), expiring after ``ttl_s`` seconds if given; its secret is ``token``
        (shown once). Raises PermissionDenied, InvalidArgument."""
        return Token.from_dict(self._c._t.call("POST", "/v1/tokens", api.compact(tenant=tenant, role=role, ttl_s=ttl_s, description=description)))

    def list(self) -> List[Token]:
        """Every token, without its secret. Raises PermissionDenied."""
        return [Token.from_dict(t) for t in self._c._t.call("GET", "/v1/tokens")["tokens"]]

    def revoke(self, token_id: str) -> Token:
        """Revokes a token (refused from now on). Raises NotFound, PermissionDenied."""
        return Token.from_dict(self._c._t.call("DELETE", "/v1/tokens/" + api.q(token_id)))


class Client:
    """Client of one dsecd (or a gateway), synchronous.

    Args:
        socket: path of dsecd's Unix socket.
        host: ``https://HOST:PORT`` of dsecd's TCP door or a gateway.
        token: API token for ``host``; ca: PEM CA file to trust; cert, key: client
            certificate and key files (mutual TLS).
        timeout: deadline of a call in seconds (default 60; None: none). Calls that run a
            command add its ``timeout_ms``; streams have none. The synchronous client
            applies it to each socket operation (no byte for that long fails the call);
            AsyncClient to the whole call.

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
        self._t = Transport(self.endpoint, timeout)
        self.sandboxes = Sandboxes(self)
        """Sandbox calls."""
        self.snapshots = Snapshots(self)
        """Snapshot, restore and fork calls."""
        self.leases = Leases(self)
        """Lease calls."""
        self.trajectories = Trajectories(self)
        """Trajectory calls."""
        self.tokens = Tokens(self)
        """API token calls (admin)."""

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes pooled connections (not needed before exit)."""
        self._t.close()

    def version(self) -> Dict[str, Any]:
        """``{version, api, agent_protocol, node}`` of dsecd."""
        return self._t.call("GET", "/v1/version")  # type: ignore[no-any-return]

    def whoami(self) -> Dict[str, Any]:
        """The caller as dsecd sees it: ``{door, token_id, tenant, role, peer}``."""
        return self._t.call("GET", "/v1/whoami")  # type: ignore[no-any-return]

    def run(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        """Runs one command in a fresh environment and returns its ExecResult: ``backend``
        ``fncall`` on a pre-warmed worker, ``container`` (default) in a sandbox created and
        destroyed for it. Keywords: ``image``, ``backend``, ``env``, ``cwd``, ``user``,
        ``stdin``, ``timeout_ms``, ``memory_bytes``, ``cpus``, ``pids``.
        Raises InvalidArgument, NotFound (image), ResourceExhausted, Unimplemented."""
        body = api.run_body(argv, **kw)
        return ExecResult.from_dict(self._t.call("POST", "/v1/run", body, timeout=api.exec_timeout(self._t.timeout, kw.get("timeout_ms"))))

    def run_code(self, code: str, language: str, **kw: Any) -> RunCodeResult:
        """SandboxFusion's ``/run_code``: compile and run ``code`` (``python``, ``bash``,
        ``c``, ``cpp``) on the fncall tier. Keywords as SandboxFusion: ``stdin`` (str),
        ``compile_timeout``/``run_timeout`` (seconds, default 10), ``memory_limit_MB``,
        ``files`` (path -> base64), ``fetch_files``. Times in the answer are seconds."""
        t = None if self._t.timeout is None else self._t.timeout + float(kw.get("compile_timeout", 10)) + float(kw.get("run_timeout", 10))
        return RunCodeResult.from_dict(self._t.call("POST", "/run_code", {"code": code, "language": language, **kw}, timeout=t))

    def events(self, selector: Optional[str] = None, follow: bool = False, since: Optional[int] = None) -> Iterator[Event]:
        """Sandbox lifecycle events, oldest first, of sandboxes matching ``selector``, at or
        after ``since`` (ms since the epoch). Without ``follow`` it ends after the recorded
        ones; with it, it waits for new ones until closed. No deadline."""
        for ln in lines(self._t.stream("GET", "/v1/events" + api.query(selector=selector, follow=follow, since=since))):
            if ln.strip():
                yield Event.from_dict(_json_line(ln, "the event stream"))

    def stats(self) -> Dict[str, Any]:
        """Resource usage of every sandbox and the host's totals."""
        return self._t.call("GET", "/v1/stats")  # type: ignore[no-any-return]
