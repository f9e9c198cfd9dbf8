"""Log-probabilities (and entropy) of given target tokens with the LM head fused in, in sequence chunks.

Why: the full fp32 logits of a 32k-token row with Qwen3's 151,936-token vocabulary are 19 GB, the most
reported out-of-memory failure in RL trainers, while the loss only needs one log-prob and one entropy per
token. We split the sequence axis into chunks of ``chunk_size`` positions and ``lax.scan`` over them, so
only one chunk's [B, chunk, V] logits exist at a time. A ``custom_vjp`` keeps per-token scalars (log-sum-exp
and E_p[z]) from the forward; the backward recomputes each chunk's logits once and forms the logit
gradient in one fused elementwise pass,

    dz = g_logp * (onehot(target) - p) - g_ent * p * (z - E_p[z])     (z = logits / temperature),

then dh = dz @ head^T and d(head) += h^T dz (accumulated in the scan carry). Values and gradients are those
of the full computation. Chunking the sequence (not the flattened batch) keeps the batch axis intact, so a
batch sharded over data/fsdp stays sharded inside every chunk.

``temperature`` divides the logits before the softmax, exactly as the sampler does, so trainer log-probs
match the behaviour (rollout) log-probs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

_F32 = jnp.float32


def _logits(h_BxCxD, head_DxV, temperature: float, compute_dtype):
    z = jnp.einsum(
        "bcd,dv->bcv", h_BxCxD.astype(compute_dtype), head_DxV.astype(compute_dtype), preferred_element_type=_F32
    )
    return z / temperature if temperature != 1.0 else z


def _chunk_fwd(h, head, tgt, temperature, compute_dtype, entropy: bool):
    """One chunk: (logp, entropy, lse, E_p[z]) per token; the [B, C, V] logits die here."""
    z = _logits(h, head, temperature, compute_dtype)
    m = jnp.max(z, axis=-1)  # finite: z comes from finite weights
    e = jnp.exp(z - m[..., None])  # one exp pass feeds both sums (the exp is most of the chunk's time on CPU)
    s0 = jnp.sum(e, axis=-1)
    lse = m + jnp.log(s0)
    logp = jnp.take_along_axis(z, tgt[..., None], axis=-1)[..., 0] - lse
    if not entropy:
        return logp, jnp.zeros_like(logp), lse, jnp.zeros_like(lse)
    ez = jnp.sum(e * z, axis=-1) / s0
    return logp, lse - ez, lse, ez


def _scan_chunks(fn, carry, *xs_NxBxC):
    return jax.lax.scan(fn, carry, xs_NxBxC)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _fused(h_NxBxCxD, head_DxV, tgt_NxBxC, temperature, compute_dtype, entropy):
    return _fused_fwd(h_NxBxCxD, head_DxV, tgt_NxBxC, temperature, compute_dtype, entropy)[0]


def _fused_fwd(h_NxBxCxD, head_DxV, tgt_NxBxC, temperature, compute_dtype, entropy):
    def body(_, xs):
        return None, _chunk_fwd(*xs[:1], head_DxV, xs[1], temperature, compute_dtype, entropy)

    _, (logp, ent, lse, ez) = _scan_chunks(body, None, h_NxBxCxD, tgt_NxBxC)
    return (logp, ent), (h_NxBxCxD, head_DxV, tgt_NxBxC, lse, ez)


def _fused_bwd(temperature, compute_dtype, entropy, res, g):
    h_all, head, tgt_all, lse_all, ez_all = res
    g_logp_all, g_ent_all = g

    def body(dhead, xs):
        h, tgt, lse, ez, g_logp, g_ent = xs
        z = _logits(h, head, temperature, compute_dtype)
        p = jnp.exp(z - lse[..., None])
        coef = g_logp[..., None] + (g_ent[..., None] * (z - ez[..., None]) if entropy else 0.0)
        onehot = jax.lax.broadcasted_iota(jnp.int32, z.shape, 2) == tgt[..., None]
        dz = (jnp.where(onehot, g_logp[..., None], 0.0) - p * coef) / temperature
        dz = dz.astype(compute_dtype)
        dh = jnp.einsum("bcv,dv->bcd", dz, head.astype(compute_dtype), preferred_element_type=_F32)
        dhead = dhead + jnp.einsum("bcd,bcv->dv", h.astype(compute_dtype), dz, preferred_element_type=_F32)
        return dhead, dh.astype(h.dtype)

    xs = (h_all, tgt_all, lse_all, ez_all, g_logp_all, g_ent_all)
    dhead, dh = _scan_chunks(body, jnp.zeros(head.shape, _F32), *xs)
    return dh, dhead.astype(head.dtype), None


_fused.defvjp(_fused_fwd, _fused_bwd)


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

    ``chunk_size`` is in sequence positions: one chunk holds [B, chunk_size, V] fp32 logits (B per device
    when the batch is sharded). ``compute_dtype`` is the matmul input dtype (default: hidden's);
    accumulation and the softmax are fp32. Targets outside [0, V) (e.g. -1 on padding) are clipped: mask
    those positions in the loss. Returns ``(logp_BxT, entropy_BxT)``; entropy is ``None`` when
    ``return_entropy=False`` (and is then not computed).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B, T, D = hidden_BxTxD.shape
    V = head_DxV.shape[1]
    compute_dtype = jnp.dtype(compute_dtype or hidden_BxTxD.dtype)
    C = max(1, min(chunk_size, T))
    n = -(-T // C)
    pad = ((0, 0), (0, n * C - T))
    h = jnp.pad(hidden_BxTxD, pad + ((0, 0),)).reshape(B, n, C, D).transpose(1, 0, 2, 3)
    tgt = jnp.clip(jnp.pad(targets_BxT.astype(jnp.int32), pad), 0, V - 1).reshape(B, n, C).transpose(1, 0, 2)
    logp, ent = _fused(h, head_DxV, tgt, float(temperature), compute_dtype, bool(return_entropy))
    unchunk = lambda x_NxBxC: x_NxBxC.transpose(1, 0, 2).reshape(B, n * C)[:, :T]
    return unchunk(logp), (unchunk(ent) if return_entropy else None)
