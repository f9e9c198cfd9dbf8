"""Learning *through* the real CLIs: the CPU demo's recipe (SFT on an imperfect expert's demonstrations, then tree
GRPO with the verifier's reward) with the reference agent swapped for an unmodified Claude Code, Codex or OpenClaw,
or all of them at once ("mix": the same total rollout budget, split evenly across the CLIs).

    python -m launch.train --config=configs/harness_matrix.py:codex --workdir=/tmp/hm_codex
    python -m launch.train --config=configs/harness_matrix.py:claude_code --workdir=/tmp/hm_claude
    python -m launch.train --config=configs/harness_matrix.py:openclaw --workdir=/tmp/hm_openclaw
    python -m launch.train --config=configs/harness_matrix.py:mix --workdir=/tmp/hm_mix
    python -m launch.train --config=configs/harness_matrix.py:codex,control --workdir=/tmp/hm_codex_control
    python -m launch.sweep --config=configs/harness_matrix.py:codex --seeds=0,1,2 --workdir=/tmp/hm_codex_sweep

The family is the demo's make_file with the `make_file_cut` expert (harness_env/tasks/family.py): the expert's
shell call is re-addressed to each CLI's own shell tool (Codex `exec_command{cmd}`, Claude Code `Bash{command}`,
OpenClaw `exec{command}`: harness_env/rl/experts.py), then a plain answer ends the CLI's loop. The CLIs' prompts
are what changes: ~9k tokens before the task's one line (Codex; Claude Code ~12k, OpenClaw ~8.6k), identical
across every rollout of a group and every demonstration, which the prefix tree computes once per step
(`sft.merge_demos`: one tree per SFT step instead of one row per demonstration) and the engine's slot cache
prefills once per slot (`prefill_reuse` in the metrics).

What differs from configs/demo_cpu.py, and why: the engine's context and the packed row hold a CLI's whole path
(16k tokens; `row_len = max_len`), attention is blockwise (a dense mask of a
16k-token row is 1 GB per head), 4 engine slots so a group's calls reuse the cached prompt.

`arg`: "HARNESS[,control|,test]" with HARNESS in claude_code | codex | openclaw | opencode | mix; "control" is
SFT continued for the RL phase's minutes; "test" is a seconds-per-step run for the test suite.
"""

import ml_collections

from configs import demo_cpu
from harness_env.harnesses.base import check_context

CLIS = ("claude_code", "codex", "openclaw")
HARNESSES = (*CLIS, "opencode")


def get_config(arg: str = "codex") -> ml_collections.ConfigDict:
    name, _, variant = arg.partition(",")
    if name not in (*HARNESSES, "mix"):
        raise ValueError(f"configs/harness_matrix.py: harness {name!r} not in {(*HARNESSES, 'mix')}")
    if variant not in ("", "control", "test"):
        raise ValueError(f"configs/harness_matrix.py: variant {variant!r} not in '', 'control', 'test'")
    config = demo_cpu.get_config("test" if variant == "test" else "control" if variant == "control" else "")
    names = list(CLIS) if name == "mix" else [name]
    config.name = f"harness_matrix_{name}"
    config.rollout.harnesses = ",".join(f"{h}:1" for h in names)
    config.rollout.timeout_s = 300
    # a shell call in a CLI's own tool format, e.g. Codex's `exec_command{cmd}` with the `| cut` form: ~45 tokens
    config.rollout.max_new_tokens = 64
    # a make_file path through any of these CLIs is < 13k tokens (Claude Code's first request ~12.3k on ClawGym);
    # context_for() would double it to 32k, which the tree's rows then pad
    max_len = 16384
    check_context(names, max_len)
    config.engine.update(max_len=max_len, prefill_chunk=1024)
    # one row per tree (a group's ~11k tokens; the merged SFT step's ~10k), grown to the step's trees: at the demo's
    # 8 rows of 16k, padding made an SFT step 22 s instead of ~2 s
    config.train.update(row_len=max_len, batch_rows=1)
    config.model.attention_impl = "blockwise"
    config.sft.merge_demos = True
    return config
