"""Bench `loop`: time split of RL steps of the demo config and end-to-end throughput.

    python -m launch.bench --suite=loop [--opt steps=4 --opt groups_per_step=4 --opt group_size=4]

Runs `steps` synchronous tree-GRPO steps of configs/demo_cpu.py (tiny policy with the real Qwen3
tokenizer, JAX engine, shim, bwrap, reference harness, make_file tasks; no SFT, no eval) in a fresh
temp workdir and reports per-step means over the steps after the first (which compiles):
  rollout_s, tree_s (seal + shards + trees + pack), train_s, sync_s, trained_tokens_per_s (tree tokens /
  train_s), rollouts_per_min (rollouts / rollout wall time), tree_compression (flat / tree tokens).
Baseline in the same run, on the last step's batch: the same train step with the full-vocabulary head
(research/trees/objective.py) vs the loop's compact head -> `compact_head_speedup`; and the tokens the
flat per-call view would train -> `tree_compression`.
"""

from __future__ import annotations

import pathlib
import statistics
import tempfile
import time


def _time(fn, reps: int) -> float:
    fn()  # compile
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def run(steps: int = 4, groups_per_step: int = 4, group_size: int = 4, reps: int = 2, keep: bool = False) -> dict:
    from configs import demo_cpu
    from research.rl import batches as B
    from research.rl.loop import train
    from research.rl.metrics import read_metrics
    from research.rl.trainer import Learner, pipeline_config
    from research.train.step import make_train_step
    from research.trees.objective import make_tree_loss_fn

    cfg = demo_cpu.get_config()
    cfg.train.steps = steps
    cfg.sft.steps = 0
    cfg.eval.update(every=0, at_start=False, after_sft=False)
    cfg.metrics.tensorboard = False
    cfg.rollout.update(groups_per_step=groups_per_step, group_size=group_size)
    wd = pathlib.Path(tempfile.mkdtemp(prefix="bench_loop_"))
    t0 = time.perf_counter()
    train(cfg, wd)
    wall = time.perf_counter() - t0
    recs = [m for m in read_metrics(wd) if m["kind"] == "train"]
    warm = recs[1:] or recs
    mean = lambda k: statistics.fmean(m.get(k, 0.0) for m in warm)
    n_rollouts = sum(m["rollout/all/count"] for m in warm)
    out = {k: round(mean(k), 4) for k in ("rollout_s", "tree_s", "train_s", "sync_s", "trained_tokens_per_s",
                                          "tree_compression")}
    out["rollouts_per_min"] = round(60.0 * n_rollouts / max(sum(m["rollout_s"] for m in warm), 1e-9), 2)
    out["step_s"] = round(sum(out[k] for k in ("rollout_s", "tree_s", "train_s", "sync_s")), 3)
    out["final_reward"] = recs[-1]["rollout/all/reward"] if recs else None
    out["wall_s"] = round(wall, 1)

    # Baseline on the last step's batch: full-vocabulary head vs the compact head, same state and step.
    learner = Learner(cfg)
    ids = _last_ids(wd)
    batch = B.build_batch(B.load_groups(wd / "shards", ids), pipeline_config(cfg), current_version=0,
                          max_off_policy=1 << 30, loss_slots_k=cfg.train.loss_slots)
    full = make_train_step(loss_fn=make_tree_loss_fn(learner.model_cfg, learner.obj),
                           optimizer=learner.init.optimizer, state_shardings=learner.shardings,
                           batch_shardings=_rows(learner), donate=False)
    dev = {k: v for k, v in batch.device.items() if k not in ("loss_idx", "loss_valid")}
    t_full = _time(lambda: full(learner.state, dev)[1]["loss"].block_until_ready(), reps)
    t_compact = _time(lambda: learner.train(batch), reps)
    out.update(full_head_train_s=round(t_full, 4), compact_head_train_s=round(t_compact, 4),
               compact_head_speedup=round(t_full / t_compact, 3))
    if not keep:
        import shutil

        shutil.rmtree(wd, ignore_errors=True)
    else:
        out["workdir"] = str(wd)
    return out


def _rows(learner):
    from jax.sharding import NamedSharding, PartitionSpec

    from research.rl.trainer import batch_axes

    return NamedSharding(learner.mesh, PartitionSpec(batch_axes(learner.config)))


def _last_ids(wd: pathlib.Path) -> set[str]:
    import json

    lines = (wd / "ledger.jsonl").read_text().splitlines()
    return set(json.loads(lines[-1])["trained"])
