"""Mesh + logical-axis sharding for the policy: one rules table (``ModelConfig.logical_rules``), four axes.

Mesh axes: ``data`` (pure data parallel), ``fsdp`` (data parallel with params/optimizer sharded on ``embed``),
``expert`` (MoE experts; outside the MoE block it is one more batch axis), ``tensor`` (heads / mlp / vocab).
Every param carries logical names (``nn.with_logical_partitioning``) and every big activation a logical
constraint, so the physical layout is decided by the rules table alone.

Init never materialises unsharded params: ``jax.eval_shape`` gives the boxed abstract tree, the rules turn
it into NamedShardings, and ``jax.jit(init, out_shardings=...)`` creates each shard on its device.
Run sharded forwards under ``jax.set_mesh(mesh)`` (``use_mesh``) so activation constraints and the
expert-parallel ``shard_map`` see the mesh.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from research.models import Qwen3, dummy_inputs
from research.models.config import ModelConfig
from research.models.params import abstract_params

MESH_AXES = ("data", "fsdp", "expert", "tensor")


def mesh_shape(sizes: dict[str, int], num_devices: int) -> dict[str, int]:
    """The axis sizes with the one -1 resolved to the remaining devices; errors name the mesh. Used by
    `make_mesh` and by the run config's start-up check (research/rl/config.py), which has no devices yet."""
    sizes = {a: int(sizes[a]) for a in MESH_AXES}
    free = [a for a, s in sizes.items() if s == -1]
    if len(free) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {sizes}")
    if any(s < 1 for a, s in sizes.items() if a not in free):
        raise ValueError(f"mesh {sizes}: sizes must be >= 1 or -1")
    known = math.prod(s for s in sizes.values() if s != -1)
    if free:
        if num_devices % known:
            raise ValueError(f"{num_devices} devices not divisible by {sizes}")
        sizes[free[0]] = num_devices // known
    return sizes


def make_mesh(data: int = 1, fsdp: int = -1, expert: int = 1, tensor: int = 1, devices=None) -> Mesh:
    """A (data, fsdp, expert, tensor) mesh over ``devices`` (default all); one size may be -1 (the rest)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = mesh_shape(dict(data=data, fsdp=fsdp, expert=expert, tensor=tensor), len(devices))
    if math.prod(sizes.values()) != len(devices):
        raise ValueError(f"mesh {sizes} needs {math.prod(sizes.values())} devices, have {len(devices)}")
    return Mesh(np.asarray(devices, dtype=object).reshape(list(sizes.values())), MESH_AXES)


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules) -> Any:
    """Unboxed tree of NamedShardings from a boxed tree's logical annotations and the rules table."""
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def param_shardings(cfg: ModelConfig, mesh: Mesh) -> Any:
    """NamedShardings of every param (e.g. for ``hf_io.load_hf(..., shardings=...)``)."""
    return logical_shardings(abstract_params(cfg), mesh, cfg.logical_rules)


def init_sharded(cfg: ModelConfig, mesh: Mesh, rng: jax.Array) -> Any:
    """Initialise params directly into their shards (eval_shape -> shardings -> jit(init, out_shardings))."""
    shardings = param_shardings(cfg, mesh)

    def init(r):
        return nn.meta.unbox(Qwen3(cfg).init(r, *dummy_inputs())["params"])

    with use_mesh(mesh):
        return jax.jit(init, out_shardings=shardings)(rng)


def batch_sharding(cfg: ModelConfig, mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding of a [B, T, ...] input batch: B over the rules' ``batch`` axes, the rest replicated."""
    spec = nn.logical_to_mesh_axes(("batch",) + (None,) * (ndim - 1), cfg.logical_rules)
    return NamedSharding(mesh, spec)


@contextlib.contextmanager
def use_mesh(mesh: Mesh):
    """Ambient mesh for activation constraints and the expert-parallel shard_map."""
    with jax.set_mesh(mesh):
        yield mesh
