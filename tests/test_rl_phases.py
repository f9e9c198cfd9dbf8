"""SFT warm start -> RL: the RL phase's own optimizer (`config.rl_optim`) starts from fresh Adam moments at
its own learning rate, on the same TrainState layout (so checkpoints restore across the phase change)."""

import jax
import numpy as np
import pytest

from research.rl.trainer import Learner


def _config(rl_lr=None):
    from configs import demo_cpu

    cfg = demo_cpu.get_config("test")
    cfg.optim.update(warmup_steps=0, learning_rate=1e-2)
    if rl_lr is None:
        del cfg["rl_optim"]
    else:
        cfg.rl_optim.update(learning_rate=rl_lr)
    return cfg


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_rl_optim_resets_moments_and_sets_its_lr(step_batch):
    cfg = _config(rl_lr=1e-4)
    learner = Learner(cfg)
    batch = step_batch(cfg)
    m_sft = learner.train(batch, sft=True)
    assert m_sft["learning_rate"] == pytest.approx(1e-2)
    params = _leaves(learner.state.params)
    assert any(np.abs(x).max() > 0 for x in _leaves(learner.state.opt_state) if x.ndim > 0)  # SFT moments
    assert learner.start_rl()
    for x, y in zip(params, _leaves(learner.state.params)):
        np.testing.assert_array_equal(x, y)  # the policy is untouched
    assert all(np.abs(x).max() == 0 for x in _leaves(learner.state.opt_state) if x.ndim > 0)  # fresh mu/nu
    m_rl = learner.train(batch)
    assert m_rl["learning_rate"] == pytest.approx(1e-4)
    # Adam's first step moves each parameter by ~lr: the RL update is 100x smaller than the SFT one
    assert m_rl["update_norm"] < 0.05 * m_sft["update_norm"]


def test_without_rl_optim_the_optimizer_continues(step_batch):
    cfg = _config()
    learner = Learner(cfg)
    batch = step_batch(cfg)
    learner.train(batch, sft=True)
    before = _leaves(learner.state.opt_state)
    assert not learner.start_rl()
    for x, y in zip(before, _leaves(learner.state.opt_state)):
        np.testing.assert_array_equal(x, y)
    assert learner.train(batch)["learning_rate"] == pytest.approx(1e-2)


def test_rl_optim_with_another_chain_is_refused():
    cfg = _config(rl_lr=1e-4)
    cfg.rl_optim.clip_norm = 0.0  # no clipping stage: a different optimizer state
    with pytest.raises(ValueError, match="same optimizer state structure"):
        Learner(cfg)  # refused when the config is validated, before any state is built
