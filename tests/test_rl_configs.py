"""The real-scale RL configs (cannot run here): they build, their state eval_shapes, and the loop's RL
train step (compact-head tree GRPO) lowers on fake devices with the configs' meshes and rules."""

import os
import pathlib
import subprocess
import sys

import jax
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["qwen3_30b_a3b_gpu", "qwen3_30b_a3b_tpu"])
def test_config_builds_with_loop_fields(name):
    import importlib

    cfg = importlib.import_module(f"configs.{name}").get_config()
    assert cfg.model.num_experts == 128 and cfg.model.hidden_size == 2048 and cfg.model.num_layers == 48
    assert set(cfg.rollout.harnesses.replace(":1", "").split(",")) == {"claude_code", "openclaw"}
    assert 200 <= cfg.train.steps <= 400 and cfg.tasks.source == "dir"
    assert cfg.sync.kind == ("sglang" if name.endswith("gpu") else "jax")
    from research.train.state import model_config

    model_config(cfg)  # every model field is a valid ModelConfig


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gpu_config_rl_step_lowers_on_8_fake_devices():
    from configs import qwen3_30b_a3b_gpu
    from research.rl.aot import lower_rl_step

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (fake) devices")
    out = lower_rl_step(qwen3_30b_a3b_gpu.get_config(), num_layers=1, devices=jax.devices()[:8])
    assert out["mesh"] == {"data": 1, "fsdp": 1, "expert": 8, "tensor": 1}
    assert out["hlo_chars"] > 10_000 and "ref_logp" not in out["batch_keys"]
    cfg = qwen3_30b_a3b_gpu.get_config()
    cfg.rl.kl_coef = 0.01  # the KL reference adds ref_logp to the batch; the step must still lower
    assert "ref_logp" in lower_rl_step(cfg, num_layers=1, devices=jax.devices()[:8])["batch_keys"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tpu_config_rl_step_lowers_on_16_fake_devices():
    code = ("import jax; from configs import qwen3_30b_a3b_tpu as c; from research.rl.aot import lower_rl_step;"
            "o = lower_rl_step(c.get_config(), num_layers=1); print(o); assert o['mesh']['fsdp'] == 2")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=16", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "'expert': 8" in p.stdout
