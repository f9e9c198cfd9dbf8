"""AOT compilation of the real train step from abstract inputs: per-device memory without any hardware.

Why: a 30B-A3B config must be shown to fit before anyone rents a pod. `jax.jit(step).lower(abstract
state, abstract batch).compile()` runs the full SPMD partitioner for the target mesh on fake CPU
devices (ShapeDtypeStructs carry the shardings; nothing is allocated), and XLA's `memory_analysis()`
then reports what ONE device holds: arguments (params + optimizer state + batch), outputs, aliased
(donated) buffers and temporaries (activations, gradients, collectives' buffers).

Caveat: the numbers come from XLA:CPU's buffer assignment; TPU/GPU compilers fuse and schedule
differently (and use bf16 collectives/kernels), so treat them as a faithful estimate of the state and a
rough one of activations.

  python -m research.train.aot --config=configs/qwen3_30b_a3b.py:gpu [--num_layers=2] [--fake_devices=8]
"""

from __future__ import annotations

import os
import sys
import time

GiB = 1024**3


def abstract_batch(*, rows: int, row_len: int, mesh, batch_axes=("data", "fsdp", "expert")) -> dict:
    """ShapeDtypeStructs of one packed-row SFT batch, rows sharded over the batch mesh axes."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    sharding = NamedSharding(mesh, PartitionSpec(tuple(batch_axes)))
    spec = lambda dt: jax.ShapeDtypeStruct((rows, row_len), dt, sharding=sharding)
    keys = ("tokens", "positions", "segment_ids", "subtree_end", "targets")
    return {**{k: spec(jnp.int32) for k in keys}, "loss_mask": spec(jnp.float32)}


def memory_report(compiled) -> dict:
    """Per-device bytes from `compiled.memory_analysis()`; `peak_bytes` = args + outputs - aliased + temps."""
    m = compiled.memory_analysis()
    rep = {
        "argument_bytes": int(m.argument_size_in_bytes),
        "output_bytes": int(m.output_size_in_bytes),
        "alias_bytes": int(m.alias_size_in_bytes),
        "temp_bytes": int(m.temp_size_in_bytes),
        "code_bytes": int(m.generated_code_size_in_bytes),
    }
    rep["peak_bytes"] = rep["argument_bytes"] + rep["output_bytes"] - rep["alias_bytes"] + rep["temp_bytes"]
    return rep


_DTYPE_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s64": 8, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1}


def largest_arrays(compiled, n: int = 6) -> list[tuple[str, int]]:
    """The n largest distinct array shapes in the optimised per-device HLO, with their bytes.

    Why: `temp_bytes` is one number; this says *what* dominates it (e.g. a compiler's lowering of a
    grouped matmul), which is what one needs to act on a memory problem.
    """
    import re

    sizes: dict[str, int] = {}
    for m in re.finditer(r"\b(f64|f32|bf16|f16|s64|s32|u32|s8|u8|pred)\[([0-9,]+)\]", compiled.as_text()):
        dims = [int(d) for d in m.group(2).split(",")]
        nbytes = _DTYPE_BYTES[m.group(1)]
        for d in dims:
            nbytes *= d
        sizes[m.group(0)] = nbytes
    return sorted(sizes.items(), key=lambda kv: -kv[1])[:n]


def aot_compile(config, *, num_layers: int | None = None, devices=None) -> dict:
    """Lowers + compiles the SFT train step of `config` on its mesh; returns the memory report.

    `num_layers` overrides the depth (real width) to keep CPU compile time short in tests; with
    scanned layers, state memory scales linearly in depth (reported as `state_bytes_per_layer`).
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from research.models.params import count_model_params
    from research.train.state import abstract_train_state, make_mesh, policy_state_init
    from research.train.step import make_sft_loss_fn, make_train_step

    if num_layers is not None:
        config = config.copy_and_resolve_references()
        config.model.num_layers = num_layers
    init, cfg = policy_state_init(config)
    mesh = make_mesh(config.mesh, devices)
    state = abstract_train_state(init, mesh, cfg.logical_rules)
    shardings = jax.tree.map(lambda a: a.sharding, state)
    batch = abstract_batch(rows=config.train.batch_rows, row_len=config.train.row_len, mesh=mesh)
    step = make_train_step(
        loss_fn=make_sft_loss_fn(cfg, logprob_chunk=config.train.logprob_chunk),
        optimizer=init.optimizer,
        state_shardings=shardings,
        batch_shardings=NamedSharding(mesh, PartitionSpec(("data", "fsdp", "expert"))),
        num_microbatches=config.train.num_microbatches,
    )
    t0 = time.perf_counter()
    lowered = step.lower(state, batch)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    state_bytes = sum(_device_bytes(a) for a in jax.tree.leaves(state))
    counts = count_model_params(cfg)
    return {
        **memory_report(compiled),
        "state_bytes_per_device": state_bytes,
        "mesh": dict(mesh.shape),
        "num_layers": cfg.num_layers,
        "params_total": counts.total,
        "params_active": counts.active,
        "tokens_per_step": config.train.batch_rows * config.train.row_len,
        "largest_arrays": largest_arrays(compiled),
        "lower_s": round(t1 - t0, 2),
        "compile_s": round(t2 - t1, 2),
    }


def _device_bytes(a) -> int:
    """Bytes one device holds of abstract array `a` under its sharding (max shard, padding included)."""
    import math

    shard = a.sharding.shard_shape(a.shape)
    return math.prod(shard) * a.dtype.itemsize


def format_report(rep: dict) -> str:
    g = lambda k: f"{rep[k] / GiB:.2f} GiB"
    return (f"mesh {rep['mesh']} layers {rep['num_layers']}: per device peak {g('peak_bytes')} "
            f"(args {g('argument_bytes')}, temps {g('temp_bytes')}, outputs {g('output_bytes')}, "
            f"aliased {g('alias_bytes')}; state {g('state_bytes_per_device')}), "
            f"lower {rep['lower_s']}s compile {rep['compile_s']}s; largest arrays: "
            + ", ".join(f"{name} {b / GiB:.2f} GiB" for name, b in rep.get("largest_arrays", [])))


def main(argv=None) -> None:
    """CLI: fake CPU devices must be configured before jax is imported, hence the late imports."""
    from absl import app, flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "config file (e.g. configs/qwen3_30b_a3b.py:gpu)")
    flags.DEFINE_integer("num_layers", None, "override depth (real width) for a quicker compile")
    flags.DEFINE_integer("fake_devices", 0, "force this many XLA:CPU devices (0: use the real backend)")

    def run(_):
        import json

        fake = flags.FLAGS.fake_devices
        if fake:
            import jax

            jax.config.update("jax_platforms", "cpu")
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                       f" --xla_force_host_platform_device_count={fake}").strip()
        rep = aot_compile(flags.FLAGS.config, num_layers=flags.FLAGS.num_layers)
        print(format_report(rep))
        print("AOT " + json.dumps(rep, sort_keys=True), flush=True)

    app.run(run, argv=argv or sys.argv)


if __name__ == "__main__":
    main()
