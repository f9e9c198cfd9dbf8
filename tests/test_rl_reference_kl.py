"""The KL penalty's reference policy: frozen when RL starts, fed to the loss as `ref_logp` at the loss
slots, reported as `kl_ref`, saved once and restored (not re-snapshotted) when a run resumes."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from tree_oracle import make_full_eval_fn

from research.rl.objective import make_rl_loss_fn, scatter_slots
from research.rl.trainer import Learner


def _config(**rl):
    from configs import demo_cpu

    cfg = demo_cpu.get_config("test")
    cfg.optim.update(warmup_steps=0, learning_rate=1e-2)
    cfg.rl_optim.update(learning_rate=5e-4)  # what these tests' KL bounds were set at, not the demo's tuning
    cfg.rl.update(**rl)
    return cfg


def _tree_equal(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_ref_logp_is_the_policy_logp_at_step0_then_kl_grows(algo, step_batch):
    cfg = _config(kl_coef=0.1)
    cfg.algo = algo
    learner = Learner(cfg)
    batch = step_batch(cfg)
    dev = learner.prepare(batch)
    ref = dev["ref_logp"]
    T = batch.device["tokens"].shape[1]
    assert ref.shape == batch.device["behav_logp"].shape == (cfg.train.batch_rows, T) and ref.dtype == np.float32
    with jax.set_mesh(learner.mesh):
        own = learner._eval(learner.state.params, learner.state.critic_params, batch.device)["logp"]
    slots = batch.device["count"] > 0
    np.testing.assert_array_equal(ref, scatter_slots(np.asarray(own), dev["loss_idx"], dev["loss_valid"], T))
    assert np.all(ref[slots] < 0) and np.all(ref[~slots] == 0)
    # independent check of the slot placement: the full-head tree objective's log-probs at those slots
    full = make_full_eval_fn(learner.model_cfg, learner.obj)(
        jax.device_get(learner.state.params), jax.device_get(learner.state.critic_params), batch.device)
    np.testing.assert_allclose(ref[slots], np.asarray(full["logp"])[slots], rtol=1e-4, atol=1e-4)
    if algo == "ppo":
        assert "old_values" in dev
    m1 = learner.train(batch)
    assert m1["kl_ref"] < 1e-6, m1["kl_ref"]  # policy == reference
    m2 = learner.train(batch)
    assert m2["kl_ref"] > 1e-5, m2["kl_ref"]  # one step of lr 1e-2 moved the policy away
    dev = learner.prepare(batch)
    np.testing.assert_array_equal(dev["ref_logp"], ref)  # the reference stays frozen
    if algo == "grpo":  # the penalty is in the loss: token_mean -> exactly kl_coef * kl_ref (k3 both)
        # (a large coefficient, so the penalty stands far above the fp32 rounding of the O(1) loss)
        obj = dataclasses.replace(learner.obj, loss=dataclasses.replace(learner.obj.loss, kl_coef=100.0))
        loss_fn = jax.jit(make_rl_loss_fn(learner.model_cfg, obj))
        with jax.set_mesh(learner.mesh):
            with_kl, m = loss_fn(learner.state.params, dev, None)
            no_kl, _ = loss_fn(learner.state.params, {k: v for k, v in dev.items() if k != "ref_logp"}, None)
        np.testing.assert_allclose(float(with_kl - no_kl), 100.0 * float(m["kl_ref"]), rtol=1e-3)
        assert float(m["kl_ref"]) > 1e-5


def test_no_reference_without_kl(step_batch):
    cfg = _config(kl_coef=0.0)
    learner = Learner(cfg)
    learner.init_reference("/nonexistent/never/written")
    assert learner.ref_params is None and "ref_logp" not in learner.prepare(step_batch(cfg))


def test_saved_reference_is_restored_not_resnapshotted(tmp_path, step_batch):
    """A resumed learner (trained params from the checkpoint) gets the reference saved when RL started."""
    from research.train.checkpoint import Checkpointer

    cfg = _config(kl_coef=0.1)
    batch = step_batch(cfg, seed=1)
    a = Learner(cfg)
    a.init_reference(tmp_path / "reference")
    saved = jax.device_get(a.ref_params)
    assert _tree_equal(saved, a.state.params)
    for _ in range(2):
        a.train(batch)
    with Checkpointer(tmp_path / "ckpt") as ck:
        ck.save(a.step, a.state, force=True)
    trained = jax.device_get(a.state.params)
    b = Learner(cfg)  # "the same command again"
    with Checkpointer(tmp_path / "ckpt") as ck:
        state, _, _ = ck.restore(b.abstract)
    b.restore(state)
    assert not _tree_equal(b.state.params, saved)
    b.init_reference(tmp_path / "reference")
    assert _tree_equal(b.ref_params, saved) and not _tree_equal(b.ref_params, trained)


# ----------------------------------------------------------------------------- the loop (real harness)


@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.timeout(400)
def test_loop_reports_kl_ref_and_resume_keeps_the_reference(tmp_path, parity_tasks):
    """One GRPO step, stop, then the same run resumed to step 2: kl_ref is ~0 at the first step only (a
    re-snapshot on resume would make it ~0 again at step 2) and the reference on disk is the initial policy."""
    from harness_env.rl.loop import train
    from harness_env.sandbox import get_backend

    if not get_backend("bwrap").available()[0]:
        pytest.skip("bwrap unavailable")
    cfg = _config(kl_coef=0.1)
    tasks = parity_tasks(tmp_path / "tasks", n=2)
    cfg.tasks.update(source="dir", train_dir=str(tasks), eval_dir=str(tasks))
    # 2 groups of 4: some reward signal at every step (a step without any would not move the policy)
    cfg.rollout.update(temperature=1.0, max_turns=1, groups_per_step=2, group_size=4)
    cfg.train.update(steps=1)
    wd = tmp_path / "run"
    assert train(cfg, wd)["rl_step"] == 1
    cfg.train.update(steps=2)
    assert train(cfg, wd)["rl_step"] == 2
    recs = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    kl = {r["step"]: r["kl_ref"] for r in recs if r["kind"] == "train"}
    assert sorted(kl) == [1, 2]
    assert kl[1] < 1e-6 and kl[2] > 1e-5, kl
    learner = Learner(cfg)  # seeded init: the policy when RL started
    initial = jax.device_get(learner.state.params)
    learner.init_reference(wd / "reference")
    assert _tree_equal(learner.ref_params, initial)
