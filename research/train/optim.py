"""Optimizer from config: optax AdamW + learning-rate schedule + global-norm clipping.

Why a config-built chain rather than free-form optax in each launcher: checkpoints store the
optimizer *state*, whose pytree structure is fixed by the chain. Building it in one place from
`config.optim` guarantees that a restore sees exactly the structure that was saved, and that the
policy and critic optimizers are built the same way.

`config.optim` fields (all ml_collections, see `default_optim_config`):
  learning_rate   peak learning rate
  schedule        key of `SCHEDULES`: "constant", "cosine", "linear" (each with linear warmup)
  warmup_steps    linear warmup from `init_lr_ratio * learning_rate` to `learning_rate`
  total_steps     length of the decay (cosine / linear); ignored by "constant"
  end_lr_ratio    final learning rate as a fraction of the peak
  b1, b2, eps     Adam moments
  weight_decay    decoupled (AdamW) decay, applied only where `decay_mask` says so
  clip_norm       global gradient-norm clip; <= 0 disables it
  mu_dtype        dtype of the first moment ("" = same as params, i.e. fp32 master state)
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax

Schedule = Callable[[jax.Array], jax.Array]


def default_optim_config() -> ml_collections.ConfigDict:
    """The defaults every config starts from; configs override fields, never add ad-hoc ones."""
    return ml_collections.ConfigDict(
        dict(
            learning_rate=1e-6,
            schedule="constant",
            warmup_steps=0,
            total_steps=1000,
            init_lr_ratio=0.0,
            end_lr_ratio=0.0,
            b1=0.9,
            b2=0.999,
            eps=1e-8,
            weight_decay=0.0,
            clip_norm=1.0,
            mu_dtype="",
        )
    )


def _warmup(cfg: ml_collections.ConfigDict, after: Schedule) -> Schedule:
    """Linear warmup for `warmup_steps` steps, then `after` (whose step count starts at 0)."""
    if cfg.warmup_steps <= 0:
        return after
    warm = optax.linear_schedule(cfg.init_lr_ratio * cfg.learning_rate, cfg.learning_rate, cfg.warmup_steps)
    return optax.join_schedules([warm, after], [cfg.warmup_steps])


def _constant(cfg: ml_collections.ConfigDict) -> Schedule:
    return _warmup(cfg, optax.constant_schedule(cfg.learning_rate))


def _cosine(cfg: ml_collections.ConfigDict) -> Schedule:
    decay_steps = max(int(cfg.total_steps) - int(cfg.warmup_steps), 1)
    return _warmup(
        cfg, optax.cosine_decay_schedule(cfg.learning_rate, decay_steps, alpha=cfg.end_lr_ratio)
    )


def _linear(cfg: ml_collections.ConfigDict) -> Schedule:
    decay_steps = max(int(cfg.total_steps) - int(cfg.warmup_steps), 1)
    return _warmup(
        cfg, optax.linear_schedule(cfg.learning_rate, cfg.end_lr_ratio * cfg.learning_rate, decay_steps)
    )


SCHEDULES: dict[str, Callable[[ml_collections.ConfigDict], Schedule]] = {
    "constant": _constant,
    "cosine": _cosine,
    "linear": _linear,
}


def make_schedule(cfg: ml_collections.ConfigDict) -> Schedule:
    """Learning rate as a function of the optimizer step (0-based)."""
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"config.optim.schedule={cfg.schedule!r}; known: {sorted(SCHEDULES)}")
    if cfg.learning_rate < 0:
        raise ValueError(f"config.optim.learning_rate={cfg.learning_rate} must be >= 0")
    if cfg.warmup_steps < 0:
        raise ValueError(f"config.optim.warmup_steps={cfg.warmup_steps} must be >= 0")
    return SCHEDULES[cfg.schedule](cfg)


def decay_mask(params) -> object:
    """Weight decay only on matrices (ndim >= 2): norm scales and biases are not decayed.

    Embeddings are matrices and are decayed, as in most LLM recipes (MaxText, Megatron default).
    Works on abstract trees (ShapeDtypeStruct) as well as arrays, so it can be built before init.
    """
    return jax.tree.map(lambda p: len(p.shape) >= 2, params)


def current_learning_rate(opt_state) -> jax.Array:
    """The learning rate of the last update (read from the inject_hyperparams state)."""
    is_inject = lambda x: isinstance(x, optax.InjectStatefulHyperparamsState)
    found = [x for x in jax.tree.leaves(opt_state, is_leaf=is_inject) if is_inject(x)]
    if len(found) != 1:
        raise ValueError(f"expected one inject_hyperparams state in the optimizer state, found {len(found)}")
    return jnp.asarray(found[0].hyperparams["learning_rate"], jnp.float32)


def make_optimizer(cfg: ml_collections.ConfigDict) -> tuple[optax.GradientTransformation, Schedule]:
    """Returns (optimizer, schedule). The schedule is returned so the train step can report it.

    The chain is clip -> adamw. Clipping first means Adam sees the clipped gradient (standard); the
    train step reports the *unclipped* global norm.
    """
    schedule = make_schedule(cfg)
    mu_dtype = jnp.dtype(cfg.mu_dtype) if cfg.mu_dtype else None
    # inject_hyperparams keeps the learning rate used by each update in the optimizer state, so the
    # train step reports it without needing the schedule, and a restore resumes the schedule exactly.
    adamw = optax.inject_hyperparams(optax.adamw, static_args=("mask", "mu_dtype"))(
        learning_rate=schedule,
        b1=cfg.b1,
        b2=cfg.b2,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        mu_dtype=mu_dtype,
        mask=decay_mask,
    )
    if cfg.clip_norm and cfg.clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), adamw), schedule
    return adamw, schedule
