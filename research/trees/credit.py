"""Node values on a group's prefix tree and the branch-segment baselines a tree estimator credits against.

Why: a group whose tree branches only after the prompt gives each rollout one advantage for all its tokens. Once
rollouts share more (a forked child replays its parent's first k calls: harness_env/rl/branching.py), the tree
holds Monte Carlo values of intermediate states: the mean reward of the rollouts below a node. A token on a
segment below a branch point can then be credited against the alternatives taken at that same state.

Definitions (host-side numpy; `research/advantages.py` has the estimator's arithmetic):
  * rollouts through node n: those with a call whose root path contains n, i.e. whose call's end node lies in n's
    subtree (DFS pre-order: [n, subtree_end[n]]). V(n) = their mean reward, C(n) = how many.
  * segment: a maximal chain of nodes the same rollouts pass through. Sets only shrink going down, so a node
    starts a segment iff it is a root or C(n) != C(parent); a non-starting node is its parent's only child, so in
    DFS pre-order a segment is a contiguous run of nodes.
  * baseline of a segment: V of the node it hangs from (where it branched off), or the group's mean reward for a
    segment starting at a root (the virtual root every rollout of the group passes through).
"""

from __future__ import annotations

import numpy as np

from research import advantages as adv_lib
from research.trees.builder import GroupTree


def rollout_rewards(tree: GroupTree) -> dict[str, float]:
    """Each rollout of the tree once, with its reward."""
    return {c.rollout_id: c.reward for c in tree.calls}


def node_values(tree: GroupTree) -> tuple[np.ndarray, np.ndarray]:
    """([N] mean reward of the rollouts through each node, [N] their number), O(rollouts x N)."""
    n = tree.num_nodes
    ends: dict[str, list[int]] = {}
    for c in tree.calls:
        ends.setdefault(c.rollout_id, []).append(c.end_node)
    reward = rollout_rewards(tree)
    count, total = np.zeros(n, np.float64), np.zeros(n, np.float64)
    lo, hi = np.arange(n), tree.subtree_end.astype(np.int64) + 1
    for rid, nodes in ends.items():
        cum = np.zeros(n + 1, np.int64)
        np.add.at(cum, np.asarray(nodes) + 1, 1)
        cum = np.cumsum(cum)  # cum[i]: this rollout's end nodes before node i
        through = (cum[hi] - cum[lo]) > 0
        count += through
        total += np.where(through, reward[rid], 0.0)
    return total / np.maximum(count, 1.0), count


def segment_baselines(tree: GroupTree, values: np.ndarray, counts: np.ndarray, root_value: float) -> np.ndarray:
    """[N] the value each node's segment is credited against (see the module doc)."""
    parent = tree.parent.astype(np.int64)
    has_parent = parent >= 0
    p = np.maximum(parent, 0)
    starts = ~has_parent | (counts[p] != counts)
    start_value = np.where(has_parent, values[p], root_value)
    seg_start = np.maximum.accumulate(np.where(starts, np.arange(tree.num_nodes), 0))
    return start_value[seg_start]


def occurrence_advantages(tree: GroupTree, *, estimator: str, eps: float = 1e-6) -> np.ndarray:
    """[O] a tree estimator's advantage of each loss occurrence (its node's), the tree holding one whole group."""
    rewards = np.asarray(list(rollout_rewards(tree).values()), np.float64)
    values, counts = node_values(tree)
    base = segment_baselines(tree, values, counts, float(rewards.mean()))
    adv = adv_lib.tree_advantages(estimator, node_value_N=values, base_value_N=base, group_std=float(rewards.std()),
                                  eps=eps)
    return np.asarray(adv, np.float32)[tree.occ_node]
