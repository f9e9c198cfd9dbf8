"""docker backend: one container per rollout from the local image (harness_env/images/build.py).

The container has `network_mode=none` (loopback only); its main process is the forwarder, which
exposes the shim's Unix socket (bind-mounted) as 127.0.0.1:PORT. Host /usr and a few /etc files are
bind-mounted read-only; the workspace (at `spec.workspace_dir`) and HOME are bind mounts owned by the
in-container user (uid 1000); without a HOME dir (the verifier's sandbox) HOME is a fresh capped tmpfs.
Limits are docker's cgroup limits (memory without swap, pids, CPU quota). A timed-out exec
kills the whole container: the one way to be sure no process of the harness is left. Containers carry
labels (owner pid + start time + host) so `reap()` removes those of dead orchestrators.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import io
import json
import os
import pathlib
import shlex
import socket
import tarfile
import time

from harness_env.images.build import IMAGE, docker_client
from harness_env.images.build import build as build_image
from harness_env.sandbox import disk, reaper
from harness_env.sandbox import limits as limits_mod
from harness_env.sandbox.base import (
    APP_SOCKET_IN,
    FORWARDER_HOST,
    FORWARDER_IN,
    HOME,
    LABEL,
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
from harness_env.sandbox.bwrap import ETC_PASSTHROUGH
from harness_env.sandbox.forwarder import READY

UID = 1000


def _chown_tree(root: pathlib.Path, uid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, uid, uid)


def _tar_of(src: pathlib.Path, arcname: str) -> bytes:
    buf = io.BytesIO()

    def owned(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.uid = ti.gid = UID
        return ti

    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(src), arcname=arcname, filter=owned)
    return buf.getvalue()



# Blocking SDK calls (an exec_start lasts as long as the harness runs) get their own threads: on the
# default executor they would starve everything else that uses it - e.g. the shim's capture appends,
# which those very harnesses wait on (a deadlock at ~6 concurrent docker rollouts on 2 cores).
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=512, thread_name_prefix="hrl-docker")


def _exec_tails(api, exec_id: str) -> tuple[bytes, bytes]:  # noqa: ANN001 - docker's APIClient
    """Runs the exec, streaming its output and keeping only each stream's tail (TailBuffer): docker-py's
    `exec_start(demux=True)` without `stream` would hold all of it (a 1 GB flood) in this process."""
    out, err = TailBuffer(), TailBuffer()
    for o, e in api.exec_start(exec_id, stream=True, demux=True):
        out.add(o)
        err.add(e)
    return out.value(), err.value()


def _blocking(fn, /, *args, **kwargs):
    return asyncio.get_running_loop().run_in_executor(_POOL, functools.partial(fn, *args, **kwargs))


class DockerSandbox(Sandbox):
    def __init__(self, sandbox_id: str, spec: SandboxSpec, backend: DockerBackend, container):
        super().__init__(sandbox_id, spec)
        self.backend, self.container = backend, container
        self.deadline = time.monotonic() + spec.limits.wall_s

    async def exec(self, argv, *, env=None, cwd=None, timeout=None, stdin=None) -> ExecResult:
        if self.closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        remaining = self.deadline - time.monotonic()
        timeout = remaining if timeout is None else min(timeout, remaining)
        argv = list(argv)
        if stdin is not None:  # docker exec stdin needs a hijacked socket; a staged file is simpler
            path = f"/tmp/.stdin-{time.monotonic_ns()}"
            await self._put(path, stdin)
            argv = ["/bin/sh", "-c", f'exec "$@" < {shlex.quote(path)}', "sh", *argv]
        api = self.backend.client.api
        t0 = time.monotonic()
        try:
            ex = await _blocking(api.exec_create, self.container.id, argv, stdout=True, stderr=True,
                                 environment={**self.spec.base_env(), **(env or {})},
                                 workdir=cwd or self.spec.workspace_dir, user=f"{UID}:{UID}")
        except Exception as e:  # docker.errors.APIError and friends: infrastructure
            raise SandboxError(f"sandbox {self.id}: exec_create failed: {e}") from e
        run = asyncio.ensure_future(_blocking(_exec_tails, api, ex["Id"]))
        try:
            out, err = await asyncio.wait_for(asyncio.shield(run), max(timeout, 0.0))
        except TimeoutError:
            await _blocking(self._kill)  # the whole tree: the container
            try:
                out, err = await asyncio.wait_for(run, 10)
            except Exception:
                out, err = b"", b""
            return ExecResult(-9, decode(out), decode(err), True, time.monotonic() - t0)
        except BaseException:  # cancelled: the blocked exec_start thread returns once the container is dead
            await asyncio.shield(_blocking(self._kill))
            raise
        try:
            info = await _blocking(api.exec_inspect, ex["Id"])
            rc = info.get("ExitCode")
            oom = False
            if rc == 137:  # SIGKILL: the kernel OOM killer, if the container's memory cgroup counted a kill
                oom = await _blocking(self._oom_killed)
        except Exception as e:  # docker.errors.NotFound and friends
            if self.closed:  # closed under the exec (the owner's teardown): it was killed with the container
                return ExecResult(-9, decode(out), decode(err), False, time.monotonic() - t0)
            raise SandboxError(f"sandbox {self.id}: reading the exec's exit status failed: {e}") from e
        return ExecResult(-1 if rc is None else rc, decode(out), decode(err), False, time.monotonic() - t0, oom)

    def _oom_killed(self) -> bool:
        """Docker's State.OOMKilled covers only the main process; exec'd processes show in the cgroup."""
        for mode, name in (("cgroup_v1", "docker"), ("cgroup_v2", "system.slice")):
            leaf = f"docker-{self.container.id}.scope" if mode == "cgroup_v2" else self.container.id
            cg = limits_mod.Cgroup(mode, leaf)
            cg.dirs = [limits_mod.CG_ROOT / ("memory" if mode == "cgroup_v1" else "") / name / leaf]
            if cg.dirs[0].is_dir():
                return cg.oom_killed()
        state = self.backend.client.api.inspect_container(self.container.id)["State"]
        return bool(state.get("OOMKilled"))

    def _kill(self) -> None:
        try:
            self.container.kill()
        except Exception:
            pass

    async def _put(self, path: str, data: bytes) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            ti = tarfile.TarInfo(os.path.basename(path))
            ti.size, ti.uid, ti.gid = len(data), UID, UID
            tar.addfile(ti, io.BytesIO(data))
        await _blocking(self.container.put_archive, os.path.dirname(path), buf.getvalue())

    async def copy_in(self, src, dest: str) -> None:
        """A tar of `src` whose member path is the whole destination, extracted at "/": docker creates
        missing parent directories, which extracting next to the destination would not."""
        src = pathlib.Path(src)
        data = await _blocking(_tar_of, src, dest.strip("/"))
        try:
            ok = await _blocking(self.container.put_archive, "/", data)
        except Exception as e:
            raise SandboxError(f"sandbox {self.id}: copy_in {src} -> {dest}: {e}") from e
        if not ok:
            raise SandboxError(f"sandbox {self.id}: copy_in {src} -> {dest} refused")

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await _blocking(self.container.remove, force=True)
        except Exception:  # already gone: the reaper or a kill got there first
            pass


@register_backend("docker")
class DockerBackend(Backend):
    def __init__(self, client=None, image: str = IMAGE, reap: bool = True, build_if_missing: bool = True):
        self._client = client
        self.image = image
        self._reaped = not reap
        self._built = not build_if_missing

    @property
    def client(self):
        if self._client is None:
            self._client = docker_client()
        return self._client

    def available(self) -> tuple[bool, str]:
        try:
            self.client.ping()
        except Exception as e:
            return False, f"no docker daemon reachable ({e.__class__.__name__}); .ci/setup.d/30-docker.sh starts one"
        return True, ""

    def run_kwargs(self, sid: str, spec: SandboxSpec) -> dict:
        """The container's configuration (pure: unit-tested without a daemon)."""
        from docker.types import Mount as DMount

        mounts = [DMount("/usr", "/usr", type="bind", read_only=True),
                  DMount(spec.workspace_dir, str(spec.workspace), type="bind")]
        mounts += [DMount(f"/etc/{n}", f"/etc/{n}", type="bind", read_only=True)
                   for n in ETC_PASSTHROUGH if os.path.exists(f"/etc/{n}")]
        tmpfs = {}
        if spec.home is not None:
            mounts.append(DMount(HOME, str(spec.home), type="bind"))
        else:
            tmpfs[HOME] = f"size={spec.limits.home_mb or 512}m,mode=1777"
        mounts += [DMount(m.target, m.host, type="bind", read_only=m.read_only) for m in spec.mounts]
        command = ["/usr/bin/sleep", "infinity"]
        if spec.shim_socket is not None:
            mounts.append(DMount(SHIM_SOCKET_IN, str(spec.shim_socket), type="bind"))
        mounts += [DMount(APP_SOCKET_IN.format(port=port), str(sock), type="bind")
                   for port, sock in sorted(spec.app_ports.items())]
        if spec.forwarder_needed:
            mounts.append(DMount(FORWARDER_IN, str(FORWARDER_HOST), type="bind", read_only=True))
            command = ["/usr/bin/python3", "-I", "-S", FORWARDER_IN, *spec.forwarder_args()]
        labels = {LABEL: "1", f"{LABEL}.owner": json.dumps(reaper.owner_record()),
                  f"{LABEL}.host": socket.gethostname(), **spec.labels}
        lim = spec.limits
        return dict(image=spec.image or self.image, command=command, name=f"hrl-{sid}", detach=True,
                    network_mode="none", mounts=mounts, labels=labels, user=f"{UID}:{UID}",
                    environment=spec.base_env(), working_dir=spec.workspace_dir, hostname="sandbox", tmpfs=tmpfs,
                    mem_limit=f"{lim.memory_mb}m", memswap_limit=f"{lim.memory_mb}m", pids_limit=lim.pids,
                    nano_cpus=int(lim.cpus * 1e9), cap_drop=["ALL"], security_opt=["no-new-privileges"],
                    init=False, auto_remove=False)

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        if not self._reaped:
            self._reaped = True
            await self.reap()
        if not self._built:
            self._built = True
            await _blocking(build_image, self.client, self.image, True)
        sid = spec.sandbox_id()
        try:
            spec.workspace.mkdir(parents=True, exist_ok=True)
            await _blocking(_chown_tree, spec.workspace, UID)
            if spec.home is not None:
                spec.home.mkdir(parents=True, exist_ok=True)
                await _blocking(_chown_tree, spec.home, UID)
            if spec.shim_socket is not None:  # uid 1000 inside must be allowed to connect
                os.chmod(spec.shim_socket, 0o666)
            container = await _blocking(self.client.containers.run, **self.run_kwargs(sid, spec))
        except Exception as e:
            raise SandboxStartError(f"sandbox {sid}: docker run failed: {e}") from e
        sbx = DockerSandbox(sid, spec, self, container)
        if spec.forwarder_needed:
            await self._wait_forwarder(sbx)
        return sbx

    async def _wait_forwarder(self, sbx: DockerSandbox, timeout_s: float = 10.0) -> None:
        """The harness must not start before 127.0.0.1:PORT listens: wait for the forwarder's ready line."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                logs = await _blocking(sbx.container.logs, stdout=True, stderr=True)
            except Exception as e:
                await sbx.close()
                raise SandboxStartError(f"sandbox {sbx.id}: reading forwarder logs: {e}") from e
            if READY.encode() in logs:
                return
            if time.monotonic() > deadline:
                await sbx.close()
                raise SandboxStartError(f"sandbox {sbx.id}: shim forwarder not ready: {logs[-300:]!r}")
            await asyncio.sleep(0.01)

    async def reap(self) -> int:
        return await _blocking(self._reap_sync)

    def _reap_sync(self) -> int:
        n = disk.reap_orphans()  # the capped workspace/HOME mounts of dead orchestrators
        host = socket.gethostname()
        # ignore_removed: a container another process removes between the listing and its inspection (parallel
        # runners, the verifier of a finished rollout) is simply gone, not an error
        for c in self.client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True):
            labels = c.labels or {}
            try:
                owner = json.loads(labels.get(f"{LABEL}.owner", "{}"))
            except ValueError:
                owner = {}
            if labels.get(f"{LABEL}.host") != host:
                continue  # another machine's orchestrator on a shared daemon: not ours to judge
            if owner and reaper.alive(owner):
                continue
            try:
                c.remove(force=True)
                n += 1
            except Exception:
                pass
        return n
