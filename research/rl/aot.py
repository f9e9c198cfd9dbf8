"""Lower (and optionally compile) the loop's RL train step for a real-scale config on fake devices.

Why: the 30B configs cannot run here, but everything up to XLA can: the abstract TrainState with its
shardings on the config's mesh, the compact-head tree GRPO/PPO objective, and the SPMD lowering. A
config that lowers here has consistent shapes, shardings and rules; `compile=True` adds XLA's
per-device memory analysis (slow at full depth on CPU: use `num_layers`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import NamedSharding, PartitionSpec

from research.rl.config import RunConfig
from research.rl.trainer import make_steps, state_init
from research.train.state import abstract_train_state, make_mesh

INT_KEYS = ("tokens", "positions", "segment_ids", "subtree_end", "parent_index")
FLOAT_KEYS = ("behav_logp", "weight", "count", "adv_pos", "adv_neg", "ret_sum", "ret_sq_sum")


def abstract_rl_batch(config: ml_collections.ConfigDict, mesh, *, with_values: bool = False,
                      with_ref: bool = False) -> dict:
    """ShapeDtypeStructs of one packed tree batch as the loop feeds it (rows over the batch axes); `ref_logp`
    when a KL reference is on (`config.rl.kl_coef > 0`), `old_values` for PPO."""
    B, T, K = config.train.batch_rows, config.train.row_len, config.train.loss_slots
    sh = NamedSharding(mesh, PartitionSpec(tuple(config.train.batch_axes)))
    s = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=sh)
    out = {**{k: s((B, T), jnp.int32) for k in INT_KEYS}, **{k: s((B, T), jnp.float32) for k in FLOAT_KEYS},
           "norm": s((B,), jnp.float32), "loss_idx": s((B, K), jnp.int32), "loss_valid": s((B, K), jnp.bool_)}
    if with_values:
        out["old_values"] = s((B, T), jnp.float32)
    if with_ref:
        out["ref_logp"] = s((B, T), jnp.float32)
    return out


def lower_rl_step(config: ml_collections.ConfigDict, *, num_layers: int | None = None, devices=None,
                  compile: bool = False) -> dict:
    """Lowers the RL step of `config` (algo grpo or ppo) on its mesh; returns shapes and (if compiled) memory."""
    if num_layers is not None:
        config = config.copy_and_resolve_references()
        config.model.num_layers = num_layers
    run = RunConfig.of(config)
    model_cfg = run.model
    init = state_init(run)
    mesh = make_mesh(config.mesh, devices)
    state = abstract_train_state(init, mesh, model_cfg.logical_rules)
    shardings = jax.tree.map(lambda a: a.sharding, state)
    step = make_steps(run, init, mesh, shardings)["rl"]
    batch = abstract_rl_batch(config, mesh, with_values=config.algo == "ppo", with_ref=config.rl.kl_coef > 0)
    lowered = step.lower(state, batch)
    out = {"mesh": dict(mesh.shape), "num_layers": model_cfg.num_layers,
           "state_leaves": len(jax.tree.leaves(state)), "hlo_chars": len(lowered.as_text()),
           "batch_keys": sorted(batch)}
    if compile:
        mem = lowered.compile().memory_analysis()
        out["temp_bytes"] = getattr(mem, "temp_size_in_bytes", None)
        out["argument_bytes"] = getattr(mem, "argument_size_in_bytes", None)
    return out
