"""Optimizer from config: exact schedule values, decay mask, clipping order, and config errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from research.train.optim import (
    SCHEDULES,
    current_learning_rate,
    decay_mask,
    default_optim_config,
    make_optimizer,
    make_schedule,
)


def _cfg(**kw):
    cfg = default_optim_config()
    cfg.update(kw)
    return cfg


def test_warmup_cosine_exact_values():
    sched = make_schedule(_cfg(schedule="cosine", learning_rate=1.0, warmup_steps=4, total_steps=14,
                               init_lr_ratio=0.0, end_lr_ratio=0.1))
    np.testing.assert_allclose([float(sched(i)) for i in range(5)], [0.0, 0.25, 0.5, 0.75, 1.0], atol=1e-7)
    # Cosine over the 10 decay steps down to alpha=0.1: lr = 0.1 + 0.9 * 0.5 * (1 + cos(pi * t / 10)).
    for t in (0, 3, 5, 10, 20):
        expect = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 10) / 10))
        assert float(sched(4 + t)) == pytest.approx(expect, rel=1e-6)


def test_constant_and_linear():
    const = make_schedule(_cfg(schedule="constant", learning_rate=3e-4))
    assert float(const(0)) == pytest.approx(3e-4) and float(const(10**6)) == pytest.approx(3e-4)
    lin = make_schedule(_cfg(schedule="linear", learning_rate=2.0, warmup_steps=0, total_steps=4, end_lr_ratio=0.5))
    np.testing.assert_allclose([float(lin(i)) for i in range(6)], [2.0, 1.75, 1.5, 1.25, 1.0, 1.0], rtol=1e-6)


def test_registry_and_bad_config():
    assert set(SCHEDULES) == {"constant", "cosine", "linear"}
    with pytest.raises(ValueError, match="config.optim.schedule='nope'"):
        make_schedule(_cfg(schedule="nope"))
    with pytest.raises(ValueError, match="learning_rate"):
        make_schedule(_cfg(learning_rate=-1.0))


def test_weight_decay_only_on_matrices():
    params = {"w": jnp.ones((2, 3)), "scale": jnp.ones((3,))}
    assert decay_mask(params) == {"w": True, "scale": False}
    opt, _ = make_optimizer(_cfg(learning_rate=0.5, weight_decay=0.1, clip_norm=0.0))
    state = opt.init(params)
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = opt.update(zero, state, params)
    # Zero gradient: Adam's update is 0, so only decoupled decay remains: -lr * wd * p on matrices only.
    np.testing.assert_allclose(updates["w"], -0.5 * 0.1 * np.ones((2, 3)), rtol=1e-6)
    np.testing.assert_array_equal(updates["scale"], np.zeros(3))


def test_clip_before_adam_and_reported_learning_rate():
    cfg = _cfg(learning_rate=1e-2, clip_norm=1.0, b1=0.9, schedule="cosine", warmup_steps=2, total_steps=10)
    opt, sched = make_optimizer(cfg)
    params = {"w": jnp.zeros((2, 2))}
    grads = {"w": jnp.full((2, 2), 5.0)}  # global norm 10 -> clipped to 1
    state = opt.init(params)
    _, state = opt.update(grads, state, params)
    (mu,) = [s.mu for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
             if isinstance(s, optax.ScaleByAdamState)]
    np.testing.assert_allclose(mu["w"], 0.1 * np.full((2, 2), 0.5), rtol=1e-6)  # (1 - b1) * clipped grad
    assert float(current_learning_rate(state)) == pytest.approx(float(sched(0)))
    _, state = opt.update(grads, state, params)
    assert float(current_learning_rate(state)) == pytest.approx(float(sched(1))) == pytest.approx(5e-3)


def test_no_clip_when_disabled():
    opt, _ = make_optimizer(_cfg(clip_norm=0.0))
    params = {"w": jnp.zeros((2,))}
    _, state = opt.update({"w": jnp.full((2,), 100.0)}, opt.init(params), params)
    (mu,) = [s.mu for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
             if isinstance(s, optax.ScaleByAdamState)]
    np.testing.assert_allclose(mu["w"], [10.0, 10.0], rtol=1e-6)
