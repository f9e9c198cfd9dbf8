"""pass@1, pass@k (unbiased estimator) and pass^k from rollout results, per harness and per category.

For a task with n samples of which c succeeded:
  pass@k = 1 - C(n-c, k) / C(n, k)   the chance that at least one of k samples succeeds (Chen et al.,
                                      unbiased when drawn without replacement from the n);
  pass^k = C(c, k) / C(n, k)          the chance that all k succeed (tau-bench's reliability metric).
Both are averaged over tasks. A rollout succeeds when its status is ok and reward >= threshold; every
other status counts as a failure (and is reported separately, so infra trouble is not hidden).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Sequence
from math import comb

from research.capture import RolloutResult


def pass_at_k(n: int, c: int, k: int) -> float:
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n} c={c} k={k}")
    if k > n:
        raise ValueError(f"k={k} > n={n} samples")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return comb(c, k) / comb(n, k)


def success(r: RolloutResult, threshold: float = 1.0) -> bool:
    return r.success(threshold)  # one definition: research/capture.py


@dataclasses.dataclass
class Row:
    harness: str
    group: str  # a category name, or "all"
    tasks: int
    rollouts: int
    metrics: dict[str, float]
    mean_reward: float
    statuses: dict[str, int]


def _task_of(r: RolloutResult) -> str:
    return str(r.meta.get("task_id") or r.group_id.rsplit("/", 1)[0])


def table(results: Iterable[RolloutResult], ks: Sequence[int], threshold: float = 1.0) -> list[Row]:
    """One row per (harness, category) and per (harness, "all"); k larger than a task's n is skipped."""
    by: dict[tuple[str, str], list[RolloutResult]] = collections.defaultdict(list)
    for r in results:
        by[(r.harness, _task_of(r))].append(r)
    groups: dict[tuple[str, str], list[tuple[str, list[RolloutResult]]]] = collections.defaultdict(list)
    for (h, task), rs in sorted(by.items()):
        cat = str(rs[0].meta.get("category", "unknown"))
        groups[(h, cat)].append((task, rs))
        groups[(h, "all")].append((task, rs))
    rows = []
    for (h, g), tasks in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "all", kv[0][1])):
        metrics: dict[str, float] = {}
        for k in ks:
            eligible = [(len(rs), sum(success(r, threshold) for r in rs)) for _, rs in tasks if len(rs) >= k]
            if eligible:
                metrics[f"pass@{k}"] = sum(pass_at_k(n, c, k) for n, c in eligible) / len(eligible)
                metrics[f"pass^{k}"] = sum(pass_hat_k(n, c, k) for n, c in eligible) / len(eligible)
        all_rs = [r for _, rs in tasks for r in rs]
        rewards = [r.reward if r.status == "ok" and r.reward is not None else 0.0 for r in all_rs]
        rows.append(Row(h, g, len(tasks), len(all_rs), metrics, sum(rewards) / len(rewards),
                        dict(collections.Counter(r.status for r in all_rs))))
    return rows
