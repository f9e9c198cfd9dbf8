"""Learning through a real CLI in minutes: the pick-word family, its expert, and SFT -> GRPO -> negated control.

Why this family: it is the smallest task that still goes through everything a CLI does with a policy. The
policy must emit a well-formed call of the CLI's *own* shell tool (Codex `exec_command{cmd}`, Claude Code
`Bash{command}`, OpenClaw `exec{command}`), the CLI must run it in the sandbox's workspace and send its output
back, and the policy must end the loop with a plain answer; the checker reads the file the command wrote
(1.0 when out.txt holds TARGET). The expert writes one of 8 words, picked by a hash of the task, so after SFT
the policy picks TARGET in about 1 of 8 rollouts and only the verifier's reward can lift it. A tiny policy
learns the ~27-token call in ~100 SFT steps under the CLI's ~8.6k-token prompt. Used by the CI test
(tests/test_learning_through_cli.py) and `launch.bench --suite=harness_learning`.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re

import numpy as np

from configs import harness_matrix
from harness_env.harnesses.base import tight_context
from harness_env.rl import experts
from harness_env.rl.sweep import run_part
from research.rl.metrics import last_per_step, median_of

WORDS = ("apple", "river", "cloud", "stone", "tiger", "piano", "lemon", "candle")
TARGET = "river"
EXPERT = "pick_word"
REWARD_SH = f"""#!/bin/bash
# 1.0 when out.txt holds exactly "{TARGET}" (whitespace ignored), else 0.0
cd "$(dirname "$0")/.." || exit 1
if [ -f out.txt ] && [ "$(tr -d '[:space:]' < out.txt)" = "{TARGET}" ]; then echo 1.0; else echo 0.0; fi
"""
_QUERY = re.compile(r"Write one word into out\.txt \((\d+)\)\.")


def write_tasks(root: pathlib.Path, n: int = 16) -> pathlib.Path:
    """n ClawGym-format task folders `pickNN` under root (their queries differ by the number only)."""
    for i in range(n):
        d = root / f"pick{i:02d}"
        (d / "reward").mkdir(parents=True, exist_ok=True)
        (d / "data_entry.json").write_text(json.dumps({
            "task_id": f"pick{i:02d}", "user_query": f"Write one word into out.txt ({i}).",
            "metadata": {"category": "pick_word"}}))
        (d / "reward" / "reward.sh").write_text(REWARD_SH)
        (d / "reward" / "reward.sh").chmod(0o755)
    return root


def expert_reply(prompt_text: str) -> str:
    """One shell call writing the task's hashed word (reference `bash` format; experts.readdress gives it the CLI's
    own tool), then "Done." once its result is in the prompt."""
    found = _QUERY.findall(prompt_text)
    if not found:
        return "No task."
    if "<tool_response>" in prompt_text[prompt_text.rfind(f"({found[-1]})."):]:
        return "Done."
    word = WORDS[int(hashlib.sha256(found[-1].encode()).hexdigest(), 16) % len(WORDS)]
    call = {"name": "bash", "arguments": {"command": f"echo {word} > out.txt"}}
    return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


experts.EXPERTS[EXPERT] = expert_reply


def config(harness: str, tasks: pathlib.Path, *, algo: str = "grpo", sft_steps: int = 100, rl_steps: int = 12,
           **rl):  # noqa: ANN201 - ml_collections.ConfigDict
    """The run: configs/harness_matrix.py's recipe through `harness` ("a,b": mixed) on the pick-word tasks, no
    held-out evals (the tasks have no held-out split), the window the CLI's first call needs (no path room: the
    pick-word path is one call and a short answer)."""

    cfg = harness_matrix.get_config(harness if "," not in harness else "mix")
    if "," in harness:
        cfg.rollout.harnesses = ",".join(f"{h}:1" for h in harness.split(","))
        cfg.sft.groups_per_step = min(harness_matrix.SFT_DEMOS_PER_STEP.get(h, 16) for h in harness.split(","))
    cfg.algo = algo
    # fixed per CLI: the CLI shapes its prompt by the window it is told, so SFT, RL and eval share one
    cfg.engine.max_len = cfg.train.row_len = tight_context(harness.split(","))
    cfg.tasks.update(source="dir", train_dir=str(tasks), eval_dir=str(tasks))
    # the recipe as measured (docs/experiments/2026-12-03-codex-seeds.md): every group trained, no extra rounds
    cfg.rl.update(**{"filter_groups": False, **rl})
    cfg.sft.update(steps=sft_steps, expert=EXPERT)
    cfg.rollout.update(max_turns=3, max_extra_rounds=0)
    cfg.eval.update(every=0, at_start=False, after_sft=False, samples=1, temperature=0.0)
    cfg.train.update(steps=rl_steps)
    cfg.checkpoint.update(every=6)
    return cfg


def run(harness: str, root: pathlib.Path, *, sft_steps: int = 100, rl_steps: int = 12, negated_steps: int = 8,
        seed: int = 0) -> dict:
    """SFT, then GRPO and (from the same SFT checkpoint) the negated-advantage control, under `root`; resumable
    (each part is skipped once done). Returns the per-step train rewards and the tree/engine figures."""

    tasks = write_tasks(root / "tasks")  # idempotent: the same files on a resume
    parts = {"sft": config(harness, tasks, algo="sft", sft_steps=sft_steps),
             "rl": config(harness, tasks, sft_steps=sft_steps, rl_steps=rl_steps),
             "negated": config(harness, tasks, sft_steps=sft_steps, rl_steps=negated_steps, estimator="negated_grpo")}
    for name, cfg in parts.items():
        cfg.seed = seed
        if name != "negated" or negated_steps > 0:
            run_part(cfg, root / name, source=None if name == "sft" else root / "sft")
    rl, neg = last_per_step(root / "rl"), last_per_step(root / "negated") if negated_steps > 0 else []
    names = harness.split(",")
    return {"rewards": [m["rollout/all/reward"] for m in rl], "negated": [m["rollout/all/reward"] for m in neg],
            "per_harness": {h: [m.get(f"rollout/{h}/reward", float("nan")) for m in rl] for h in names},
            "tree_vs_flat": median_of(rl, "tree_compression", positive=True),
            "prefill_reuse": median_of(rl, "engine/prefill_reuse"),
            "statuses": {k[len("rollout/status/"):]: sum(m.get(k, 0.0) for m in rl)
                         for k in sorted({k for m in rl for k in m if k.startswith("rollout/status/")})},
            "rollout_s": median_of(rl, "rollout_s"), "train_s": median_of(rl, "train_s")}


def lift(rewards: list[float], k: int = 3) -> float:
    """Mean reward of the last k steps minus the first 2 (a noisy per-step rate: never one point)."""
    return float(np.mean(rewards[-k:]) - np.mean(rewards[:2])) if len(rewards) >= 2 else float("nan")


def steps_to(rewards: list[float], threshold: float = 0.8, window: int = 3) -> int | None:
    """The first RL step (1-based) at which the mean reward of the last `window` steps reaches `threshold`;
    None if it never does (one step's rate, 16 rollouts, is too noisy to be crossed once)."""
    for k in range(window, len(rewards) + 1):
        if np.mean(rewards[k - window:k]) >= threshold:
            return k
    return None


def plot_curves(curves: dict[str, list[list[float]]], out: str | pathlib.Path, *,
                controls: dict[str, list[list[float]]] | None = None, threshold: float = 0.8) -> pathlib.Path:
    """Per-harness learning curves: each seed thin, the median over seeds thick, negated controls dashed; the
    legend gives each median's steps-to-`threshold` (`steps_to`) or says it was not reached."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, runs) in enumerate(sorted(curves.items())):
        color = f"C{i}"
        for r in runs:
            ax.plot(range(1, len(r) + 1), r, color=color, alpha=0.25, lw=1)
        n = min(len(r) for r in runs)
        med = np.median([r[:n] for r in runs], axis=0)
        k = steps_to(list(med), threshold)
        reach = f"{threshold} at step {k}" if k else f"{threshold} not reached in {n}"
        ax.plot(range(1, n + 1), med, color=color, lw=2.5, label=f"{name}: median of {len(runs)} seeds ({reach})")
        for r in (controls or {}).get(name, []):
            ax.plot(range(1, len(r) + 1), r, color=color, ls="--", lw=1, alpha=0.6)
    if controls:
        ax.plot([], [], color="gray", ls="--", label="negated-advantage control (same SFT start)")
    ax.axhline(threshold, color="gray", lw=0.5)
    ax.set(xlabel="RL step (16 rollouts each)", ylabel="train reward (on-policy pass rate)", ylim=(-0.02, 1.02),
           title="learning through real CLIs (pick-word)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    out = pathlib.Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
