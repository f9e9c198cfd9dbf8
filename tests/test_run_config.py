"""The typed run config: every section typed, unknown keys named, invariants checked at start."""

import dataclasses

import pytest

from configs import demo_cpu, qwen3_30b_a3b_gpu, qwen3_30b_a3b_tpu
from research.rl import config as config_lib
from research.rl.config import RunConfig, RunConfigError, defaults


def _cfg():
    return demo_cpu.get_config()


def test_every_field_reaches_its_component_config():
    cfg = _cfg()
    cfg.algo = "ppo"
    cfg.rl.update(value_clip=0.3, mis_low=0.25, mis_high=4.0, is_correction="mis", kl_coef=0.1, kl_estimator="k1")
    cfg.rollout.temperature = 0.8
    run = RunConfig.of(cfg)
    loss = run.loss()
    assert (loss.value_clip, loss.mis_low, loss.mis_high, loss.is_correction) == (0.3, 0.25, 4.0, "mis")
    assert (loss.kl_coef, loss.kl_estimator, loss.algo) == (0.1, "k1", "ppo")
    obj = run.objective()
    assert obj.temperature == 0.8 and obj.critic == "head" and obj.logprob_chunk == cfg.train.logprob_chunk
    pipe = run.pipeline()
    assert pipe.merge_generations is False  # a clipped value loss needs one occurrence per slot
    assert pipe.vocab_size == 151936 and (run.batching().row_len, run.batching().num_rows) == (512, 8)
    assert run.engine.max_len == cfg.engine.max_len and run.rl_optim.learning_rate == cfg.rl_optim.learning_rate


def test_defaults_hold_every_field_so_every_field_overrides():
    d = defaults()
    for section in ("train", "rl", "rollout", "engine", "sft", "eval"):
        assert section in d
    assert {"minibatches", "epochs", "skip_empty"} <= set(d.train) and "filter_groups" in d.rl


@pytest.mark.parametrize("path,value,msg", [
    ("rl.clip_hihg", 0.3, r"config.rl: unknown field\(s\) \['clip_hihg'\]"),
    ("train.batch_rows", "8", r"config.train.batch_rows='8': expected int"),
    ("algo", "dpo", r"config.algo='dpo'"),
    ("rl.estimator", "gae", r"config.rl.estimator='gae'"),
    ("rollout.top_p", 0.95, r"top_p=0.95"),
    ("rollout.temperature", 0.0, r"T > 0"),
    ("engine.max_len", 1024, r"row_len=512 < config.engine.max_len=1024"),
    ("sync.kind", "sglang", r"needs config.sync.sglang_url"),
    ("rollout.group_size", 1, r"group_size=1"),
])
def test_invariants_fail_at_start_with_a_message(path, value, msg):
    cfg = _cfg().to_dict()  # a plain dict: ml_collections itself would refuse some of these assignments
    *parents, leaf = path.split(".")
    node = cfg
    for p in parents:
        node = node[p]
    node[leaf] = value
    with pytest.raises(RunConfigError, match=msg):
        RunConfig.of(cfg)


def test_mesh_and_rows_are_checked_against_the_devices():
    cfg = _cfg()
    cfg.mesh.update(data=-1, fsdp=1)
    cfg.train.update(minibatches=1)
    assert RunConfig.of(cfg, num_devices=8)
    cfg.train.update(minibatches=2)
    with pytest.raises(RunConfigError, match="not divisible by minibatches"):
        RunConfig.of(cfg, num_devices=8)  # 8 rows: 2 minibatches of 4 rows cannot span data=8
    cfg.train.update(minibatches=3)
    with pytest.raises(RunConfigError, match="not divisible by minibatches"):
        RunConfig.of(cfg, num_devices=1)
    cfg.train.update(minibatches=1)
    with pytest.raises(RunConfigError, match="not divisible by the batch axes"):
        RunConfig.of(cfg, num_devices=16)  # 8 rows over data=16
    cfg.mesh.update(data=3)
    with pytest.raises(RunConfigError, match="needs 3 devices, have 2"):
        RunConfig.of(cfg, num_devices=2)


def test_a_run_is_validated_once_per_device_count(monkeypatch):
    """The loop validates with the real device count, then its Learner asks again: the second ask is free, a
    new count or a changed config is checked again, and the stamp never reaches config.json."""
    run = RunConfig.of(_cfg(), num_devices=8)
    calls = []
    monkeypatch.setattr(config_lib, "validate", lambda r, num_devices=None: calls.append(num_devices))
    assert RunConfig.of(run, num_devices=8) is run and calls == []
    assert RunConfig.of(run, num_devices=16).validated_devices == 16 and calls == [16]
    assert RunConfig.of(dataclasses.replace(run, seed=1), num_devices=16) and calls == [16, 16]
    unchecked = RunConfig.of(_cfg(), check=False)
    assert unchecked.validated_devices is None and RunConfig.of(unchecked, num_devices=8) and calls[-1] == 8
    assert RunConfig.of(run, num_devices=1, check=False) and calls[-1] == 8  # check=False never validates
    assert "_validated_devices" not in run.to_dict() and "validated_devices" not in run.to_dict()


def test_a_run_that_fails_validation_is_not_stamped():
    cfg = _cfg()
    cfg.mesh.update(data=3)
    run = RunConfig.of(cfg, check=False)
    with pytest.raises(RunConfigError, match="needs 3 devices, have 2"):
        RunConfig.of(run, num_devices=2)
    assert run.validated_devices is None


def test_real_scale_configs_are_consistent():
    for module, devices in ((qwen3_30b_a3b_gpu, 16), (qwen3_30b_a3b_tpu, 32)):
        run = RunConfig.of(module.get_config(), num_devices=devices)
        assert run.train.row_len >= run.engine.max_len >= 16384  # a real harness's rollout path fits one row
        with pytest.raises(RunConfigError, match=f"needs {devices} devices"):
            RunConfig.of(module.get_config(), num_devices=devices // 2)


def test_unknown_harness_is_named_before_any_sandbox_starts(tmp_path):
    from harness_env.rl.rollouts import harness_weights

    cfg = _cfg()
    cfg.rollout.harnesses = "reference_bash:1,claude_cod:1"
    with pytest.raises(ValueError, match=r"unknown harness\(es\) \['claude_cod'\]"):
        harness_weights(RunConfig.of(cfg))
