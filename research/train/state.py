"""The one explicit training state, and its sharded creation without ever materialising it unsharded.

Creation follows the MaxText recipe: `jax.eval_shape(init)` gives the abstract (boxed) parameter tree
with logical axis names -> the logical rules turn them into `NamedSharding`s on the mesh -> the
optimizer state's shardings follow its parameters (`optax.tree_map_params`) -> one
`jax.jit(init, out_shardings=...)` builds every array directly in its shard. A 30B model therefore
never exists on one device, and the same function returns the *abstract* state (ShapeDtypeStruct
with shardings) used for AOT compilation and for orbax restores onto another mesh.

Master weights and optimizer moments are fp32 (the model's `param_dtype`); the compute dtype is the
model config's business. The rng is stored as raw uint32 key data so checkpoints are plain arrays.

The data-iterator position is deliberately NOT a field: it is host state (grain iterator JSON) that
changes every step and must never enter a jitted signature. `checkpoint.py` saves it next to the
state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from research.models import ModelConfig, Qwen3, dummy_inputs
from research.models import sharding as sharding_lib
from research.models.qwen3_vl import Qwen3VL
from research.models.qwen3_vl import dummy_inputs as vl_dummy_inputs
from research.models.sharding import logical_shardings
from research.models.vision import VisionConfig

PyTree = Any
InitFn = Callable[[jax.Array], PyTree]  # rng -> boxed params (nn.Partitioned leaves carry logical names)


class TrainState(struct.PyTreeNode):
    """Everything a train step reads and writes. `critic_*` are None unless a critic is trained."""

    step: jax.Array  # int32 scalar: number of optimizer updates applied
    params: PyTree
    opt_state: PyTree
    rng: jax.Array  # uint32[2] raw key data; split once per step
    critic_params: PyTree = None
    critic_opt_state: PyTree = None

    @property
    def has_critic(self) -> bool:
        return self.critic_params is not None


@dataclasses.dataclass(frozen=True)
class StateInit:
    """How to build a state: params init (boxed), optimizer, and optionally the same for a critic."""

    init_fn: InitFn
    optimizer: optax.GradientTransformation
    critic_init_fn: InitFn | None = None
    critic_optimizer: optax.GradientTransformation | None = None

    def __post_init__(self):
        if (self.critic_init_fn is None) != (self.critic_optimizer is None):
            raise ValueError("critic_init_fn and critic_optimizer must be given together")


def _replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def _opt_shardings(optimizer, abstract_params: PyTree, p_shardings: PyTree, mesh: Mesh) -> PyTree:
    """Moments mirror their parameter's sharding; counters and other scalars are replicated."""
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
    return optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        abstract_opt,
        p_shardings,
        transform_non_params=lambda _: _replicated(mesh),
    )


def _build(init: StateInit, rng: jax.Array) -> TrainState:
    """The pure init: unboxed params, optimizer state, and a fresh step rng (fp32 from the model)."""
    p_rng, c_rng, s_rng = jax.random.split(rng, 3)
    params = nn.unbox(init.init_fn(p_rng))
    critic_params = critic_opt = None
    if init.critic_init_fn is not None:
        critic_params = nn.unbox(init.critic_init_fn(c_rng))
        critic_opt = init.critic_optimizer.init(critic_params)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=init.optimizer.init(params),
        rng=jax.random.key_data(s_rng) if jnp.issubdtype(s_rng.dtype, jax.dtypes.prng_key) else s_rng,
        critic_params=critic_params,
        critic_opt_state=critic_opt,
    )


def state_shardings(init: StateInit, mesh: Mesh, rules: Sequence[tuple[str, Any]]) -> TrainState:
    """A TrainState-shaped tree of NamedShardings, computed from abstract shapes only."""
    with jax.set_mesh(mesh):
        return _state_shardings(init, mesh, rules)


def _state_shardings(init: StateInit, mesh: Mesh, rules: Sequence[tuple[str, Any]]) -> TrainState:
    rng = jax.random.PRNGKey(0)
    boxed = jax.eval_shape(init.init_fn, rng)
    p_sh = logical_shardings(boxed, mesh, rules)
    critic_sh = critic_opt_sh = None
    if init.critic_init_fn is not None:
        c_boxed = jax.eval_shape(init.critic_init_fn, rng)
        critic_sh = logical_shardings(c_boxed, mesh, rules)
        critic_opt_sh = _opt_shardings(init.critic_optimizer, nn.unbox(c_boxed), critic_sh, mesh)
    rep = _replicated(mesh)
    return TrainState(
        step=rep,
        params=p_sh,
        opt_state=_opt_shardings(init.optimizer, nn.unbox(boxed), p_sh, mesh),
        rng=rep,
        critic_params=critic_sh,
        critic_opt_state=critic_opt_sh,
    )


def abstract_train_state(init: StateInit, mesh: Mesh, rules: Sequence[tuple[str, Any]]) -> TrainState:
    """ShapeDtypeStructs carrying their target shardings: for AOT lowering and orbax restore targets."""
    shardings = state_shardings(init, mesh, rules)
    with jax.set_mesh(mesh):
        shapes = jax.eval_shape(lambda r: _build(init, r), jax.random.PRNGKey(0))
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def init_train_state(
    init: StateInit, mesh: Mesh, rules: Sequence[tuple[str, Any]], rng: jax.Array
) -> tuple[TrainState, TrainState]:
    """Returns (state, shardings); every array is created directly in its shard by one jit."""
    shardings = state_shardings(init, mesh, rules)
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        state = jax.jit(lambda r: _build(init, r), out_shardings=shardings)(rng)
    return state, shardings


def tree_norm(tree: PyTree) -> jax.Array:
    """Global L2 norm in fp32 (what the train step reports for params, grads and updates)."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.zeros((), jnp.float32)
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


AXES = sharding_lib.MESH_AXES


def make_mesh(mesh_cfg: ml_collections.ConfigDict | dict, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Mesh (data, fsdp, expert, tensor) from `config.mesh`; one axis may be -1 = all remaining devices. A mesh
    smaller than `devices` takes the first ones (a 1-device config on a host with 8 fake devices)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = {a: int(dict(mesh_cfg)[a]) for a in AXES}
    if -1 not in sizes.values():
        n = int(np.prod(list(sizes.values())))
        if n > len(devices):
            raise ValueError(f"config.mesh {dict(mesh_cfg)} needs {n} devices, have {len(devices)}")
        devices = devices[:n]
    try:
        return sharding_lib.make_mesh(**sizes, devices=devices)
    except ValueError as e:
        raise ValueError(f"config.mesh {dict(mesh_cfg)}: {e}") from e


def model_config(config: ml_collections.ConfigDict | dict) -> ModelConfig:
    """`config.model` (all ModelConfig fields) -> the frozen ModelConfig the model functions take."""
    model = config["model"]
    fields = model.to_dict() if isinstance(model, ml_collections.ConfigDict) else dict(model)
    for key in ("mlp_only_layers", "logical_rules"):
        if key in fields:
            fields[key] = _tuples(fields[key])
    try:
        return ModelConfig(**fields)
    except (TypeError, ValueError) as e:
        raise ValueError(f"config.model: {e}") from e


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, list | tuple) else x


def policy_state_init(model_cfg: ModelConfig, optimizer: optax.GradientTransformation, *,
                      critic_init_fn: InitFn | None = None,
                      critic_optimizer: optax.GradientTransformation | None = None,
                      vision: VisionConfig | None = None) -> StateInit:
    """The one StateInit of the Qwen3 policy (and, with a critic, its value head): functions only, nothing
    is allocated. The RL learner, the AOT compile and the tests all build their state from this.

    With `vision`, a Qwen3-VL policy: params {"visual", "language_model"} (`model_cfg` is its text model), both
    towers laid out by the same logical rules; the critic reads the text model's hidden states as before."""
    # Init runs one forward on a dummy row; expert parallelism does not change the params and would
    # need the dummy token count to divide the expert mesh axis, so the init forward runs without it.
    init_cfg = model_cfg.replace(expert_parallel=False)
    if vision is None:
        init_fn = lambda r: Qwen3(init_cfg).init(r, *dummy_inputs())["params"]
    else:  # the placeholder id only marks the dummy row's image tokens: no parameter depends on it
        args, kw = vl_dummy_inputs(vision, 1)
        init_fn = lambda r: Qwen3VL(init_cfg, vision, 1).init(r, *args, **kw)["params"]
    return StateInit(init_fn=init_fn, optimizer=optimizer, critic_init_fn=critic_init_fn,
                     critic_optimizer=critic_optimizer)
