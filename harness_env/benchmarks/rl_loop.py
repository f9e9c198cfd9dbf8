"""Bench `loop`: time split of RL steps of the demo config and end-to-end throughput.

    python -m launch.bench --suite=rl_loop [--opt steps=4 --opt groups_per_step=4 --opt group_size=4]

Runs `steps` synchronous tree-GRPO steps of configs/demo_cpu.py (tiny policy with the real Qwen3
tokenizer, JAX engine, shim, bwrap, reference harness, make_file tasks; no SFT, no eval) in a fresh
temp workdir and reports per-step means over the steps after the first (which compiles):
  rollout_s, tree_s (seal + shards + trees + pack), train_s, sync_s, trained_tokens_per_s (tree tokens /
  train_s), rollouts_per_min (rollouts / rollout wall time), tree_compression (flat / tree tokens).
Baseline in the same run, on the last step's batch: the same objective with the LM head on every slot
(`objective.all_slots`) vs the loop's compact head (loss slots only) -> `compact_head_speedup`; and the
tokens the flat per-call view would train -> `tree_compression`.
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
    from harness_env.rl.loop import train
    from research.rl.metrics import read_metrics

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

    out.update(_head_baseline(cfg, wd, reps))
    if not keep:
        import shutil

        shutil.rmtree(wd, ignore_errors=True)
    else:
        out["workdir"] = str(wd)
    return out


def _head_baseline(cfg, wd: pathlib.Path, reps: int) -> dict:
    """Full-vocabulary head on every slot vs the compact head, same state, same batch, same jitted step."""
    from jax.sharding import NamedSharding, PartitionSpec

    from research.data.pipeline import step_stream
    from research.rl import batches as B
    from research.rl.objective import all_slots, make_rl_loss_fn
    from research.rl.trainer import Learner
    from research.train.step import make_train_step

    learner = Learner(cfg)
    run = learner.run
    *_, sealed = list(step_stream(wd / "shards", run.pipeline()))
    # every group of the step, signal or not (a tiny random policy often gets one reward for a whole group)
    batch = B.build_batch(sealed.items, run.batching(), current_version=1 << 30, max_off_policy=1 << 30,
                          loss_slots_k=run.train.loss_slots, filter_groups=False)
    if not batch.trees:
        raise RuntimeError(f"the last step of {wd} left no trainable tree ({len(sealed.items)} items sealed)")
    rows = NamedSharding(learner.mesh, PartitionSpec(run.train.batch_axes))
    step = make_train_step(loss_fn=make_rl_loss_fn(run.model, learner.obj), optimizer=learner.init.optimizer,
                           state_shardings=learner.shardings, batch_shardings=rows, donate=False)
    B_, T = batch.device["tokens"].shape
    idx, valid = all_slots(B_, T)
    full = {**batch.device, "loss_idx": idx, "loss_valid": valid}
    t_full = _time(lambda: step(learner.state, full)[1]["loss"].block_until_ready(), reps)
    t_compact = _time(lambda: step(learner.state, batch.device)[1]["loss"].block_until_ready(), reps)
    return dict(full_head_train_s=round(t_full, 4), compact_head_train_s=round(t_compact, 4),
                compact_head_speedup=round(t_full / t_compact, 3))
