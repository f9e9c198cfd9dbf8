"""Bench `branching`: forking by replay + per-turn credit (`tree_grpo`) vs trajectory-level GRPO, same rollout budget.

    python -m launch.bench --suite=branching [--opt seeds=0,1,2] [--opt sft_steps=250] [--opt rl_steps=24]
        [--opt workdir=DIR] [--opt variant=test]

On the recover family (harness_env/tasks/recover.py) through the reference agent, per seed one SFT checkpoint and
both arms from it (harness_env/rl/branch_compare.py, configs/branching.py). Medians over seeds:
`pass_branching` / `pass_trajectory` (held-out pass@1 at the end, 32 tasks x 2 samples at T=1) and `pass_start`
(the shared SFT checkpoint's); `recovery_before` (at RL start) and `recovery_after` (the branching arm's end;
`recovery_after_trajectory` the other arm's): of the held-out rollouts with a failed tool call, the share that
succeeded; `replay_match_rate` (children whose replayed calls matched their records) and `children_per_step`;
`tree_vs_flat_tokens` per arm and `rollout_s` per arm (the RL step's rollouts, with the children's round).
`pass_control` / `recovery_after_control`: the SFT-only control (more SFT from the same checkpoint for the
trajectory arm's work minutes) at those minutes. `branching_minus_trajectory` and `trajectory_minus_control` are
the same-run comparisons; compare.png in the workdir plots the curves. `workdir` (default: a temporary directory)
makes the runs resumable; `variant=test` runs configs/branching.py's seconds-per-step variant (the test suite's).
Time: ~30 min per seed on 2 idle cores at the defaults (SFT ~15 min, each RL arm and the control ~5 min).
"""

from __future__ import annotations

import contextlib
import pathlib
import tempfile

from harness_env.benchmarks import ready_backend
from harness_env.rl import branch_compare


def run(seeds: str | int = "0", sft_steps: int = 250, rl_steps: int = 24, workdir: str = "", variant: str = "") -> dict:
    ready_backend("bwrap")
    seed_list = [int(s) for s in str(seeds).split(",") if s != ""]
    overrides = {"sft.steps": int(sft_steps), "train.steps": int(rl_steps)}
    scratch = contextlib.nullcontext(workdir) if workdir else tempfile.TemporaryDirectory(prefix="branching-")
    with scratch as where:
        s = branch_compare.run(seed_list, pathlib.Path(where), overrides, variant=variant)["summary"]
    br, tr, ctl = s["branching"], s["trajectory"], s["control"]
    return {"seeds": ",".join(map(str, seed_list)), "sft_steps": int(sft_steps), "rl_steps": int(rl_steps),
            "pass_start": br["start"], "pass_branching": br["final"], "pass_trajectory": tr["final"],
            "branching_minus_trajectory": round(br["final"] - tr["final"], 3),
            "recovery_before": br["recovery_start"], "recovery_after": br["recovery_final"],
            "recovery_after_trajectory": tr["recovery_final"],
            "pass_control": ctl["final"], "recovery_after_control": ctl["recovery_final"],
            "trajectory_minus_control": round(tr["final"] - ctl["final"], 3),
            "replay_match_rate": br["replay_match_rate"], "children_per_step": br["children_per_step"],
            "tree_vs_flat_tokens_branching": br["tree_vs_flat"], "tree_vs_flat_tokens_trajectory": tr["tree_vs_flat"],
            "rollout_s_branching": br["rollout_s"], "rollout_s_trajectory": tr["rollout_s"]}
