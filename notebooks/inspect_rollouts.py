# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
# ---

# %% [markdown]
# # Inspect the rollouts of a training run
#
# Opens a workdir written by `python -m launch.train`, picks one rollout group, rebuilds its prefix tree
# from the captured calls (exactly as the trainer did), draws the tree, and lists each call's tokens
# (context vs generated), the rollouts' rewards and their GRPO advantages. Set `WORKDIR` (env
# `INSPECT_WORKDIR`) and optionally `GROUP` (env `INSPECT_GROUP`); figures go to `INSPECT_OUT`.

# %%
import collections
import json
import os
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from research.capture import CallRecord, read_log
from research.models.tokenizer import load_tokenizer
from research.rl.metrics import read_metrics
from research.trees.builder import build_tree
from research.trees.targets import rollout_advantages

WORKDIR = pathlib.Path(os.environ.get("INSPECT_WORKDIR", "/tmp/demo"))
OUT = pathlib.Path(os.environ.get("INSPECT_OUT", str(WORKDIR)))
GROUP = os.environ.get("INSPECT_GROUP", "")
tok = load_tokenizer(json.loads((WORKDIR / "config.json").read_text())["tokenizer_dir"] or None)  # "": packaged

# %% [markdown]
# ## Calls and results of the run, grouped by (group, harness)

# %%
calls, results = collections.defaultdict(list), {}
for rec in read_log(WORKDIR / "capture.jsonl"):
    if isinstance(rec, CallRecord):
        calls[(rec.group_id, rec.harness)].append(rec)
    else:
        results[rec.rollout_id] = rec
groups = sorted(k for k, cs in calls.items() if all(results.get(c.rollout_id) is not None for c in cs))
print(f"{len(groups)} finished groups, {sum(len(v) for v in calls.values())} calls, {len(results)} results")
key = next((g for g in groups if g[0] == GROUP), groups[-1])
group_calls = calls[key]
group_results = [results[r] for r in sorted({c.rollout_id for c in group_calls})]
for r in group_results:
    print(f"{r.rollout_id}: status={r.status} reward={r.reward}")

# %% [markdown]
# ## The group's prefix tree (nodes in DFS order; generated tokens in colour)

# %%
ok = [r for r in group_results if r.status == "ok"]
tree = build_tree([c for c in group_calls if c.rollout_id in {r.rollout_id for r in ok}], ok)
flat_tokens = sum(len(c.prompt_ids) + len(c.completion_ids) for c in group_calls)
print(f"tree: {tree.num_nodes} nodes for {flat_tokens} flat tokens ({flat_tokens / tree.num_nodes:.2f}x)")
(adv,) = rollout_advantages([tree], estimator="grpo")
adv_by_rollout = {tree.calls[c].rollout_id: float(a) for c, a in zip(tree.occ_call, adv)}
gen = tree.is_generated()
fig, ax = plt.subplots(figsize=(10, 4))
x = np.arange(tree.num_nodes)
for n in range(tree.num_nodes):
    p = tree.parent[n]
    if p >= 0:
        ax.plot([p, n], [tree.depth[p], tree.depth[n]], color="0.8", lw=0.5, zorder=1)
node_adv = np.zeros(tree.num_nodes)
node_adv[tree.occ_node] = adv
sc = ax.scatter(x[gen], tree.depth[gen], c=node_adv[gen], cmap="coolwarm", s=6, zorder=2, vmin=-2, vmax=2)
ax.scatter(x[~gen], tree.depth[~gen], color="0.5", s=1, zorder=2, label="context")
fig.colorbar(sc, ax=ax, label="advantage of generated token")
ax.set_xlabel("node (DFS order)")
ax.set_ylabel("depth = RoPE position")
ax.set_title(f"{key[0]} / {key[1]}: {len(tree.calls)} calls of {len(ok)} rollouts")
ax.legend(loc="upper left")
fig.tight_layout()
tree_png = OUT / "rollout_tree.png"
fig.savefig(tree_png, dpi=90)

# %% [markdown]
# ## Each call: the new context it saw, what it generated, its reward and advantage

# %%
rows = []
for c in sorted(group_calls, key=lambda c: (c.rollout_id, c.call_index)):
    r = results[c.rollout_id]
    new_ctx = c.prompt_ids[c.prefix_match_len or 0:] if c.call_index else c.prompt_ids[-40:]
    rows.append(dict(rollout=c.rollout_id, call=c.call_index, version=c.weight_version, reward=r.reward,
                     advantage=adv_by_rollout.get(c.rollout_id), context_tokens=len(c.prompt_ids),
                     generated_tokens=len(c.completion_ids)))
    print(f"--- {c.rollout_id} call {c.call_index} (v{c.weight_version}) reward={r.reward} "
          f"adv={adv_by_rollout.get(c.rollout_id)}")
    print("   context (tail):", repr(tok.decode(list(new_ctx))[-300:]))
    print("   generated     :", repr(tok.decode(c.completion_ids)))

# %% [markdown]
# ## The run's metrics so far

# %%
metrics = read_metrics(WORKDIR)
train_rewards = [(m["step"], m["rollout/all/reward"]) for m in metrics if m["kind"] == "train"]
evals = [(m["step"], m["eval/all/pass_rate"]) for m in metrics if m["kind"] == "eval"]
print("train reward by step:", train_rewards[-10:])
print("held-out pass rate by step:", evals)
