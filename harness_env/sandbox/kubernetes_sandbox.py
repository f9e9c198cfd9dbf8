"""kubernetes backend: one Pod per rollout (kubernetes Python client).

NOT run against a real cluster here (none exists on the dev machine): the manifests and the lifecycle
(create -> wait Running -> copy workspace/HOME in -> exec -> timeout = delete the pod -> close; reap
by label) are tested against a fake CoreV1Api in tests/test_sandbox_kubernetes.py. What differs from
bwrap/docker, by necessity:
  - the shim is reached over TCP (`shim_address` host:port, e.g. a Service); the forwarder in the pod
    still exposes it as 127.0.0.1:PORT, and `network_policy()` gives the NetworkPolicy that allows
    egress to that address only (a CNI that enforces NetworkPolicy is required);
  - the workspace and HOME are emptyDir volumes filled by `copy_in` (tar over exec), not host binds,
    with `sizeLimit` = the disk caps (the kubelet evicts a pod over them: `ExecResult.disk_exceeded`);
    `export_workspace` kills every process in the pod and copies the workspace back to the host dir
    (tarfile's `tar` filter, regular files / dirs / links only: nothing lands outside it, no device
    node, no setuid bit), from where the verifier's fresh pod gets it;
  - the workspace's path is the task's (`spec.workspace_dir`): an image must leave its parents
    traversable by uid 1000 (Dockerfile.k8s opens /root for ClawGym's /root/.openclaw/workspace);
  - the image must contain python3, tar and coreutils (harness_env/images/Dockerfile.k8s): host /usr
    cannot be mounted;
  - a pids limit is a kubelet setting (podPidsLimit), not part of the Pod spec.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import io
import json
import os
import pathlib
import shutil
import socket
import tarfile
import time

from harness_env.sandbox import disk, reaper
from harness_env.sandbox.base import (
    FORWARDER_IN,
    HOME,
    LABEL,
    Backend,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxSpec,
    SandboxStartError,
    decode,
    register_backend,
)

K8S_IMAGE = "harness-rl/sandbox-k8s:latest"
OWNER = "harness-rl.sandbox/owner"  # annotation: {"owner": {pid, start}, "host": ...}


def extract_into(data: bytes, dest: pathlib.Path) -> int:
    """Replaces dest's contents by the tar `data` from a pod, through tarfile's `tar` filter (no member
    written outside dest or through a link, no setuid bits) and regular files, dirs and links only (no
    device node or FIFO); refused members are skipped.
    Returns how many were skipped."""
    dest.mkdir(parents=True, exist_ok=True)
    for child in dest.iterdir():  # dest itself may be a capped mount: empty it, keep it
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    skipped = 0

    def keep(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        nonlocal skipped
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            skipped += 1  # device nodes and FIFOs: never created on the host (we extract as root)
            return None
        try:
            return tarfile.tar_filter(member, path)
        except tarfile.FilterError:
            skipped += 1
            return None

    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        tar.extractall(dest, filter=keep)
    os.chmod(dest, 0o755)
    return skipped


def _tar(src: pathlib.Path, arcname: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(src), arcname=arcname)
    return buf.getvalue()


def pod_manifest(name: str, namespace: str, spec: SandboxSpec, image: str, shim_address: str | None) -> dict:
    lim = spec.limits
    command = ["/bin/sleep", "infinity"]
    if shim_address:
        command = ["python3", "-I", "-S", FORWARDER_IN, "--port", str(spec.shim_port), "--socket", shim_address]
    resources = {"cpu": str(lim.cpus), "memory": f"{lim.memory_mb}Mi", "ephemeral-storage": "4Gi"}
    env = [{"name": k, "value": v} for k, v in sorted(spec.base_env().items())]
    owner = {"owner": reaper.owner_record(), "host": socket.gethostname()}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {LABEL: "1", "app.kubernetes.io/managed-by": "harness-rl",
                                **{k.replace("/", "-"): v[:63] for k, v in spec.labels.items()}},
                     "annotations": {OWNER: json.dumps(owner)}},
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": int(lim.wall_s),  # the cluster kills the pod even if we are gone
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "hostname": "sandbox",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000, "runAsNonRoot": True},
            "containers": [{
                "name": "sandbox", "image": image, "imagePullPolicy": "IfNotPresent", "command": command,
                "workingDir": spec.workspace_dir, "env": env,
                **({"readinessProbe": {"exec": {"command": [  # Running is not enough: the port must listen
                    "python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {spec.shim_port}))"]},
                    "periodSeconds": 1}} if shim_address else {}),
                "resources": {"limits": resources, "requests": resources},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                    "privileged": False},
                "volumeMounts": [{"name": "workspace", "mountPath": spec.workspace_dir},
                                 {"name": "home", "mountPath": HOME}, {"name": "tmp", "mountPath": "/tmp"}],
            }],
            "volumes": [{"name": "workspace", "emptyDir": _size(lim.workspace_mb)},
                        {"name": "home", "emptyDir": _size(lim.home_mb)},
                        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "512Mi"}}],
        },
    }


def _size(mb: int | None) -> dict:
    return {} if mb is None else {"sizeLimit": f"{mb}Mi"}


def network_policy(namespace: str, shim_ip: str, shim_port: int) -> dict:
    """Sandbox pods may talk to the shim's address and nothing else (no DNS, no ingress)."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "harness-rl-sandbox-egress", "namespace": namespace},
        "spec": {"podSelector": {"matchLabels": {LABEL: "1"}}, "policyTypes": ["Ingress", "Egress"],
                 "ingress": [],
                 "egress": [{"to": [{"ipBlock": {"cidr": f"{shim_ip}/32"}}],
                             "ports": [{"protocol": "TCP", "port": shim_port}]}]},
    }



# Blocking SDK calls (an exec_start lasts as long as the harness runs) get their own threads: on the
# default executor they would starve everything else that uses it - e.g. the shim's capture appends,
# which those very harnesses wait on (a deadlock at ~6 concurrent docker rollouts on 2 cores).
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=512, thread_name_prefix="hrl-k8s")


def _blocking(fn, /, *args, **kwargs):
    return asyncio.get_running_loop().run_in_executor(_POOL, functools.partial(fn, *args, **kwargs))


class KubernetesSandbox(Sandbox):
    def __init__(self, sandbox_id: str, spec: SandboxSpec, backend: KubernetesBackend, pod: str):
        super().__init__(sandbox_id, spec)
        self.backend, self.pod = backend, pod
        self.deadline = time.monotonic() + spec.limits.wall_s

    async def exec(self, argv, *, env=None, cwd=None, timeout=None, stdin=None) -> ExecResult:
        rc, out, err, timed_out, dt = await self._exec_raw(argv, env=env, cwd=cwd, timeout=timeout, stdin=stdin)
        if rc is None:  # the pod is gone: evicted for its disk caps is the agent's doing, anything else infra
            why = await _blocking(self.backend.eviction, self.pod)
            if why is None:
                raise SandboxError(f"sandbox {self.id}: exec in pod {self.pod}: {err!r}")
            return ExecResult(-9, "", why, False, dt, disk_exceeded=True)
        return ExecResult(rc, decode(out), decode(err), timed_out, dt, oom_killed=rc == 137)

    async def _exec_raw(self, argv, *, env=None, cwd=None, timeout=None, stdin=None):
        """(rc | None when the exec itself failed, stdout bytes, stderr bytes | error, timed_out, seconds)."""
        if self.closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        remaining = self.deadline - time.monotonic()
        timeout = remaining if timeout is None else min(timeout, remaining)
        full_env = {**self.spec.base_env(), **(env or {})}
        # Pod exec takes neither env nor cwd: coreutils env sets both (-i: exactly this environment).
        cmd = ["env", "-i", "-C", cwd or self.spec.workspace_dir, *(f"{k}={v}" for k, v in full_env.items()), *argv]
        t0 = time.monotonic()
        try:
            rc, out, err = await asyncio.wait_for(
                _blocking(self.backend.exec_fn, self.pod, self.backend.namespace, cmd, stdin), max(timeout, 0))
        except TimeoutError:
            await self.close()  # deleting the pod is what kills every process of the tree
            return -9, b"", b"", True, time.monotonic() - t0
        except Exception as e:
            return None, b"", f"{type(e).__name__}: {e}", False, time.monotonic() - t0
        except BaseException:  # cancelled: deleting the pod ends the blocked exec thread too
            await asyncio.shield(self.close())
            raise
        return rc, out, err, False, time.monotonic() - t0

    async def export_workspace(self) -> None:
        """Stops every process in the pod (kill -1 as its one user: nothing can change the workspace after),
        then copies the workspace to the host dir through a filtered tar extraction."""
        if self.closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        # The agent may have made files unreadable (chmod 000): a failing export would be an infra error it
        # could provoke at will, so its own uid restores read access first.
        await self._exec_raw(["/bin/sh", "-c", 'kill -9 -1 2>/dev/null; chmod -R u+rwX -- "$1" 2>/dev/null; true', "sh",
                              self.spec.workspace_dir], cwd="/", timeout=60)
        rc, out, err, _, _ = await self._exec_raw(["tar", "-c", "-f", "-", "-C", self.spec.workspace_dir, "."],
                                                  cwd="/", timeout=300)
        if rc not in (0, 1):  # GNU tar: 1 = "some files changed while being read"
            raise SandboxError(f"sandbox {self.id}: exporting the workspace: tar exited {rc}: {err!r}")
        await asyncio.to_thread(extract_into, out, pathlib.Path(self.spec.workspace))

    async def copy_in(self, src, dest: str) -> None:
        src = pathlib.Path(src)
        dest = dest.rstrip("/")
        parent, name = dest.rsplit("/", 1)
        data = await _blocking(_tar, src, name)
        res = await self.exec(["tar", "-x", "-f", "-", "-C", parent or "/"], stdin=data, timeout=120)
        if not res.ok:
            raise SandboxError(f"sandbox {self.id}: copy_in {src} -> {dest}: tar exited {res.exit_code}: {res.stderr}")

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await _blocking(self.backend.delete_pod, self.pod)


@register_backend("kubernetes")
class KubernetesBackend(Backend):
    supports_web = False  # a task's web app would need a second pod and a socket route: not built

    def __init__(self, api=None, namespace: str = "harness-rl", image: str = K8S_IMAGE, shim_address: str | None = None,
                 exec_fn=None, start_timeout_s: float = 120.0, poll_s: float = 0.5, reap: bool = True):
        self._api = api
        self.namespace, self.image, self.shim_address = namespace, image, shim_address
        self._exec_fn = exec_fn
        self.start_timeout_s, self.poll_s = start_timeout_s, poll_s
        self._reaped = not reap

    @property
    def api(self):
        if self._api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self._api = client.CoreV1Api()
        return self._api

    def available(self) -> tuple[bool, str]:
        try:
            self.api.list_namespaced_pod(self.namespace, limit=1)
        except Exception as e:
            return False, f"no kubernetes cluster reachable ({e.__class__.__name__})"
        return True, ""

    def exec_fn(self, pod: str, namespace: str, cmd: list[str], stdin: bytes | None) -> tuple[int, bytes, bytes]:
        if self._exec_fn is not None:
            return self._exec_fn(pod, namespace, cmd, stdin)
        from kubernetes.stream import stream

        ws = stream(self.api.connect_get_namespaced_pod_exec, pod, namespace, command=cmd, stdin=stdin is not None,
                    stdout=True, stderr=True, tty=False, _preload_content=False, binary=True)
        out, err = bytearray(), bytearray()
        if stdin is not None:
            ws.write_stdin(stdin)
            ws.write_channel(3, b"")  # not all servers honour close-stdin; tar stops at the archive end anyway
        while ws.is_open():
            ws.update(timeout=1)
            out += ws.read_stdout() or b""
            err += ws.read_stderr() or b""
        ws.close()
        return (ws.returncode if ws.returncode is not None else -1), bytes(out), bytes(err)

    def eviction(self, pod: str) -> str | None:
        """Why the kubelet evicted the pod for exceeding its storage, or None (not evicted, or for another reason)."""
        try:
            status = self.api.read_namespaced_pod(pod, self.namespace).status
        except Exception:
            return None
        msg = str(getattr(status, "message", "") or "")
        if getattr(status, "reason", None) == "Evicted" and ("storage" in msg or "emptyDir" in msg):
            return f"evicted: {msg}"
        return None

    def delete_pod(self, pod: str) -> None:
        try:
            self.api.delete_namespaced_pod(pod, self.namespace, grace_period_seconds=0)
        except Exception as e:  # 404: already gone
            if getattr(e, "status", None) != 404:
                raise

    async def create(self, spec: SandboxSpec) -> KubernetesSandbox:
        if not self._reaped:
            self._reaped = True
            await self.reap()
        if spec.app_ports:
            raise SandboxStartError("web apps (SandboxSpec.app_ports) run on the bwrap and docker backends only")
        sid = spec.sandbox_id()
        pod = f"hrl-{sid}"[:63]
        manifest = pod_manifest(pod, self.namespace, spec, spec.image if spec.image != "harness-rl/sandbox:latest"
                                else self.image, self.shim_address if spec.shim else None)
        try:
            await _blocking(self.api.create_namespaced_pod, self.namespace, manifest)
            await self._wait_running(pod)
            sbx = KubernetesSandbox(sid, spec, self, pod)
            if spec.workspace.exists():
                await sbx.copy_in(spec.workspace, spec.workspace_dir)
            if spec.home is not None and spec.home.exists():
                await sbx.copy_in(spec.home, HOME)
        except Exception as e:
            await _blocking(self.delete_pod, pod)
            raise SandboxStartError(f"sandbox {sid}: pod {pod}: {e}") from e
        return sbx

    async def _wait_running(self, pod: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            status = (await _blocking(self.api.read_namespaced_pod, pod, self.namespace)).status
            if status.phase == "Running" and all(getattr(c, "ready", True) for c in status.container_statuses or []):
                return
            if status.phase in ("Failed", "Succeeded"):
                raise SandboxStartError(f"pod ended in phase {status.phase}: {getattr(status, 'reason', '')}")
            waiting = [c.state.waiting for c in (status.container_statuses or []) if c.state and c.state.waiting]
            bad = [w for w in waiting if w.reason in ("ErrImagePull", "ImagePullBackOff", "CreateContainerError",
                                                      "InvalidImageName", "CreateContainerConfigError")]
            if bad:
                raise SandboxStartError(f"{bad[0].reason}: {bad[0].message}")
            if time.monotonic() > deadline:
                raise SandboxStartError(f"not Running after {self.start_timeout_s:.0f}s (phase {status.phase})")
            await asyncio.sleep(self.poll_s)

    async def reap(self) -> int:
        return await _blocking(self._reap_sync)

    def _reap_sync(self) -> int:
        host = socket.gethostname()
        n = disk.reap_orphans()  # the host-side capped workspace/HOME mounts of dead orchestrators
        pods = self.api.list_namespaced_pod(self.namespace, label_selector=f"{LABEL}=1").items
        for p in pods:
            try:
                ann = json.loads((p.metadata.annotations or {}).get(OWNER, "{}"))
            except ValueError:
                ann = {}
            if ann.get("host") != host or reaper.alive(ann.get("owner", {})):
                continue  # another machine's orchestrator, or ours and alive
            self.delete_pod(p.metadata.name)
            n += 1
        return n
