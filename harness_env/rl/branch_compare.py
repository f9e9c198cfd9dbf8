"""Branching + per-turn credit vs trajectory-level GRPO at the same rollout budget (configs/branching.py), per seed
from one shared SFT checkpoint, and the recovery metric before and after RL.

Why one SFT per seed: which SFT policy a seed produces decides where RL starts; two arms that start from different
checkpoints compare the starts, not the estimators. So per seed (every part resumable, as in harness_env/rl/sweep.py):

  WORKDIR/seed{s}/sft         the SFT phase (`algo="sft"`; its eval after SFT is both arms' start);
  WORKDIR/seed{s}/trajectory  a copy of sft/, resumed with the trajectory arm: 8 groups x 4 fresh rollouts, `grpo`;
  WORKDIR/seed{s}/branching   a copy of sft/, resumed with the branching arm: 8 x 3 fresh + <= 8 forked, `tree_grpo`;
  WORKDIR/seed{s}/control     a copy of sft/, resumed with SFT only, for as many more SFT steps as the trajectory
                              arm's work minutes buy at the SFT phase's pace (sweep.py's control): is a gain RL's, or
                              would more of the same demonstrations have given it?

The result, `compare.json`: per seed and arm the held-out curve, the recovery (sweep.recovery: of the held-out
rollouts with a failed tool call, the share that succeeded) at RL start and at the end, and the branching arm's
replay match rate, children and tree-vs-flat tokens per step; the control at the trajectory arm's final minutes;
then medians over seeds.
"""

from __future__ import annotations

import copy
import json
import logging
import pathlib
import statistics

from configs import branching
from harness_env.rl.sweep import at_or_after, control_steps, evals, median_curve, recovery, run_part
from research.rl.config import override
from research.rl.metrics import last_per_step, median_of

log = logging.getLogger(__name__)
ARMS = ("trajectory", "branching")


def arm_configs(overrides: dict | None = None, variant: str = "") -> dict:  # {part: ml_collections.ConfigDict}
    """The SFT phase (the trajectory arm's config with `algo="sft"`: the arms differ only after SFT) and both arms."""
    v = f",{variant}" if variant else ""
    parts = {"sft": override(branching.get_config(f"trajectory{v}"), {"algo": "sft"}),
             **{a: branching.get_config(f"{a}{v}") for a in ARMS}}
    return {k: override(copy.deepcopy(c), dict(overrides or {})) for k, c in parts.items()}


def _step_metrics(workdir: pathlib.Path) -> dict:
    """The arm's RL steps: medians of rollout and update seconds and tree-vs-flat tokens; its forked children."""
    steps = last_per_step(workdir)
    kids = sum(m.get("branch/all/children", 0.0) for m in steps)
    match = sum(m.get("branch/all/replay_match", 0.0) for m in steps)
    return {"steps": len(steps), "rollout_s": median_of(steps, "rollout_s"), "train_s": median_of(steps, "train_s"),
            "tree_vs_flat": median_of(steps, "tree_compression"), "children_per_step": kids / max(len(steps), 1),
            "replay_match_rate": match / kids if kids else float("nan"),
            "train_reward": [round(m.get("rollout/all/reward", 0.0), 3) for m in steps]}


def _control(parts: dict, base: pathlib.Path, sft_steps: int) -> dict:
    """SFT only from the SFT checkpoint for the trajectory arm's work minutes; its eval at (or just after) the
    minute the trajectory arm ended, and the recovery there."""
    traj = evals(base / "trajectory")
    extra = control_steps(evals(base / "sft"), traj, sft_steps)
    cfg = override(copy.deepcopy(parts["sft"]), {"sft.steps": sft_steps + extra, "eval.sft_every": max(1, extra // 4),
                                                 "eval.after_sft": True})
    run_part(cfg, base / "control", source=base / "sft")
    curve = [p for p in evals(base / "control") if p["version"] >= sft_steps]
    at = at_or_after(curve[1:] or curve, traj[-1]["minutes"])
    return {"steps": at["version"] - sft_steps, "final": at["pass"], "recovery_final": recovery(base / "control",
                                                                                                at["version"]),
            "curve": [(p["version"] - sft_steps, p["pass"]) for p in curve], "curve_minutes": _by_minute(curve)}


def _by_minute(curve: list[dict]) -> list[tuple[float, float]]:
    """(work minutes since the shared SFT checkpoint, pass@1) of a part's evals from that checkpoint's on."""
    return [(round(p["minutes"] - curve[0]["minutes"], 2), p["pass"]) for p in curve]


def run_seed(seed: int, root: pathlib.Path, overrides: dict | None = None, *, variant: str = "",
             control: bool = True) -> dict:
    parts = arm_configs({"seed": seed, **(overrides or {})}, variant)
    base = root / f"seed{seed}"
    base.mkdir(parents=True, exist_ok=True)
    log.info("branch_compare seed %d: SFT", seed)
    run_part(parts["sft"], base / "sft")
    sft_steps = int(parts["sft"].sft.steps)
    row = {"seed": seed, "sft_steps": sft_steps}
    for arm in ARMS:
        log.info("branch_compare seed %d: %s arm from the SFT checkpoint", seed, arm)
        run_part(parts[arm], base / arm, source=base / "sft")
        curve = evals(base / arm)
        start = [p for p in curve if p["version"] <= sft_steps][-1]
        final = curve[-1]
        row[arm] = {"start": start["pass"], "final": final["pass"],
                    "curve": [(p["version"] - sft_steps, p["pass"]) for p in curve if p["version"] >= sft_steps],
                    "curve_minutes": _by_minute([p for p in curve if p["version"] >= sft_steps]),
                    "recovery_start": recovery(base / arm, start["version"]),
                    "recovery_final": recovery(base / arm, final["version"]), **_step_metrics(base / arm)}
    if control:
        log.info("branch_compare seed %d: SFT-only control from the SFT checkpoint", seed)
        row["control"] = _control(parts, base, sft_steps)
    return row


def _median(rows: list[dict], arm: str, key: str) -> float:
    vals = [r[arm][key] for r in rows if arm in r]
    vals = [v["recovered"] if isinstance(v, dict) else v for v in vals]
    vals = [v for v in vals if v is not None and v == v]  # None: no rollout with a failed call; NaN: no child
    return round(statistics.median(vals), 3) if vals else float("nan")


def summarize(rows: list[dict]) -> dict:
    out = {"seeds": [r["seed"] for r in rows]}
    for arm in ARMS:
        if all(arm in r for r in rows):
            out[arm] = {k: _median(rows, arm, k) for k in ("start", "final", "recovery_start", "recovery_final",
                                                           "rollout_s", "train_s", "tree_vs_flat")}
    if all("control" in r for r in rows):
        out["control"] = {k: _median(rows, "control", k) for k in ("final", "recovery_final", "steps")}
    if "branching" in out:
        out["branching"].update(children_per_step=_median(rows, "branching", "children_per_step"),
                                replay_match_rate=_median(rows, "branching", "replay_match_rate"))
    return out


def run(seeds: list[int], workdir: str | pathlib.Path, overrides: dict | None = None, *, variant: str = "",
        control: bool = True) -> dict:
    root = pathlib.Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    rows = [run_seed(s, root, overrides, variant=variant, control=control) for s in seeds]
    summary = summarize(rows)
    (root / "compare.json").write_text(json.dumps({"summary": summary, "runs": rows}, indent=2))
    plot_compare(rows, root / "compare.png")
    return {"summary": summary, "runs": rows}


def plot_compare(rows: list[dict], out: pathlib.Path) -> pathlib.Path:
    """Held-out pass@1 against work minutes since the shared SFT checkpoint: each seed thin, the median over seeds
    thick (per eval: both arms have the same eval schedule); the SFT-only control dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (part, style) in enumerate((("trajectory", "-"), ("branching", "-"), ("control", "--"))):
        curves = [r[part]["curve_minutes"] for r in rows if part in r]
        for c in curves:
            ax.plot([m for m, _ in c], [p for _, p in c], style, color=f"C{i}", lw=0.8, alpha=0.5)
        med = median_curve(curves)
        if med:
            ax.plot([m for m, _ in med], [p for _, p in med], style, color=f"C{i}", lw=2.5,
                    label=f"{part}: median of {len(curves)} seeds")
    ax.set_xlabel("work minutes since the shared SFT checkpoint")
    ax.set_ylabel("held-out pass@1 (T=1)")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
