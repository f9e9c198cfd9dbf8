"""Bench `harness_tree`: what the prefix tree saves on real CLI rollouts (tokens a step trains on, tree vs flat).

    python -m launch.bench --suite=harness_tree [--opt harnesses=reference,codex,claude_code] [--opt group=8]

Why: a real CLI sends a long first request (tool schemas, system prompt: ~7.5k-12k tokens) and resends the whole
conversation on every call, so a flat trainer recomputes that prefix once per call and per rollout; the tree
computes each shared token once. Per harness, one group of `group` rollouts through the unmodified CLI, the
real shim (Qwen3 chat template, captured token ids) and a replay policy that diverges per rollout (its first
command names a random sample number, so rollouts share the harness's prefix and the task, then differ, as a
sampled policy's would). Reported per harness: `<name>_first_prompt` (tokens), `<name>_calls` (per rollout),
`<name>_flat_tokens` (sum over calls of prompt + completion: what a flat trainer processes),
`<name>_tree_tokens` (nodes of the merged tree) and their ratio `<name>_tree_vs_flat`, against the reference
agent's ratio in the same run (`<name>_vs_reference`).
"""

from __future__ import annotations

import asyncio
import pathlib
import random
import tempfile

from harness_env.benchmarks import ready_backend, with_reference
from harness_env.harnesses.base import get_harness
from harness_env.harnesses.scripted import scripted_reply
from harness_env.runner import RolloutSpec, RunnerConfig, run_through_shim
from harness_env.sandbox import Limits
from harness_env.tasks import LIBRARY

TASK = LIBRARY / "file_hello"


def diverging_policy(harness, decode, seed: int = 0):  # noqa: ANN001, ANN201
    """Two shell commands, then a final answer; the first names a random sample number (drawn per call), the rest
    follow from the prompt (so a rollout's later calls extend its own first call)."""
    rng = random.Random(seed)

    def reply(req) -> str:  # noqa: ANN001
        first = f"echo sample-{rng.randrange(10**6)} > out.txt"  # used at step 0 only
        commands = [first, "printf 'Hello, world!\\n' > hello.txt && cat out.txt"]
        return scripted_reply(harness, commands, "I created hello.txt.", decode(list(req.prompt_ids)))

    return reply


async def _group(tok, name: str, backend, root: pathlib.Path, group: int) -> dict:
    from research.serving.replay import ReplayEngine
    from research.trees.builder import build_tree

    harness = get_harness(name)
    await harness.install()
    cfg = RunnerConfig(out_dir=root / "run", backend=backend.name, timeout_s=300, progress=False, infra_retries=0,
                       concurrency=4, limits=Limits(cpus=2.0, memory_mb=4096, pids=1024, wall_s=330))
    results, calls = await run_through_shim(root, ReplayEngine(diverging_policy(harness, tok.decode), tok), tok,
                                            [RolloutSpec(TASK, name, k) for k in range(group)], cfg, backend=backend)
    bad = [r for r in results if r.status != "ok"]
    if bad:
        raise RuntimeError(f"{name}: {bad[0].rollout_id} ended {bad[0].status}: {bad[0].message}")
    tree = build_tree(calls, results)
    flat = sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls)
    # the agent's first request (a harness's side sessions, e.g. opencode's title call, are shorter)
    first = max((c for c in calls if c.call_index == 0), key=lambda c: len(c.prompt_ids))
    return {"first_prompt": len(first.prompt_ids), "calls": round(len(calls) / group, 2), "flat_tokens": flat,
            "tree_tokens": tree.num_nodes, "tree_vs_flat": round(flat / tree.num_nodes, 2),
            "reward": min(r.reward for r in results)}


def run(harnesses: str = "reference,codex,claude_code", group: int = 8, backend: str = "bwrap",
        tokenizer_dir: str = "") -> dict:
    from research.models.tokenizer import load_tokenizer

    names = with_reference(harnesses)
    b = ready_backend(backend)
    tok = load_tokenizer(tokenizer_dir)
    out: dict = {"backend": backend, "group": group}
    with tempfile.TemporaryDirectory(prefix="bench-harness-tree-") as tmp:
        for name in names:
            r = asyncio.run(_group(tok, name, b, pathlib.Path(tmp) / name, group))
            out.update({f"{name}_{k}": v for k, v in r.items()})
    for name in names:
        out[f"{name}_vs_reference"] = round(out[f"{name}_tree_vs_flat"] / out["reference_tree_vs_flat"], 2)
    return out
