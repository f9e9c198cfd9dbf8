"""Bench suite `gpu_check`: the first thing to run on a machine with one GPU (or TPU): does the stack work there,
and how fast. Installs nothing; imports only this project and its dependencies.

    python -m launch.bench --suite=gpu_check            # < 5 min on one GPU; several minutes on 2 CPU cores

Parts (each timed; a failing part is reported as `<part>_error` and the others still run):
  env           backend, device kind and count, per-device memory where the runtime reports it;
  attention     the Pallas tree-attention kernels vs the reference (values and gradients; interpret mode on
                CPU, compiled on GPU/TPU), what impl="auto" runs here, and their lowering for cuda/tpu;
  train_step    the RL loop's Learner (tiny MoE, tree GRPO, compact head) with attention impl="auto" (the
                Pallas kernel on an accelerator) on synthetic packed tree batches: tokens/s, and the first
                batch's loss vs impl="reference" (`train_loss_rel_diff`: the objective alone;
                `train_step_loss_rel_diff`: the train step's reported loss);
  engine        the JAX engine (continuous batching, KV cache): decode tokens/s at several concurrencies;
  tree_vs_flat  tree vs flat per-call training on harness-shaped groups: speedup and loss agreement.
Sizes follow the backend (`size="auto"`: "gpu" sizes on an accelerator, "cpu" sizes on CPU, where CI runs it).
"""

from __future__ import annotations

import time
import traceback

SIZES = {
    "cpu": dict(row_len=128, rows=2, steps=3, groups=2, engine=dict(new_tokens=8, concurrency=(1, 4), layers=2,
                hidden=64, vocab=512), tree=dict(turns=(3,), sessions=2, prefix=64, scale=0.02, flat_steps=1,
                                                 loss_calls=4)),
    "gpu": dict(row_len=2048, rows=8, steps=10, groups=16, engine=dict(new_tokens=128, concurrency=(1, 8, 32),
                layers=4, hidden=256, vocab=4096), tree=dict(turns=(10, 20), sessions=8, prefix=2048, scale=0.25,
                                                             flat_steps=2, loss_calls=24)),
}


def _env() -> dict:
    import jax

    devs = jax.devices()
    out = {"backend": jax.default_backend(), "device_kind": devs[0].device_kind, "device_count": len(devs),
           "jax_version": jax.__version__}
    try:
        stats = devs[0].memory_stats() or {}
        if "bytes_limit" in stats:
            out["device_memory_gib"] = round(stats["bytes_limit"] / 1024**3, 2)
    except Exception:  # CPU devices have no memory stats: nothing to report
        pass
    return out


def _learner_config(size: dict, attention: str):
    from configs import demo_cpu, tiny

    cfg = demo_cpu.get_config("test")
    cfg.model = tiny.get_config("moe").model
    cfg.model.update(vocab_size=512, attention_impl=attention, moe_impl="auto")
    cfg.mesh.update(data=1, fsdp=1, expert=1, tensor=1)
    cfg.train.update(batch_rows=size["rows"], row_len=size["row_len"], loss_slots=64)
    cfg.engine.update(max_len=min(cfg.engine.max_len, size["row_len"]))  # a path fits a row
    cfg.rollout.update(groups_per_step=size["groups"])
    del cfg["rl_optim"]
    return cfg


def _batches(run, n: int, seed: int = 0):
    """`n` packed step batches of synthetic harness-shaped groups, packed as the loop's typed `run` packs."""
    import numpy as np

    from research.data.pipeline import to_tree
    from research.data.shards import GroupRecord
    from research.rl import batches as B
    from research.trees import synthetic

    rng = np.random.default_rng(seed)
    pcfg, bcfg = run.pipeline(), run.batching()
    scale = max(1, run.train.row_len // 128)
    out = []
    for s in range(n):
        groups = []
        for g in range(run.rollout.groups_per_step):
            calls, results = synthetic.make_group(rng, group_id=f"s{s}g{g}", harness="reference", sessions=4, turns=3,
                                                  vocab=run.model.vocab_size, prefix_len=16 * scale,
                                                  gen_len=(2, 8 * scale), tool_len=(1, 6 * scale), p_trunc=0.0)
            groups.append(to_tree(GroupRecord(group_id=f"s{s}g{g}", harness="reference", calls=calls,
                                              results=results), pcfg))
        out.append(B.build_batch(groups, bcfg, current_version=0, max_off_policy=1 << 30,
                                 loss_slots_k=run.train.loss_slots))
    return out


def _train_step(size: dict) -> dict:
    """Learner steps with impl="auto"; the first batch's loss also through a forward-only impl="reference"
    objective on the same initial params (cheaper to compile than a second train step)."""
    import statistics

    import jax

    from research.rl.config import RunConfig
    from research.rl.objective import make_rl_loss_fn
    from research.rl.trainer import Learner
    from research.train.state import model_config

    cfg = _learner_config(size, "auto")
    # validated once, against the devices the Learner's mesh will really span (it takes this run unchecked)
    run = RunConfig.of(cfg, num_devices=jax.device_count())
    batches = _batches(run, size["steps"])
    learner = Learner(run)
    loss_at = lambda c: jax.jit(make_rl_loss_fn(model_config(c), learner.obj))(learner.state.params,
                                                                              batches[0].device, None)[0]
    ref, auto = float(loss_at(_learner_config(size, "reference"))), float(loss_at(cfg))
    times, losses = [], []
    for b in batches:
        t0 = time.perf_counter()
        losses.append(learner.train(b)["loss"])
        times.append(time.perf_counter() - t0)
    tokens = [int((b.device["segment_ids"] != 0).sum()) for b in batches]
    steady = statistics.median(times[1:]) if len(times) > 1 else times[0]
    return {"train_rows": int(batches[0].device["tokens"].shape[0]), "train_row_len": cfg.train.row_len,
            "train_first_step_s": times[0], "train_step_s": steady,
            "train_tokens_per_s": statistics.median(tokens) / steady, "train_losses": losses,
            "train_loss_rel_diff": abs(auto - ref) / max(abs(ref), 1e-12),
            "train_step_loss_rel_diff": abs(losses[0] - ref) / max(abs(ref), 1e-12)}


def _attention(size: dict) -> dict:
    import jax

    from research.benchmarks import attention

    if jax.default_backend() == "cpu":
        return attention.pallas_check()
    out = attention.run(prefix=2048, sessions=8, turns=10, block=128, repeats=2, flat=False, pallas=True)
    return {f"attention_{k}" if not k.startswith("pallas") and k != "auto_impl" else k: v for k, v in out.items()}


def _engine(size: dict) -> dict:
    from research.benchmarks import engine

    out = engine.run(transformers=False, **size["engine"])
    return {f"engine_{k}": v for k, v in out.items()}


def _tree_vs_flat(size: dict) -> dict:
    from research.benchmarks import tree_vs_flat

    return {f"tree_vs_flat_{k}": v for k, v in tree_vs_flat.run(**size["tree"]).items()}


PARTS = {"env": lambda size: _env(), "attention": _attention, "train_step": _train_step, "engine": _engine,
         "tree_vs_flat": _tree_vs_flat}


def run(size: str = "auto", parts: str | list[str] = "all") -> dict:
    import jax

    size = ("cpu" if jax.default_backend() == "cpu" else "gpu") if size == "auto" else size
    names = list(PARTS) if parts == "all" else ([parts] if isinstance(parts, str) else list(parts))
    unknown = set(names) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown gpu_check parts {sorted(unknown)}; known: {list(PARTS)}")
    out: dict = {"size": size, "parts": names}
    t_all = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        try:
            out.update(PARTS[name](SIZES[size]))
        except Exception as e:  # one broken part must not hide the others' numbers
            out[f"{name}_error"] = f"{type(e).__name__}: {e}"[:2000]
            out[f"{name}_traceback"] = traceback.format_exc()[-4000:]
        out[f"part_s_{name}"] = round(time.perf_counter() - t0, 2)
        print(f"gpu_check: {name} done in {out[f'part_s_{name}']} s", flush=True)
    out["total_s"] = round(time.perf_counter() - t_all, 2)
    out["ok"] = not any(k.endswith("_error") for k in out)
    return out
