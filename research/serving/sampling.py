"""Token sampling for the JAX engine: temperature, top-k, top-p, per-request seeds, behaviour logprobs.

Logprob convention (the one the trainer must match): the reported logprob of a sampled token is
`log_softmax(logits / T)[token]` — the distribution after temperature, exactly what
`research.models.logprobs.token_logprobs(..., temperature=T)` computes on the full forward. top-k and
top-p truncation only restrict *which* tokens can be drawn; they are not folded into the reported
logprob (the trainer has no notion of truncation, and a truncated logprob would make the importance
ratio undefined for tokens outside the nucleus). Greedy requests (T <= 0) report T = 1 logprobs.

Seeds: the uniform behind decoding step n of a request comes from `fold_in(PRNGKey(seed), n)`, so a seeded
request produces the same tokens whatever else is batched with it and whichever slot it lands in. (Its
logits can differ in the last fp32 bits with how its sequence was split into cached prefix, prefill chunks
and decode blocks, and with the length bucket; a draw only changes if the uniform falls within that
rounding of a boundary between two tokens' cumulative mass.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, UInt32

NEG_INF = -1e30


def request_key(seed) -> jax.Array:
    """The raw uint32[2] base key of a request (seed taken mod 2**32); step keys come from `fold_in`."""
    if isinstance(seed, int):
        seed &= 0xFFFFFFFF
    return jax.random.PRNGKey(seed)


def _truncate(scaled_BxV: Float[Array, "B V"], top_p_B: Float[Array, "B"], top_k_B: Int[Array, "B"]):
    """Masks logits outside top-k / the top-p nucleus to -inf (one descending sort per row).

    The nucleus is the smallest prefix of the sorted distribution whose mass reaches top_p; the
    token that crosses top_p is kept (standard definition), ties at the threshold are kept too.
    """
    V = scaled_BxV.shape[-1]
    sorted_BxV = -jnp.sort(-scaled_BxV, axis=-1)
    probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
    mass_before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
    keep_p = mass_before_BxV < top_p_B[:, None]
    k_B = jnp.where(top_k_B > 0, jnp.minimum(top_k_B, V), V)
    keep_k = jnp.arange(V)[None, :] < k_B[:, None]
    keep = keep_p & keep_k
    # Threshold = smallest kept sorted logit; everything >= it survives.
    thresh_B = jnp.min(jnp.where(keep, sorted_BxV, jnp.inf), axis=-1)
    return jnp.where(scaled_BxV >= thresh_B[:, None], scaled_BxV, NEG_INF)


def _first(mask_BxN, fallback_B):
    """Index of the first True per row (a min-reduce: XLA:CPU's argmax is a slow variadic reduce), else fallback."""
    N = mask_BxN.shape[-1]
    i = jnp.min(jnp.where(mask_BxN, jnp.arange(N, dtype=jnp.int32), N), axis=-1)
    return jnp.where(i < N, i, fallback_B)


def _last(mask_BxN):
    return jnp.max(jnp.where(mask_BxN, jnp.arange(mask_BxN.shape[-1], dtype=jnp.int32), 0), axis=-1)


def _inverse_cdf(p_BxV: Float[Array, "B V"], u_B: Float[Array, "B"], block: int = 256) -> Int[Array, "B"]:
    """Draws i with probability p[i] / sum(p) from one uniform per row: the first i whose cumulative mass
    exceeds u * sum(p), found block by block (block sums, then one block's cumsum), so the cost is a couple of
    passes over V instead of V random numbers (Gumbel-max draws one per token: ~60 ms a step at V=152k).
    Never returns a zero-probability index, even when fp32 rounding puts the target past the last mass."""
    B, V = p_BxV.shape
    C = min(block, V)
    R = -(-V // C)
    p_BxRxC = jnp.pad(p_BxV, ((0, 0), (0, R * C - V))).reshape(B, R, C)
    mass_BxR = p_BxRxC.sum(-1)
    cum_BxR = jnp.cumsum(mass_BxR, axis=-1)
    target_B = u_B * cum_BxR[:, -1]
    r_B = _first((cum_BxR > target_B[:, None]) & (mass_BxR > 0), _last(mass_BxR > 0))
    row_BxC = jnp.take_along_axis(p_BxRxC, r_B[:, None, None], axis=1)[:, 0]
    before_B = jnp.take_along_axis(cum_BxR - mass_BxR, r_B[:, None], axis=1)[:, 0]
    c_B = _first((jnp.cumsum(row_BxC, axis=-1) > (target_B - before_B)[:, None]) & (row_BxC > 0), _last(row_BxC > 0))
    return r_B * C + c_B


def sample_tokens(
    logits_BxV: Float[Array, "B V"],
    *,
    temperature_B: Float[Array, "B"],
    top_p_B: Float[Array, "B"],
    top_k_B: Int[Array, "B"],
    keys_Bx2: UInt32[Array, "B 2"],
    steps_B: Int[Array, "B"],
) -> tuple[Int[Array, "B"], Float[Array, "B"]]:
    """Samples one token per row and returns (tokens_B, logprob_B) under the convention above.

    One max, one exp and one sum over the vocabulary serve the logprob, the greedy token and the draw (inverse
    CDF with one uniform per row). The sort for top-k/top-p runs only when some row asks for truncation
    (lax.cond), because RL sampling normally uses neither and a full-vocabulary sort dominates a CPU step.
    """
    logits_BxV = logits_BxV.astype(jnp.float32)
    greedy_B = temperature_B <= 0.0
    temp_B = jnp.where(greedy_B, 1.0, temperature_B)
    scaled_BxV = logits_BxV / temp_B[:, None]
    max_B = scaled_BxV.max(axis=-1)
    shifted_BxV = scaled_BxV - max_B[:, None]
    p_BxV = jnp.exp(shifted_BxV)
    log_z_B = jnp.log(p_BxV.sum(axis=-1))

    needs_trunc = jnp.any(((top_p_B < 1.0) | (top_k_B > 0)) & ~greedy_B)
    p_BxV = jax.lax.cond(
        needs_trunc, lambda p: jnp.where(_truncate(scaled_BxV, top_p_B, top_k_B) > NEG_INF, p, 0.0), lambda p: p,
        p_BxV,
    )
    step_keys = jax.vmap(jax.random.fold_in)(keys_Bx2, steps_B.astype(jnp.uint32))
    u_B = jax.vmap(lambda k: jax.random.uniform(k, dtype=jnp.float32))(step_keys)
    sampled_B = _inverse_cdf(p_BxV, u_B)
    argmax_B = _first(shifted_BxV == 0.0, 0)  # greedy rows have T = 1: the first maximal logit
    tokens_B = jnp.where(greedy_B, argmax_B, sampled_B).astype(jnp.int32)
    logprob_B = jnp.take_along_axis(shifted_BxV, tokens_B[:, None], axis=-1)[:, 0] - log_z_B
    return tokens_B, logprob_B
