"""PPO/GRPO losses on prefix trees and on the flat per-call view: pure keyword-only functions on arrays.

Tree form. Every token slot of a packed tree carries the aggregate of its *loss occurrences* (one per
call in which it is a completion token, see research/trees/builder.py). For occurrence o with
aggregation coefficient c_o and advantage A_o the flat surrogate is -c_o * min(r A_o, clip(r) A_o),
and min(rA, cA) = A * min(r, c) for A >= 0 and A * max(r, c) for A < 0. So with
    adv_pos = sum_{A_o >= 0} c_o A_o,   adv_neg = sum_{A_o < 0} c_o A_o,   weight = sum_o c_o
the slot's contribution is -(adv_pos * min(r, c) + adv_neg * max(r, c)), and terms that do not
involve A (KL, entropy) are `weight * term`: exactly the flat sum, in value and gradient. The value
loss needs sum_o c_o R_o and sum_o c_o R_o^2; the clipped value loss is not linear per occurrence,
so it requires at most one occurrence per slot (build trees with merge_generations=False).
The global normaliser (tokens or sequences, per the aggregation) is a batch scalar, so splitting a
group over rows or batches changes nothing.

Flat form: [N, L] arrays of calls (completion tokens), an independent implementation used as the
reference in tests and by the flat baseline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Hashable (static under jit). algo: grpo (no critic) | ppo (critic + value loss)."""

    algo: str = "grpo"
    aggregation: str = "token_mean"
    clip_low: float = 0.2
    clip_high: float = 0.28  # clip-higher (DAPO): a larger upper clip keeps exploration alive
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    # pi_old defaults to the rollout (behaviour) log-probs. When the trainer recomputes pi_old (batch
    # `old_logp`), the PG term is reweighted by rho = pi_old / pi_rollout: none | tis (min(rho, is_cap)) |
    # mis (rho outside [mis_low, mis_high] masked). The k3 mismatch metric is reported regardless.
    is_correction: str = "none"
    is_cap: float = 2.0  # TIS truncation
    mis_low: float = 0.5  # MIS keeps tokens with rho in [mis_low, mis_high]
    mis_high: float = 2.0
    value_coef: float = 0.5
    value_clip: float | None = None


@dataclasses.dataclass(frozen=True)
class Aggregation:
    """coef(L) per occurrence of a call with L completion tokens; norm(L) its share of the denominator."""

    coef: Callable[[Array], Array]
    norm: Callable[[Array], Array]


AGGREGATIONS: dict[str, Aggregation] = {
    "token_mean": Aggregation(coef=lambda L: jnp.ones_like(L, jnp.float32), norm=lambda L: L.astype(jnp.float32)),
    "seq_mean_token_mean": Aggregation(coef=lambda L: 1.0 / L.astype(jnp.float32),
                                       norm=lambda L: jnp.ones_like(L, jnp.float32)),
    "seq_mean_token_sum": Aggregation(coef=lambda L: jnp.ones_like(L, jnp.float32),
                                      norm=lambda L: jnp.ones_like(L, jnp.float32)),
}


def aggregation(name: str) -> Aggregation:
    try:
        return AGGREGATIONS[name]
    except KeyError:
        raise ValueError(f"unknown loss aggregation {name!r}; known: {sorted(AGGREGATIONS)}") from None


def kl_term(*, logp: Array, ref_logp: Array, estimator: str) -> Array:
    """Per-token KL(pi || ref) estimate from samples of pi: k1 = log(pi/ref), k3 = (ref/pi - 1) - log(ref/pi)."""
    log_r = ref_logp - logp
    if estimator == "k1":
        return -log_r
    if estimator == "k3":
        return jnp.exp(log_r) - log_r - 1.0
    raise ValueError(f"unknown kl estimator {estimator!r}; known: k1, k3")


def mismatch_k3(*, logp: Array, behav_logp: Array) -> Array:
    """k3 estimate of KL(rollout || trainer) per token (samples come from the rollout engine)."""
    log_r = jax.lax.stop_gradient(logp) - behav_logp
    return jnp.exp(log_r) - log_r - 1.0


def is_weight(*, old_logp: Array, behav_logp: Array, cfg: LossConfig) -> Array:
    """Importance weight for pi_old / rollout: 1 (none), truncated (TIS) or masked (MIS)."""
    rho = jnp.exp(jax.lax.stop_gradient(old_logp - behav_logp))
    if cfg.is_correction == "none":
        return jnp.ones_like(rho)
    if cfg.is_correction == "tis":
        return jnp.minimum(rho, cfg.is_cap)
    if cfg.is_correction == "mis":
        return ((rho >= cfg.mis_low) & (rho <= cfg.mis_high)).astype(rho.dtype)
    raise ValueError(f"unknown is_correction {cfg.is_correction!r}; known: none, tis, mis")


def _ratio(logp, old_logp, cfg):
    ratio = jnp.exp(logp - jax.lax.stop_gradient(old_logp))
    return ratio, jnp.clip(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)


def tree_policy_loss(
    *, logp: Float[Array, "*S"], old_logp: Float[Array, "*S"], behav_logp: Float[Array, "*S"],
    weight: Float[Array, "*S"], adv_pos: Float[Array, "*S"], adv_neg: Float[Array, "*S"],
    count: Float[Array, "*S"], normalizer: Float[Array, ""], cfg: LossConfig,
    ref_logp: Float[Array, "*S"] | None = None, entropy: Float[Array, "*S"] | None = None,
) -> tuple[Float[Array, ""], dict[str, Array]]:
    """Clipped surrogate (+KL, +entropy bonus) over aggregated tree slots. Slots with weight 0 are inert."""
    ratio, clipped = _ratio(logp, old_logp, cfg)
    surrogate = adv_pos * jnp.minimum(ratio, clipped) + adv_neg * jnp.maximum(ratio, clipped)
    per_slot = -surrogate * is_weight(old_logp=old_logp, behav_logp=behav_logp, cfg=cfg)
    if cfg.kl_coef and ref_logp is not None:
        per_slot = per_slot + cfg.kl_coef * weight * kl_term(logp=logp, ref_logp=ref_logp, estimator=cfg.kl_estimator)
    if cfg.entropy_coef and entropy is not None:
        per_slot = per_slot - cfg.entropy_coef * weight * entropy
    norm = jnp.maximum(normalizer, 1e-8)
    n_tok = jnp.maximum(count.sum(), 1.0)
    metrics = {
        "policy_loss": per_slot.sum() / norm,
        "mismatch_k3": (count * mismatch_k3(logp=logp, behav_logp=behav_logp)).sum() / n_tok,
        "clip_frac": (count * (ratio != clipped)).sum() / n_tok,
        "loss_tokens": count.sum(),
    }
    if entropy is not None:
        metrics["entropy"] = (count * jax.lax.stop_gradient(entropy)).sum() / n_tok
    return per_slot.sum() / norm, metrics


def tree_value_loss(
    *, values: Float[Array, "*S"], old_values: Float[Array, "*S"], weight: Float[Array, "*S"],
    ret_sum: Float[Array, "*S"], ret_sq_sum: Float[Array, "*S"], normalizer: Float[Array, ""], cfg: LossConfig,
) -> Float[Array, ""]:
    """0.5 * sum_o c_o (V - R_o)^2 from the sums; clipped: one occurrence per slot (R = ret_sum / weight)."""
    if cfg.value_clip is None:
        per_slot = 0.5 * (weight * values**2 - 2.0 * values * ret_sum + ret_sq_sum)
    else:
        ret = ret_sum / jnp.where(weight > 0, weight, 1.0)
        v_clip = old_values + jnp.clip(values - old_values, -cfg.value_clip, cfg.value_clip)
        per_slot = 0.5 * weight * jnp.maximum((values - ret) ** 2, (v_clip - ret) ** 2)
    return per_slot.sum() / jnp.maximum(normalizer, 1e-8)


# ----------------------------------------------------------------------------------------------- flat


def _flat_aggregate(per_tok_NxL, mask_NxL, name):
    mask = mask_NxL.astype(per_tok_NxL.dtype)
    tok_sum_N = (per_tok_NxL * mask).sum(-1)
    len_N = mask.sum(-1)
    if name == "token_mean":
        return tok_sum_N.sum() / jnp.maximum(len_N.sum(), 1.0)
    if name == "seq_mean_token_mean":
        return (tok_sum_N / jnp.maximum(len_N, 1.0)).mean()
    if name == "seq_mean_token_sum":
        return tok_sum_N.mean()
    raise ValueError(f"unknown loss aggregation {name!r}; known: {sorted(AGGREGATIONS)}")


def flat_policy_loss(
    *, logp_NxL: Float[Array, "N L"], old_logp_NxL: Float[Array, "N L"], behav_logp_NxL: Float[Array, "N L"],
    adv_NxL: Float[Array, "N L"], mask_NxL: Array, cfg: LossConfig,
    ref_logp_NxL: Float[Array, "N L"] | None = None, entropy_NxL: Float[Array, "N L"] | None = None,
) -> Float[Array, ""]:
    """The textbook per-call loss: -min(rA, clip(r)A) per token, aggregated over calls (rows)."""
    ratio, clipped = _ratio(logp_NxL, old_logp_NxL, cfg)
    per_tok = -jnp.minimum(ratio * adv_NxL, clipped * adv_NxL)
    per_tok = per_tok * is_weight(old_logp=old_logp_NxL, behav_logp=behav_logp_NxL, cfg=cfg)
    if cfg.kl_coef and ref_logp_NxL is not None:
        per_tok = per_tok + cfg.kl_coef * kl_term(logp=logp_NxL, ref_logp=ref_logp_NxL, estimator=cfg.kl_estimator)
    if cfg.entropy_coef and entropy_NxL is not None:
        per_tok = per_tok - cfg.entropy_coef * entropy_NxL
    return _flat_aggregate(per_tok, mask_NxL, cfg.aggregation)


def flat_value_loss(
    *, values_NxL: Float[Array, "N L"], old_values_NxL: Float[Array, "N L"], returns_NxL: Float[Array, "N L"],
    mask_NxL: Array, cfg: LossConfig,
) -> Float[Array, ""]:
    """0.5 (V - R)^2 per token (or the PPO clipped max), aggregated like the policy loss."""
    err = (values_NxL - returns_NxL) ** 2
    if cfg.value_clip is not None:
        v_clip = old_values_NxL + jnp.clip(values_NxL - old_values_NxL, -cfg.value_clip, cfg.value_clip)
        err = jnp.maximum(err, (v_clip - returns_NxL) ** 2)
    return _flat_aggregate(0.5 * err, mask_NxL, cfg.aggregation)
