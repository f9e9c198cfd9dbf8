"""Exactness: tree loss and gradients == flat per-call loss and gradients, every variant.

The "model" here is a table lookup keyed by a hash of the token path, so any function of the path
(log-prob, value, entropy, reference and pi_old log-probs) is shared exactly as a real model's
would be. The flat side is computed independently from the raw CallRecords (its own advantages and
per-session GAE loop); the tree side goes through build -> stats -> split/pack -> slot losses.
"""

import dataclasses
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research import losses
from research.trees import synthetic
from research.trees.builder import build_tree
from research.trees.packing import pack_trees
from research.trees.targets import node_stats, normalizer, rollout_advantages, tree_gae

M = 4099  # table size of the path model
GAMMA, LAM = 0.95, 0.9


def _h(path) -> int:
    return zlib.crc32(np.asarray(path, np.int32).tobytes()) % M


def _tables(seed):
    r = np.random.default_rng(seed)
    return {"theta": jnp.asarray(-r.random(M) * 2.0, jnp.float32), "phi": jnp.asarray(r.normal(size=M), jnp.float32),
            "old": jnp.asarray(-r.random(M) * 2.0, jnp.float32), "ref": jnp.asarray(-r.random(M) * 2.0, jnp.float32),
            "v_old": jnp.asarray(r.normal(size=M), jnp.float32)}


def _model(params, tables, h, cfg, behav):
    logp = params["theta"][h]
    old = behav if cfg.is_correction == "none" else tables["old"][h]
    return dict(logp=logp, old=old, ref=tables["ref"][h], ent=params["theta"][h] ** 2,
                values=params["phi"][h], v_old=tables["v_old"][h])


def _groups(seed, forked=False):
    """Three groups; `forked`: with children that replay their parents' first calls (branches at later calls,
    research/trees/synthetic.fork_group) and no duplicated first completions (the tree_grpo oracle's premise)."""
    rng = np.random.default_rng(seed)
    groups = [synthetic.make_group(rng, group_id="t0", harness="codex", sessions=4, turns=3,
                                   p_duplicate=0.0 if forked else 0.8),
              synthetic.make_group(rng, group_id="t0", harness="claude", sessions=3, turns=2,
                                   p_duplicate=0.0 if forked else 0.3),
              synthetic.make_group(rng, group_id="t1", harness="codex", sessions=3, turns=4,
                                   p_duplicate=0.0 if forked else 0.3)]
    return [synthetic.fork_group(rng, *g, forks=2, children=2) for g in groups] if forked else groups


# ------------------------------------------------------------------------------------------------ flat


def _flat_batch(groups):
    calls = [c for cs, _ in groups for c in sorted(cs, key=lambda c: (c.rollout_id, c.session_id, c.call_index))]
    L = max(len(c.completion_ids) for c in calls)
    h = np.zeros((len(calls), L), np.int32)
    behav = np.zeros((len(calls), L), np.float32)
    mask = np.zeros((len(calls), L), bool)
    for i, c in enumerate(calls):
        for k in range(len(c.completion_ids)):
            h[i, k] = _h(c.prompt_ids + c.completion_ids[: k + 1])
            behav[i, k] = c.logprobs[k]
            mask[i, k] = True
    return calls, h, behav, mask


def _flat_grpo_adv(groups, calls, estimator):
    reward = {r.rollout_id: r.reward for _, rs in groups for r in rs}
    by_group: dict = {}
    for _, rs in groups:
        for r in rs:
            by_group.setdefault((r.group_id, r.harness), []).append(r.rollout_id)
    adv = {}
    for rids in by_group.values():
        x = np.asarray([reward[r] for r in rids], np.float64)
        if estimator == "grpo":
            a = (x - x.mean()) / (x.std() + 1e-6)
        elif estimator == "dr_grpo":
            a = x - x.mean()
        else:
            a = x - (x.sum() - x) / (len(x) - 1)
        adv.update(zip(rids, a))
    return np.asarray([adv[c.rollout_id] for c in calls], np.float32)


def _flat_tree_grpo_adv(groups, calls, mask):
    """tree_grpo from its definition on token paths, per group: V(path) = mean reward of the rollouts with a call
    starting with that path; a token's baseline is V of its path's longest prefix that more rollouts share (the
    group's mean if none). Valid where distinct token paths are distinct tree nodes (checked by the caller)."""
    reward = {r.rollout_id: r.reward for _, rs in groups for r in rs}
    adv = np.zeros(mask.shape, np.float32)
    seqs = [(c.group_id, c.harness, c.rollout_id, tuple(c.prompt_ids + c.completion_ids)) for c in calls]
    memo: dict = {}

    def through(g, path):
        if (g, path) not in memo:
            memo[(g, path)] = {rid for gg, h, rid, seq in seqs if (gg, h) == g and seq[:len(path)] == path}
        return memo[(g, path)]

    for i, c in enumerate(calls):
        g = (c.group_id, c.harness)
        x = np.asarray([reward[r] for r in through(g, ())], np.float64)
        seq = tuple(c.prompt_ids + c.completion_ids)
        for k in range(len(c.completion_ids)):
            n = len(c.prompt_ids) + k + 1
            here = through(g, seq[:n])
            q = next((q for q in range(n - 1, 0, -1) if len(through(g, seq[:q])) > len(here)), None)
            base = x.mean() if q is None else np.mean([reward[r] for r in through(g, seq[:q])])
            adv[i, k] = (np.mean([reward[r] for r in here]) - base) / (x.std() + 1e-6)
    return adv


def _flat_gae(groups, calls, values_NxL, mask):
    """Per session: concatenate its calls' completion tokens, terminal reward at the end, textbook loop."""
    reward = {r.rollout_id: r.reward for _, rs in groups for r in rs}
    adv, ret = np.zeros_like(values_NxL), np.zeros_like(values_NxL)
    sessions: dict = {}
    for i, c in enumerate(calls):
        sessions.setdefault((c.rollout_id, c.session_id), []).append(i)
    for (rid, _), idx in sessions.items():
        steps = [(i, k) for i in idx for k in range(int(mask[i].sum()))]
        v = [values_NxL[i, k] for i, k in steps]
        gae = 0.0
        for t in range(len(steps) - 1, -1, -1):
            last = t == len(steps) - 1
            delta = (reward[rid] if last else 0.0) + (0.0 if last else GAMMA * v[t + 1]) - v[t]
            gae = delta + (0.0 if last else GAMMA * LAM * gae)
            adv[steps[t]], ret[steps[t]] = gae, gae + v[t]
    return adv, ret


def _flat_loss(params, tables, groups, cfg, estimator):
    calls, h, behav, mask = _flat_batch(groups)
    m = _model(params, tables, h, cfg, behav)
    if cfg.algo == "ppo":
        adv, ret = _flat_gae(groups, calls, np.asarray(jax.lax.stop_gradient(m["values"])), mask)
    elif estimator == "tree_grpo":
        adv = _flat_tree_grpo_adv(groups, calls, mask)
    else:
        adv = np.broadcast_to(_flat_grpo_adv(groups, calls, estimator)[:, None], h.shape)
    loss = losses.flat_policy_loss(logp_NxL=m["logp"], old_logp_NxL=m["old"], behav_logp_NxL=behav,
                                   adv_NxL=jnp.asarray(adv), mask_NxL=mask, cfg=cfg, ref_logp_NxL=m["ref"],
                                   entropy_NxL=m["ent"])
    if cfg.algo == "ppo":
        loss = loss + cfg.value_coef * losses.flat_value_loss(
            values_NxL=m["values"], old_values_NxL=m["v_old"], returns_NxL=jnp.asarray(ret), mask_NxL=mask, cfg=cfg)
    return loss


# ------------------------------------------------------------------------------------------------ tree


def _tree_batch(params, groups, cfg, estimator, row_len):
    merge = not (cfg.algo == "ppo" and cfg.value_clip is not None)
    trees = [build_tree(cs, rs, merge_generations=merge) for cs, rs in groups]
    node_h = [np.asarray([_h(t.tokens[t.path(n)]) for n in range(t.num_nodes)], np.int32) for t in trees]
    if cfg.algo == "ppo":
        phi = np.asarray(params["phi"])
        gaes = [tree_gae(t, node_values=phi[nh], gamma=GAMMA, lam=LAM) for t, nh in zip(trees, node_h)]
        stats = [node_stats(t, occ_adv=a, occ_ret=r, agg_name=cfg.aggregation) for t, (a, r) in zip(trees, gaes)]
    else:
        advs = rollout_advantages(trees, estimator=estimator)
        stats = [node_stats(t, occ_adv=a, agg_name=cfg.aggregation) for t, a in zip(trees, advs)]
    norms = [normalizer(t, cfg.aggregation) for t in trees]
    packed = pack_trees(trees, stats, norms, row_len=row_len)
    valid = packed["tree_id"] >= 0
    packed["h"] = np.zeros(valid.shape, np.int32)
    for t, nh in enumerate(node_h):
        sel = packed["tree_id"] == t
        packed["h"][sel] = nh[packed["node_id"][sel]]
    return trees, packed


def _tree_loss(params, tables, packed, cfg):
    m = _model(params, tables, packed["h"], cfg, packed["behav_logp"])
    f = lambda k: jnp.asarray(packed[k])
    norm = f("norm").sum()
    loss, metrics = losses.tree_policy_loss(
        logp=m["logp"], old_logp=m["old"], behav_logp=f("behav_logp"), weight=f("weight"), adv_pos=f("adv_pos"),
        adv_neg=f("adv_neg"), count=f("count"), normalizer=norm, cfg=cfg, ref_logp=m["ref"], entropy=m["ent"])
    if cfg.algo == "ppo":
        loss = loss + cfg.value_coef * losses.tree_value_loss(
            values=m["values"], old_values=m["v_old"], weight=f("weight"), ret_sum=f("ret_sum"),
            ret_sq_sum=f("ret_sq_sum"), normalizer=norm, cfg=cfg)
    return loss


VARIANTS = {
    "grpo_token_mean": (losses.LossConfig(), "grpo"),
    "grpo_seq_mean_token_mean": (losses.LossConfig(aggregation="seq_mean_token_mean"), "grpo"),
    "dr_grpo_seq_mean_token_sum": (losses.LossConfig(aggregation="seq_mean_token_sum"), "dr_grpo"),
    "rloo_kl_k3_entropy": (losses.LossConfig(kl_coef=0.1, entropy_coef=0.01), "rloo"),
    "grpo_kl_k1_tis": (losses.LossConfig(kl_coef=0.05, kl_estimator="k1", is_correction="tis"), "grpo"),
    "grpo_mis_seq_mean": (losses.LossConfig(is_correction="mis", aggregation="seq_mean_token_mean"), "grpo"),
    "ppo_token_mean": (losses.LossConfig(algo="ppo"), None),
    "ppo_seq_mean_token_sum_kl": (losses.LossConfig(algo="ppo", aggregation="seq_mean_token_sum", kl_coef=0.1), None),
    "ppo_value_clip_seq_mean": (losses.LossConfig(algo="ppo", value_clip=0.2, aggregation="seq_mean_token_mean"),
                                None),
    "tree_grpo_seq_mean_token_mean": (losses.LossConfig(aggregation="seq_mean_token_mean"), "tree_grpo"),
}
# every variant on plain groups (tree_grpo's oracle needs forked ones) and on groups with forked children
CASES = [(n, False) for n in sorted(VARIANTS) if VARIANTS[n][1] != "tree_grpo"] + [(n, True) for n in sorted(VARIANTS)]


@pytest.mark.parametrize(("name", "forked"), CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_tree_equals_flat_loss_and_grads(name, forked, seed):
    cfg, estimator = VARIANTS[name]
    tables = _tables(seed)
    params = {"theta": tables["theta"] + 0.3 * jnp.sin(jnp.arange(M)), "phi": tables["phi"]}
    groups = _groups(seed, forked=forked)
    trees, packed = _tree_batch(params, groups, cfg, estimator, row_len=96)
    if forked:  # the children's replayed calls are their parents' nodes: the tree holds each distinct path once
        for t, (cs, _) in zip(trees, groups):
            prefixes = {tuple((c.prompt_ids + c.completion_ids)[:n]) for c in cs
                        for n in range(1, len(c.prompt_ids) + len(c.completion_ids) + 1)}
            assert t.num_nodes == len(prefixes) or cfg.value_clip is not None
    if estimator == "tree_grpo":  # its credit differs from the rollouts' GRPO on most tokens of forked groups
        calls, h, _, mask = _flat_batch(groups)
        diff = _flat_tree_grpo_adv(groups, calls, mask) - _flat_grpo_adv(groups, calls, "grpo")[:, None]
        assert (np.abs(diff[mask]) > 0.1).mean() > 0.3
    assert ((packed["segment_ids"] > 0) & ~packed["own"]).any()  # trees were split: ancestor copies exist
    # merged identical generations (of different reward) occur, unless the variant forbids merging
    assert (packed["count"] > 1).any() != (cfg.value_clip is not None)
    flat_l, flat_g = jax.value_and_grad(_flat_loss)(params, tables, groups, cfg, estimator)
    tree_l, tree_g = jax.value_and_grad(_tree_loss)(params, tables, packed, cfg)
    np.testing.assert_allclose(tree_l, flat_l, rtol=1e-5, atol=1e-7)
    for k in params:
        scale = float(jnp.abs(flat_g[k]).max()) + 1e-12
        np.testing.assert_allclose(np.asarray(tree_g[k]) / scale, np.asarray(flat_g[k]) / scale, atol=1e-5, err_msg=k)
    assert float(jnp.abs(flat_g["theta"]).sum()) > 0


def test_tree_gae_equals_per_path_gae():
    groups = _groups(3)
    params = {"phi": _tables(3)["phi"]}
    calls, h, _, mask = _flat_batch(groups)
    values = np.asarray(params["phi"])[h]
    adv, ret = _flat_gae(groups, calls, values, mask)
    trees = [build_tree(cs, rs) for cs, rs in groups]
    flat_i = 0
    for t in trees:
        nh = np.asarray([_h(t.tokens[t.path(n)]) for n in range(t.num_nodes)])
        a, r = tree_gae(t, node_values=np.asarray(params["phi"])[nh], gamma=GAMMA, lam=LAM)
        n_calls = len(t.calls)
        np.testing.assert_allclose(a, adv[flat_i:flat_i + n_calls][mask[flat_i:flat_i + n_calls]], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(r, ret[flat_i:flat_i + n_calls][mask[flat_i:flat_i + n_calls]], rtol=1e-5, atol=1e-6)
        flat_i += n_calls


def test_mismatch_metric_and_is_weights():
    cfg = losses.LossConfig(is_correction="tis", is_cap=2.0)
    w = losses.is_weight(old_logp=jnp.log(jnp.array([3.0, 1.0])), behav_logp=jnp.zeros(2), cfg=cfg)
    np.testing.assert_allclose(w, [2.0, 1.0])
    mis = losses.LossConfig(is_correction="mis", mis_low=0.5, mis_high=2.0)
    w = losses.is_weight(old_logp=jnp.log(jnp.array([3.0, 1.0, 0.25])), behav_logp=jnp.zeros(3), cfg=mis)
    np.testing.assert_allclose(w, [0.0, 1.0, 0.0])
    k3 = losses.mismatch_k3(logp=jnp.log(jnp.array([2.0])), behav_logp=jnp.zeros(1))
    np.testing.assert_allclose(k3, [2.0 - 1.0 - np.log(2.0)], rtol=1e-6)
    with pytest.raises(ValueError, match="unknown loss aggregation 'x'"):
        losses.aggregation("x")


# ----------------------------------------------------------------------------- hand-computed values
# The tree and the flat losses share `_ratio`, `kl_term` and `is_weight`; these pin them to numbers
# worked out by hand, so an error in a shared helper cannot hide behind tree == flat.


def test_kl_estimators_by_hand():
    logp, ref = jnp.log(jnp.asarray([0.5])), jnp.log(jnp.asarray([0.25]))
    np.testing.assert_allclose(losses.kl_term(logp=logp, ref_logp=ref, estimator="k1"), [np.log(2.0)], rtol=1e-6)
    # k3: r = ref / pi = 0.5 -> (r - 1) - log r = -0.5 + log 2
    np.testing.assert_allclose(losses.kl_term(logp=logp, ref_logp=ref, estimator="k3"), [np.log(2.0) - 0.5],
                               rtol=1e-6)
    same = losses.kl_term(logp=logp, ref_logp=logp, estimator="k3")
    assert float(same[0]) == 0.0


def test_ratio_clip_and_is_weights_by_hand():
    cfg = losses.LossConfig(clip_low=0.2, clip_high=0.28, is_correction="tis", is_cap=2.0)
    old = jnp.log(jnp.asarray([0.5, 0.5, 0.5]))
    ratio, clipped = losses._ratio(jnp.log(jnp.asarray([0.7, 0.3, 0.6])), old, cfg)
    np.testing.assert_allclose(ratio, [1.4, 0.6, 1.2], rtol=1e-6)
    np.testing.assert_allclose(clipped, [1.28, 0.8, 1.2], rtol=1e-6)
    behav = jnp.log(jnp.asarray([0.3, 0.9, 0.45]))  # rho = old / behav = 5/3, 5/9, 10/9
    np.testing.assert_allclose(losses.is_weight(old_logp=old, behav_logp=behav, cfg=cfg), [5 / 3, 5 / 9, 10 / 9],
                               rtol=1e-6)
    np.testing.assert_allclose(losses.is_weight(old_logp=jnp.log(jnp.asarray([0.9])),
                                                behav_logp=jnp.log(jnp.asarray([0.3])), cfg=cfg), [2.0], rtol=1e-6)
    mis = dataclasses.replace(cfg, is_correction="mis", mis_low=0.6, mis_high=1.5)
    np.testing.assert_array_equal(losses.is_weight(old_logp=old, behav_logp=behav, cfg=mis), [0.0, 0.0, 1.0])


def test_tree_policy_loss_by_hand():
    """Three slots: a clipped positive, a clipped negative, and a slot holding both signs."""
    cfg = losses.LossConfig(clip_low=0.2, clip_high=0.28)
    logp = jnp.log(jnp.asarray([0.7, 0.3, 0.6]))
    old = jnp.log(jnp.asarray([0.5, 0.5, 0.5]))
    loss, m = losses.tree_policy_loss(
        logp=logp, old_logp=old, behav_logp=old, weight=jnp.asarray([1.0, 1.0, 2.0]),
        adv_pos=jnp.asarray([2.0, 0.0, 1.0]), adv_neg=jnp.asarray([0.0, -1.0, -0.5]),
        count=jnp.asarray([1.0, 1.0, 2.0]), normalizer=jnp.asarray(4.0), cfg=cfg)
    # surrogate: 2 * min(1.4, 1.28) + (-1) * max(0.6, 0.8) + (1 * 1.2 - 0.5 * 1.2) = 2.56 - 0.8 + 0.6 = 2.36
    np.testing.assert_allclose(loss, -2.36 / 4, rtol=1e-6)
    np.testing.assert_allclose(m["clip_frac"], 0.5, rtol=1e-6)  # slots 0 and 1 (1 + 1 of 4 occurrences)
    # the gradient flows only where the ratio is not clipped: d/dlogp of the third slot = -(1 - 0.5) * 1.2 / 4
    g = jax.grad(lambda lp: losses.tree_policy_loss(
        logp=lp, old_logp=old, behav_logp=old, weight=jnp.asarray([1.0, 1.0, 2.0]),
        adv_pos=jnp.asarray([2.0, 0.0, 1.0]), adv_neg=jnp.asarray([0.0, -1.0, -0.5]),
        count=jnp.asarray([1.0, 1.0, 2.0]), normalizer=jnp.asarray(4.0), cfg=cfg)[0])(logp)
    np.testing.assert_allclose(g, [0.0, 0.0, -0.5 * 1.2 / 4], atol=1e-7)
