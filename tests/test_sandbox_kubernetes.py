"""kubernetes backend against a fake CoreV1Api (no cluster here): manifests and lifecycle logic."""
import asyncio
import io
import json
import os
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
