"""kubernetes backend against a fake CoreV1Api (no cluster here): manifests and lifecycle logic."""
import asyncio
import io
import json
import os
import pathlib
import tarfile
import types

import pytest

from harness_env.sandbox import LABEL, Limits, SandboxSpec, SandboxStartError
from harness_env.sandbox.kubernetes_sandbox import OWNER, KubernetesBackend, network_policy, pod_manifest
from harness_env.sandbox.reaper import owner_record


class FakeApi:
    """Pods go Pending -> Running after `pending_polls` reads; `fail` makes them end Failed instead."""

    def __init__(self, pending_polls=2, fail=None, waiting=None):
        self.pods, self.deleted, self.reads = {}, [], 0
        self.pending_polls, self.fail, self.waiting = pending_polls, fail, waiting

    def create_namespaced_pod(self, namespace, body):
        assert body["metadata"]["namespace"] == namespace
        self.pods[body["metadata"]["name"]] = body

    def read_namespaced_pod(self, name, namespace):
        self.reads += 1
        phase = "Pending" if self.reads <= self.pending_polls else (self.fail or "Running")
        waiting = [types.SimpleNamespace(state=types.SimpleNamespace(waiting=self.waiting))] if self.waiting else []
        return types.SimpleNamespace(status=types.SimpleNamespace(phase=phase, reason="Evicted",
                                                                  container_statuses=waiting))

    def delete_namespaced_pod(self, name, namespace, grace_period_seconds=None):
        assert grace_period_seconds == 0
        self.deleted.append(name)
        self.pods.pop(name, None)

    def list_namespaced_pod(self, namespace, label_selector=None, limit=None):
        assert label_selector == f"{LABEL}=1"
        items = [types.SimpleNamespace(metadata=types.SimpleNamespace(name=n, annotations=p["metadata"]["annotations"]))
                 for n, p in self.pods.items()]
        return types.SimpleNamespace(items=items)


class FakeExec:
    def __init__(self, delay=0.0, rc=0):
        self.calls, self.delay, self.rc = [], delay, rc

    def __call__(self, pod, namespace, cmd, stdin):
        import time

        self.calls.append((pod, cmd, stdin))
        time.sleep(self.delay if cmd[-1] != "-" and "tar" not in cmd else 0)
        return self.rc, b"out", b"err"


def _spec(tmp_path, **kw):
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "input.txt").write_text("data")
    return SandboxSpec(workspace=tmp_path / "ws", name="Roll/Out 1", limits=Limits(cpus=0.5, memory_mb=300,
                                                                                    wall_s=600), **kw)


def test_pod_manifest_limits_security_labels(tmp_path):
    spec = _spec(tmp_path, labels={"harness-rl.rollout": "r1"}, shim_port=18080)
    m = pod_manifest("hrl-x", "ns", spec, "img:1", "10.0.0.5:8765")
    s, c = m["spec"], m["spec"]["containers"][0]
    assert m["metadata"]["labels"][LABEL] == "1" and m["metadata"]["labels"]["harness-rl.rollout"] == "r1"
    assert json.loads(m["metadata"]["annotations"][OWNER])["owner"] == owner_record()
    assert s["restartPolicy"] == "Never" and s["activeDeadlineSeconds"] == 600
    assert s["automountServiceAccountToken"] is False and s["securityContext"]["runAsNonRoot"] is True
    assert c["resources"]["limits"] == c["resources"]["requests"]
    assert c["resources"]["limits"]["cpu"] == "0.5" and c["resources"]["limits"]["memory"] == "300Mi"
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                    "privileged": False}
    assert c["command"][-4:] == ["--port", "18080", "--socket", "10.0.0.5:8765"]
    assert "18080" in c["readinessProbe"]["exec"]["command"][-1]
    assert {v["mountPath"] for v in c["volumeMounts"]} == {"/workspace", "/home/agent", "/tmp"}
    assert {"name": "HOME", "value": "/home/agent"} in c["env"]
    np_ = network_policy("ns", "10.0.0.5", 8765)
    assert np_["spec"]["egress"] == [{"to": [{"ipBlock": {"cidr": "10.0.0.5/32"}}],
                                      "ports": [{"protocol": "TCP", "port": 8765}]}]
    assert np_["spec"]["ingress"] == [] and np_["spec"]["podSelector"]["matchLabels"] == {LABEL: "1"}


def test_lifecycle_create_exec_copy_close(tmp_path):
    api, ex = FakeApi(), FakeExec()
    b = KubernetesBackend(api=api, exec_fn=ex, poll_s=0.001, reap=False)

    async def go():
        sbx = await b.create(_spec(tmp_path))
        res = await sbx.exec(["ls", "-la"], env={"X": "1"}, cwd="/workspace/sub")
        await sbx.close()
        await sbx.close()
        return sbx, res

    sbx, res = asyncio.run(go())
    assert api.reads == 3 and res.exit_code == 0 and res.stdout == "out"
    pod, tar_cmd, data = ex.calls[0]  # the workspace was copied in first, as a tar over exec
    assert pod == sbx.pod and pod.startswith("hrl-roll-out-1-") and tar_cmd[-6:] == ["tar", "-x", "-f", "-", "-C", "/"]
    names = tarfile.open(fileobj=io.BytesIO(data)).getnames()
    assert "workspace/input.txt" in names
    cmd = ex.calls[-1][1]
    assert cmd[:4] == ["env", "-i", "-C", "/workspace/sub"] and "X=1" in cmd and cmd[-2:] == ["ls", "-la"]
    assert api.deleted == [sbx.pod]  # closed once


def test_exec_timeout_deletes_the_pod(tmp_path):
    api, ex = FakeApi(pending_polls=0), FakeExec(delay=0.5)
    b = KubernetesBackend(api=api, exec_fn=ex, poll_s=0.001, reap=False)

    async def go():
        sbx = await b.create(_spec(tmp_path))
        return sbx, await sbx.exec(["sleep", "100"], timeout=0.1)

    sbx, res = asyncio.run(go())
    assert res.timed_out and res.exit_code == -9 and sbx.closed and api.deleted == [sbx.pod]


@pytest.mark.parametrize("kw,match", [({"fail": "Failed"}, "phase Failed"),
                                      ({"pending_polls": 10**9}, "not Running"),
                                      ({"pending_polls": 10**9, "waiting": types.SimpleNamespace(
                                          reason="ErrImagePull", message="no registry")}, "ErrImagePull")])
def test_start_failures_raise_and_clean_up(tmp_path, kw, match):
    api = FakeApi(**kw)
    b = KubernetesBackend(api=api, exec_fn=FakeExec(), poll_s=0.001, start_timeout_s=0.05, reap=False)
    with pytest.raises(SandboxStartError, match=match):
        asyncio.run(b.create(_spec(tmp_path)))
    assert len(api.deleted) == 1 and not api.pods


def test_reap_removes_only_pods_of_dead_owners_on_this_host(tmp_path):
    import socket

    api = FakeApi()
    host = socket.gethostname()
    dead = {"pid": 2**22 + 7, "start": 1}
    for name, ann in [("live", {"owner": owner_record(), "host": host}), ("dead", {"owner": dead, "host": host}),
                      ("other-host", {"owner": dead, "host": host + "-x"}), ("garbled", None)]:
        api.pods[name] = {"metadata": {"annotations": {OWNER: json.dumps(ann) if ann else "{"}}}
    n = asyncio.run(KubernetesBackend(api=api, exec_fn=FakeExec()).reap())
    assert n == 1 and api.deleted == ["dead"] and os.getpid() == owner_record()["pid"]


def test_task_workspace_path_and_disk_caps_in_the_pod(tmp_path):
    spec = _spec(tmp_path, workspace_dir="/root/.openclaw/workspace")
    spec.limits = Limits(workspace_mb=300, home_mb=100)
    m = pod_manifest("hrl-x", "ns", spec, "img:1", None)
    c, vols = m["spec"]["containers"][0], {v["name"]: v for v in m["spec"]["volumes"]}
    assert c["workingDir"] == "/root/.openclaw/workspace"
    assert {v["mountPath"] for v in c["volumeMounts"]} == {"/root/.openclaw/workspace", "/home/agent", "/tmp"}
    assert vols["workspace"]["emptyDir"] == {"sizeLimit": "300Mi"}
    assert vols["home"]["emptyDir"] == {"sizeLimit": "100Mi"}
    assert "readinessProbe" not in c and c["command"] == ["/bin/sleep", "infinity"]  # no shim: no forwarder


def _hostile_tar() -> bytes:
    """What a pod's agent can leave: links out, `..` members, absolute names, a device node, a setuid file."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name, data=b"", **kw):
            ti = tarfile.TarInfo(name)
            for k, v in kw.items():
                setattr(ti, k, v)
            ti.size = len(data) if ti.type == tarfile.REGTYPE else 0
            tar.addfile(ti, io.BytesIO(data) if ti.type == tarfile.REGTYPE else None)
        add("./output/answer.txt", b"42\n")
        add("./hostlink", type=tarfile.SYMTYPE, linkname="/etc")
        add("./hostlink/evil.conf", b"pwned")  # would write /etc/evil.conf through the link
        add("../escape.txt", b"pwned")
        add("/abs.txt", b"pwned")
        add("./dev", type=tarfile.CHRTYPE, devmajor=1, devminor=3)
        add("./suid", b"#!/bin/sh\n", mode=0o4755)
        add("./inner", type=tarfile.SYMTYPE, linkname="output/answer.txt")
    return buf.getvalue()


class ExportExec(FakeExec):
    def __call__(self, pod, namespace, cmd, stdin):
        self.calls.append((pod, cmd, stdin))
        if "-c" in cmd and "tar" in cmd:
            return 0, _hostile_tar(), b""
        return 0, b"", b""


def test_export_workspace_kills_everything_and_extracts_only_inside(tmp_path):
    api, ex = FakeApi(pending_polls=0), ExportExec()
    b = KubernetesBackend(api=api, exec_fn=ex, poll_s=0.001, reap=False)
    spec = _spec(tmp_path, workspace_dir="/root/.openclaw/workspace")
    (spec.workspace / "stale.txt").write_text("from before the rollout")

    async def go():
        async with await b.create(spec) as sbx:
            await sbx.export_workspace()

    asyncio.run(go())
    cmds = [c for _, c, _ in ex.calls]
    kill = next(i for i, c in enumerate(cmds) if "kill -9 -1" in " ".join(c))
    tar_c = next(i for i, c in enumerate(cmds) if "-c" in c and "tar" in c)
    assert kill < tar_c and cmds[tar_c][-3:] == ["-C", "/root/.openclaw/workspace", "."]
    ws = spec.workspace
    assert (ws / "output" / "answer.txt").read_text() == "42\n" and os.readlink(ws / "inner") == "output/answer.txt"
    assert not (ws / "stale.txt").exists()  # the workspace IS what the pod had
    assert not (tmp_path / "escape.txt").exists() and not pathlib.Path("/abs.txt").exists()
    assert (ws / "abs.txt").read_text() == "pwned"  # an absolute member name lands inside, stripped of its "/"
    assert not pathlib.Path("/etc/evil.conf").exists() and not (ws / "dev").exists()
    assert not (ws / "suid").exists() or not (ws / "suid").stat().st_mode & 0o4000


def test_pod_evicted_for_storage_is_disk_exceeded_not_infra(tmp_path):
    class Evicting(FakeApi):
        def read_namespaced_pod(self, name, namespace):
            st = super().read_namespaced_pod(name, namespace).status
            st.message = "Pod ephemeral local storage usage exceeds the total limit of containers 300Mi."
            return types.SimpleNamespace(status=st)

    def exec_fn(pod, namespace, cmd, stdin):
        if "tar" in cmd:
            return 0, b"", b""
        raise ConnectionError("pod is gone")

    b = KubernetesBackend(api=Evicting(pending_polls=0), exec_fn=exec_fn, poll_s=0.001, reap=False)

    async def go():
        async with await b.create(_spec(tmp_path)) as sbx:
            return await sbx.exec(["sh", "-c", "yes > big"])

    res = asyncio.run(go())
    assert res.disk_exceeded and "ephemeral local storage" in res.stderr


def test_cancelled_exec_deletes_the_pod(tmp_path):
    api, ex = FakeApi(pending_polls=0), FakeExec(delay=2.0)
    b = KubernetesBackend(api=api, exec_fn=ex, poll_s=0.001, reap=False)

    async def go():
        sbx = await b.create(_spec(tmp_path))
        t = asyncio.ensure_future(sbx.exec(["sleep", "100"]))
        await asyncio.sleep(0.2)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        return sbx

    sbx = asyncio.run(go())
    assert sbx.closed and api.deleted == [sbx.pod]
