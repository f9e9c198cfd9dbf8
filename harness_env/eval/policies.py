"""Policies from RL workdirs, and the transfer matrix: every policy evaluated under every harness.

    python -m launch.eval --tasks=DIR --harness=codex,claude_code,reference --k=1 \
        --policies=sft=W/sft,codex=W/codex/rl,mix=W/mix/rl --out=OUT

A policy is a run's latest checkpoint (`launch.train`'s workdir: its config.json and orbax checkpoints), served by
the JAX engine. Why a window per (policy, harness): the CLIs shape their prompts by the context window they are
told (Codex cuts its skill list to fit), so a policy is evaluated under a harness it trained through with its
training run's window (the prompt it learned), and under any other with that harness's own (`tight_context` of
harnesses/base.py, when the run's is too small for it). Every cell serves the policy as its run's rollouts did
(`shim_options`: thinking switch, token cap, held-out sampling temperature; the run's turn limit). Each cell is one
`evaluate` run under OUT/POLICY/HARNESS (resumable); `matrix.json` / `matrix.md` hold pass@1 and the mean reward
per cell, and the run version evaluated.
"""

from __future__ import annotations

import asyncio
import json
import pathlib

from harness_env.harnesses.base import first_call_need, tight_context
from harness_env.rl.rollouts import CappedEngine
from research.shim.session import ShimOptions


def load_policy(workdir: pathlib.Path):  # noqa: ANN201 - (RunConfig, params, version)
    """The run config, the latest checkpoint's policy params and its version (ValueError: no checkpoint)."""
    import ml_collections

    from research.rl.run_state import RunState
    from research.rl.trainer import Learner

    path = pathlib.Path(workdir)
    if not (path / "config.json").exists():
        raise ValueError(f"{path}: no config.json (not a launch.train workdir)")
    learner = Learner(ml_collections.ConfigDict(json.loads((path / "config.json").read_text())))
    state = RunState(path, save_every=1 << 30, keep=1 << 30)
    restored = state.restore(learner.abstract)
    if restored is None:
        raise ValueError(f"{path}: no checkpoint to evaluate")
    learner.restore(restored)
    return learner.run, learner.params_copy(), state.version


def window(run, harness: str) -> int:  # noqa: ANN001 - research.rl.config.RunConfig
    """The context window to serve `run`'s policy under `harness` with (see the module docstring)."""
    trained = {h.split(":")[0] for h in run.rollout.harnesses.split(",")}
    fits = run.engine.max_len >= first_call_need(harness)
    return run.engine.max_len if (harness in trained or fits) else tight_context([harness])


def shim_options(run) -> ShimOptions:  # noqa: ANN001 - research.rl.config.RunConfig
    """The shim as the run's rollouts saw it: its thinking switch (Qwen3's template renders the assistant turn
    differently without thinking), its token cap and its held-out sampling (`eval.temperature`)."""
    return ShimOptions(enable_thinking=run.rollout.enable_thinking, default_max_tokens=run.rollout.max_new_tokens,
                       sampling_override={"temperature": run.eval.temperature})


def served_config(run, cfg, out: pathlib.Path):  # noqa: ANN001, ANN201 - RunnerConfig
    """`cfg` with the run's turn limit and rollout timeout: the policy is evaluated under the protocol it learned."""
    import dataclasses

    return dataclasses.replace(cfg, out_dir=out, max_turns=run.rollout.max_turns, timeout_s=run.rollout.timeout_s)


async def transfer_matrix(policies: dict[str, pathlib.Path], harnesses: list[str], *, tasks: list[pathlib.Path],
                          k: int, tok, out: pathlib.Path, cfg) -> dict:  # noqa: ANN001
    """Evaluates every policy under every harness (one engine per cell); writes and returns the matrix."""
    import dataclasses

    from harness_env.eval.run import evaluate
    from research.serving.factory import jax_engine

    cells = {}
    for name, workdir in policies.items():
        run, params, version = await asyncio.to_thread(load_policy, workdir)
        for h in harnesses:
            engine = jax_engine(run.model, params, dataclasses.replace(run.engine, max_len=window(run, h)), version)
            cell_out = out / name / h
            capped = CappedEngine(engine, run.rollout.max_new_tokens)
            doc = await evaluate(tasks=tasks, harnesses=[h], k=k, engine=capped, tok=tok, out=cell_out,
                                 cfg=served_config(run, cfg, cell_out), close_engine=True,
                                 shim_options=shim_options(run))
            row = next(r for r in doc["rows"] if r.harness == h and r.group == "all")
            cells[f"{name}/{h}"] = {"policy": name, "harness": h, "version": version, "window": engine.max_context,
                                    "rollouts": row.rollouts, "pass_at_1": row.metrics.get("pass@1", 0.0),
                                    "reward": row.mean_reward, "statuses": row.statuses}
    matrix = {"harnesses": harnesses, "policies": list(policies), "cells": cells}
    out.mkdir(parents=True, exist_ok=True)
    (out / "matrix.json").write_text(json.dumps(matrix, indent=1))
    (out / "matrix.md").write_text(to_markdown(matrix))
    return matrix


def to_markdown(matrix: dict) -> str:
    hs = matrix["harnesses"]
    lines = ["| policy \\ harness | " + " | ".join(hs) + " |", "|---|" + "---|" * len(hs)]
    for p in matrix["policies"]:
        row = [f"{matrix['cells'][f'{p}/{h}']['pass_at_1']:.2f}" for h in hs]
        lines.append(f"| {p} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
