"""The training objective (research/rl/objective.py, head on every slot) on the real tiny MoE model: tree
rows == flat per-call rows (loss and grads), routing replay, and the jitted train step does not recompile
for different tree shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from research import losses
from research.models import init_params, tiny_moe
from research.rl.objective import Objective, all_slots, init_critic_params, make_eval_fn, make_rl_loss_fn
from research.train.optim import default_optim_config, make_optimizer
from research.train.state import init_train_state, make_mesh, policy_state_init
from research.train.step import make_train_step
from research.trees import synthetic
from research.trees.batch import DEVICE_ROW_FIELDS
from research.trees.builder import build_tree
from research.trees.packing import pack_routed_experts, pack_trees
from research.trees.targets import node_stats, normalizer, ppo_stats_from_values, rollout_advantages

CFG = tiny_moe()
BATCH_KEYS = DEVICE_ROW_FIELDS


def _groups(seed, sessions=3, turns=2, forked=False, **kw):
    """`forked`: each group with children replaying its rollouts' first calls (branches at later calls)."""
    rng = np.random.default_rng(seed)
    groups = [synthetic.make_group(rng, group_id=f"t{g}", sessions=sessions, turns=turns, vocab=CFG.vocab_size,
                                   prefix_len=12, **kw) for g in range(2)]
    return [synthetic.fork_group(rng, *g, vocab=CFG.vocab_size) for g in groups] if forked else groups


def _pack(trees, agg, row_len, num_rows=None):
    advs = rollout_advantages(trees, estimator="grpo")
    stats = [node_stats(t, occ_adv=a, agg_name=agg) for t, a in zip(trees, advs)]
    norms = [normalizer(t, agg) for t in trees]
    return pack_trees(trees, stats, norms, row_len=row_len, num_rows=num_rows)


def _tree_and_flat(groups, agg, row_len=128, num_rows=None):
    trees = [build_tree(c, r) for c, r in groups]
    flat = [build_tree([c], r) for cs, r in groups for c in cs]  # each call alone: the flat per-call view
    return trees, _pack(trees, agg, row_len, num_rows), _pack(flat, agg, row_len, num_rows)


def _jnp(packed):
    idx, valid = all_slots(*packed["tokens"].shape)
    return {**{k: jnp.asarray(packed[k]) for k in BATCH_KEYS}, "loss_idx": jnp.asarray(idx),
            "loss_valid": jnp.asarray(valid)}


@pytest.mark.parametrize("forked", [False, True])
def test_model_tree_rows_equal_flat_rows(forked):
    agg = "seq_mean_token_mean"  # the other aggregations are covered on arrays (test_losses.py)
    params = init_params(CFG, jax.random.PRNGKey(0))
    _, tree_b, flat_b = _tree_and_flat(_groups(0, turns=3 if forked else 2, forked=forked), agg,
                                       num_rows=None if forked else 6)
    assert flat_b["segment_ids"].astype(bool).sum() > 1.5 * tree_b["segment_ids"].astype(bool).sum()
    loss_fn = make_rl_loss_fn(CFG, Objective(loss=losses.LossConfig(aggregation=agg, entropy_coef=0.01)))
    f = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b, None)[0]))
    tl, tg = f(params, _jnp(tree_b))
    fl, fg = f(params, _jnp(flat_b))
    np.testing.assert_allclose(tl, fl, rtol=1e-5)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(tg), jax.tree.leaves(fg)):
        scale = float(jnp.abs(b).max()) + 1e-12
        np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=2e-5, err_msg=str(path))


def test_routing_replay_uses_recorded_experts():
    params = init_params(CFG, jax.random.PRNGKey(1))
    groups = _groups(1, routed_shape=(CFG.num_layers, CFG.num_experts_per_tok))
    trees, tree_b, _ = _tree_and_flat(groups, "token_mean")
    batch = _jnp(tree_b)
    batch["expert_ids"] = jnp.asarray(pack_routed_experts(trees, tree_b))
    assert (batch["expert_ids"] >= 0).any() and (batch["expert_ids"] < 0).any()
    on = make_rl_loss_fn(CFG, Objective())(params, batch, None)[0]
    off = make_rl_loss_fn(CFG, Objective(routing_replay=False))(params, batch, None)[0]
    assert np.isfinite(float(on)) and float(on) != float(off)  # random recorded routing changes the loss


def _state(obj=None):
    mesh = make_mesh(dict(data=1, fsdp=1, expert=1, tensor=1), devices=jax.devices()[:1])
    opt, _ = make_optimizer(default_optim_config())
    kw = {}
    if obj is not None and obj.critic != "none":
        kw = dict(critic_init_fn=lambda r: init_critic_params(CFG, r), critic_optimizer=opt)
    init = policy_state_init(CFG, opt, **kw)
    state, shardings = init_train_state(init, mesh, CFG.logical_rules, jax.random.PRNGKey(0))
    return mesh, opt, state, shardings


@pytest.mark.parametrize("critic", ["none", pytest.param("head", marks=pytest.mark.slow)])
def test_train_step_on_tree_batches_does_not_recompile(critic):
    loss_cfg = losses.LossConfig(algo="grpo" if critic == "none" else "ppo")
    obj = Objective(loss=loss_cfg, critic=critic)
    mesh, opt, state, shardings = _state(obj)
    step = make_train_step(loss_fn=make_rl_loss_fn(CFG, obj), optimizer=opt, state_shardings=shardings,
                           batch_shardings=NamedSharding(mesh, PartitionSpec()),
                           critic_optimizer=opt if critic != "none" else None)
    eval_fn = make_eval_fn(CFG, obj)
    shapes = set()
    for seed in (2, 3, 4):
        groups = _groups(seed, sessions=2 + seed % 2, turns=1 + seed % 3)
        trees = [build_tree(c, r) for c, r in groups]
        packed = _pack(trees, "token_mean", 128, num_rows=4)
        shapes.add(tuple(packed["parent_index"].ravel()))
        if critic != "none":
            values = eval_fn(state.params, state.critic_params, _jnp(packed))["values"]
            packed = ppo_stats_from_values(trees, packed, np.asarray(values), gamma=1.0, lam=0.95,
                                           aggregation="token_mean")
        batch = _jnp(packed) | ({"old_values": jnp.asarray(packed["old_values"])} if critic != "none" else {})
        state, metrics = step(state, batch)
        assert np.isfinite(float(metrics["loss"])) and float(metrics["loss_tokens"]) > 0
        if critic != "none":
            assert np.isfinite(float(metrics["value_loss"])) and float(metrics["critic_grad_norm"]) > 0
    assert len(shapes) == 3 and step.cache_size() == 1
