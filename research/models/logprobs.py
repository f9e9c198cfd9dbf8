"""Log-probabilities (and entropy) of given target tokens with the LM head fused in, in sequence chunks.

Why: the full fp32 logits of a 32k-token row with Qwen3's 151,936-token vocabulary are 19 GB, the most
reported out-of-memory failure in RL trainers (the loss only needs one log-prob and one entropy per
token). We flatten (B, T) into N tokens, split them into chunks of ``chunk_size`` and ``lax.scan`` over the
chunks with a ``jax.checkpoint``-ed body: the forward keeps only per-token scalars, and the backward
recomputes one chunk's [chunk, V] logits at a time, accumulating d(head) in the scan carry. Peak memory is
O(chunk_size * V) instead of O(T * V), values and gradients are those of the full computation.

``temperature`` divides the logits before the softmax, exactly as the sampler does, so trainer log-probs
match the behaviour (rollout) log-probs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def _chunk_stats(h_CxD, head_DxV, tgt_C, temperature: float, compute_dtype, return_entropy: bool):
    """Per-token log p(target) and entropy of one chunk; the [C, V] logits live only inside this call."""
    z_CxV = jnp.dot(h_CxD.astype(compute_dtype), head_DxV.astype(compute_dtype), preferred_element_type=jnp.float32)
    if temperature != 1.0:
        z_CxV = z_CxV / temperature
    lse_C = jax.nn.logsumexp(z_CxV, axis=-1)
    z_tgt_C = jnp.take_along_axis(z_CxV, tgt_C[:, None], axis=-1, mode="clip")[:, 0]
    logp_C = z_tgt_C - lse_C
    if not return_entropy:
        return logp_C, jnp.zeros_like(logp_C)
    p_CxV = jnp.exp(z_CxV - lse_C[:, None])
    ent_C = lse_C - jnp.sum(p_CxV * z_CxV, axis=-1)
    return logp_C, ent_C


def token_logprobs(
    hidden_BxTxD: Float[Array, "B T D"],
    head_DxV: Float[Array, "D V"],
    targets_BxT: Int[Array, "B T"],
    *,
    chunk_size: int = 1024,
    return_entropy: bool = True,
    compute_dtype=None,
    temperature: float = 1.0,
) -> tuple[Float[Array, "B T"], Float[Array, "B T"] | None]:
    """log softmax(hidden @ head / temperature)[target] and the softmax entropy per token, both fp32.

    ``compute_dtype`` is the matmul input dtype (default: hidden's); accumulation and the softmax are
    fp32. Targets outside [0, V) (e.g. -1 on padding) are clipped: mask those positions in the loss.
    Returns ``(logp_BxT, entropy_BxT)``; entropy is ``None`` when ``return_entropy=False``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B, T, D = hidden_BxTxD.shape
    compute_dtype = compute_dtype or hidden_BxTxD.dtype
    N = B * T
    C = max(1, min(chunk_size, N))
    n_chunks = -(-N // C)
    pad = n_chunks * C - N
    h_NxD = jnp.pad(hidden_BxTxD.reshape(N, D), ((0, pad), (0, 0)))
    t_N = jnp.pad(targets_BxT.reshape(N).astype(jnp.int32), (0, pad))

    @jax.checkpoint
    def chunk(head, h_CxD, tgt_C):
        return _chunk_stats(h_CxD, head, tgt_C, temperature, compute_dtype, return_entropy)

    def body(_, xs):
        return None, chunk(head_DxV, *xs)

    _, (logp, ent) = jax.lax.scan(body, None, (h_NxD.reshape(n_chunks, C, D), t_N.reshape(n_chunks, C)))
    logp_BxT = logp.reshape(-1)[:N].reshape(B, T)
    if not return_entropy:
        return logp_BxT, None
    return logp_BxT, ent.reshape(-1)[:N].reshape(B, T)
