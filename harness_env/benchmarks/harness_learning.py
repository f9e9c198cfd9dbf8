"""Bench `harness_learning`: a tiny policy learning through each real CLI, and through all of them at once.

    python -m launch.bench --suite=harness_learning [--opt harnesses=codex,openclaw] [--opt mix=1]
        [--opt sft_steps=100] [--opt rl_steps=12] [--opt workdir=DIR]

Per CLI: the pick-word family (harness_env/rl/cli_learning.py): SFT on the expert's demonstrations captured through
that unmodified CLI, then tree GRPO with the checker's reward. `lift_<cli>`: the train reward (on-policy pass rate,
16 rollouts per step) over the last 3 RL steps minus the first 2; `steps_to_80_<cli>` the first step whose 3-step
mean reaches 0.8 (null: not within the run); `rollout_s_<cli>` / `train_s_<cli>` the RL step's time split (medians).
`mix` (default on when >= 2 CLIs) also trains one policy through all of them with the same rollout budget, and
`mix_gap_max` is the largest shortfall of the mix under one CLI (its rollouts through that CLI, last 3 steps)
against that CLI's single-harness policy. The tree and the engine's cache, over every RL step of every run:
`tree_vs_flat_tokens` (median over steps of flat tokens / tree tokens; groups of 4 rollouts of 2 calls) and
`prefill_reuse` (median share of requested prompt tokens the engine served from its slot cache). `workdir` (default:
a temporary directory) makes the runs resumable.
Time: ~10 min per CLI on 2 cores at the defaults (SFT ~3.5 s per step under a ~9k-token prompt).
"""

from __future__ import annotations

import contextlib
import pathlib
import tempfile

import numpy as np

from harness_env.benchmarks import ready_backend


def run(harnesses: str = "codex,openclaw", mix: int = -1, sft_steps: int = 100, rl_steps: int = 12,
        workdir: str = "") -> dict:
    from harness_env.rl import cli_learning

    ready_backend("bwrap")
    names = [h for h in str(harnesses).split(",") if h]
    do_mix = (len(names) >= 2) if mix < 0 else bool(mix)
    scratch = contextlib.nullcontext(workdir) if workdir else tempfile.TemporaryDirectory(prefix="harness_learning-")
    with scratch as where:
        root = pathlib.Path(where)
        runs = {h: cli_learning.run(h, root / h, sft_steps=sft_steps, rl_steps=rl_steps, negated_steps=0)
                for h in names}
        out: dict = {f"lift_{h}": round(cli_learning.lift(r["rewards"]), 3) for h, r in runs.items()}
        out.update({f"end_{h}": round(float(np.mean(r["rewards"][-3:])), 3) for h, r in runs.items()})
        out.update({f"steps_to_80_{h}": cli_learning.steps_to(r["rewards"], 0.8) for h, r in runs.items()})
        for h, r in runs.items():  # the RL step's time split (medians over steps): rollouts through the CLI vs update
            out.update({f"rollout_s_{h}": round(r["rollout_s"], 2), f"train_s_{h}": round(r["train_s"], 2)})
        if do_mix:
            runs["mix"] = m = cli_learning.run(",".join(names), root / "mix", sft_steps=sft_steps, rl_steps=rl_steps,
                                               negated_steps=0)
            gaps = {h: float(np.mean(runs[h]["rewards"][-3:]) - np.nanmean(m["per_harness"][h][-3:])) for h in names}
            out.update({f"mix_end_{h}": round(float(np.nanmean(m["per_harness"][h][-3:])), 3) for h in names})
            out["mix_gap_max"] = round(max(gaps.values()), 3)
    out["tree_vs_flat_tokens"] = round(float(np.median([r["tree_vs_flat"] for r in runs.values()])), 2)
    out["prefill_reuse"] = round(float(np.median([r["prefill_reuse"] for r in runs.values()])), 3)
    out["harnesses"] = ",".join(names)
    out.update(sft_steps=sft_steps, rl_steps=rl_steps)
    return out
