"""Advantage estimators: pure keyword-only functions on arrays, plus a small registry.

Group estimators (GRPO family) turn one scalar reward per rollout into one advantage per rollout,
normalised within its group (the trainer assigns one integer group per (task, harness) pair). Tree
estimators (`tree_grpo`) give one advantage per prefix-tree node instead, from node values.
GAE runs along paths of generated tokens (PPO with a critic); context tokens between two generated
tokens are environment transitions, so a path is just the ordered list of its action tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int


def _group_stats(rewards_N, group_ids_N, num_groups):
    ones = jnp.ones_like(rewards_N)
    count_G = jax.ops.segment_sum(ones, group_ids_N, num_groups)
    mean_G = jax.ops.segment_sum(rewards_N, group_ids_N, num_groups) / jnp.maximum(count_G, 1.0)
    return count_G, mean_G


def grpo_advantages(*, rewards_N: Float[Array, "N"], group_ids_N: Int[Array, "N"], num_groups: int,
                    eps: float = 1e-6) -> Float[Array, "N"]:
    """(r - mean) / (std + eps) within each group (population std, as in GRPO)."""
    count_G, mean_G = _group_stats(rewards_N, group_ids_N, num_groups)
    centred_N = rewards_N - mean_G[group_ids_N]
    var_G = jax.ops.segment_sum(centred_N**2, group_ids_N, num_groups) / jnp.maximum(count_G, 1.0)
    return centred_N / (jnp.sqrt(var_G)[group_ids_N] + eps)


def dr_grpo_advantages(*, rewards_N: Float[Array, "N"], group_ids_N: Int[Array, "N"], num_groups: int,
                       eps: float = 1e-6) -> Float[Array, "N"]:
    """Dr.GRPO: r - mean, no std division (removes the difficulty bias of std normalisation)."""
    del eps
    _, mean_G = _group_stats(rewards_N, group_ids_N, num_groups)
    return rewards_N - mean_G[group_ids_N]


def rloo_advantages(*, rewards_N: Float[Array, "N"], group_ids_N: Int[Array, "N"], num_groups: int,
                    eps: float = 1e-6) -> Float[Array, "N"]:
    """RLOO: r_i - mean of the *other* rewards of the group (0 for a group of one)."""
    del eps
    count_G = jax.ops.segment_sum(jnp.ones_like(rewards_N), group_ids_N, num_groups)
    sum_G = jax.ops.segment_sum(rewards_N, group_ids_N, num_groups)
    n_N = count_G[group_ids_N]
    loo_mean_N = (sum_G[group_ids_N] - rewards_N) / jnp.maximum(n_N - 1.0, 1.0)
    return jnp.where(n_N > 1, rewards_N - loo_mean_N, 0.0)


def negated_grpo_advantages(*, rewards_N: Float[Array, "N"], group_ids_N: Int[Array, "N"], num_groups: int,
                            eps: float = 1e-6) -> Float[Array, "N"]:
    """-GRPO: the negated-advantage control. Everything else in the chain unchanged, a run with it must drive
    the reward *down*; a chain that "learns" under both signs learns from something other than the reward."""
    return -grpo_advantages(rewards_N=rewards_N, group_ids_N=group_ids_N, num_groups=num_groups, eps=eps)


GroupEstimator = Callable[..., Float[Array, "N"]]
GROUP_ESTIMATORS: dict[str, GroupEstimator] = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
    "negated_grpo": negated_grpo_advantages,
}


def tree_grpo_advantages(*, node_value_N: Float[Array, "N"], base_value_N: Float[Array, "N"], group_std: float,
                         eps: float = 1e-6) -> Float[Array, "N"]:
    """Per-node credit on a group's prefix tree: (V(node) - V(the branch point above its segment)) / (std + eps).

    V(node) is the mean reward of the rollouts whose calls pass through the node; a segment is a maximal chain of
    nodes the same rollouts pass through, credited against the node where it branched off (the group's mean for a
    segment leaving the root: research/trees/credit.py computes both). The group term is the first segment's:
    below the root's branch every token gets V - mean, so on a tree whose rollouts share nothing after they first
    part this IS GRPO; a segment below a later branch (a forked child's call k, rollouts sharing their first
    tokens) is credited against its siblings' common state instead. `group_std`: the rollouts' population std.
    Plain arithmetic: numpy in, numpy out (the batch builder's host path compiles nothing per tree size)."""
    return (node_value_N - base_value_N) / (group_std + eps)


TreeEstimator = Callable[..., Float[Array, "N"]]
TREE_ESTIMATORS: dict[str, TreeEstimator] = {"tree_grpo": tree_grpo_advantages}
ESTIMATORS = (*GROUP_ESTIMATORS, *TREE_ESTIMATORS)  # every name config.rl.estimator may take


def tree_advantages(name: str, **kw) -> Float[Array, "N"]:
    """Tree registry lookup with a clear error."""
    try:
        fn = TREE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown tree estimator {name!r}; known: {sorted(TREE_ESTIMATORS)}") from None
    return fn(**kw)


def group_advantages(name: str, **kw) -> Float[Array, "N"]:
    """Registry lookup with a clear error."""
    try:
        fn = GROUP_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(GROUP_ESTIMATORS)} (tree "
                         f"estimators {sorted(TREE_ESTIMATORS)}: research.trees.targets.rollout_advantages)") from None
    return fn(**kw)


def segment_gae(*, values_O: Float[Array, "O"], rewards_O: Float[Array, "O"], last_O: Bool[Array, "O"],
                gamma: float, lam: float) -> tuple[Float[Array, "O"], Float[Array, "O"]]:
    """GAE over concatenated paths (each path's actions in order; `last_O` marks its final action).

    V after a path's final action is 0 (terminal). Returns (advantages, returns = adv + V).
    """
    values_O, rewards_O = jnp.asarray(values_O), jnp.asarray(rewards_O)
    next_v_O = jnp.where(last_O, 0.0, jnp.roll(values_O, -1))
    delta_O = rewards_O + gamma * next_v_O - values_O
    cont_O = jnp.where(last_O, 0.0, gamma * lam)

    def body(carry, x):
        delta, cont = x
        adv = delta + cont * carry
        return adv, adv

    _, adv_O = jax.lax.scan(body, jnp.zeros((), values_O.dtype), (delta_O, cont_O), reverse=True)
    return adv_O, adv_O + values_O
