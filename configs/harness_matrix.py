"""Learning *through* the real CLIs: SFT on an imperfect expert's demonstrations captured through an unmodified Claude
Code, Codex or OpenClaw, then tree GRPO with the verifier's reward, held-out pass@1 under that CLI; or through all
of them at once ("mix": the same rollout budget per step, its groups split across the CLIs round robin).

    python -m launch.sweep --config=configs/harness_matrix.py:codex --seeds=0,1,2 --workdir=/tmp/hm_codex
    python -m launch.sweep --config=configs/harness_matrix.py:claude_code --seeds=0,1,2 --workdir=/tmp/hm_claude
    python -m launch.sweep --config=configs/harness_matrix.py:openclaw --seeds=0,1,2 --workdir=/tmp/hm_openclaw
    python -m launch.sweep --config=configs/harness_matrix.py:mix --seeds=0,1,2 --workdir=/tmp/hm_mix
    python -m launch.train --config=configs/harness_matrix.py:codex --workdir=/tmp/hm_codex_one   # one run
    python -m launch.eval --tasks=relay:heldout --harness=codex,claude_code,reference --k=2 \\
        --policies=codex=/tmp/hm_codex/seed0/rl,claude=/tmp/hm_claude/seed0/rl --out=/tmp/matrix

The family is `relay` (harness_env/tasks/relay.py): "Copy the word in clue.txt into out.txt (N)." — two tool calls
(`cat clue.txt`, then `echo WORD > out.txt`), the second conditioned on the first's output as the CLI hands it
back. The expert reads the clue and copies it, on 62.5% of the tasks in the literal form `echo the word WORD`
(reward 0), so SFT teaches the calls and the copy in each CLI's own tool (Codex `exec_command{cmd}`, Claude Code
`Bash{command}`, OpenClaw `exec{command}`: harness_env/rl/experts.py) and only the verifier can teach the form.
64 train tasks, 16 held out (by number); held-out pass@1 is the mean of 2 samples per task at T=1 (greedy would
report the SFT policy's mode, 0 or 1, not its rate). `launch.sweep` adds, per seed, the SFT control at equal work
minutes.

The recipe is the one measured through Codex and Claude Code on the pick-word family (harness_env/rl/cli_learning.py,
docs/experiments/2026-12-03-codex-seeds.md): a 2-layer, 32-wide Qwen3 (real tokenizer), SFT at lr 4e-3 (250 steps),
every demonstration merged into one tree per step (the CLI's ~8-12k-token prompt trained once: `sft.merge_demos`),
GRPO at lr 1e-3 with a k3 KL of 0.1 to the SFT policy (at 2e-3 without KL one update broke the call's format),
groups of 4 x 4 rollouts. The engine's window is each CLI's first call rounded up to whole 1k blocks plus one
(`tight_context`): the CLIs shape their prompts by the window they are told, so SFT, RL and eval share it, and a
policy is evaluated under the window it learned in.

`arg`: "HARNESS[,control|,test]" with HARNESS in claude_code | codex | openclaw | opencode | mix (all three CLIs) |
A+B (a mix of the named ones, e.g. codex+claude_code); "control" is SFT
continued for 150 more steps (launch.sweep computes its own at equal minutes); "test" is a seconds-per-step run
for the test suite.
"""

import ml_collections

from configs import demo_cpu
from harness_env.harnesses.base import check_context, tight_context

CLIS = ("claude_code", "codex", "openclaw")
HARNESSES = (*CLIS, "opencode")
# demonstrations merged into one SFT step's tree. Claude Code's first request puts ~2.1k tokens of per-session
# context (its environment block) after the task line, so 16 merged demonstrations are a 9.5k shared prefix plus
# 16 x 2.1k tails: 44k tokens that a 13k row holds only as pieces, each with a copy of the prefix (measured 35 s
# per SFT step vs Codex's 4 s). 4 per step keep each step near one row.
SFT_DEMOS_PER_STEP = {"claude_code": 4}
# room after a CLI's first call for the relay path's later turns (2 tool results, 2 more replies)
PATH_ROOM = 1024


def get_config(arg: str = "codex") -> ml_collections.ConfigDict:
    name, _, variant = arg.partition(",")
    names = list(CLIS) if name == "mix" else name.split("+")
    if any(h not in HARNESSES for h in names):
        raise ValueError(f"configs/harness_matrix.py: harness {name!r} not in {(*HARNESSES, 'mix')} (or A+B)")
    if variant not in ("", "control", "test"):
        raise ValueError(f"configs/harness_matrix.py: variant {variant!r} not in '', 'control', 'test'")
    config = demo_cpu.get_config("test")  # the tiny model; every field below says what the recipe sets
    config.name = f"harness_matrix_{name.replace('+', '_')}"
    config.model.update(embedding_init_std=0.2, attention_impl="blockwise")  # O(T) memory at ~10k-token rows
    config.optim.update(learning_rate=4e-3, warmup_steps=0)
    config.rl_optim.update(learning_rate=1e-3)
    # zero-variance groups (every rollout of a task in the same form) filtered, and one extra round of groups
    # sampled while fewer than groups_per_step carry signal (the demo's DAPO-style dynamic sampling)
    config.rl.update(kl_coef=0.1, filter_groups=True)
    config.tasks.update(source="relay", validate=True)
    config.rollout.harnesses = ",".join(f"{h}:1" for h in names)
    # a shell call in a CLI's own tool format (Codex `exec_command{cmd}`): ~30 tokens
    config.rollout.update(groups_per_step=4, group_size=4, max_turns=4, temperature=1.0, max_new_tokens=64,
                          timeout_s=300, concurrency=4, max_extra_rounds=1)
    if "openclaw" in names:  # Node, ~60 bundled plugins and SQLite workers: every rollout OOM-killed at 1 GiB
        config.rollout.sandbox_memory_mb = 3072  # (exit 137 in 64 of 64 relay demonstrations, 2026-12-07)
    max_len = tight_context(names) + PATH_ROOM
    check_context(names, max_len)
    config.engine.update(max_len=max_len, prefill_chunk=1024, num_slots=4)
    # one row per tree (a group's ~10k tokens; the merged SFT step's), grown to the step's trees
    config.train.update(steps=24, row_len=max_len, batch_rows=1)
    per_step = min(SFT_DEMOS_PER_STEP.get(h, 16) for h in names)
    # 250, not pick-word's 100: the relay path is 3 calls of ~30 sampled tokens each, and at T=1 a stray token
    # anywhere breaks a call. At SFT 100 (NLL 0.065, still falling) 45% of Codex rollouts broke a call's format,
    # held-out pass@1 0.03 at RL start, and 16 GRPO steps mostly repaired format (train 0.06 -> 0.16)
    config.sft.update(steps=250, groups_per_step=per_step, num_demos=-1, expert="relay_literal", min_reward=0.0,
                      merge_demos=True)
    config.eval.update(every=6, sft_every=0, at_start=False, after_sft=True, num_tasks=-1, samples=2,
                       temperature=1.0)
    config.checkpoint.update(every=4, keep=2)
    config.metrics.update(tensorboard=False, plot_every=1000)
    if variant == "control":
        config.algo = "sft"
        config.sft.steps = 400
    elif variant == "test":
        config.train.steps = 2
        config.sft.update(steps=2, num_demos=4, groups_per_step=min(per_step, 4))
        config.rollout.update(groups_per_step=2, group_size=2)
        config.eval.update(every=0, after_sft=False, samples=1, temperature=0.0)
        config.checkpoint.update(every=1)
    return config
