"""Pallas forward kernel of the block-sparse tree attention (``attend(..., impl="pallas")``).

The same algorithm as ``attention_ops._flash_fwd_impl``, written as one Pallas program per (query block,
kv head): the program reads its compacted key-block list (``kidx``, ``n_full``, ``count`` from
``attention_ops._block_lists``) and loops only over the visible key blocks, unmasked ones first. All dots
are 2-D ([G*bq, D] x [bk, D]^T), the shape Triton (GPU) lowers. The backward is the jnp kernel
(``_flash_bwd_impl``) on the saved (out, lse), so gradients are identical to ``impl="blockwise"``.

Status: tested in Pallas interpret mode on CPU (values and gradients == reference). Lowering on a real
GPU/TPU has NOT been run here (no accelerator in this environment). On TPU the production form is the
splash-attention layout: a grid over (query block, kv head, list position) with ``kidx`` as a scalar-
prefetch operand in the key/value ``index_map`` (``PrefetchScalarGridSpec``), so each visible key block
is DMA'd to VMEM instead of the whole K/V living in one ref as here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

_NEG = -1e30


def _kernel(
    kidx_ref,
    nfull_ref,
    count_ref,
    q_ref,
    segq_ref,
    idxq_ref,
    k_ref,
    v_ref,
    segk_ref,
    idxk_ref,
    endk_ref,
    o_ref,
    lse_ref,
    *,
    groups: int,
):
    i, h = pl.program_id(0), pl.program_id(1)
    q = q_ref[0, 0]  # [G*bq, D]
    seg_q, idx_q = segq_ref[0], idxq_ref[0]  # [bq]
    GQ, D = q.shape

    def step(t, carry, masked: bool):
        m, l, acc = carry
        kj = kidx_ref[i, t]
        k, v = k_ref[kj, h], v_ref[kj, h]  # [bk, D]
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        if masked:
            seg_k, idx_k, end_k = segk_ref[kj], idxk_ref[kj], endk_ref[kj]
            mask = (
                (seg_q[:, None] == seg_k[None, :])
                & (seg_q[:, None] != 0)
                & (idx_k[None, :] <= idx_q[:, None])
                & (idx_q[:, None] <= end_k[None, :])
            )
            mask = jnp.tile(mask, (groups, 1))
            s = jnp.where(mask, s, _NEG)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.exp(s - m_new[:, None])
        if masked:
            p = jnp.where(mask, p, 0.0)
        alpha = jnp.exp(m - m_new)
        pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return m_new, alpha * l + p.sum(-1), alpha[:, None] * acc + pv

    init = (jnp.full((GQ,), _NEG, jnp.float32), jnp.zeros((GQ,), jnp.float32), jnp.zeros((GQ, D), jnp.float32))
    carry = jax.lax.fori_loop(0, nfull_ref[i], functools.partial(step, masked=False), init)
    m, l, acc = jax.lax.fori_loop(nfull_ref[i], count_ref[i], functools.partial(step, masked=True), carry)
    safe_l = jnp.where(l > 0, l, 1.0)
    o_ref[0, 0] = (acc / safe_l[:, None]).astype(o_ref.dtype)
    lse_ref[0, 0] = jnp.where(l > 0, m + jnp.log(safe_l), 0.0)


def flash_fwd_pallas(qT, kT, vT, bl, groups: int, *, interpret: bool):
    """(out [NQ, K, G*bq, D], lse [NQ, K, G*bq]) like ``attention_ops._flash_fwd_impl``."""
    NQ, K, GQ, D = qT.shape
    bq = bl.seg_q.shape[1]
    whole = lambda x: pl.BlockSpec(x.shape, lambda i, h, n=x.ndim: (0,) * n)
    in_specs = [
        whole(bl.kidx),
        whole(bl.n_full),
        whole(bl.count),
        pl.BlockSpec((1, 1, GQ, D), lambda i, h: (i, h, 0, 0)),
        pl.BlockSpec((1, bq), lambda i, h: (i, 0)),
        pl.BlockSpec((1, bq), lambda i, h: (i, 0)),
        whole(kT),
        whole(vT),
        whole(bl.seg_k),
        whole(bl.idx_k),
        whole(bl.end_k),
    ]
    out_specs = [
        pl.BlockSpec((1, 1, GQ, D), lambda i, h: (i, h, 0, 0)),
        pl.BlockSpec((1, 1, GQ), lambda i, h: (i, h, 0)),
    ]
    out_shape = [jax.ShapeDtypeStruct(qT.shape, qT.dtype), jax.ShapeDtypeStruct((NQ, K, GQ), jnp.float32)]
    call = pl.pallas_call(
        functools.partial(_kernel, groups=groups),
        out_shape=out_shape,
        grid=(NQ, K),
        in_specs=in_specs,
        out_specs=out_specs,
        interpret=interpret,
    )
    out, lse = call(bl.kidx, bl.n_full, bl.count, qT, bl.seg_q, bl.idx_q, kT, vT, bl.seg_k, bl.idx_k, bl.end_k)
    return out, lse
