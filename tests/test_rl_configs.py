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


@pytest.mark.parametrize("arg", ["codex", "claude_code", "openclaw", "opencode", "mix", "codex,control", "mix,test",
                                 "codex+claude_code"])
def test_harness_matrix_configs_validate_and_hold_each_clis_first_request(arg):
    from configs import harness_matrix
    from harness_env.harnesses.base import check_context
    from research.rl.config import RunConfig

    run = RunConfig.of(harness_matrix.get_config(arg))
    names = [h.split(":")[0] for h in run.rollout.harnesses.split(",")]
    assert names == (list(harness_matrix.CLIS) if arg.startswith("mix") else arg.split(",")[0].split("+"))
    check_context(names, run.engine.max_len)
    assert run.train.row_len >= run.engine.max_len and run.sft.merge_demos
    assert run.algo == ("sft" if arg.endswith("control") else "grpo")
    with pytest.raises(ValueError, match="not in"):
        harness_matrix.get_config("browser_use")
