"""The one objective (compact head: LM head on loss slots only) equals the independent full-head oracle
(tests/tree_oracle.py) in loss, metrics and gradients; and so does the same objective with every slot
a loss slot (`all_slots`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tree_oracle import make_full_eval_fn, make_full_loss_fn

from research import losses
from research.models import init_params, tiny_dense, tiny_moe
from research.rl.objective import (
    Objective,
    all_slots,
    init_critic_params,
    loss_slots,
    make_eval_fn,
    make_rl_loss_fn,
    make_sft_loss_fn,
    scatter_slots,
)
from research.trees import synthetic
from research.trees.batch import DEVICE_ROW_FIELDS
from research.trees.builder import build_tree
from research.trees.packing import pack_trees
from research.trees.targets import node_stats, normalizer, rollout_advantages

KEYS = DEVICE_ROW_FIELDS


def _batch(cfg, seed=0, k=4):
    rng = np.random.default_rng(seed)
    groups = [synthetic.make_group(rng, group_id=f"t{g}", sessions=3, turns=2, vocab=cfg.vocab_size, prefix_len=12)
              for g in range(2)]
    trees = [build_tree(c, r) for c, r in groups]
    advs = rollout_advantages(trees, estimator="grpo")
    stats = [node_stats(t, occ_adv=a, agg_name="token_mean") for t, a in zip(trees, advs)]
    packed = pack_trees(trees, stats, [normalizer(t, "token_mean") for t in trees], row_len=128, num_rows=3)
    full = {k_: jnp.asarray(packed[k_]) for k_ in KEYS}
    idx, valid = loss_slots(packed["count"], k)  # k doubles until every row fits
    assert idx.shape[1] >= (packed["count"] > 0).sum(1).max() and idx.shape[1] < 128
    return trees, packed, full, {**full, "loss_idx": jnp.asarray(idx), "loss_valid": jnp.asarray(valid)}


@pytest.mark.slow
@pytest.mark.parametrize("make_cfg", [tiny_dense, tiny_moe])
def test_compact_head_equals_full_head_grpo(make_cfg):
    cfg = make_cfg()
    obj = Objective(loss=losses.LossConfig(entropy_coef=0.01, is_correction="tis"), routing_replay=False)
    params = init_params(cfg, jax.random.PRNGKey(1))
    _, packed, full, compact = _batch(cfg)
    idx, valid = all_slots(*packed["tokens"].shape)
    every = {**full, "loss_idx": jnp.asarray(idx), "loss_valid": jnp.asarray(valid)}
    f_full = jax.jit(jax.value_and_grad(lambda p, b: make_full_loss_fn(cfg, obj)(p, b, None), has_aux=True))
    f_comp = jax.jit(jax.value_and_grad(lambda p, b: make_rl_loss_fn(cfg, obj)(p, b, None), has_aux=True))
    (l1, m1), g1 = f_full(params, full)
    for batch in (compact, every):
        (l2, m2), g2 = f_comp(params, batch)
        np.testing.assert_allclose(l2, l1, rtol=1e-5)
        for k in ("policy_loss", "mismatch_k3", "clip_frac", "entropy", "loss_tokens"):
            np.testing.assert_allclose(m2[k], m1[k], rtol=1e-5, atol=1e-7, err_msg=k)
        for a, b in zip(jax.tree.leaves(g2), jax.tree.leaves(g1)):
            scale = float(jnp.abs(b).max()) + 1e-12
            np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=2e-5)


@pytest.mark.slow
def test_compact_head_equals_full_head_ppo_values_and_sft():
    cfg = tiny_dense()
    obj = Objective(loss=losses.LossConfig(algo="ppo"), critic="head")
    params = init_params(cfg, jax.random.PRNGKey(2))
    critic = jax.tree.map(lambda x: x + 0.01, __import__("flax").linen.unbox(init_critic_params(cfg)))
    trees, packed, full, compact = _batch(cfg, seed=1)
    l1, m1 = make_full_loss_fn(cfg, obj)(params, full, None, critic_params=critic)
    l2, m2 = make_rl_loss_fn(cfg, obj)(params, compact, None, critic_params=critic)
    np.testing.assert_allclose(l2, l1, rtol=1e-5)
    np.testing.assert_allclose(m2["value_loss"], m1["value_loss"], rtol=1e-5)
    # the PPO pre-pass: compact values scattered back == full values on every loss slot
    v_full = np.asarray(make_full_eval_fn(cfg, obj)(params, critic, full)["values"])
    out = make_eval_fn(cfg, obj)(params, critic, compact)
    T = packed["tokens"].shape[1]
    v_comp = scatter_slots(np.asarray(out["values"]), np.asarray(compact["loss_idx"]),
                           np.asarray(compact["loss_valid"]), T)
    sel = packed["count"] > 0
    np.testing.assert_allclose(v_comp[sel], v_full[sel], rtol=1e-5, atol=1e-6)
    # SFT: token-mean NLL of the generated slots == -sum(weight * logp) / sum(weight) from the full head
    nll, _ = make_sft_loss_fn(cfg, obj)(params, compact, None)
    logp = np.asarray(make_full_eval_fn(cfg, obj)(params, critic, full)["logp"])
    w = packed["weight"]
    np.testing.assert_allclose(nll, -(w * logp).sum() / w.sum(), rtol=1e-5)
