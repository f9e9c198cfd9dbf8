"""Bench `redteam`: the red-team suite (harness_env/redteam.py) on one backend, with an honest control.

    python -m launch.bench --suite=redteam [--opt backend=bwrap|docker] [--opt tokenizer_dir=DIR]

Reported: `attacks` (adversarial policies run), `defended` (trained on with the failure reward: the goal is all),
`sheltered` (failures the policy caused that the loop would drop, so GRPO could not push against them: goal 0),
`paid` (attacks the batch would reward above the failure reward: goal 0), `grade_s_max` (the slowest attack's
grading, seconds) against the honest control's grading time in the same run (`grade_s_max_vs_honest`: an
attack that held the checker, e.g. a FIFO until the reward timeout, shows here), and `control_reward` (1.0, or the
path itself is broken). Per attack: status, cause, grade, batch reward.
"""

from __future__ import annotations

import asyncio
import pathlib
import tempfile

from harness_env import redteam
from harness_env.benchmarks import ready_backend


def run(backend: str = "bwrap", tokenizer_dir: str = "", attacks: str = "") -> dict:
    """`attacks`: a comma list of attack names (default: every attack); the honest control always runs."""
    from research.models.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    be = ready_backend(backend)
    with tempfile.TemporaryDirectory(prefix="hrl-redteam-") as tmp:
        chosen = [a for a in str(attacks).split(",") if a] or [a.name for a in redteam.ATTACKS]
        names = chosen + [redteam.CONTROL.name]
        results, calls = asyncio.run(redteam.run_attacks(pathlib.Path(tmp), tok, be, names))
    report = redteam.assess(results, calls)
    control = report.pop(redteam.CONTROL.name)
    grade_s = max(r["reward_s"] for r in report.values())
    return {"backend": backend, "attacks": len(report), "defended": sum(r["defended"] for r in report.values()),
            "sheltered": sum(r["sheltered"] for r in report.values()),
            "paid": sum((r["reward"] or 0.0) > redteam.FAILURE_REWARD for r in report.values()),
            "grade_s_max": round(grade_s, 3), "control_grade_s": round(control["reward_s"], 3),
            "grade_s_max_vs_honest": round(grade_s / max(control["reward_s"], 1e-3), 2),
            "control_reward": control["reward"],
            "per_attack": {n: {k: r[k] for k in ("status", "cause", "grade", "reward")} for n, r in report.items()}}
