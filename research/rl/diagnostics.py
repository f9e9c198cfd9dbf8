"""What a researcher needs to see an RL update: how much signal the batch carried, and what the step did.

`signal` (before the update, host side): groups, groups whose rewards differ (the only ones with a GRPO
advantage), the share of loss tokens with A > 0 / A < 0, response length, per harness.
`update_effect` (after the update, from a second forward on the SAME batch): the mean change of the
log-prob of the A > 0 and of the A < 0 tokens (a healthy step raises the first and lowers the second),
and KL between the policy before and after the step on the batch's tokens.

Why these: a step can raise the surrogate while *lowering* the log-prob of the tokens it should favour
(measured on this project's CPU demo: with token-mean aggregation and many long failed rollouts, the
push-down of A < 0 tokens drags shared structure down with it), and nothing in the loss shows that.
All statistics are slot level: a slot of a merged tree carries the summed advantages of its
occurrences (research/trees/targets.py), weighted here by its occurrence count.
"""

from __future__ import annotations

import collections

import numpy as np

from research.rl.batches import has_signal
from research.trees.builder import GroupTree


def signal(dev: dict[str, np.ndarray], trees: list[GroupTree]) -> dict[str, float]:
    count = dev["count"]
    pos, neg = count * (dev["adv_pos"] > 0), count * (dev["adv_neg"] < 0)
    n = max(float(count.sum()), 1.0)
    out = {"groups": float(len(trees)), "signal_groups": float(sum(has_signal(t) for t in trees)),
           "adv_tokens": float((count * ((dev["adv_pos"] > 0) | (dev["adv_neg"] < 0))).sum()),
           "pos_token_share": float(pos.sum()) / n, "neg_token_share": float(neg.sum()) / n}
    lens = [c.completion_len for t in trees for c in t.calls]
    out["response_len"] = float(np.mean(lens)) if lens else 0.0
    by_h = collections.defaultdict(list)
    for t in trees:
        by_h[t.harness].append(has_signal(t))
    for h, flags in by_h.items():
        out[f"signal_groups/{h}"] = float(sum(flags))
        out[f"groups/{h}"] = float(len(flags))
    return out


def _mean(x: np.ndarray, w: np.ndarray) -> float:
    s = float(w.sum())
    return float((x * w).sum()) / s if s > 0 else 0.0


def update_effect(dev: dict[str, np.ndarray], *, old_logp: np.ndarray, new_logp: np.ndarray) -> dict[str, float]:
    """dlogp of A > 0 / A < 0 tokens and KL(old || new), KL(new || old) on the batch's loss tokens."""
    count = dev["count"]
    d = np.where(count > 0, new_logp - old_logp, 0.0).astype(np.float64)
    r = np.exp(d)
    return {"dlogp_pos": _mean(d, count * (dev["adv_pos"] > 0)),
            "dlogp_neg": _mean(d, count * (dev["adv_neg"] < 0)),
            "kl_old_new": _mean(r - 1.0 - d, count),  # k3 estimator with samples from pi_old
            "kl_new_old": _mean(r * d, count),  # importance-weighted: E_old[r log r]
            "ratio_max": float(r[count > 0].max(initial=1.0)), "ratio_min": float(r[count > 0].min(initial=1.0))}


def per_row_normaliser(dev: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Spread the batch normaliser over rows in proportion to their loss weight.

    Why: the packer puts a tree's whole normaliser share on the row of its first piece; when the rows are
    split into minibatches each minibatch must be normalised by its own share (for token-mean: its own
    token count), else one minibatch steps too far and another too little."""
    w_B = dev["weight"].sum(axis=1)
    total_w = float(w_B.sum())
    if total_w <= 0:
        return dev
    return {**dev, "norm": (w_B * (float(dev["norm"].sum()) / total_w)).astype(np.float32)}
