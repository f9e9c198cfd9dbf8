"""Web environments: a task's `env/` web app, run in a sandbox of its own for one rollout.

A web task is a ClawGym task folder with an `env/` beside `input_files/`:
    env/env.json   {"command": [...], "port": 8000, "ready_path"?: "/", "start_path"?: "/",
                    "startup_timeout_s"?: 30, "state_mb"?: 64, "memory_mb"?: 512}
    env/...        the app (ours: app.py + site.json, harness_env/web/site_app.py)
The app listens on 127.0.0.1:PORT and writes its server-side state under $HRL_STATE_DIR.

Why a sandbox of its own rather than a process in the agent's: the agent (a shell, a browser with
devtools) must not be able to forge the state the verifier reads. In the agent's sandbox the app would
run as the same uid: it could be killed and replaced, its files rewritten, its source (holding the
answers) read. So the app runs in an "env sandbox" (same backend, loopback-only, no shim, no agent
files) with its code mounted read-only and its state dir writable; inside it, the forwarder exposes the
app's port as a Unix socket in a host dir; the agent's sandbox binds that socket and its forwarder
serves it on the same 127.0.0.1:PORT (SandboxSpec.app_ports). The agent reaches the app only through
HTTP, like a user; its sandbox holds neither the app's code nor its state.

Lifecycle (harness_env/runner.py): start before the agent's sandbox, wait until `ready_path` answers
(a probe marked with the X-HRL-Probe header, which our apps do not log), run the harness, close the
agent's sandbox, stop the app (nothing of either runs any more), copy the state dir to the rollout's
`env_state/`, and hand that copy to the verifier as `<workspace>/reward/env_state/`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import stat
import tempfile
import time

from harness_env.sandbox.base import FORWARDER_HOST, FORWARDER_IN, Backend, Limits, Mount, SandboxSpec

ENV_DIRNAME = "env"
MANIFEST = "env.json"
APP_IN = "/srv/hrl-app"  # the task's env/ inside the env sandbox (read-only)
ENV_WS_IN = "/srv/hrl-env"  # the env sandbox's writable dir: state/ and run/ (the socket)
STATE_DIRNAME = "env_state"  # the rollout's copy of the app state, and its name under reward/
PROBE_HEADER = "X-HRL-Probe"
SHIM_PORT = 18080


class WebEnvError(RuntimeError):
    """The app did not start (its output is in the message)."""


@dataclasses.dataclass(frozen=True)
class WebEnv:
    """A task's env/env.json, validated."""

    root: pathlib.Path  # the task's env/ folder
    command: tuple[str, ...]
    port: int
    ready_path: str = "/"
    start_path: str = "/"
    startup_timeout_s: float = 30.0
    state_mb: int = 64
    memory_mb: int = 512

    @property
    def start_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.start_path}"

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def load_env(task_root: pathlib.Path) -> WebEnv | None:
    """The task's web env, or None when it has no env/. Raises ValueError naming the bad field."""
    root = task_root / ENV_DIRNAME
    if not os.path.lexists(root):
        return None
    path = root / MANIFEST
    st = os.lstat(path) if os.path.lexists(path) else None
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 16:
        raise ValueError(f"{path}: env/ needs an env.json (a regular file of at most 64 KiB)")
    try:
        d = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(d, dict):
        raise ValueError(f"{path}: must be a JSON object")
    cmd = d.get("command")
    if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) and c and "\0" not in c for c in cmd):
        raise ValueError(f"{path}: command must be a non-empty list of non-empty strings")
    port = d.get("port")
    if type(port) is not int or not 1024 <= port < 65536 or port == SHIM_PORT:
        raise ValueError(f"{path}: port must be an integer in [1024, 65536), not the shim's {SHIM_PORT}")
    kw = {}
    for key in ("ready_path", "start_path"):
        v = d.get(key, "/")
        if not isinstance(v, str) or not v.startswith("/") or any(c in v for c in " \r\n\0"):
            raise ValueError(f"{path}: {key} must be a path starting with '/'")
        kw[key] = v
    for key, lo, hi in (("startup_timeout_s", 1, 600), ("state_mb", 1, 4096), ("memory_mb", 64, 16384)):
        v = d.get(key, WebEnv.__dataclass_fields__[key].default)
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise ValueError(f"{path}: {key} must be a number in [{lo}, {hi}]")
        kw[key] = v
    return WebEnv(root=root, command=tuple(cmd), port=port, **kw)


class RunningEnv:
    """One started web env: its sandbox, the app's exec (a task) and the host socket the agent's sandbox binds."""

    def __init__(self, web: WebEnv, host_dir: pathlib.Path, sbx, run_task: asyncio.Future):
        self.web, self.host_dir, self.sbx, self.run_task = web, host_dir, sbx, run_task
        self.socket = host_dir / "run" / "app.sock"
        self.stopped = False
        self._short: str | None = None

    @property
    def connect_path(self) -> str:
        """A path to connect to the socket from the host: AF_UNIX paths must stay under 108 bytes, so a deep
        rollout dir is reached through a short symlink in the temp dir (removed by `stop`)."""
        if len(str(self.socket)) < 100:
            return str(self.socket)
        if self._short is None:
            self._short = tempfile.mkdtemp(prefix="hrl-app-")
            os.symlink(self.socket.parent, os.path.join(self._short, "run"))
        return os.path.join(self._short, "run", self.socket.name)

    async def stop(self):
        """Kills the app (its whole process tree) and removes its sandbox; returns the app's ExecResult or None."""
        if self.stopped:
            return None
        self.stopped = True
        res = None
        if not self.run_task.done():
            self.run_task.cancel()
        with contextlib.suppress(BaseException):
            res = await self.run_task
        await self.sbx.close()
        if self._short is not None:
            shutil.rmtree(self._short, ignore_errors=True)
        return res

    def collect(self, dest: pathlib.Path) -> pathlib.Path:
        """Copies the app's state dir (regular files and dirs only) to `dest`; returns it."""
        copy_regular(self.host_dir / "state", dest)
        return dest


def env_spec(web: WebEnv, host_dir: pathlib.Path, *, name: str, wall_s: float, labels: dict) -> SandboxSpec:
    lim = Limits(cpus=1.0, memory_mb=int(web.memory_mb), pids=256, wall_s=wall_s, workspace_mb=None, home_mb=64)
    return SandboxSpec(
        workspace=host_dir,
        home=None,
        limits=lim,
        name=name,
        shim=False,
        workspace_dir=ENV_WS_IN,
        mounts=[Mount(str(web.root.resolve()), APP_IN), Mount(str(FORWARDER_HOST), FORWARDER_IN)],
        labels={**labels, "harness-rl.role": "web-env"},
    )


async def start(
    backend: Backend, web: WebEnv, host_dir: pathlib.Path, *, name: str, wall_s: float, labels: dict | None = None
) -> RunningEnv:
    """Starts the app in its own sandbox and waits until it answers. Raises WebEnvError (the app exited or never
    answered) or SandboxError (infrastructure)."""
    for sub in ("state", "run"):
        (host_dir / sub).mkdir(parents=True, exist_ok=True)
    sbx = await backend.create(env_spec(web, host_dir, name=name, wall_s=wall_s, labels=labels or {}))
    argv = [
        "/usr/bin/python3",
        "-I",
        "-S",
        FORWARDER_IN,
        "--listen-unix",
        f"{ENV_WS_IN}/run/app.sock",
        "--socket",
        f"127.0.0.1:{web.port}",
        "--",
        *web.command,
    ]
    env = {"HRL_STATE_DIR": f"{ENV_WS_IN}/state", "PORT": str(web.port)}
    task = asyncio.ensure_future(sbx.exec(argv, env=env, cwd=APP_IN, timeout=wall_s))
    running = RunningEnv(web, host_dir, sbx, task)
    try:
        await wait_ready(running)
    except BaseException:
        await running.stop()
        raise
    return running


async def wait_ready(env: RunningEnv) -> None:
    deadline = time.monotonic() + env.web.startup_timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if env.run_task.done():
            res = env.run_task.result() if not env.run_task.cancelled() else None
            out = f"exit {res.exit_code}: {(res.stderr or res.stdout)[-600:]}" if res is not None else "cancelled"
            raise WebEnvError(f"the web app exited before answering ({out})")
        try:
            status = await probe(env.connect_path, env.web.ready_path, env.web.port)
            if 200 <= status < 400:
                return
            last = f"HTTP {status}"
        except OSError as e:
            last = f"{type(e).__name__}: {e}"
        await asyncio.sleep(0.1)
    raise WebEnvError(
        f"the web app did not answer {env.web.ready_path} within {env.web.startup_timeout_s:.0f}s ({last})"
    )


async def probe(sock: str | pathlib.Path, path: str, port: int, timeout: float = 5.0) -> int:
    """GET `path` over the app's Unix socket from the host; returns the HTTP status."""
    reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(sock)), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n{PROBE_HEADER}: 1\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    parts = line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise OSError(f"not an HTTP answer: {line[:80]!r}")
    return int(parts[1])


def copy_regular(src: pathlib.Path, dest: pathlib.Path) -> None:
    """Regular files and directories of src into dest (no links, sockets or FIFOs: nothing that reaches out)."""
    dest.mkdir(parents=True, exist_ok=True)
    if not src.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(src):
        rel = pathlib.Path(dirpath).relative_to(src)
        for d in dirnames:
            if stat.S_ISDIR(os.lstat(os.path.join(dirpath, d)).st_mode):
                (dest / rel / d).mkdir(exist_ok=True)
        for f in filenames:
            p = os.path.join(dirpath, f)
            if stat.S_ISREG(os.lstat(p).st_mode):
                shutil.copyfile(p, dest / rel / f, follow_symlinks=False)


def summarize(state_dir: pathlib.Path) -> dict:
    """Behaviour from the app's own request log (when it keeps one in our format): pages the agent visited,
    actions it submitted and how many of them the app rejected (a failed action), in order."""
    try:
        state = json.loads((state_dir / "state.json").read_text())
    except (OSError, ValueError):
        return {"state": False}
    log = state.get("log") if isinstance(state, dict) else None
    if not isinstance(log, list):
        return {"state": True}
    log = [e for e in log if isinstance(e, dict)]
    gets = [e for e in log if e.get("method") == "GET" and isinstance(e.get("status"), int) and e["status"] < 400]
    posts = [e for e in log if e.get("method") == "POST"]
    failed = [i for i, e in enumerate(log) if e.get("method") == "POST" and int(e.get("status") or 0) >= 400]
    recovered = any(
        any(e.get("method") == "POST" and int(e.get("status") or 0) < 400 for e in log[i + 1 :]) for i in failed
    )
    return {
        "state": True,
        "requests": len(log) + int(state.get("log_dropped") or 0),
        "pages_visited": len({str(e.get("path")) for e in gets}),
        "page_views": len(gets),
        "actions": len(posts),
        "failed_actions": len(failed),
        "recovered": recovered if failed else None,
    }
