"""bubblewrap backend: the embedded default. No daemon; a sandbox is a state dir + a cgroup.

Each `exec` is one `bwrap` invocation with fresh namespaces (user, pid, net, ipc, uts, cgroup): the
process runs as uid 1000 with no capabilities, sees only read-only /usr, a few /etc files, the
workspace (at `spec.workspace_dir`) and HOME (a fresh size-capped tmpfs when `spec.home` is None),
and a loopback-only network where the in-sandbox forwarder exposes the shim. Because the pid
namespace dies with its exec, nothing the harness started survives into a later exec, and files
copied in later outside the workspace are bind-mounted only into later execs. bwrap itself is
started with a minimal environment (LAUNCH_ENV): its init is PID 1 inside, and /proc/1/environ would
otherwise hand the orchestrator's environment (tokens, keys) to the agent. `--die-with-parent` kills
the namespace when the orchestrator dies; the cgroup (and the reaper at start-up) catches anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import shlex
import shutil
import signal
import time
from collections.abc import Mapping, Sequence

from harness_env.sandbox import disk, reaper
from harness_env.sandbox import limits as limits_mod
from harness_env.sandbox.base import (
    APP_SOCKET_IN,
    FORWARDER_HOST,
    FORWARDER_IN,
    HOME,
    LAUNCH_ENV,
    SHIM_SOCKET_IN,
    Backend,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxSpec,
    SandboxStartError,
    TailBuffer,
    decode,
    register_backend,
)

ETC_PASSTHROUGH = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl", "ca-certificates",
                   "localtime", "nsswitch.conf", "mime.types", "gitconfig", "fonts")  # fonts: headless chromium
UID = 1000
ROOT_LINKS = {"/bin": "usr/bin", "/lib": "usr/lib", "/lib64": "usr/lib64", "/sbin": "usr/sbin"}


def _write_etc(etc: pathlib.Path) -> None:
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "passwd").write_text(f"root:x:0:0::/root:/bin/sh\nagent:x:{UID}:{UID}::{HOME}:/bin/bash\n")
    (etc / "group").write_text(f"root:x:0:\nagent:x:{UID}:\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
    (etc / "hostname").write_text("sandbox\n")


# `--clearenv`: the command gets only the env it is given, never bwrap's own. Redundant with LAUNCH_ENV (bwrap's
# own env is fixed) on purpose; tests/test_redteam.py switches each off alone to show the other still holds.
CLEAR_ENV = True


class BwrapSandbox(Sandbox):
    def __init__(self, sandbox_id: str, spec: SandboxSpec, backend: BwrapBackend, state: pathlib.Path):
        super().__init__(sandbox_id, spec)
        self.backend, self.state = backend, state
        self.cgroup = limits_mod.Cgroup(backend.mode, sandbox_id)
        self.copied: list[tuple[str, str]] = []  # (host path, target) bound into later execs
        self.deadline = time.monotonic() + spec.limits.wall_s
        self._running: set[asyncio.subprocess.Process] = set()

    def _bwrap_argv(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, status_fd: int) -> list[str]:
        spec = self.spec
        a = ["bwrap", "--json-status-fd", str(status_fd), "--unshare-all", "--unshare-user",
             "--uid", str(UID), "--gid", str(UID), "--die-with-parent", "--new-session", "--hostname", "sandbox",
             "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/run"]
        for link, target in ROOT_LINKS.items():
            a += ["--symlink", target, link]
        for name in ETC_PASSTHROUGH:
            a += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        for name in ("passwd", "group", "hosts", "hostname"):
            a += ["--ro-bind", str(self.state / "etc" / name), f"/etc/{name}"]
        a += ["--bind", str(spec.workspace), spec.workspace_dir]
        if spec.home is not None:
            a += ["--bind", str(spec.home), HOME]
        else:  # a fresh HOME per exec (the verifier's), capped like a rollout's HOME
            home_mb = spec.limits.home_mb or 512
            a += ["--size", str(home_mb << 20), "--perms", "0700", "--tmpfs", HOME]
        for m in spec.mounts:
            a += ["--ro-bind" if m.read_only else "--bind", m.host, m.target]
        for host, target in self.copied:
            a += ["--bind", host, target]
        if spec.shim_socket is not None:
            a += ["--bind", str(spec.shim_socket), SHIM_SOCKET_IN]
        for port, sock in sorted(spec.app_ports.items()):
            a += ["--bind", str(sock), APP_SOCKET_IN.format(port=port)]
        if spec.forwarder_needed:
            a += ["--ro-bind", str(FORWARDER_HOST), FORWARDER_IN]
        a += ["--chdir", cwd, *(["--clearenv"] if CLEAR_ENV else [])]
        for k, v in env.items():
            a += ["--setenv", k, v]
        a.append("--")
        if spec.forwarder_needed:
            a += ["/usr/bin/python3", "-I", "-S", FORWARDER_IN, *spec.forwarder_args(), "--"]
        return a + list(argv)

    def _launcher(self, bwrap_argv: list[str]) -> list[str]:
        """Joins the cgroup before exec'ing bwrap (so every descendant is counted and killable)."""
        if self.backend.mode == "rlimit":
            return limits_mod.rlimit_prefix(self.spec.limits) + bwrap_argv
        join = " && ".join(f"echo $$ > {shlex.quote(f)}" for f in self.cgroup.procs_files)
        return ["/bin/sh", "-c", join + ' && exec "$@"', "sh", *bwrap_argv]

    async def exec(self, argv, *, env=None, cwd=None, timeout=None, stdin=None) -> ExecResult:
        if self.closed:
            raise SandboxStartError(f"sandbox {self.id} is closed")
        remaining = self.deadline - time.monotonic()
        timeout = remaining if timeout is None else min(timeout, remaining)
        full_env = {**self.spec.base_env(), **(env or {})}
        # bwrap reports {"exit-code": N} on this fd once the command itself ran: only without it is a
        # "bwrap: ..." exit 1 a start failure (a command printing that must not pass for infrastructure).
        status_r, status_w = os.pipe()
        os.set_blocking(status_r, False)
        cmd = self._launcher(self._bwrap_argv(argv, full_env, cwd or self.spec.workspace_dir, status_w))
        t0 = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
                env=LAUNCH_ENV, pass_fds=(status_w,))
        except OSError as e:
            os.close(status_r)
            raise SandboxStartError(f"sandbox {self.id}: cannot start bwrap: {e}") from e
        finally:
            os.close(status_w)
        self._running.add(proc)
        reaper.record_pid(self.state, proc.pid)
        comm = asyncio.ensure_future(_collect(proc, stdin))
        timed_out = False
        try:
            out, err = await asyncio.wait_for(asyncio.shield(comm), max(timeout, 0.0))
        except TimeoutError:
            timed_out = True
            self._kill_tree(proc)
            out, err = await _drain(comm)
        except BaseException:  # cancelled (or worse): kill the tree and reap it before letting go
            self._kill_tree(proc)
            await _drain(comm)
            raise
        finally:
            self._running.discard(proc)
            status = _read_all(status_r)
        rc = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        res = ExecResult(rc, decode(out), decode(err), timed_out, time.monotonic() - t0, self.cgroup.oom_killed())
        if rc == 1 and res.stderr.startswith("bwrap:") and b'"exit-code"' not in status:
            raise SandboxStartError(f"sandbox {self.id}: {res.stderr.strip()}")
        return res

    def _kill_tree(self, proc: asyncio.subprocess.Process) -> None:
        for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
            try:
                kill()
            except ProcessLookupError:
                pass
        self.cgroup.kill_all()

    async def copy_in(self, src, dest: str) -> None:
        src = pathlib.Path(src)
        found = self._host_path(dest)
        if found is None:  # outside the writable binds: stage it and bind it into later execs
            root = self.state / "files"
            host = root / f"{len(self.copied)}"
            self.copied.append((str(host), dest))
        else:
            root, host = found
        await asyncio.to_thread(_copy, src, host, root)

    def _host_path(self, dest: str) -> tuple[pathlib.Path, pathlib.Path] | None:
        """(host root of the bind, host path) of an in-sandbox path inside the workspace or HOME."""
        p = pathlib.PurePosixPath(dest)
        roots = [(self.spec.workspace_dir, self.spec.workspace)] + ([(HOME, self.spec.home)] if self.spec.home else [])
        for inside, host in roots:
            if p == pathlib.PurePosixPath(inside) or pathlib.PurePosixPath(inside) in p.parents:
                return pathlib.Path(host), pathlib.Path(host) / p.relative_to(inside)
        return None

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for proc in list(self._running):
            self._kill_tree(proc)
        await asyncio.to_thread(reaper.destroy, self.state, self.id, self.backend.mode)


def _read_all(fd: int) -> bytes:
    """Whatever a (non-blocking) pipe holds, then closes it."""
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    return b"".join(chunks)


async def _collect(proc: asyncio.subprocess.Process, stdin: bytes | None) -> tuple[bytes, bytes]:
    """`proc.communicate(stdin)` that keeps only the tail of each stream (TailBuffer): the output is read as it
    comes, so the process never blocks on a full pipe, and the host holds at most ~2 x OUTPUT_CAP per stream."""

    async def feed() -> None:
        if stdin is None or proc.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin)
            await proc.stdin.drain()
        proc.stdin.close()

    async def read(stream: asyncio.StreamReader | None) -> bytes:
        tail = TailBuffer()
        while stream is not None and (chunk := await stream.read(1 << 16)):
            tail.add(chunk)
        return tail.value()

    _, out, err = await asyncio.gather(feed(), read(proc.stdout), read(proc.stderr))
    await proc.wait()
    return out, err


async def _drain(comm: asyncio.Future, timeout_s: float = 10.0) -> tuple[bytes, bytes]:
    """The output of a killed process; gives up (cancelling the reader) if a pipe stays open."""
    try:
        return await asyncio.wait_for(asyncio.shield(comm), timeout_s)
    except (TimeoutError, asyncio.CancelledError):
        comm.cancel()
        with contextlib.suppress(BaseException):
            await comm
        return b"", b""


def _copy(src: pathlib.Path, dst: pathlib.Path, root: pathlib.Path) -> None:
    """Host-side copy into a dir the agent may have written: never through a link it made (a `reward ->
    /etc` link would otherwise have the orchestrator write host files)."""
    for p in [dst, *dst.parents]:
        if p == root or root not in p.parents:
            break
        if p.is_symlink():
            raise SandboxError(f"copy_in: {p} is a symlink; refusing to write through it")
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst, follow_symlinks=False)


@register_backend("bwrap")
class BwrapBackend(Backend):
    def __init__(self, mode: str | None = None, state_dir: str | os.PathLike | None = None, reap: bool = True):
        self.mode = mode or limits_mod.detect_mode()
        self.state_dir = pathlib.Path(state_dir) if state_dir else reaper.STATE_DIR
        self._reaped = not reap

    def available(self) -> tuple[bool, str]:
        if shutil.which("bwrap") is None:
            return False, "bwrap not installed (apt-get install bubblewrap)"
        return True, ""

    async def create(self, spec: SandboxSpec) -> BwrapSandbox:
        if not self._reaped:  # first use in this process: clean up after dead orchestrators
            self._reaped = True
            await self.reap()
        sid = spec.sandbox_id()
        state = self.state_dir / sid
        try:
            reaper.write_owner(state, {"backend": "bwrap", "mode": self.mode})
            _write_etc(state / "etc")
            spec.workspace.mkdir(parents=True, exist_ok=True)
            if spec.home is not None:
                spec.home.mkdir(parents=True, exist_ok=True)
            sbx = BwrapSandbox(sid, spec, self, state)
            sbx.cgroup.create(spec.limits)
        except OSError as e:
            raise SandboxStartError(f"sandbox {sid}: {e}") from e
        return sbx

    async def reap(self) -> int:
        n = await asyncio.to_thread(reaper.reap_process_sandboxes, self.mode, self.state_dir)
        return n + await asyncio.to_thread(disk.reap_orphans)
