# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Prefix-tree losses equal flat per-call losses
#
# A harness calls the model many times per rollout and each prompt repeats the history. We merge the
# calls of a group into a token trie and train on the trie. This notebook builds a tiny group by
# hand, shows the tree, and compares the flat per-call loss and gradient with the tree loss and
# gradient for every aggregation, for GRPO and for PPO with a value loss.

# %%
import os
import zlib

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from research import losses
from research.capture import CallRecord, RolloutResult
from research.trees.builder import build_tree
from research.trees.packing import pack_trees
from research.trees.targets import node_stats, normalizer, rollout_advantages, tree_gae

OUT_DIR = os.environ.get("NOTEBOOK_OUT", ".")


def call(rid, k, prompt, comp, lps):
    return CallRecord(rollout_id=rid, session_id=rid, group_id="task", harness="demo", call_index=k,
                      prompt_ids=prompt, completion_ids=comp, logprobs=lps, weight_version=0, finish_reason="stop")


# %% [markdown]
# Three sessions of one task share the system prompt `[1, 2, 3]`. Session **a** appends (one path);
# session **b** generated exactly what **a** generated in its first call (same tokens, same
# rollout log-probs: merged nodes shared by trajectories of different reward); session **c** branches.

# %%
SYS = [1, 2, 3]
calls = [
    call("a", 0, SYS + [10], [20, 21], [-0.5, -1.0]),
    call("a", 1, SYS + [10, 20, 21, 30], [22, 23, 24], [-0.2, -0.7, -1.5]),
    call("b", 0, SYS + [10], [20, 21], [-0.5, -1.0]),
    call("b", 1, SYS + [10, 20, 21, 31], [25], [-0.3]),
    call("c", 0, SYS + [11], [26, 27], [-0.9, -0.4]),
]
results = [RolloutResult(rollout_id=r, group_id="task", harness="demo", status="ok", reward=x)
           for r, x in (("a", 1.0), ("b", 0.0), ("c", 0.5))]
tree = build_tree(calls, results)
gen = tree.is_generated()
through = tree.node_rollouts()
for n in range(tree.num_nodes):
    print(f"node {n:2d} depth {tree.depth[n]}  token {tree.tokens[n]:3d}  parent {tree.parent[n]:2d}  "
          f"{'gen' if gen[n] else 'ctx'}  rollouts {sorted(through[n])}")
flat_tokens = sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls)
print(f"flat tokens {flat_tokens}, tree tokens {tree.num_nodes}")

# %% [markdown]
# A stand-in for the model: every quantity (log-prob, value) is a function of the token path, looked
# up in a table by a hash of the path — exactly the sharing a real model has.

# %%
M = 257
theta0 = jnp.asarray(-np.random.default_rng(0).random(M) * 2.0, jnp.float32) + 0.3
phi0 = jnp.asarray(np.random.default_rng(1).normal(size=M), jnp.float32)
h = lambda path: zlib.crc32(np.asarray(path, np.int32).tobytes()) % M
node_h = np.asarray([h(tree.tokens[tree.path(n)]) for n in range(tree.num_nodes)])

L = max(len(c.completion_ids) for c in calls)
flat_h = np.zeros((len(calls), L), np.int32)
flat_mask = np.zeros((len(calls), L), bool)
flat_behav = np.zeros((len(calls), L), np.float32)
for i, c in enumerate(sorted(calls, key=lambda c: (c.rollout_id, c.call_index))):
    for k, _ in enumerate(c.completion_ids):
        flat_h[i, k] = h(c.prompt_ids + c.completion_ids[: k + 1])
        flat_mask[i, k], flat_behav[i, k] = True, c.logprobs[k]
rollout_of_row = [c.rollout_id for c in sorted(calls, key=lambda c: (c.rollout_id, c.call_index))]

# %% [markdown]
# GRPO: flat loss on [calls, tokens] arrays vs tree loss on the packed row, every aggregation.

# %%
occ_adv = rollout_advantages([tree], estimator="grpo")[0]
adv_of = {tree.calls[c].rollout_id: a for c, a in zip(tree.occ_call, occ_adv)}
flat_adv = np.asarray([[adv_of[r]] * L for r in rollout_of_row], np.float32)
rows = []
for agg in losses.AGGREGATIONS:
    cfg = losses.LossConfig(aggregation=agg, kl_coef=0.0, entropy_coef=0.0)
    packed = pack_trees([tree], [node_stats(tree, occ_adv=occ_adv, agg_name=agg)], [normalizer(tree, agg)],
                        row_len=32)
    slot_h = jnp.asarray(node_h[np.maximum(packed["node_id"], 0)])

    def flat_loss(theta, cfg=cfg):
        lp = theta[flat_h]
        return losses.flat_policy_loss(logp_NxL=lp, old_logp_NxL=flat_behav - 0.1, behav_logp_NxL=flat_behav,
                                       adv_NxL=flat_adv, mask_NxL=flat_mask, cfg=cfg)

    def tree_loss(theta, cfg=cfg, packed=packed, slot_h=slot_h):
        p = {k: jnp.asarray(v) for k, v in packed.items()}
        return losses.tree_policy_loss(
            logp=theta[slot_h], old_logp=p["behav_logp"] - 0.1, behav_logp=p["behav_logp"], weight=p["weight"],
            adv_pos=p["adv_pos"], adv_neg=p["adv_neg"], count=p["count"], normalizer=p["norm"].sum(), cfg=cfg)[0]

    fl, fg = jax.value_and_grad(flat_loss)(theta0)
    tl, tg = jax.value_and_grad(tree_loss)(theta0)
    rows.append((agg, float(fl), float(tl), float(jnp.abs(fg - tg).max() / jnp.abs(fg).max())))
    print(f"{agg:22s} flat {float(fl):+.7f}  tree {float(tl):+.7f}  max rel grad diff {rows[-1][3]:.1e}")
grads = (np.asarray(fg), np.asarray(tg))

# %% [markdown]
# PPO with a critic: GAE along each session's generated tokens on the tree, value loss from the
# per-node sums of returns.

# %%
adv, ret = tree_gae(tree, node_values=np.asarray(phi0)[node_h], gamma=1.0, lam=0.95)
print("occurrence advantages", np.round(adv, 3))
st = node_stats(tree, occ_adv=adv, occ_ret=ret, agg_name="token_mean")
cfg = losses.LossConfig(algo="ppo")
vt = lambda phi: losses.tree_value_loss(values=phi[node_h], old_values=phi[node_h], weight=st["weight"],
                                        ret_sum=st["ret_sum"], ret_sq_sum=st["ret_sq_sum"],
                                        normalizer=normalizer(tree, "token_mean"), cfg=cfg)
vf = lambda phi: 0.5 * jnp.mean((phi[node_h[tree.occ_node]] - ret) ** 2)  # token mean over every (call, token)
print(f"value loss  flat {float(vf(phi0)):.7f}  tree {float(vt(phi0)):.7f}")
rows.append(("ppo value", float(vf(phi0)), float(vt(phi0)), 0.0))
max_rel_diff = max(abs(f - t) / max(abs(f), 1e-12) for _, f, t, _ in rows)
max_rel_diff = max(max_rel_diff, *(r[3] for r in rows))
print("max relative difference over all variants:", max_rel_diff)

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
names = [r[0] for r in rows]
x = np.arange(len(rows))
ax1.bar(x - 0.2, [r[1] for r in rows], 0.4, label="flat per call")
ax1.bar(x + 0.2, [r[2] for r in rows], 0.4, label="tree")
ax1.set_xticks(x, names, rotation=20)
ax1.set_title("loss")
ax1.legend()
nz = np.nonzero(grads[0])[0]
ax2.scatter(grads[0][nz], grads[1][nz])
ax2.set_xlabel("flat d loss / d theta")
ax2.set_ylabel("tree d loss / d theta")
ax2.set_title(f"gradients ({len(nz)} path entries)")
fig.tight_layout()
plot_path = os.path.join(OUT_DIR, "tree_losses.png")
fig.savefig(plot_path)
print("saved", plot_path)
