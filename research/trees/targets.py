"""Per-occurrence advantages/returns -> per-node loss statistics (host-side numpy).

The loss (research/losses.py) sees one slot per tree node holding sums over the node's loss
occurrences: weight = sum c_o, adv_pos/adv_neg = sums of c_o A_o by sign of A_o, ret_sum/ret_sq_sum =
sums of c_o R_o and c_o R_o^2, count = number of occurrences (for token-mean metrics). c_o is the
aggregation coefficient of the occurrence's call (research.losses.AGGREGATIONS).
"""

from __future__ import annotations

import numpy as np

from research import advantages as adv_lib
from research import losses
from research.trees import credit
from research.trees.batch import STAT_FIELDS
from research.trees.builder import GroupTree


def call_lengths(tree: GroupTree) -> np.ndarray:
    return np.asarray([c.completion_len for c in tree.calls], np.int32)


def occ_coef(tree: GroupTree, agg_name: str) -> np.ndarray:
    """[O] aggregation coefficient of each loss occurrence."""
    coef_C = np.asarray(losses.aggregation(agg_name).coef(call_lengths(tree)))
    return coef_C[tree.occ_call].astype(np.float64)


def normalizer(tree: GroupTree, agg_name: str) -> float:
    """The tree's share of the batch denominator (tokens or calls)."""
    return float(np.asarray(losses.aggregation(agg_name).norm(call_lengths(tree))).sum())


def node_stats(tree: GroupTree, *, occ_adv: np.ndarray, agg_name: str,
               occ_ret: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Scatter occurrences into [N] float32 sums (accumulated in float64)."""
    c = occ_coef(tree, agg_name)
    occ_adv = np.asarray(occ_adv, np.float64)
    occ_ret = np.zeros_like(occ_adv) if occ_ret is None else np.asarray(occ_ret, np.float64)
    out = {k: np.zeros(tree.num_nodes, np.float64) for k in STAT_FIELDS}
    pos = occ_adv >= 0
    np.add.at(out["weight"], tree.occ_node, c)
    np.add.at(out["count"], tree.occ_node, 1.0)
    np.add.at(out["adv_pos"], tree.occ_node, np.where(pos, c * occ_adv, 0.0))
    np.add.at(out["adv_neg"], tree.occ_node, np.where(pos, 0.0, c * occ_adv))
    np.add.at(out["ret_sum"], tree.occ_node, c * occ_ret)
    np.add.at(out["ret_sq_sum"], tree.occ_node, c * occ_ret**2)
    return {k: v.astype(np.float32) for k, v in out.items()}


def rollout_advantages(trees: list[GroupTree], *, estimator: str) -> list[np.ndarray]:
    """GRPO-family: one advantage per rollout, normalised within each (group_id, harness) group.
    Tree estimators (`tree_grpo`): one per node, from the group's tree (research/trees/credit.py).

    Returns per tree the [O] advantage of each occurrence (its rollout's, or its node's).
    """
    if estimator in adv_lib.TREE_ESTIMATORS:
        return _tree_estimator(trees, estimator)
    keys, rewards, gids, group_of, seen = [], [], [], {}, set()
    for t in trees:
        gid = group_of.setdefault((t.group_id, t.harness), len(group_of))
        for rid, r in dict((c.rollout_id, c.reward) for c in t.calls).items():
            if (gid, rid) in seen:  # a rollout split over several trees (e.g. the flat one-call-per-tree view)
                continue
            seen.add((gid, rid))
            keys.append((gid, rid))
            rewards.append(r)
            gids.append(gid)
    adv = np.asarray(adv_lib.group_advantages(
        estimator, rewards_N=np.asarray(rewards, np.float32), group_ids_N=np.asarray(gids, np.int32),
        num_groups=len(group_of)))
    by_key = dict(zip(keys, adv.tolist()))
    return [np.asarray([by_key[(group_of[(t.group_id, t.harness)], t.calls[ci].rollout_id)] for ci in t.occ_call],
                       np.float32) for t in trees]


def _tree_estimator(trees: list[GroupTree], estimator: str) -> list[np.ndarray]:
    """A tree estimator needs each group whole in one tree (node values come from all of its rollouts)."""
    seen: dict[tuple[str, str], int] = {}
    for i, t in enumerate(trees):
        if seen.setdefault((t.group_id, t.harness), i) != i:
            raise ValueError(f"estimator {estimator!r} needs each group in one tree; group {t.group_id!r} harness "
                             f"{t.harness!r} is split over trees {seen[(t.group_id, t.harness)]} and {i}")
    return [credit.occurrence_advantages(t, estimator=estimator) for t in trees]


def path_last(tree: GroupTree) -> np.ndarray:
    """[O] True at the final action of each GAE path (= a session of a rollout; occurrences are in path order)."""
    ids: dict[tuple[str, str], int] = {}
    sess = np.asarray([ids.setdefault((c.rollout_id, c.session_id), len(ids)) for c in tree.calls])[tree.occ_call]
    last = np.ones(len(sess), bool)
    last[:-1] = sess[:-1] != sess[1:]
    return last


def tree_gae(tree: GroupTree, *, node_values: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """GAE along each session's actions: V of action o is the value of its node (predicted from its parent).

    The terminal reward of the rollout is given at the path's last action. Returns [O] (adv, ret).
    """
    last = path_last(tree)
    reward_C = np.asarray([c.reward for c in tree.calls], np.float32)
    rewards = np.where(last, reward_C[tree.occ_call], 0.0).astype(np.float32)
    values = np.asarray(node_values, np.float32)[tree.occ_node]
    adv, ret = adv_lib.segment_gae(values_O=values, rewards_O=rewards, last_O=last, gamma=gamma, lam=lam)
    return np.asarray(adv), np.asarray(ret)


def ppo_stats_from_values(trees: list[GroupTree], packed: dict[str, np.ndarray], values_BxT: np.ndarray, *,
                          gamma: float, lam: float, aggregation: str) -> dict[str, np.ndarray]:
    """PPO: GAE on each tree with the pre-pass values; returns `packed` with fresh stats and `old_values`."""
    values_BxT = np.asarray(values_BxT, np.float32)
    own = packed["own"]
    out = dict(packed)
    node_values = [np.zeros(t.num_nodes, np.float32) for t in trees]
    for b, i in zip(*np.nonzero(own)):
        node_values[packed["tree_id"][b, i]][packed["node_id"][b, i]] = values_BxT[b, i]
    stats = []
    for t, nv in zip(trees, node_values):
        adv, ret = tree_gae(t, node_values=nv, gamma=gamma, lam=lam)
        stats.append(node_stats(t, occ_adv=adv, occ_ret=ret, agg_name=aggregation))
    for k in STAT_FIELDS:
        arr = np.zeros_like(packed[k])
        for t, s in enumerate(stats):
            sel = own & (packed["tree_id"] == t)
            arr[sel] = s[k][packed["node_id"][sel]]
        out[k] = arr
    out["old_values"] = values_BxT
    return out
