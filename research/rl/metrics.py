"""Run metrics: metrics.jsonl (one line per record, fsync'd), TensorBoard events, reward-curve PNG.

Why JSONL as the source of truth: a killed run keeps every line it wrote, a resumed run appends, and
the plot / notebook / tests read the same file. TensorBoard is a view of it.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import statistics

from research.capture import RolloutResult


def rollout_metrics(results: list[RolloutResult], prefix: str = "rollout") -> dict[str, float]:
    """Reward / pass rate overall and per harness, failure counts by status, latency."""
    out: dict[str, float] = {}
    by_h: dict[str, list[RolloutResult]] = collections.defaultdict(list)
    for r in results:
        by_h[r.harness].append(r)
    for name, rs in [("all", results), *sorted(by_h.items())]:
        if not rs:
            continue
        rewards = [r.reward if r.reward is not None else 0.0 for r in rs]
        out[f"{prefix}/{name}/reward"] = statistics.fmean(rewards)
        out[f"{prefix}/{name}/pass_rate"] = statistics.fmean([float(r.success()) for r in rs])
        out[f"{prefix}/{name}/count"] = float(len(rs))
    for status, n in collections.Counter(r.status for r in results).items():
        out[f"{prefix}/status/{status}"] = float(n)
    for cause, n in collections.Counter((r.meta or {}).get("cause") for r in results if r.status != "ok").items():
        out[f"{prefix}/cause/{cause or 'unattributed'}"] = float(n)  # harness_env/attribution.py
    out[f"{prefix}/tampered"] = float(sum(bool((r.meta or {}).get("tampered")) for r in results))  # tamper.py
    lat = [r.timings.get("total_s", 0.0) for r in results if r.timings]
    if lat:
        out[f"{prefix}/latency_s"] = statistics.fmean(lat)
    return out


class MetricsWriter:
    def __init__(self, workdir: pathlib.Path, *, tensorboard: bool = True):
        self.path = workdir / "metrics.jsonl"
        self._f = open(self.path, "a")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(workdir / "tb"))

    def write(self, step: int, metrics: dict[str, float], kind: str = "train") -> None:
        self._f.write(json.dumps({"kind": kind, "step": step, **metrics}) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, int | float):
                    self._tb.add_scalar(f"{kind}/{k}", v, step)
            self._tb.flush()

    def close(self) -> None:
        self._f.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(workdir: pathlib.Path) -> list[dict]:
    path = pathlib.Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # torn last line of a killed run
            continue
    return out


def last_per_step(workdir: pathlib.Path, kind: str = "train") -> list[dict]:
    """The run's `kind` records in step order, the last one per step (a resumed run rewrites the steps after its
    checkpoint)."""
    last = {r["step"]: r for r in read_metrics(workdir) if r["kind"] == kind}
    return [last[s] for s in sorted(last)]


def median_of(records: list[dict], key: str, *, default: float = 0.0, positive: bool = False) -> float:
    """The median of `key` over `records` (missing: `default`; `positive`: only values > 0); NaN without any."""
    vals = [r.get(key, default) for r in records]
    vals = [v for v in vals if v > 0] if positive else vals
    return float(statistics.median(vals)) if vals else float("nan")


def plot_rewards(workdir: pathlib.Path) -> pathlib.Path:
    """reward_curve.png: train reward + pass rate per step, eval pass rate (held-out) per eval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(workdir)
    last: dict[tuple[str, int], dict] = {}
    for r in rows:  # a resumed run rewrites steps: keep the last record per (kind, step)
        last[(r["kind"], r["step"])] = r
    fig, ax = plt.subplots(figsize=(7, 4))
    for kind, key, label, style in (("train", "rollout/all/reward", "train reward", "-"),
                                    ("train", "rollout/all/pass_rate", "train pass rate", "--"),
                                    ("sft", "nll", "sft nll (right axis)", None),
                                    ("eval", "eval/all/pass_rate", "held-out pass rate (greedy)", "-o")):
        pts = sorted((s, r[key]) for (k, s), r in last.items() if k == kind and key in r)
        if not pts or style is None:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
        if kind == "eval":  # when held-out evals happened, in minutes since the run started (not crowded)
            span, prev = max(s for (_, s) in last) or 1, None
            for st, r in sorted((s, r) for (k, s), r in last.items() if k == "eval" and "eval/elapsed_min" in r):
                if prev is None or st - prev >= 0.06 * span:
                    ax.annotate(f"{r['eval/elapsed_min']:.0f} min", (st, r[key]), textcoords="offset points",
                                xytext=(0, 6), ha="center", fontsize=7)
                    prev = st
    sft_steps = [s for (k, s) in last if k == "sft"]
    if sft_steps and any(k == "train" for (k, _) in last):
        ax.axvline(max(sft_steps), color="grey", ls=":", lw=1)
        ax.annotate("SFT | RL", (max(sft_steps), 0.5), textcoords="offset points", xytext=(3, 0), fontsize=7,
                    color="grey")
    ax.set_xlabel("step (SFT steps, then RL steps)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"{pathlib.Path(workdir).name}: reward / pass rate")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    out = pathlib.Path(workdir) / "reward_curve.png"
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_runs(workdirs: list[str | pathlib.Path], out: str | pathlib.Path, *, labels: list[str] | None = None,
              title: str = "held-out pass rate") -> pathlib.Path:
    """Held-out pass rate (greedy evals) of several runs against minutes since each run started, one line per
    run (for a run and its control: e.g. RL after SFT vs the same minutes spent on more SFT). The x axis is
    wall-clock minutes because the compared runs spend their steps on different things."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, wd in enumerate(workdirs):
        last: dict[int, dict] = {}
        for r in read_metrics(pathlib.Path(wd)):
            if r["kind"] == "eval" and "eval/elapsed_min" in r:
                last[r["step"]] = r
        pts = sorted((r["eval/elapsed_min"], r["eval/all/pass_rate"]) for r in last.values())
        if not pts:
            raise ValueError(f"{wd}: no held-out evals in metrics.jsonl")
        label = labels[i] if labels else pathlib.Path(wd).name
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", ms=3, label=label)
        rl = [r for r in read_metrics(pathlib.Path(wd)) if r["kind"] == "train"]
        if rl:  # where the RL phase began (the first RL step's eval time is not logged; the last pre-RL eval is)
            start = max((r["eval/elapsed_min"] for s, r in last.items() if s <= min(x["step"] for x in rl) - 1),
                        default=None)
            if start is not None:
                ax.axvline(start, color=ax.lines[-1].get_color(), ls=":", lw=1)
    ax.set_xlabel("minutes since the run started")
    ax.set_ylabel("held-out pass rate (greedy)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    out = pathlib.Path(out)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
