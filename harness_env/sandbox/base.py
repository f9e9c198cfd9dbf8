"""One async sandbox interface for every backend (bwrap, docker, kubernetes).

A rollout gets one sandbox: a workspace (mounted rw at `spec.workspace_dir`, by default /workspace; a
task may name another, e.g. ClawGym's /root/.openclaw/workspace), a private HOME (/home/agent),
read-only mounts (the harness install dir, node), no network except the shim, which a forwarder
started inside exposes as 127.0.0.1:`shim_port`, and CPU / memory / pids / wall-clock limits (disk
caps for workspace and HOME: harness_env/sandbox/disk.py). The verifier runs later in a *second*,
fresh sandbox over the same workspace (harness_env/runner.py), so nothing the agent started or left
outside the workspace reaches it. Every backend records what it started so `reap()` at start-up can
clean up after an orchestrator that died (kill -9) before calling `close()`.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import os
import pathlib
import uuid
from collections.abc import Callable, Mapping, Sequence

WORKSPACE = "/workspace"  # the default workspace path inside a sandbox (SandboxSpec.workspace_dir)
HOME = "/home/agent"
SHIM_SOCKET_IN = "/run/hrl/shim.sock"  # where the shim's Unix socket appears inside the sandbox
APP_SOCKET_IN = "/run/hrl/app-{port}.sock"  # where a web app's Unix socket appears (SandboxSpec.app_ports)
FORWARDER_IN = "/opt/hrl/forwarder.py"
FORWARDER_HOST = pathlib.Path(__file__).with_name("forwarder.py")
LABEL = "harness-rl.sandbox"  # docker/k8s label (and cgroup/state-dir name) marking our sandboxes
# The environment the orchestrator starts sandbox processes (bwrap, prlimit, sh) with: bwrap's own init
# is PID 1 inside and keeps the environment it was started with, readable there as /proc/1/environ.
LAUNCH_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# A workspace may neither be, nor lie in, nor contain one of these: the sandbox's system and runtime dirs.
RESERVED_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
                 "/sys", "/tmp", "/usr", "/var", "/opt/hrl", "/opt/harness-rl", HOME)


def check_workspace_dir(path: object) -> str:
    """The in-sandbox workspace path a task asks for, validated: absolute, normalised, not a system dir.
    Raises ValueError naming the problem (the task loader turns it into `task_error`)."""
    if not isinstance(path, str):
        raise ValueError(f"must be a string, not {type(path).__name__}")
    return _check_workspace_dir(path)


@functools.lru_cache(maxsize=4096)
def _check_workspace_dir(path: str) -> str:
    if not path.startswith("/") or path.startswith("//"):
        raise ValueError(f"{path!r} is not an absolute path")
    if len(path) > 255 or any(ord(c) < 32 or c == "\x7f" for c in path):
        raise ValueError(f"{path[:80]!r}: too long or holds control characters")
    path = path.rstrip("/")
    if not path:
        raise ValueError("the workspace cannot be /")
    if any(part in ("", ".", "..") for part in path.split("/")[1:]):
        raise ValueError(f"{path!r} is not a normalised path (no '.', '..', '//')")
    for r in RESERVED_DIRS:
        if path == r or path.startswith(r + "/") or r.startswith(path + "/"):
            raise ValueError(f"{path!r} overlaps the sandbox's own {r}")
    return path


class SandboxError(RuntimeError):
    """Infrastructure failure (start, copy, backend gone): the runner retries these."""


class SandboxStartError(SandboxError):
    """The sandbox could not be created or its first process could not be started."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-sandbox resource limits. cgroups when the host allows, else rlimits (see limits.py)."""

    cpus: float = 1.0
    memory_mb: int = 2048
    pids: int = 512
    wall_s: float = 900.0  # whole-sandbox lifetime cap; each exec also takes its own timeout
    # Disk caps (MiB; None = uncapped) of the workspace and of HOME; exceeding one ends the rollout with
    # status `disk_limit`. Size-limited tmpfs mounts where the host allows, else a watcher (disk.py).
    workspace_mb: int | None = 1024
    home_mb: int | None = 512


@dataclasses.dataclass(frozen=True)
class Mount:
    host: str
    target: str
    read_only: bool = True


@dataclasses.dataclass
class SandboxSpec:
    """What a rollout needs. Paths are host paths; targets are paths inside the sandbox."""

    workspace: pathlib.Path
    home: pathlib.Path | None = None  # None: a fresh empty HOME (the verifier's sandbox)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    limits: Limits = dataclasses.field(default_factory=Limits)
    mounts: list[Mount] = dataclasses.field(default_factory=list)
    shim_socket: pathlib.Path | None = None  # host Unix socket of the shim
    shim: bool = True  # False: no route to the shim at all (the verifier's sandbox), whatever the backend
    shim_port: int = 18080  # loopback TCP port the forwarder listens on inside the sandbox
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    name: str = ""  # usually the rollout id; becomes part of the sandbox id
    image: str = "harness-rl/sandbox:latest"  # docker / kubernetes only
    workspace_dir: str = WORKSPACE  # where the workspace appears inside (check_workspace_dir-validated)
    # Web apps of the task (harness_env/web/env.py): loopback port inside -> host Unix socket of the app,
    # which runs in a sandbox of its own; the in-sandbox forwarder serves these beside the shim's port.
    app_ports: dict[int, pathlib.Path] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workspace_dir = check_workspace_dir(self.workspace_dir)
        for port in self.app_ports:
            if not 1024 <= int(port) < 65536 or int(port) == self.shim_port:
                raise ValueError(f"app port {port}: must be in [1024, 65536) and not the shim's {self.shim_port}")

    @property
    def forwarder_needed(self) -> bool:
        return self.shim_socket is not None or bool(self.app_ports)

    def forwarder_args(self) -> list[str]:
        """The in-sandbox forwarder's arguments (before `--`): the shim's port and every app port."""
        a = ["--port", str(self.shim_port), "--socket", SHIM_SOCKET_IN] if self.shim_socket is not None else []
        for port in sorted(self.app_ports):
            a += ["--forward", f"{port}={APP_SOCKET_IN.format(port=port)}"]
        return a

    def sandbox_id(self) -> str:
        stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in self.name)[:40].strip("-")
        return f"{stem or 'sbx'}-{uuid.uuid4().hex[:8]}".lower()

    def base_env(self) -> dict[str, str]:
        env = {
            "HOME": HOME,
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "TERM": "dumb",
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
        }
        if self.shim_socket is not None and self.shim:
            env["HRL_SHIM_URL"] = f"http://127.0.0.1:{self.shim_port}"
        return {**env, **self.env}


@dataclasses.dataclass
class ExecResult:
    exit_code: int  # negative: killed by that signal; -9 also after a timeout
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0
    oom_killed: bool = False
    disk_exceeded: bool = False  # the backend saw a disk cap hit (kubernetes: evicted for ephemeral storage)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Sandbox(abc.ABC):
    """A started sandbox. Use as `async with await backend.create(spec) as sbx:`."""

    def __init__(self, sandbox_id: str, spec: SandboxSpec):
        self.id = sandbox_id
        self.spec = spec
        self.closed = False

    @abc.abstractmethod
    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Runs argv inside (cwd None: the workspace); on timeout kills its whole process tree and returns
        timed_out=True. Cancelling the call kills the tree too before the CancelledError propagates: no
        caller is ever left waiting on a process nobody reads."""

    @abc.abstractmethod
    async def copy_in(self, src: str | os.PathLike, dest: str) -> None:
        """Copies a host file or directory to `dest` inside the sandbox (visible to later execs)."""

    async def export_workspace(self) -> None:
        """Brings the workspace's final state to the host dir `spec.workspace` and stops every process that
        could still change it. A no-op where the workspace IS that host dir (bwrap, docker: `close()`
        then stops the processes); kubernetes copies it out of the pod."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Kills everything still running and removes the sandbox; idempotent."""

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class Backend(abc.ABC):
    name: str = ""
    supports_web: bool = True  # can run a task's web app in a sandbox of its own (SandboxSpec.app_ports)

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Starts a sandbox; raises SandboxStartError when it cannot."""

    @abc.abstractmethod
    async def reap(self) -> int:
        """Removes sandboxes left behind by dead orchestrators; returns how many were removed."""

    def available(self) -> tuple[bool, str]:
        """(usable here?, why not). Tests skip cleanly on False."""
        return True, ""


# name -> factory, filled by @register_backend as each backend's module loads (harness_env/sandbox/backends.py
# imports the built-in ones and looks names up here)
BACKENDS: dict[str, Callable[..., Backend]] = {}


def register_backend(name: str):
    def deco(factory):
        factory.name = name
        BACKENDS[name] = factory
        return factory

    return deco


OUTPUT_CAP = 1 << 20  # bytes of each stream an exec keeps (its tail): what `decode` returns anyway


class TailBuffer:
    """The last `cap` bytes of a stream, however much flows through: an agent's `yes` or a 1 GB flood is read
    and dropped as it comes, never held by the host (trimmed when it reaches twice the cap: amortised O(1))."""

    def __init__(self, cap: int = OUTPUT_CAP):
        self.cap, self.buf, self.seen = cap, bytearray(), 0

    def add(self, chunk: bytes | None) -> None:
        if chunk:
            self.seen += len(chunk)
            self.buf += chunk
            if len(self.buf) > 2 * self.cap:
                del self.buf[: -self.cap]

    def value(self) -> bytes:
        return bytes(self.buf[-self.cap :])


def decode(b: bytes | None, limit: int = OUTPUT_CAP) -> str:
    """Output as text, cut to the last `limit` bytes: a chatty harness must not fill the host's memory."""
    if not b:
        return ""
    if len(b) > limit:
        b = b[-limit:]
    return b.decode("utf-8", "replace")
