"""Typed views of dsecd's API objects (docs/api/openapi.json), as dataclasses.

Each is built from the JSON dsecd sent with ``from_dict``: known fields are taken,
fields a newer dsecd adds are kept in ``extra`` rather than refused, and a field an
older dsecd leaves out takes its default. Times are ms since the Unix epoch, sizes
bytes, CPU limits cores, durations ms unless a field's name says ``_s`` (seconds).
"""
from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Type, TypeVar

T = TypeVar("T")


def _from_dict(cls: Type[T], d: Dict[str, Any]) -> T:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    known = {k: v for k, v in d.items() if k in names and k != "extra"}
    obj = cls(**known)  # type: ignore[call-arg]
    obj.extra = {k: v for k, v in d.items() if k not in names}  # type: ignore[attr-defined]
    return obj


class _Model:
    extra: Dict[str, Any]

    @classmethod
    def from_dict(cls: Type[T], d: Dict[str, Any]) -> T:
        """Builds the object from dsecd's JSON; unknown keys go to ``extra``."""
        return _from_dict(cls, d)


@dataclass
class SandboxInfo(_Model):
    """A sandbox as dsecd describes it (GET /v1/sandboxes/{id})."""

    id: str = ""
    """16 lowercase hex characters."""
    backend: str = "container"
    """Isolation tier: ``container``, ``fncall``, ``microvm`` or ``vm``."""
    image: str = ""
    """Image reference as resolved, ``name:tag``."""
    state: str = ""
    """``creating``, ``running``, ``paused``, ``stopped``, ``failed`` or ``destroyed``."""
    cpus: float = 0.0
    """CPU limit, cores."""
    memory_bytes: int = 0
    """Memory limit, bytes."""
    pids: int = 0
    """Process limit."""
    labels: Dict[str, str] = field(default_factory=dict)
    env: Dict[str, str] = field(default_factory=dict)
    ttl_s: Optional[int] = None
    """Seconds after creation when dsecd destroys it; None: never."""
    created_at: int = 0
    """ms since the Unix epoch."""
    updated_at: int = 0
    """Last state change, ms since the Unix epoch."""
    init_pid: Optional[int] = None
    error: Optional[str] = None
    """Why it failed, when ``state`` is ``failed``."""
    priority: str = "latency"
    idle_timeout_s: Optional[int] = None
    last_active_at: Optional[int] = None
    snapshot: Optional[str] = None
    """Id of the snapshot it was restored or forked from."""
    disk_bytes: Optional[int] = None
    """Quota on the writable layer, bytes."""
    image_layers: List[str] = field(default_factory=list)
    network: Optional[Dict[str, Any]] = None
    seccomp: Optional[Dict[str, Any]] = None
    filesystem: Optional[Dict[str, Any]] = None
    uid_base: Optional[int] = None
    uid_count: Optional[int] = None
    io_weight: Optional[int] = None
    io_max: Optional[Dict[str, Any]] = None
    disk_used_bytes: Optional[int] = None
    defences: Optional[Dict[str, Any]] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ExecResult(_Model):
    """The result of a command run to completion (POST /v1/sandboxes/{id}/exec, /v1/run).

    ``stdout`` and ``stderr`` are the decoded bytes (at most dsecd's
    ``max_output_bytes`` each; see ``stdout_truncated``); ``text`` decodes stdout as UTF-8.
    """

    exit_code: Optional[int] = None
    """Exit status; None when killed by a signal."""
    signal: Optional[str] = None
    """Signal name (e.g. ``SIGKILL``) when killed by one."""
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float = 0.0
    """Time from fork to exit inside the sandbox, ms."""
    oom: bool = False
    """Killed by SIGKILL while the memory cgroup recorded an OOM kill."""
    oom_kills: Optional[int] = None
    timed_out: bool = False
    """True when ``timeout_ms`` elapsed and the command was killed."""
    trajectory: Optional[str] = None
    """The trajectory the step belongs to (trajectory execs only)."""
    step: Optional[int] = None
    replayed: bool = False
    """True when this is the recorded result of an earlier run of the same step: nothing ran now."""
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ExecResult":  # type: ignore[override]
        """Builds the result, decoding ``stdout_b64`` and ``stderr_b64``."""
        d = dict(d)
        d["stdout"] = base64.b64decode(d.pop("stdout_b64", "") or "")
        d["stderr"] = base64.b64decode(d.pop("stderr_b64", "") or "")
        return _from_dict(cls, d)

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """exit code 0."""
        return self.exit_code == 0


@dataclass
class ExecInfo(_Model):
    """An exec session (POST /v1/sandboxes/{id}/execs): a command running in the background."""

    exec_id: str = ""
    sandbox_id: str = ""
    argv: List[str] = field(default_factory=list)
    tty: bool = False
    stdin: bool = False
    """Whether stdin is open for writing."""
    state: str = ""
    """``running`` or ``exited``."""
    pid: Optional[int] = None
    started_at: int = 0
    finished_at: Optional[int] = None
    exit_code: Optional[int] = None
    """127 not found, 126 not executable, else the exit status; None while running or when killed."""
    signal: Optional[str] = None
    timed_out: bool = False
    error: Optional[str] = None
    stdout_bytes: int = 0
    """Bytes of stdout produced so far."""
    stderr_bytes: int = 0
    stdout_dropped_bytes: int = 0
    stderr_dropped_bytes: int = 0
    paced: bool = False
    oom_kills: Optional[int] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Snapshot(_Model):
    """A snapshot to restore or fork from (POST /v1/sandboxes/{id}/snapshot)."""

    id: str = ""
    """``snap-`` and 16 lowercase hex characters."""
    name: Optional[str] = None
    kind: str = ""
    """``filesystem`` (a container's writable layer) or ``vm`` (a whole machine)."""
    sandbox_id: str = ""
    backend: str = ""
    image: str = ""
    image_layers: List[str] = field(default_factory=list)
    layer: str = ""
    size_bytes: int = 0
    """Host bytes the snapshot takes."""
    cpus: float = 0.0
    memory_bytes: int = 0
    pids: int = 0
    priority: str = ""
    labels: Dict[str, str] = field(default_factory=dict)
    env: Dict[str, str] = field(default_factory=dict)
    created_at: int = 0
    machine: Optional[Dict[str, Any]] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class BulkResult(_Model):
    """One sandbox's outcome of a bulk action (POST /v1/sandboxes/bulk)."""

    id: str = ""
    ok: bool = False
    state: Optional[str] = None
    error: Optional[Dict[str, Any]] = None
    """``{code, message}`` when not ok."""
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Lease(_Model):
    """A job's lease: when it lapses dsecd pauses the job's sandboxes, later destroys them."""

    job: str = ""
    ttl_s: int = 0
    """Seconds a renewal extends it by."""
    expires_at: int = 0
    """ms since the epoch; a renewal at or after it is refused."""
    lapsed_at: Optional[int] = None
    created_at: int = 0
    sandboxes: int = 0
    """Sandboxes labelled ``job=<job>``."""
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class TrajectoryStep(_Model):
    """One recorded step of a trajectory (without its output)."""

    step: int = 0
    state: str = ""
    """``running``, ``finished`` or ``unknown``."""
    hash: str = ""
    """sha256 (hex) of the canonical request."""
    sandbox_id: str = ""
    argv: List[str] = field(default_factory=list)
    started_at: int = 0
    finished_at: Optional[int] = None
    exit_code: Optional[int] = None
    signal: Optional[str] = None
    oom: Optional[bool] = None
    timed_out: Optional[bool] = None
    duration_ms: Optional[float] = None
    stdout_bytes: Optional[int] = None
    stderr_bytes: Optional[int] = None
    replays: int = 0
    """How many times the recorded result was replayed."""
    error: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Trajectory(_Model):
    """A trajectory's summary, and with GET /v1/trajectories/{id} its steps."""

    id: str = ""
    host: str = ""
    steps: int = 0
    """Recorded steps."""
    first_step: Optional[int] = None
    last_step: Optional[int] = None
    unknown: int = 0
    """Steps whose outcome is unknown."""
    sandbox_id: Optional[str] = None
    truncations: int = 0
    created_at: int = 0
    updated_at: int = 0
    step_list: List[TrajectoryStep] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Trajectory":  # type: ignore[override]
        """Builds the trajectory and its steps."""
        d = dict(d)
        d["step_list"] = [TrajectoryStep.from_dict(s) for s in d.get("step_list") or []]
        return _from_dict(cls, d)


@dataclass
class TrajectoryRecord(_Model):
    """One step of a trajectory export: the step, its request and its recorded output."""

    trajectory: str = ""
    step: int = 0
    state: str = ""
    hash: str = ""
    sandbox_id: str = ""
    argv: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    cwd: Optional[str] = None
    user: Optional[str] = None
    timeout_ms: Optional[int] = None
    exit_code: Optional[int] = None
    stdout: bytes = b""
    stderr: bytes = b""
    replays: int = 0
    started_at: int = 0
    finished_at: Optional[int] = None
    duration_ms: Optional[float] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "TrajectoryRecord":  # type: ignore[override]
        """Builds the record, decoding ``stdout_b64`` and ``stderr_b64``."""
        d = dict(d)
        d["stdout"] = base64.b64decode(d.pop("stdout_b64", None) or "")
        d["stderr"] = base64.b64decode(d.pop("stderr_b64", None) or "")
        return _from_dict(cls, d)


@dataclass
class Event(_Model):
    """A sandbox lifecycle event (GET /v1/events)."""

    time: int = 0
    """ms since the Unix epoch."""
    type: str = ""
    """e.g. ``sandbox.created``, ``sandbox.destroyed``."""
    sandbox_id: Optional[str] = None
    state: Optional[str] = None
    labels: Dict[str, str] = field(default_factory=dict)
    message: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class FileStat(_Model):
    """What is at a path in a sandbox."""

    path: str = ""
    type: str = ""
    """``file``, ``dir``, ``symlink`` or ``other``."""
    size: int = 0
    """Bytes."""
    mode: int = 0
    """Permission bits."""
    uid: int = 0
    gid: int = 0
    mtime_ms: float = 0.0
    target: Optional[str] = None
    """Symlink target."""
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class PauseResult(_Model):
    """A pause's answer: the sandbox and what memory was reclaimed (None if it was already paused)."""

    sandbox: Dict[str, Any] = field(default_factory=dict)
    reclaim: Optional[Dict[str, Any]] = None
    """``reclaimed_bytes``, ``anon_bytes``, ``swap``, ... (bytes)."""
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Token(_Model):
    """An API token as listed (its secret is shown once, at create: ``secret``)."""

    id: str = ""
    tenant: str = ""
    role: str = ""
    """``admin``, ``user``, ``reader`` or ``metrics``."""
    state: str = ""
    created_at: int = 0
    expires_at: Optional[int] = None
    description: Optional[str] = None
    token: Optional[str] = None
    """The secret (``e2b_...``): set only in the answer of create."""
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class RunCodeResult(_Model):
    """POST /run_code's SandboxFusion-shaped answer; times in seconds, as SandboxFusion has them."""

    status: str = ""
    """``Success``, ``Failed`` or ``SandboxError``."""
    message: str = ""
    compile_result: Optional[Dict[str, Any]] = None
    run_result: Optional[Dict[str, Any]] = None
    """``{status, execution_time (s), return_code, stdout, stderr}``."""
    executor_pod_name: Optional[str] = None
    files: Dict[str, str] = field(default_factory=dict)
    """fetch_files that exist, path -> base64."""
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)
