"""The Kubernetes objects the kubernetes sandbox backend sends validate against the Kubernetes OpenAPI schema
(strict: unknown fields rejected) of several Kubernetes versions, via the `kubernetes-validate` package (JSON
schemas generated from Kubernetes' OpenAPI spec). The pods are taken from what the backend really posts to
the (fake) API, so a manifest change that a real API server would reject fails here."""

import asyncio
import copy

import kubernetes_validate
import pytest
from test_sandbox_kubernetes import FakeApi, FakeExec, _spec

from harness_env.sandbox import Limits, SandboxSpec
from harness_env.sandbox.kubernetes_sandbox import KubernetesBackend, network_policy

# the oldest minor still in the main clouds' support windows here, and the newest the package knows
VERSIONS = ["1.30", kubernetes_validate.latest_version()]


def _posted_pod(tmp_path, *, shim_address, **spec_kw) -> dict:
    """The pod body the backend posts for a sandbox (through the fake API: no cluster)."""
    api = FakeApi(pending_polls=0)
    backend = KubernetesBackend(api=api, exec_fn=FakeExec(), poll_s=0.001, reap=False, shim_address=shim_address)

    async def go():
        sbx = await backend.create(_spec(tmp_path, **spec_kw))
        body = copy.deepcopy(api.pods[sbx.pod])
        await sbx.close()
        return body

    return asyncio.run(go())


def _validate(obj: dict) -> None:
    for version in VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("shim", ["10.0.0.5:8765", None])
def test_posted_pods_validate(tmp_path, shim):
    pod = _posted_pod(tmp_path, shim_address=shim, labels={"harness-rl.rollout": "r1"}, shim_port=18080)
    assert pod["kind"] == "Pod" and ("readinessProbe" in pod["spec"]["containers"][0]) == bool(shim)
    _validate(pod)


def test_pod_limits_of_other_shapes_validate(tmp_path):
    (tmp_path / "ws").mkdir()
    spec = SandboxSpec(workspace=tmp_path / "ws", name="x", limits=Limits(cpus=2.0, memory_mb=4096, wall_s=1800))
    api = FakeApi(pending_polls=0)
    backend = KubernetesBackend(api=api, exec_fn=FakeExec(), poll_s=0.001, reap=False)
    sbx = asyncio.run(backend.create(spec))
    _validate(api.pods[sbx.pod])


def test_network_policy_validates():
    _validate(network_policy("harness-rl", "10.0.0.5", 8765))


def test_the_schema_check_rejects_what_an_api_server_would(tmp_path):
    """Controls: the validator is not vacuous for the backend's own objects."""
    pod = _posted_pod(tmp_path, shim_address=None)
    typo = copy.deepcopy(pod)
    typo["spec"]["restartPolicyy"] = typo["spec"].pop("restartPolicy")  # unknown field (strict)
    wrong_type = copy.deepcopy(pod)
    wrong_type["spec"]["activeDeadlineSeconds"] = "600"  # an integer field given a string
    no_name = copy.deepcopy(pod)
    del no_name["spec"]["containers"][0]["name"]  # a required field
    for bad in (typo, wrong_type, no_name):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)
    policy = network_policy("ns", "10.0.0.5", 8765)
    policy["spec"]["egress"][0]["ports"][0]["protocol"] = 6  # protocol is a string ("TCP")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(policy, VERSIONS[-1], strict=True)
