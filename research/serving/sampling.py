"""Token sampling for the JAX engine: temperature, top-k, top-p, per-request seeds, behaviour logprobs.

Logprob convention (the one the trainer must match): the reported logprob of a sampled token is
`log_softmax(logits / T)[token]` — the distribution after temperature, exactly what
`research.models.logprobs.token_logprobs(..., temperature=T)` computes on the full forward. top-k and
top-p truncation only restrict *which* tokens can be drawn; they are not folded into the reported
logprob (the trainer has no notion of truncation, and a truncated logprob would make the importance
ratio undefined for tokens outside the nucleus). Greedy requests (T <= 0) report T = 1 logprobs.

Seeds: the key of decoding step n of a request is `fold_in(PRNGKey(seed), n)`, so a seeded request
produces the same tokens whatever else is batched with it and whichever slot it lands in.
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

    The sort for top-k/top-p runs only when some row asks for truncation (lax.cond), because RL
    sampling normally uses neither and a full-vocabulary sort dominates a CPU decode step.
    """
    logits_BxV = logits_BxV.astype(jnp.float32)
    greedy_B = temperature_B <= 0.0
    temp_B = jnp.where(greedy_B, 1.0, temperature_B)
    scaled_BxV = logits_BxV / temp_B[:, None]
    logp_BxV = jax.nn.log_softmax(scaled_BxV, axis=-1)

    needs_trunc = jnp.any(((top_p_B < 1.0) | (top_k_B > 0)) & ~greedy_B)
    masked_BxV = jax.lax.cond(
        needs_trunc, lambda s: _truncate(s, top_p_B, top_k_B), lambda s: s, scaled_BxV
    )
    step_keys = jax.vmap(jax.random.fold_in)(keys_Bx2, steps_B.astype(jnp.uint32))
    sampled_B = jax.vmap(lambda k, l: jax.random.categorical(k, l))(step_keys, masked_BxV)
    tokens_B = jnp.where(greedy_B, jnp.argmax(logits_BxV, axis=-1), sampled_B).astype(jnp.int32)
    logprob_B = jnp.take_along_axis(logp_BxV, tokens_B[:, None], axis=-1)[:, 0]
    return tokens_B, logprob_B
