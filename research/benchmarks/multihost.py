"""Bench suite `multihost`: real multi-process training on one machine vs one process, same numbers.

    python -m launch.bench --suite=multihost [--opt processes=2 --opt steps=3 --opt moe=true]

Starts `processes` Python processes joined by `jax.distributed.initialize` (CPU devices, gloo collectives,
coordinator on 127.0.0.1; rank and count come from the environment, as a pod launcher would give them),
one CPU device each, and trains the RL loop's `Learner` (tree GRPO, compact head) for `steps` steps on a
mesh with params FSDP-sharded and rows sharded over all processes. Each process reads only its share of the
sealed ArrayRecord shards through grain (`research/data/per_process.shard_dataset`), packs its own rows,
and `global_batch` assembles the step's global arrays. The baseline, in the same run: ONE process with as
many devices (same mesh, same SPMD program) reading every group. Then the checkpoints cross over: the
multi-process run restores the one-process checkpoint, and a fresh single process restores the
multi-process checkpoint (saved collectively by all processes), each compared with its source exactly.

Reported: `loss_rel_diff` (max over steps), `param_max_diff` (final params, max abs), `step_s_1proc`,
`step_s_2proc` (median step after the first, which compiles; the key names the process count of the
run), `restore_1to{N}_max_diff`, `restore_{N}to1_max_diff`, and the per-step losses. Processes on a
2-core machine compete for the cores: the timing ratio shows overhead, not speed-up.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------- inputs
def write_shards(out_dir: pathlib.Path, *, groups: int, vocab: int, seed: int = 0) -> list[str]:
    """Synthetic capture-shaped groups -> capture log -> sealed shards (the loop's own data path)."""
    import numpy as np

    from research.capture import CaptureLog
    from research.data.shards import seal_log
    from research.trees import synthetic

    rng = np.random.default_rng(seed)
    log = out_dir / "capture.jsonl"
    with CaptureLog(log, fsync=False) as cap:
        for g in range(groups):
            calls, results = synthetic.make_group(rng, group_id=f"g{g:03d}", harness="reference", sessions=3,
                                                  turns=2, vocab=vocab, prefix_len=16, p_trunc=0.0)
            cap.append_many([*calls, *results])
    return seal_log(log, out_dir / "shards", groups_per_shard=4)


def worker_config(*, devices: int, groups_per_step: int, moe: bool):
    """demo_cpu:test shrunk: small vocab, params FSDP-sharded and rows sharded over every device."""
    from configs import demo_cpu, tiny

    cfg = demo_cpu.get_config("test")
    if moe:  # tiny MoE (8 experts): the expert weights are FSDP-sharded across processes too
        cfg.model = tiny.get_config("moe").model
    cfg.model.update(vocab_size=128, attention_impl="reference")
    cfg.mesh.update(data=1, fsdp=-1, expert=1, tensor=1)
    cfg.train.update(batch_rows=devices, row_len=128, loss_slots=32)
    cfg.engine.update(max_len=128)  # a path fits a row (the run config's invariant)
    cfg.train.batch_axes = ("data", "fsdp")
    cfg.rollout.update(groups_per_step=groups_per_step)
    cfg.optim.update(warmup_steps=0, learning_rate=1e-3)
    del cfg["rl_optim"]
    return cfg


# ---------------------------------------------------------------------------------------------- worker
def _gather(tree):
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def _flat(tree) -> dict:
    import jax
    import numpy as np

    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _max_diff(a: dict, b: dict) -> float:
    import numpy as np

    if a.keys() != b.keys():
        raise ValueError(f"param trees differ: {sorted(a.keys() ^ b.keys())[:5]}")
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)


def _group_iterator(cfg, shards: list[str]):
    """This process's share of the shuffled groups, `groups_per_step / processes` per step (grain)."""
    import grain
    import jax

    from research.data import per_process
    from research.data.shards import ShardSource

    per_step = cfg.rollout.groups_per_step // jax.process_count()
    ds = per_process.shard_dataset(grain.MapDataset.source(ShardSource(shards)).shuffle(seed=cfg.seed))
    return iter(ds.to_iter_dataset().batch(per_step, batch_fn=list))


def _steps(learner, cfg, it, steps: int) -> tuple[list[float], list[float], list[list[str]]]:
    """`steps` RL steps on this process's groups; returns (losses, step seconds, group ids read)."""
    import dataclasses

    import jax

    from research.data import per_process
    from research.data.pipeline import to_tree
    from research.rl import batches as B

    run = learner.run
    pcfg = run.pipeline()
    bcfg = dataclasses.replace(run.batching(), num_rows=run.train.batch_rows // jax.process_count())
    losses, times, read = [], [], []
    for _ in range(steps):
        groups = next(it)
        read.append([g.group_id for g in groups])
        batch = B.build_batch([to_tree(g, pcfg) for g in groups], bcfg, current_version=learner.step,
                              max_off_policy=1 << 30, loss_slots_k=run.train.loss_slots)
        batch.device = per_process.global_batch(batch.device, learner.mesh, run.train.batch_axes)
        t0 = time.perf_counter()
        metrics = learner.train(batch)
        times.append(time.perf_counter() - t0)
        losses.append(metrics["loss"])
    return losses, times, read


def _all(flag: bool) -> bool:
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.asarray([flag]))))


def worker(spec: dict) -> None:
    """One process of a run (`python -m research.benchmarks.multihost SPEC_JSON`); process 0 writes `out`.

    Order: restore the other run's checkpoint (if given) and compare its params with that run's; train; save
    params (process 0) and a checkpoint (all processes, each with its own grain iterator position); restore
    that checkpoint and resume the iterator from it: the next groups must be those the live iterator gives.
    """
    import jax
    import numpy as np

    from research.rl.trainer import Learner
    from research.train import distributed
    from research.train.checkpoint import Checkpointer

    if spec["processes"] > 1:
        distributed.initialize({})  # rank/count/coordinator from the environment
    assert jax.process_count() == spec["processes"], (jax.process_count(), spec)
    cfg = worker_config(devices=jax.device_count(), groups_per_step=spec["groups_per_step"], moe=spec["moe"])
    t0 = time.perf_counter()
    learner = Learner(cfg)
    out: dict = {"processes": jax.process_count(), "devices": jax.device_count(), "mesh": dict(learner.mesh.shape),
                 "init_s": time.perf_counter() - t0}
    if spec.get("restore"):  # a checkpoint written by the other process count: restore, compare with its params
        with Checkpointer(spec["restore"], async_save=False) as ck:
            state, data, _ = ck.restore(learner.abstract)
        out["restore_max_diff"] = _max_diff(_flat(_gather(state.params)), dict(np.load(spec["restore_params"])))
        out.update(restore_step=int(state.step), restored_data=data)  # another process count: every state
        del state
    if spec["steps"]:
        it = _group_iterator(cfg, spec["shards"])
        t0 = time.perf_counter()
        losses, times, read = _steps(learner, cfg, it, spec["steps"])
        out.update(losses=losses, step_s=times, train_s=time.perf_counter() - t0)
        pathlib.Path(f"{spec['out']}.groups{jax.process_index()}").write_text(json.dumps(read))
        params = _flat(_gather(learner.state.params))
        if jax.process_index() == 0:
            np.savez(spec["params_out"], **params)
        # the process index rides along so the per-process data states differ (as a real pipeline's may)
        saved = {"iterator": it.get_state(), "process": jax.process_index()}
        with Checkpointer(spec["ckpt_out"], async_save=False) as ck:
            ck.save(learner.step, learner.state, data_state=saved, force=True)
            ck.wait()
            _, data, _ = ck.restore(learner.abstract)
        resumed = _group_iterator(cfg, spec["shards"])
        resumed.set_state(data["iterator"])
        same = [g.group_id for g in next(resumed)] == [g.group_id for g in next(it)]
        out["data_resume_ok"] = _all(same and data == saved)
    if jax.process_index() == 0:
        pathlib.Path(spec["out"]).write_text(json.dumps(out))


# ---------------------------------------------------------------------------------------------- launcher
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(spec: dict, *, processes: int, devices_per_process: int, timeout_s: float,
          cache_dir: str | None = None) -> dict:
    """Runs `worker(spec)` in `processes` fresh processes (the env of a pod launcher) and returns process 0's
    result. Any failure or timeout kills every process of the run and raises with their stderr tails.
    `cache_dir`: a JAX persistent compilation cache shared by the runs (the same programs compile once)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}",
               PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    if cache_dir:
        env.update(JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    if processes > 1:
        env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{_free_port()}", JAX_NUM_PROCESSES=str(processes))
    spec = {**spec, "processes": processes}
    logs = [tempfile.TemporaryFile() for _ in range(processes)]
    procs = [subprocess.Popen([sys.executable, "-m", "research.benchmarks.multihost", json.dumps(spec)], cwd=REPO,
                              env={**env, "JAX_PROCESS_ID": str(i)}, stdout=log, stderr=subprocess.STDOUT)
             for i, log in enumerate(logs)]
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    if failed:
        tails = []
        for i in failed:
            logs[i].seek(0)
            tails.append(f"--- process {i} (rc {procs[i].returncode}):\n" + logs[i].read().decode()[-3000:])
        raise RuntimeError(f"multihost run of {processes} processes failed:\n" + "\n".join(tails))
    return json.loads(pathlib.Path(spec["out"]).read_text())


def run(processes: int = 2, steps: int = 3, moe: bool = False, groups_per_step: int | None = None,
        crossover: bool = True, timeout_s: float = 300.0, workdir: str | None = None) -> dict:
    """`crossover=False` skips the checkpoint exchange (the multi-process run still saves, restores and
    resumes its own checkpoint): the cheaper form for larger process counts."""
    import statistics

    tmp = tempfile.TemporaryDirectory() if workdir is None else None
    root = pathlib.Path(workdir or tmp.name)
    root.mkdir(parents=True, exist_ok=True)
    gps = groups_per_step or 2 * processes
    shards = write_shards(root, groups=gps * (steps + 1), vocab=128)  # +1 step: the resumed iterator's next
    base = dict(shards=shards, groups_per_step=gps, moe=moe, steps=steps)
    one = {**base, "out": str(root / "one.json"), "params_out": str(root / "one.npz"), "ckpt_out": str(root / "ck1")}
    many = {**base, "out": str(root / "many.json"), "params_out": str(root / "many.npz"),
            "ckpt_out": str(root / f"ck{processes}")}
    if crossover:
        many.update(restore=one["ckpt_out"], restore_params=one["params_out"])
    back = {**base, "steps": 0, "out": str(root / "back.json"), "restore": many["ckpt_out"],
            "restore_params": many["params_out"]}
    kw = dict(timeout_s=timeout_s, cache_dir=str(root / "jax_cache"))
    try:
        walls = [time.perf_counter()]
        r1 = spawn(one, processes=1, devices_per_process=processes, **kw)
        walls.append(time.perf_counter())
        rn = spawn(many, processes=processes, devices_per_process=1, **kw)
        walls.append(time.perf_counter())
        rb = spawn(back, processes=1, devices_per_process=processes, **kw) if crossover else {}
        walls.append(time.perf_counter())
        import numpy as np

        a, b = dict(np.load(one["params_out"])), dict(np.load(many["params_out"]))
        param_diff = _max_diff(a, b)
    finally:
        if tmp is not None:
            tmp.cleanup()
    rel = [abs(x - y) / max(abs(x), 1e-12) for x, y in zip(r1["losses"], rn["losses"])]
    med = lambda ts: statistics.median(ts[1:]) if len(ts) > 1 else ts[0]
    out = {
        "processes": processes,
        "devices": r1["devices"],
        "mesh": rn["mesh"],
        "model": "tiny_moe" if moe else "tiny_dense",
        "steps": steps,
        "losses_1proc": r1["losses"],
        f"losses_{processes}proc": rn["losses"],
        "loss_rel_diff": max(rel),
        "param_max_diff": param_diff,
        "data_resume_ok": r1["data_resume_ok"] and rn["data_resume_ok"],
        "step_s_1proc": med(r1["step_s"]),
        f"step_s_{processes}proc": med(rn["step_s"]),
        "step_time_ratio": med(rn["step_s"]) / med(r1["step_s"]),
        "first_step_s_1proc": r1["step_s"][0],  # compile + run
        f"first_step_s_{processes}proc": rn["step_s"][0],
        "run_wall_s": [round(b - a, 1) for a, b in zip(walls, walls[1:])],  # 1 proc, N procs[, 1 proc restoring]
    }
    if crossover:
        out.update({
            f"restore_1to{processes}_max_diff": rn["restore_max_diff"],
            f"restore_{processes}to1_max_diff": rb["restore_max_diff"],
            "restored_step": rb["restore_step"],
            "restored_data_processes": len(rb["restored_data"].get("__per_process__", [rb["restored_data"]])),
        })
    return out


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
