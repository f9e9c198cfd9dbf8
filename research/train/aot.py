"""AOT lowering + compilation of the real train steps from abstract inputs: per-device memory, no hardware.

Why: a 30B-A3B config must be shown to fit before anyone rents a pod. `jax.jit(step).lower(abstract
state, abstract batch).compile()` runs the full SPMD partitioner for the target mesh on fake CPU
devices (ShapeDtypeStructs carry the shardings; nothing is allocated), and XLA's `memory_analysis()`
then reports what ONE device holds: arguments (params + optimizer state + batch), outputs, aliased
(donated) buffers and temporaries (activations, gradients, collectives' buffers).

Steps (`step=`), all built by the code that trains (research/rl/trainer.py `make_steps` over the one
objective, research/rl/objective.py):
  grpo, ppo  the RL loop's step (compact-head tree objective; PPO adds the value head and `old_values`);
             `kl=True` adds the reference log-probs, `replay=True` (MoE) the recorded routed experts
             [B, T, L, k] of routing replay (R3), which also adds the routing forward pass;
  sft        the SFT step on the same tree batch (the default for model-only configs: configs/tiny.py,
             configs/qwen3_30b_a3b.py, whose other run sections take their defaults).

Device memory: `config.device.memory_gb` (the per-device HBM of the config's target) is what the report's
`fits` compares against. Caveat: the numbers come from XLA:CPU's buffer assignment; TPU/GPU compilers fuse
and schedule differently (and use bf16 collectives/kernels), so treat them as a faithful estimate of the
state and a rough one of activations. MoE configs compile with `moe_impl="shapes"` by default: XLA:CPU lowers
`ragged_dot` to dense [local experts, assignments, D] arrays (287 GiB per device for ONE layer of the 30B
GRPO step on the 8-GPU mesh, vs 35 GiB with the stand-in), which no accelerator allocates.

  python -m launch.aot --config=configs/qwen3_30b_a3b_gpu.py --step=grpo,ppo,sft --kl --replay \
      --fake_devices=8 [--num_layers=2]
  python -m launch.aot --config=configs/qwen3_30b_a3b.py:tpu --step=sft --fake_devices=16
"""

from __future__ import annotations

import functools
import math
import re
import time

import jax

from research.models.params import count_model_params
from research.rl.config import RunConfig
from research.rl.trainer import make_steps, state_init
from research.train.state import abstract_train_state, make_mesh
from research.trees import batch as fields

GiB = 1024**3
STEPS = ("grpo", "ppo", "sft")


def _run_config(config):
    """The typed run config; model-only configs get every other section's defaults (invariants unchecked)."""

    return RunConfig.of(config, check=bool(config.get("rl")))


def abstract_batch(config, mesh, *, step: str, kl: bool = False, replay: bool = False,
                   image_patches: int = 0) -> dict:
    """ShapeDtypeStructs of one packed tree batch of `step` as the trainer feeds it, each field laid out as the
    batch table says (rows over `config.train.batch_axes`), with its loss slots (`config.train.loss_slots`; SFT:
    `config.sft.loss_slots` when set); `ref_logp` when `kl`, `old_values` for ppo, `expert_ids` [B, T, L, k] when
    `replay` (MoE only); a vision policy's 3-D positions and `image_patches` patch rows of images (replicated)."""


    run = _run_config(config)
    t, m = run.train, config.model
    keys = [*fields.DEVICE_ROW_FIELDS, *fields.names(fields.SLOTS)]
    if step == "ppo":
        keys.append("old_values")
    if kl and step in ("grpo", "ppo"):
        keys.append("ref_logp")
    if replay:
        if not m.num_experts:
            raise ValueError("replay=True needs an MoE model (config.model.num_experts > 0)")
        keys.append("expert_ids")
    if image_patches:
        if run.vision is None:
            raise ValueError("image_patches needs a vision policy (config.vision)")
        keys += [*fields.names(fields.VISUAL), *fields.names(fields.IMAGES)]
    layout = functools.partial(fields.sharding, mesh=mesh, batch_axes=tuple(t.batch_axes))
    return fields.abstract(keys, sharding=layout, B=t.batch_rows, T=t.row_len,
                           K=run.sft_loss_slots if step == "sft" else t.loss_slots, L=m.num_layers,
                           k=m.get("num_experts_per_tok") or 0, N=image_patches,
                           P=run.vision.patch_dim if run.vision else 0)


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
    sizes: dict[str, int] = {}
    for m in re.finditer(r"\b(f64|f32|bf16|f16|s64|s32|u32|s8|u8|pred)\[([0-9,]+)\]", compiled.as_text()):
        sizes[m.group(0)] = _DTYPE_BYTES[m.group(1)] * math.prod(int(d) for d in m.group(2).split(","))
    return sorted(sizes.items(), key=lambda kv: -kv[1])[:n]


def _device_bytes(a) -> int:
    """Bytes one device holds of abstract array `a` under its sharding (max shard, padding included)."""
    return math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize


def device_memory_bytes(config) -> int | None:
    """Per-device memory of the config's target (`config.device.memory_gb`, decimal GB as vendors state it)."""
    dev = config.get("device")
    return int(dev.memory_gb * 1e9) if dev and dev.get("memory_gb") else None


def _with(config, *, step: str, kl: bool, num_layers: int | None, moe_impl: str | None):
    """A copy of `config` for `step`: algo, KL coefficient, depth and MoE kernel set (nothing else changes)."""
    config = config.copy_and_resolve_references()
    if num_layers is not None:
        config.model.num_layers = num_layers
    if moe_impl and config.model.get("num_experts"):
        config.model.moe_impl = moe_impl
    if step in ("grpo", "ppo"):
        config.algo = step
        if kl and not config.rl.kl_coef > 0:
            config.rl.kl_coef = 0.01
    return config


def _build(config, step: str, mesh):
    """(step fn, abstract state, model config) of `step` on `mesh`, from the trainer's own builders."""


    run = _run_config(config)
    init = state_init(run)
    state = abstract_train_state(init, mesh, run.model.logical_rules)
    steps = make_steps(run, init, mesh, jax.tree.map(lambda a: a.sharding, state))
    return steps["sft" if step == "sft" else "rl"], state, run.model


def aot_compile(config, *, step: str | None = None, kl: bool = False, replay: bool = False,
                num_layers: int | None = None, devices=None, compile: bool = True,
                moe_impl: str | None = "shapes", image_patches: int = 0) -> dict:
    """Lowers (and compiles) `step` of `config` on its mesh; returns the per-device memory report.

    `step` defaults to the config's algo for loop configs (`config.rl` present), else "sft". `num_layers`
    overrides the depth (real width); with scanned layers compile time barely depends on it and state
    memory scales linearly. `compile=False` stops after lowering (shapes and shardings checked).
    `moe_impl`: the MoE kernel compiled; "shapes" (research/models/moe.py) has the buffers of the
    accelerators' grouped GEMM, which XLA:CPU's own lowering of `ragged_dot` inflates ~E_local-fold
    (None: the config's own kernel). `image_patches`: a vision policy's step with that many patch rows of images.
    """


    step = step or (config.algo if config.get("rl") and config.algo != "sft" else "sft")
    if step not in STEPS:
        raise ValueError(f"step {step!r} not in {STEPS}")
    if step != "sft" and not config.get("rl"):
        raise ValueError(f"step {step!r} needs a loop config (with config.rl), e.g. configs/qwen3_30b_a3b_gpu.py")
    config = _with(config, step=step, kl=kl, num_layers=num_layers, moe_impl=moe_impl)
    mesh = make_mesh(config.mesh, devices)
    fn, state, cfg = _build(config, step, mesh)
    batch = abstract_batch(config, mesh, step=step, kl=kl, replay=replay, image_patches=image_patches)
    t0 = time.perf_counter()
    lowered = fn.lower(state, batch)
    t1 = time.perf_counter()
    counts = count_model_params(cfg)
    rep = {"step": step, "moe_impl": config.model.get("moe_impl"), "kl": "ref_logp" in batch,
           "replay": "expert_ids" in batch, "mesh": dict(mesh.shape),
           "num_layers": cfg.num_layers, "params_total": counts.total, "params_active": counts.active,
           "tokens_per_step": config.train.batch_rows * config.train.row_len, "batch_keys": sorted(batch),
           "state_bytes_per_device": sum(_device_bytes(a) for a in jax.tree.leaves(state)),
           "batch_bytes_per_device": sum(_device_bytes(a) for a in jax.tree.leaves(batch)),
           "lower_s": round(t1 - t0, 2), "device_memory_bytes": device_memory_bytes(config)}
    if not compile:
        return rep
    compiled = lowered.compile()
    rep.update(memory_report(compiled), largest_arrays=largest_arrays(compiled),
               compile_s=round(time.perf_counter() - t1, 2))
    if rep["device_memory_bytes"]:
        rep["fits"] = rep["peak_bytes"] <= rep["device_memory_bytes"]
    return rep


def format_report(rep: dict) -> str:
    g = lambda k: f"{rep[k] / GiB:.2f} GiB"
    head = (f"{rep['step']}{' +kl' if rep['kl'] else ''}{' +replay' if rep['replay'] else ''} mesh {rep['mesh']} "
            f"layers {rep['num_layers']}: ")
    if "peak_bytes" not in rep:
        return head + f"lowered in {rep['lower_s']}s (state {g('state_bytes_per_device')} per device)"
    dev = f" of {rep['device_memory_bytes'] / GiB:.1f} GiB ({'fits' if rep['fits'] else 'DOES NOT FIT'})" \
        if rep.get("device_memory_bytes") else ""
    return (head + f"per device peak {g('peak_bytes')}{dev} "
            f"(args {g('argument_bytes')}, temps {g('temp_bytes')}, outputs {g('output_bytes')}, "
            f"aliased {g('alias_bytes')}; state {g('state_bytes_per_device')}), "
            f"lower {rep['lower_s']}s compile {rep['compile_s']}s; largest arrays: "
            + ", ".join(f"{name} {b / GiB:.2f} GiB" for name, b in rep.get("largest_arrays", [])))
