"""Bench `harnesses`: wall time of one real rollout per harness, vs the built-in reference harness.

    python -m launch.bench --suite=harnesses [--opt backend=bwrap] [--opt repeats=2] [--opt harnesses=a,b]

Why: in RL the harness's own start-up and per-turn overhead bound rollout throughput (the model here
is a zero-cost scripted replay engine). Each rollout is the full production path: runner -> sandbox
-> real CLI -> shim (real Qwen3 tokenizer, capture) -> replay engine emitting that harness's shell tool
call, then a final answer, then the task's checker. Reported per harness: median rollout seconds
(`<name>_rollout_s`), median harness-process seconds (`<name>_harness_s`), model calls, reward, and the
ratio to the reference harness (`<name>_vs_reference`).
"""

from __future__ import annotations

import asyncio
import pathlib
import statistics
import tempfile

from harness_env.benchmarks import ready_backend, with_reference
from harness_env.harnesses.base import get_harness
from harness_env.harnesses.scripted import scripted_policy
from harness_env.runner import RolloutSpec, RunnerConfig, run_through_shim
from harness_env.sandbox import Limits
from harness_env.tasks import LIBRARY
from research.models.tokenizer import load_tokenizer
from research.serving.replay import ReplayEngine

TASK = LIBRARY / "file_hello"
SOLVE = "printf 'Hello, world!\\n' > hello.txt && cat hello.txt"
FINAL = "I created hello.txt."


async def _one(tok, name: str, backend, root: pathlib.Path, sample: int) -> dict:
    harness = get_harness(name)
    engine = ReplayEngine(scripted_policy(harness, [SOLVE], FINAL, tok.decode), tok)
    cfg = RunnerConfig(out_dir=root / "run", backend=backend.name, timeout_s=300, progress=False, infra_retries=0,
                       limits=Limits(cpus=2.0, memory_mb=4096, pids=1024, wall_s=330))
    (res,), _ = await run_through_shim(root, engine, tok, [RolloutSpec(TASK, name, sample)], cfg, backend=backend)
    if res.status != "ok":
        raise RuntimeError(f"{name}: rollout ended {res.status}: {res.message}")
    return {"rollout_s": res.timings["total_s"], "harness_s": res.timings["harness_s"],
            "calls": res.meta["calls"], "reward": res.reward}


def run(backend: str = "bwrap", repeats: int = 1, harnesses: str = "reference,claude_code,codex,opencode,openclaw",
        tokenizer_dir: str = "") -> dict:
    names = with_reference(harnesses)
    b = ready_backend(backend)
    tok = load_tokenizer(tokenizer_dir)
    out: dict = {"backend": backend, "repeats": repeats}
    with tempfile.TemporaryDirectory(prefix="bench-harnesses-") as tmp:
        for name in names:
            asyncio.run(get_harness(name).install())
            runs = [asyncio.run(_one(tok, name, b, pathlib.Path(tmp) / f"{name}-{k}", k)) for k in range(repeats)]
            out[f"{name}_rollout_s"] = round(statistics.median(r["rollout_s"] for r in runs), 3)
            out[f"{name}_harness_s"] = round(statistics.median(r["harness_s"] for r in runs), 3)
            out[f"{name}_calls"] = runs[-1]["calls"]
            out[f"{name}_reward"] = min(r["reward"] for r in runs)
    ref = out["reference_rollout_s"]
    for name in names:
        out[f"{name}_vs_reference"] = round(out[f"{name}_rollout_s"] / ref, 2)
    return out
