"""The real-scale RL configs (cannot run here) build with every loop field; their RL and SFT steps are
lowered and compiled on fake devices by tests/test_train_aot.py."""

import pathlib

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
