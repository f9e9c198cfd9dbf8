"""The RL update's mechanics that issue 10's diagnosis rests on (research/rl/trainer.py, research/rl/batches.py):
epochs x minibatches are that many optimizer steps and make the PPO clip act; a step with no signal is not
taken (Adam's momentum would still move the policy); zero-variance groups are filtered and counted."""

import jax
import numpy as np
import pytest

from research.rl.trainer import Learner


def _config(**train):
    from research.benchmarks.learning import bandit_config

    cfg = bandit_config(lr=3e-2)  # a 1-layer Qwen3 over 64 tokens: compiles in seconds
    cfg.rl.update(recompute_old_logp=True, is_correction="none")  # pi_old = the params before the update
    cfg.train.update(**train)
    return cfg


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _moved(a, b) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def test_one_pass_is_on_policy_and_the_clip_never_acts(step_batch):
    cfg = _config(epochs=1, minibatches=1)
    learner = Learner(cfg)
    m = learner.train(step_batch(cfg))
    assert m["optimizer_steps"] == 1 and int(learner.state.step) == 1
    assert m["clip_frac"] == 0.0  # ratio == 1 exactly: nothing but the optimizer bounds the change


def test_epochs_x_minibatches_are_that_many_steps_and_the_clip_acts(step_batch):
    cfg = _config(epochs=2, minibatches=2)
    learner = Learner(cfg)
    m = learner.train(step_batch(cfg))
    assert m["optimizer_steps"] == 4 and int(learner.state.step) == 4
    assert m["clip_frac"] > 0.0, m  # step 1 is on-policy (0); the later ones see the moved policy: the clip acts
    assert m["kl_old_new"] > 0.0 and m["ratio_max"] > 1.0


def test_a_step_without_signal_is_skipped_so_momentum_cannot_move_the_policy(step_batch):
    cfg = _config(skip_empty=True)
    learner = Learner(cfg)
    learner.train(step_batch(cfg))  # a real step: Adam now carries momentum
    before, step = _leaves(learner.state.params), int(learner.state.step)
    m = learner.train(step_batch(cfg, seed=1, flat_groups=(0, 1)))
    assert m["skipped"] == 1.0 and m["adv_tokens"] == 0
    assert int(learner.state.step) == step and _moved(before, _leaves(learner.state.params)) == 0.0

    cfg = _config(skip_empty=False)  # the control: the same two batches, the empty step taken
    learner = Learner(cfg)
    learner.train(step_batch(cfg))
    before = _leaves(learner.state.params)
    m = learner.train(step_batch(cfg, seed=1, flat_groups=(0, 1)))
    assert m["skipped"] == 0.0 and _moved(before, _leaves(learner.state.params)) > 1e-3  # zero gradient, moved


@pytest.mark.parametrize("filter_groups", [True, False])
def test_zero_variance_groups_are_filtered_and_counted(step_batch, filter_groups):
    cfg = _config()
    batch = step_batch(cfg, flat_groups=(1,), filter_groups=filter_groups)
    assert [t.group_id for t in batch.trees] == (["t0"] if filter_groups else ["t0", "t1"])
    assert batch.filtered_groups == (1 if filter_groups else 0)
    assert len(batch.rollout_ids) == 6  # a filtered group is consumed all the same (never trained later)
