"""AOT (research/train/aot.py): the real Qwen3-30B-A3B steps — the loop's tree GRPO and PPO (KL on, routing
replay on) and its SFT step — lower + compile from abstract inputs on fake CPU meshes and fit the target's
per-device memory: the RL configs' 2 x 8 H200 (16 devices) and v5p-64 (32) targets with 16k rows (in a fresh
process: the CLI forces that many fake devices), the model-only config's 8 x H200 mesh in process."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import qwen3_30b_a3b, qwen3_30b_a3b_gpu
from research.models import moe
from research.train.aot import GiB, aot_compile, format_report
from research.trees import batch as fields

REPO = pathlib.Path(__file__).resolve().parents[1]
GPU_MESH = {"data": 1, "fsdp": 1, "expert": 8, "tensor": 1}  # the model-only config's one-host mesh
RL_GPU_MESH = {"data": 1, "fsdp": 2, "expert": 8, "tensor": 1}  # the RL config: 2 hosts x 8 H200
# the 30B state on the gpu mesh: 12 bytes/param; experts split 8 ways, the rest replicated (+ a few scalars)
L, D, E, I, V = 48, 2048, 128, 768, 151936
EXPERTS = L * 3 * E * D * I
REST = 2 * V * D + D + L * (D * 128 * (2 * 32 + 2 * 4) + 2 * 128 + 2 * D + D * E)


def _check_memory(rep: dict) -> None:
    """Donation works (the state is aliased in -> out; extra arguments are the batch) and the peak fits."""
    assert 0 <= rep["state_bytes_per_device"] - rep["alias_bytes"] < 1024 * 1024  # (PPO's tiny critic: a few KiB)
    # (XLA prunes batch arrays the step never reads, e.g. GRPO's return sums: a few rows of KiB)
    assert abs(rep["argument_bytes"] - rep["alias_bytes"] - rep["batch_bytes_per_device"]) < 1024 * 1024
    assert rep["temp_bytes"] > 0 and rep["peak_bytes"] > rep["argument_bytes"]
    assert rep["largest_arrays"] and all(b > 0 for _, b in rep["largest_arrays"])
    assert rep["fits"] and rep["peak_bytes"] < rep["device_memory_bytes"], format_report(rep)


def _cli(config: str, steps: str, devices: int, *extra: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, "-m", "launch.aot", f"--config={config}", f"--step={steps}", "--kl", "--replay",
         f"--fake_devices={devices}", *extra],
        capture_output=True, text=True, timeout=1400, env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(x[4:]) for x in out.stdout.splitlines() if x.startswith("AOT ")]


@pytest.mark.timeout(900)
def test_grpo_kl_replay_full_model_fits_2x8_h200():
    """All 48 layers at real width, 16k rows, on the RL config's 16-GPU mesh: tree GRPO with the KL reference
    and routing replay. With scanned layers this compiles as fast as 1 layer (~30-60 s)."""
    (rep,) = _cli("configs/qwen3_30b_a3b_gpu.py", "grpo", 16)
    print(format_report(rep))
    assert rep["mesh"] == RL_GPU_MESH and rep["num_layers"] == 48 and rep["params_total"] == 30_532_122_624
    assert rep["tokens_per_step"] == 16 * 16384
    assert {"ref_logp", "expert_ids", "loss_idx", "adv_pos"} <= set(rep["batch_keys"])
    assert "old_values" not in rep["batch_keys"] and rep["moe_impl"] == "shapes"
    assert rep["device_memory_bytes"] == 141 * 10**9
    assert 28 * GiB < rep["state_bytes_per_device"] < 29 * GiB  # experts over 16, the rest over fsdp=2
    _check_memory(rep)


@pytest.mark.parametrize("step,kl,keys,absent", [
    ("ppo", True, {"old_values", "ref_logp", "expert_ids"}, set()),
    ("sft", True, {"expert_ids", "weight"}, {"ref_logp", "old_values"}),  # SFT never reads the reference
    ("grpo", False, {"expert_ids"}, {"ref_logp", "old_values"}),
])
def test_every_step_lowers_on_the_gpu_mesh(step, kl, keys, absent):
    """Lowering only (shapes, shardings, the SPMD program), 2 layers, the RL config on one 8-GPU host: seconds."""
    cfg = qwen3_30b_a3b_gpu.get_config()
    cfg.mesh.fsdp = 1
    rep = aot_compile(cfg, step=step, kl=kl, replay=True, num_layers=2, devices=jax.devices()[:8], compile=False)
    assert rep["step"] == step and rep["mesh"] == GPU_MESH and rep["num_layers"] == 2
    assert keys <= set(rep["batch_keys"]) and not absent & set(rep["batch_keys"])
    assert "peak_bytes" not in rep and "lowered" in format_report(rep)


def test_refusals():
    cfg = qwen3_30b_a3b_gpu.get_config()
    with pytest.raises(ValueError, match="step 'dpo' not in"):
        aot_compile(cfg, step="dpo")
    with pytest.raises(ValueError, match="needs a loop config"):
        aot_compile(qwen3_30b_a3b.get_config("gpu"), step="grpo")
    from configs import tiny

    with pytest.raises(ValueError, match="replay=True needs an MoE model"):
        aot_compile(tiny.get_config("dense"), step="sft", replay=True, devices=jax.devices()[:1])


def test_shapes_moe_standin_has_the_grouped_gemm_shapes():
    """moe_impl="shapes" (AOT only): same output and gradient shapes/dtypes as the ragged kernel."""
    rng = np.random.default_rng(0)
    N, K, Dm, Im, Em = 16, 2, 8, 4, 4
    x = jnp.asarray(rng.normal(size=(N, Dm)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, Em, size=(N, K)), jnp.int32)
    w = jnp.full((N, K), 0.5, jnp.float32)
    ws = [jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((Em, Dm, Im), (Em, Dm, Im), (Em, Im, Dm))]

    def grads(impl):
        f = lambda x, *ws: moe._IMPLS[impl](x, ids, w, *ws).sum()
        return jax.eval_shape(jax.grad(f, argnums=(0, 1, 2, 3)), x, *ws)

    assert grads("shapes") == grads("ragged")
    out = moe._IMPLS["shapes"](x, ids, w, *ws)
    assert out.shape == (N, Dm) and bool(jnp.all(jnp.isfinite(out)))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("step", ["ppo", "sft"])
def test_ppo_and_sft_full_model_fit_2x8_h200(step):
    (rep,) = _cli("configs/qwen3_30b_a3b_gpu.py", step, 16)
    print(format_report(rep))
    assert rep["num_layers"] == 48 and rep["mesh"] == RL_GPU_MESH
    _check_memory(rep)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sft_step_of_the_model_only_config_gpu_mesh():
    """The model-only config (configs/qwen3_30b_a3b.py:gpu) compiles the one objective's SFT step."""
    rep = aot_compile(qwen3_30b_a3b.get_config("gpu"), devices=jax.devices()[:8])
    print(format_report(rep))
    assert rep["step"] == "sft" and {"tokens", "parent_index", "weight", "loss_idx"} <= set(rep["batch_keys"])
    assert 0 <= rep["state_bytes_per_device"] - 12 * (EXPERTS // 8 + REST) < 256
    _check_memory(rep)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_cli_tpu_v5p_64_mesh_32_fake_devices():
    """The RL config's TPU v5p-64 mesh needs 32 devices: the CLI forces 32 fake CPU devices in a fresh process
    and compiles every step (48 layers, 16k rows, KL + routing replay); each fits a v5p's 95 GB."""
    reps = _cli("configs/qwen3_30b_a3b_tpu.py", "grpo,ppo,sft", 32)
    assert [r["step"] for r in reps] == ["grpo", "ppo", "sft"]
    for rep in reps:
        assert rep["mesh"] == {"data": 1, "fsdp": 4, "expert": 8, "tensor": 1} and rep["num_layers"] == 48
        assert rep["device_memory_bytes"] == 95 * 10**9
        _check_memory(rep)


@pytest.mark.timeout(900)
def test_qwen3_vl_30b_a3b_grpo_step_fits_2x8_h200_with_16k_image_patches():
    """Qwen3-VL-30B-A3B (both towers at full size) on the RL config's 16-GPU mesh: the tree GRPO step with KL and
    routing replay, with a batch carrying 16,384 patch rows of screenshots (replicated) beside the 16 rows of 16k
    tokens, compiles and fits an H200: 99.7 GiB per device, measured (the text model alone: 92.7). Before the
    DeepStack layers joined their run's scan and the tower's blocks were rematerialised it was 264.5 GiB
    (docs/experiments/2026-12-07-deepstack-in-scan.md)."""
    (rep,) = _cli("configs/qwen3_vl_30b_a3b_gpu.py", "grpo", 16, "--image_patches=16384")
    assert rep["mesh"] == RL_GPU_MESH and rep["num_layers"] == 48
    _check_memory(rep)
    assert rep["peak_bytes"] < 110 * GiB, format_report(rep)  # 99.7 measured; the split runs alone cost +109
    assert set(fields.names(fields.VISUAL, fields.IMAGES)) | {"ref_logp", "expert_ids"} <= set(rep["batch_keys"])
    # the state holds both towers in fp32 + Adam: 31.87 GiB per device against the text model's 28.86 GiB (the
    # ~0.41B-param tower's 3.0 GiB, laid out by the same rules); measured, deterministic from the shardings
    assert rep["state_bytes_per_device"] == 34_223_062_128
