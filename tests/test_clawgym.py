"""The 2000 real ClawGym training tasks as their authors ship them (../shared/clawgym/train; issue 11, part 1):
all load, the seeded train/held-out split and sampling shared by launch.eval and the RL loop, a scripted run
that solves a real task and a do-nothing run through the reference harness (bwrap, and docker when marked),
the tiny JAX policy on 10 real tasks, and `python -m launch.eval --tasks=... --limit=N` itself."""
import asyncio
import collections
import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import pytest
from rollout_kit import (
    DO_NOTHING,
    SOLVE_0185,
    SOLVED_0185,
    WS,
    clawgym_train,
    logs_of,
    per_task_policy,
    query_marker,
    run_rollouts,
)

from harness_env.runner import RolloutSpec
from harness_env.sandbox import get_backend
from harness_env.tasks import load_task, select_tasks, split_of

REPO = pathlib.Path(__file__).resolve().parents[1]
IDLE_TASK = "task_0000"  # an untouched workspace scores exactly 0.0 on its shipped checker
BAD = {"task_error", "infra_error", "reward_error"}


def test_all_2000_real_tasks_load_with_their_workspace_path():
    dirs = select_tasks(str(clawgym_train()))
    tasks = [load_task(d) for d in dirs]
    assert len(tasks) == 2000 and len({t.task_id for t in tasks}) == 2000
    assert {t.workspace_dir for t in tasks} == {WS}  # 1987 say so, 13 (no input files) get ClawGym's default
    assert sum(1 for d in dirs if "input_mount_dir" not in json.loads((d / "data_entry.json").read_text())) == 13


def test_seeded_split_and_sample_are_one_selection_for_eval_and_the_rl_loop(tmp_path):
    from harness_env.eval.run import task_dirs as eval_task_dirs
    from harness_env.rl.rollouts import task_dirs as loop_task_dirs
    from research.rl.config import TasksConfig

    root = str(clawgym_train())
    train, held = select_tasks(root, split="train"), select_tasks(root, split="heldout")
    assert not set(train) & set(held) and len(train) + len(held) == 2000
    assert 150 <= len(held) <= 250  # heldout_fraction 0.1
    assert all(split_of(d.name) == "heldout" for d in held)
    assert set(select_tasks(root, split="heldout", seed=1)) != set(held)  # another seed, another split
    sample = select_tasks(root, split="train", limit=20, seed=3)
    train3 = select_tasks(root, split="train", seed=3)
    assert len(sample) == 20 and sample == sorted(sample) and set(sample) <= set(train3)
    assert sample == select_tasks(root, split="train", limit=20, seed=3) != select_tasks(root, split="train",
                                                                                         limit=20, seed=4)
    assert sample[:5] != train3[:5]  # a random sample, not the first names
    # The same selection behind launch.eval and the RL loop's config.tasks.source = a ClawGym folder.
    assert eval_task_dirs(root, tmp_path, split="train", limit=20, seed=3) == sample
    cfg = TasksConfig(source=root, seed=3, limit=20)  # the run config's `tasks` section (research/rl/config.py)
    assert loop_task_dirs(cfg, tmp_path, "train") == sample
    cfg = dataclasses.replace(cfg, limit=0)
    assert loop_task_dirs(cfg, tmp_path, "heldout") == select_tasks(root, split="heldout", seed=3)
    fam = TasksConfig(source="make_file", seed=0)
    assert len(loop_task_dirs(fam, tmp_path, "heldout")) == 36  # the family keeps its own split


def _solve_and_idle(tmp_path, tok_dir, backend_name, harness="reference"):
    from research.models.tokenizer import load_tokenizer
    from research.serving.replay import ReplayEngine

    backend = get_backend(backend_name)
    ok, why = backend.available()
    if not ok:
        pytest.skip(why)
    root = clawgym_train()
    solve, idle = root / "task_0185", root / IDLE_TASK
    tok = load_tokenizer(tok_dir)
    plans = {query_marker(solve): ([SOLVE_0185], SOLVED_0185), query_marker(idle): ([], DO_NOTHING)}
    engine = ReplayEngine(per_task_policy(harness, plans, tok.decode), tok)
    specs = [RolloutSpec(solve, harness, 0), RolloutSpec(idle, harness, 0)]
    results, calls = run_rollouts(tmp_path, engine, tok, specs, backend=backend, concurrency=2)
    by = {r.rollout_id.split(".")[0]: r for r in results}
    for r in results:
        print(f"{harness}/{backend_name} {r.rollout_id}: {r.status} reward={r.reward} "
              + " ".join(f"{k}={v:.2f}" for k, v in sorted(r.timings.items())))
        assert r.status == "ok", f"{r.rollout_id}: {r.status}: {r.message}\n{logs_of(tmp_path, r.rollout_id)}"
    return by, calls


def test_scripted_run_solves_a_real_task_and_doing_nothing_scores_zero(tmp_path, qwen3_tokenizer_dir):
    by, calls = _solve_and_idle(tmp_path, qwen3_tokenizer_dir, "bwrap")
    assert by["task_0185"].reward == 1.0  # relative paths: the harness ran in /root/.openclaw/workspace
    assert by[IDLE_TASK].reward == 0.0
    assert by[IDLE_TASK].meta["inputs_changed"] == [] == by["task_0185"].meta["inputs_changed"]
    assert {c.rollout_id for c in calls} == {r.rollout_id for r in by.values()}
    assert by["task_0185"].meta["workspace_dir"] == WS


@pytest.mark.docker
def test_real_task_in_docker(tmp_path, qwen3_tokenizer_dir):
    by, _ = _solve_and_idle(tmp_path, qwen3_tokenizer_dir, "docker")
    assert by["task_0185"].reward == 1.0 and by[IDLE_TASK].reward == 0.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tiny_jax_policy_on_ten_real_tasks_through_launch_eval_library(tmp_path, qwen3_tokenizer_dir):
    """The tiny random JAX policy on 10 sampled real tasks via the reference harness, through `evaluate` (what
    launch.eval runs): every rollout ends with a named status that is not a task/infra/reward error, and
    every completed rollout has a reward computed by the shipped checker."""
    import jax

    from harness_env.eval.run import evaluate, task_dirs
    from harness_env.rl.rollouts import CappedEngine
    from harness_env.runner import RunnerConfig
    from harness_env.sandbox import Limits
    from research.models import init_params, tiny_dense
    from research.models.tokenizer import load_tokenizer
    from research.serving.jax_engine import EngineConfig, JaxEngine
    from research.serving.qwen3_runner import Qwen3Runner

    tok = load_tokenizer(qwen3_tokenizer_dir)
    cfg = tiny_dense(vocab_size=151936)
    engine = CappedEngine(JaxEngine(Qwen3Runner(cfg), init_params(cfg, jax.random.PRNGKey(0)),
                                    config=EngineConfig(num_slots=4, max_len=4096, prefill_chunk=512)), 16)
    tasks = task_dirs(str(clawgym_train()), tmp_path, limit=10, seed=0)
    rcfg = RunnerConfig(out_dir=tmp_path / "out", concurrency=4, timeout_s=120, progress=False, max_turns=3,
                        limits=Limits(memory_mb=2048, wall_s=200))
    try:
        doc = asyncio.run(evaluate(tasks=tasks, harnesses=["reference"], k=1, engine=engine, tok=tok,
                                   out=tmp_path / "out", cfg=rcfg))
    finally:
        asyncio.run(engine.close())
    from research.capture import RolloutResult, read_log

    results = [r for r in read_log(tmp_path / "out" / "results.jsonl") if isinstance(r, RolloutResult)]
    statuses = collections.Counter(r.status for r in results)
    print("tiny-jax on 10 real tasks:", dict(statuses), [r.reward for r in results],
          "mean total_s", sum(r.timings["total_s"] for r in results) / len(results))
    assert len(results) == 10 and {r.group_id.split("/")[0] for r in results} == {t.name for t in tasks}
    assert not BAD & set(statuses), [(r.rollout_id, r.status, r.message) for r in results if r.status in BAD]
    assert all(isinstance(r.reward, float) and 0.0 <= r.reward <= 1.0 for r in results if r.status == "ok")
    assert statuses["ok"] >= 5  # a random policy's first reply is usually plain text: the agent's final answer
    (row,) = [r for r in doc["rows"] if r.group == "all"]
    assert row.rollouts == 10


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_launch_eval_limit_on_real_tasks(tmp_path, qwen3_tokenizer_dir):
    """`python -m launch.eval --tasks=../shared/clawgym/train --limit=3 --seed=1` as a user types it (the
    `oracle` endpoint knows only the make_file family, so here it is an agent that does nothing)."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "launch.eval", f"--tasks={clawgym_train()}", "--limit=3", "--seed=1",
           "--harness=reference", "--k=1", "--endpoint=oracle", f"--out={out}", f"--tokenizer={qwen3_tokenizer_dir}",
           "--concurrency=3", "--timeout_s=60"]
    p = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"},
                       capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stderr[-3000:]
    from research.capture import RolloutResult, read_log

    results = [r for r in read_log(out / "results.jsonl") if isinstance(r, RolloutResult)]
    names = sorted(r.group_id.split("/")[0] for r in results)
    assert names == [d.name for d in select_tasks(str(clawgym_train()), limit=3, seed=1)]
    assert [(r.status, r.reward) for r in results] == [("ok", 0.0)] * 3, [r.message for r in results]
    report = json.loads((out / "report.json").read_text())
    assert report and (out / "report.txt").exists()
