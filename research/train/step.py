"""The train step: ONE jitted pure function `train_step(state, batch) -> (state, metrics)`.

Why one function with explicit in/out shardings and donation: the step is the unit XLA optimises and
the unit we AOT-compile for the 30B config; explicit shardings make the layout a contract instead of
a propagation accident, and donating the old state halves peak memory (params + moments are updated
in place). The batch is pure data (packed rows of fixed padded shape), so different prefix-tree
shapes never recompile.

The objective is supplied by the caller as `loss_fn(params, batch, rng) -> (loss, metrics)` — the
tree PPO/GRPO or SFT loss of research/rl/objective.py. When the state carries a critic, the loss is
called as `loss_fn(params, batch, rng, critic_params=...)` and both are differentiated in one
backward pass, each updated by its own optimizer (critics usually want a larger learning rate).

Microbatching (`num_microbatches > 1`) accumulates fp32 gradients over equal slices of the batch's
leading axis with `lax.scan` before one optimizer update; the loss and metrics are the mean over
microbatches (each microbatch weighted equally).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from research.train.optim import current_learning_rate
from research.train.state import TrainState, tree_norm
from research.trees.batch import IMAGES, names

# batch fields that are not rows (the step's distinct images): never split into microbatches or minibatches
SHARED_FIELDS = frozenset(names(IMAGES))

PyTree = Any
Batch = dict[str, jax.Array]
LossFn = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]


def _loss_and_grads(loss_fn: LossFn, state: TrainState, batch: Batch, rng: jax.Array):
    """(loss, metrics), (policy_grads, critic_grads or None) for one (micro)batch."""
    if state.has_critic:
        f = lambda p, c: loss_fn(p, batch, rng, critic_params=c)
        (loss, metrics), (g, cg) = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(
            state.params, state.critic_params
        )
        return (loss, metrics), (g, cg)
    (loss, metrics), g = jax.value_and_grad(lambda p: loss_fn(p, batch, rng), has_aux=True)(state.params)
    return (loss, metrics), (g, None)


def _sharding_of(batch_shardings, key: str):
    """The sharding of batch field `key`: one for all, a tree (dict) by key, or a function of the key."""
    if isinstance(batch_shardings, NamedSharding | None):
        return batch_shardings
    return batch_shardings(key) if callable(batch_shardings) else batch_shardings[key]


def _split_microbatches(rows: Batch, num: int, batch_shardings) -> Batch:
    """[B, ...] -> [num, B/num, ...]; each slice keeps the batch's own sharding spec on its rows."""

    def split(key, x):
        if x.shape[0] % num:
            raise ValueError(f"batch leading dim {x.shape[0]} is not divisible by num_microbatches={num}")
        y = x.reshape(num, x.shape[0] // num, *x.shape[1:])
        sharding = _sharding_of(batch_shardings, key)
        if isinstance(sharding, NamedSharding):
            spec = PartitionSpec(None, *sharding.spec)
            y = jax.lax.with_sharding_constraint(y, NamedSharding(sharding.mesh, spec))
        return y

    return {k: split(k, x) for k, x in rows.items()}


def _accumulated(loss_fn: LossFn, state: TrainState, batch: Batch, rng, num: int, batch_shardings):
    """Mean loss/metrics/grads over `num` microbatches; the running sums are fp32. The step's images (IMAGES
    fields: not rows) go to every microbatch whole; a microbatch's rows index into them."""
    if num == 1:
        return _loss_and_grads(loss_fn, state, batch, rng)
    shared = {k: v for k, v in batch.items() if k in SHARED_FIELDS}
    micro = _split_microbatches({k: v for k, v in batch.items() if k not in shared}, num, batch_shardings)
    rngs = jax.random.split(rng, num)
    one = lambda mb, r: _loss_and_grads(loss_fn, state, {**mb, **shared}, r)
    shapes = jax.eval_shape(one, jax.tree.map(lambda x: x[0], micro), rngs[0])
    carry0 = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), shapes)

    def body(carry, xs):
        return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), carry, one(*xs)), None

    total, _ = jax.lax.scan(body, carry0, (micro, rngs))
    floating = lambda d: jnp.issubdtype(d, jnp.floating)
    return jax.tree.map(lambda t, s: (t / num).astype(s.dtype if floating(s.dtype) else jnp.float32), total, shapes)


def _apply(optimizer: optax.GradientTransformation, params, opt_state, grads, prefix: str) -> tuple:
    """One optimizer update; returns new params, new opt state and the standard norms/learning rate."""
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics = {
        f"{prefix}grad_norm": tree_norm(grads),
        f"{prefix}update_norm": tree_norm(updates),
        f"{prefix}param_norm": tree_norm(params),
        f"{prefix}learning_rate": current_learning_rate(opt_state),
    }
    return params, opt_state, metrics


def make_train_step(
    *,
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    state_shardings: TrainState,
    batch_shardings,
    critic_optimizer: optax.GradientTransformation | None = None,
    donate: bool = True,
    num_microbatches: int = 1,
) -> TrainStep:
    """Builds the jitted step. Metrics always hold loss, grad_norm, param_norm, update_norm,
    learning_rate (fp32 scalars, replicated) plus whatever `loss_fn` returns; with a critic also the
    `critic_`-prefixed norms and learning rate.

    `batch_shardings`: one NamedSharding for every batch leaf (typically rows over (data, fsdp)), a tree
    matching the batch, or a function of the field name (a vision policy: its images replicated).
    `state_shardings`: from `state.state_shardings` / `init_train_state`.
    """
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches={num_microbatches} must be >= 1")
    has_critic = state_shardings.critic_params is not None
    if has_critic and critic_optimizer is None:
        raise ValueError("the state has a critic but no critic_optimizer was given")

    def train_step(state: TrainState, batch: Batch):
        rng, step_rng = jax.random.split(state.rng)
        (loss, aux), (grads, critic_grads) = _accumulated(
            loss_fn, state, batch, step_rng, num_microbatches, batch_shardings
        )
        params, opt_state, metrics = _apply(optimizer, state.params, state.opt_state, grads, "")
        critic_params, critic_opt_state = state.critic_params, state.critic_opt_state
        if has_critic:
            critic_params, critic_opt_state, cm = _apply(
                critic_optimizer, critic_params, critic_opt_state, critic_grads, "critic_"
            )
            metrics.update(cm)
        aux = {k: jnp.asarray(v, jnp.float32) for k, v in aux.items()}
        metrics = {**aux, **metrics, "loss": loss.astype(jnp.float32)}
        new_state = state.replace(
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            rng=rng,
            critic_params=critic_params,
            critic_opt_state=critic_opt_state,
        )
        return new_state, metrics

    mesh = jax.tree.leaves(state_shardings, is_leaf=lambda x: isinstance(x, NamedSharding))[0].mesh
    replicated = NamedSharding(mesh, PartitionSpec())

    def jit_for(keys: tuple[str, ...]):
        in_batch = batch_shardings
        if callable(batch_shardings) and not isinstance(batch_shardings, NamedSharding):
            in_batch = {k: batch_shardings(k) for k in keys}
        return jax.jit(train_step, in_shardings=(state_shardings, in_batch),
                       out_shardings=(state_shardings, replicated), donate_argnums=(0,) if donate else ())

    return TrainStep(jit_for, mesh)


class TrainStep:
    """The jitted step, traced and run with its mesh as the ambient mesh.

    Why: the model's logical sharding constraints (and the expert-parallel shard_map) resolve against
    the ambient mesh at trace time; without it they would silently be no-ops. `lower` is exposed for
    AOT compilation with abstract inputs. Batch shardings given as a function of the field name (rows over the
    batch axes, a vision policy's images replicated) make one jitted function per set of batch fields.
    """

    def __init__(self, jit_for, mesh: Mesh):
        self._jit_for = jit_for
        self._jitted: dict[tuple[str, ...], object] = {}
        self.mesh = mesh

    def jitted(self, batch: Batch):
        keys = tuple(sorted(batch))
        if keys not in self._jitted:
            self._jitted[keys] = self._jit_for(keys)
        return self._jitted[keys]

    def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        with jax.set_mesh(self.mesh):
            return self.jitted(batch)(state, batch)

    def lower(self, state: TrainState, batch: Batch):
        with jax.set_mesh(self.mesh):
            return self.jitted(batch).lower(state, batch)

    def cache_size(self) -> int:
        """Number of compiled variants (1 after any number of same-shaped batches)."""
        return sum(j._cache_size() for j in self._jitted.values())
