"""Tree-structured attention over packed rows: one mask contract, several implementations.

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
- ``"dense_blocks"``: the blockwise kernel with skipping disabled (every key block visited, masked per
  element): the no-skipping baseline of ``research/benchmarks/attention.py``.
- ``"pallas"``: the blockwise algorithm with the forward as a Pallas kernel (``attention_pallas.py``) in the
  backend's form (TPU: splash-style grid over the visible-block lists, Mosaic; GPU: block-sparse loop,
  Triton; CPU: the GPU form in interpret mode), backward as in ``"blockwise"``. ``"pallas_gpu"`` /
  ``"pallas_tpu"`` force a form (interpret mode on CPU: how both are tested here).
- ``"auto"``: ``"pallas"`` on TPU/GPU, ``"blockwise"`` on CPU (``auto_impl``), and under an ambient mesh
  (``jax.set_mesh``) via ``attend_on_mesh``: rows over the batch axes and kv heads over ``tensor`` in a
  ``shard_map`` (the SPMD partitioner cannot split the kernel's block loops and would all-gather the batch
  onto every device).

Mapping to accelerators. Our per-pair classification (skip / partial / full) is splash attention's
``block_mask`` (0 / 1 / 2), and the compacted key-block list per query block is its ``data_next`` table
(``jax.experimental.pallas.ops.tpu.splash_attention``, ``MaskInfo``). Stock splash builds ``MaskInfo`` on the
host from a static mask; a tree differs per batch, so on TPU the same tables come from ``_block_lists`` on
device and go to the kernel as scalar-prefetch operands (``PrefetchScalarGridSpec``: the K/V ``index_map``
reads ``kidx``), with the per-element mask computed in-kernel from the O(T) vectors (seg, idx,
subtree_end): ``attention_pallas`` form "tpu". On GPU a Pallas/Triton kernel walks the same list
(block-sparse FlashAttention): form "gpu". On CPU the jnp path is what runs; the per-block bodies are
matmuls batched over kv heads that XLA:CPU threads.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import export
from jaxtyping import Array, Float, Int

from research.models import attention_pallas

IMPLS = ("auto", "blockwise", "causal", "dense_blocks", "pallas", "pallas_gpu", "pallas_tpu", "reference")
_PALLAS = {"pallas": None, "pallas_gpu": "gpu", "pallas_tpu": "tpu"}  # impl -> kernel form (None: the backend's)
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


class _Blocks(NamedTuple):
    """Per-block O(T) data of a batch of packed rows, flattened over (row, block)."""

    seg_q: Array  # [NQ, bq] segment ids of each query block
    idx_q: Array  # [NQ, bq] in-row token index
    seg_k: Array  # [NK, bk]
    idx_k: Array  # [NK, bk]
    end_k: Array  # [NK, bk] subtree_end (segment end for the causal mask)
    kidx: Array  # [NQ, nk] global key-block ids: fully visible ones, then partially visible, then the rest
    n_full: Array  # [NQ] how many key blocks query block qi sees entirely (no per-element mask needed)
    count: Array  # [NQ] how many key blocks query block qi sees at all


def _block_lists(seg, end, bq: int, bk: int, causal: bool, skip: bool = True) -> _Blocks:
    """Which key blocks each query block can see, from O(T) summaries (conservative: never drops one).

    A pair is visible if some key j <= some query i (ks <= qe), some key's subtree reaches the query block
    (max subtree_end >= qs), and their segment ranges overlap. The result is compacted with a stable sort
    so the kernel's inner loop has a data-dependent trip count instead of a static nq x nk sweep. Pairs
    that are visible element for element (one segment, keys before queries, every subtree reaching past
    the query block) come first and skip the per-element mask: in a prefix tree that is most of them.
    """
    B, T = seg.shape
    nq, nk = T // bq, T // bk
    idx = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    valid = seg != 0
    big = jnp.iinfo(jnp.int32).max

    def summary(x, valid_x, n, fill, red):
        return red(jnp.where(valid_x, x, fill).reshape(B, n, -1), axis=-1)

    q_lo, q_hi = idx.reshape(B, nq, bq)[..., 0], idx.reshape(B, nq, bq)[..., -1]
    qs_min, qs_max = summary(seg, valid, nq, big, jnp.min), summary(seg, valid, nq, -1, jnp.max)
    k_lo = idx.reshape(B, nk, bk)[..., 0]
    ks_min, ks_max = summary(seg, valid, nk, big, jnp.min), summary(seg, valid, nk, -1, jnp.max)
    end_mask = jnp.full_like(end, big) if causal else end  # causal: seg[i] == seg[j] and j <= i, no subtree
    k_end = summary(end_mask, valid, nk, -1, jnp.max)
    k_end_min = summary(end_mask, valid, nk, big, jnp.min)
    q_all, k_all = valid.reshape(B, nq, bq).all(-1), valid.reshape(B, nk, bk).all(-1)
    k_hi = idx.reshape(B, nk, bk)[..., -1]
    vis = (
        (k_lo[:, None, :] <= q_hi[:, :, None])
        & (k_end[:, None, :] >= q_lo[:, :, None])
        & (ks_min[:, None, :] <= qs_max[:, :, None])
        & (ks_max[:, None, :] >= qs_min[:, :, None])
    )
    one_seg = (qs_min == qs_max)[:, :, None] & (ks_min == ks_max)[:, None, :] & (qs_min[:, :, None] == ks_min[:, None])
    full = (
        vis
        & one_seg
        & (q_all[:, :, None] & k_all[:, None, :])
        & (k_hi[:, None, :] <= q_lo[:, :, None])
        & (k_end_min[:, None, :] >= q_hi[:, :, None])
    )
    if not skip:  # baseline for benchmarks: visit every key block, rely on the per-element mask
        vis = jnp.ones_like(vis)
    rank = jnp.where(full, 0, jnp.where(vis, 1, 2))
    order = jnp.argsort(rank, axis=-1, stable=True).astype(jnp.int32)
    kidx = (order + (jnp.arange(B, dtype=jnp.int32) * nk)[:, None, None]).reshape(B * nq, nk)
    return _Blocks(
        seg_q=seg.reshape(B * nq, bq),
        idx_q=idx.reshape(B * nq, bq),
        seg_k=seg.reshape(B * nk, bk),
        idx_k=idx.reshape(B * nk, bk),
        end_k=end_mask.reshape(B * nk, bk),
        kidx=kidx,
        n_full=full.sum(-1).reshape(B * nq).astype(jnp.int32),
        count=vis.sum(-1).reshape(B * nq).astype(jnp.int32),
    )


def _pair_mask(seg_q, idx_q, seg_k, idx_k, end_k, groups: int):
    """[G*bq, bk] mask of one block pair (rows ordered (group, query) like the q block)."""
    m = (
        (seg_q[:, None] == seg_k[None, :])
        & (seg_q[:, None] != 0)
        & (idx_k[None, :] <= idx_q[:, None])
        & (idx_q[:, None] <= end_k[None, :])
    )
    return jnp.tile(m, (groups, 1))


def _kv_block(bl: _Blocks, kT, vT, kj):
    return kT[kj], vT[kj], (bl.seg_k[kj], bl.idx_k[kj], bl.end_k[kj])


def _zeros(like, *sources):
    """fp32 zeros shaped like ``like`` that vary over the same shard_map axes as all ``sources``.

    Loop carries must start with the manual-axis type (vma) their bodies produce, or ``fori_loop`` inside a
    user's ``shard_map`` (check_vma=True) fails. ``zeros_like`` keeps an array's vma without touching its
    values (no 0 * inf = NaN).
    """
    z = jnp.zeros_like(like, jnp.float32)
    for src in sources:
        z = z + jnp.zeros_like(src.reshape(-1)[0], jnp.float32)
    return z


def _two_loops(n_full, count, make_body, init):
    """Run the unmasked body over the fully visible pairs, then the masked body over the partial ones."""
    carry = jax.lax.fori_loop(0, n_full, make_body(False), init)
    return jax.lax.fori_loop(n_full, count, make_body(True), carry)


def _flash_fwd_impl(qT, kT, vT, bl: _Blocks, groups: int):
    """Online-softmax forward over the visible key blocks of each query block. Returns (out, lse)."""
    K, GQ, D = qT.shape[1:]

    def per_query_block(xs):
        q_blk, seg_q, idx_q, kidx, n_full, count = xs

        def make_body(masked: bool):
            def body(t, carry):
                m, l, acc = carry
                k_blk, v_blk, (seg_k, idx_k, end_k) = _kv_block(bl, kT, vT, kidx[t])
                s = jnp.einsum("kqd,kcd->kqc", q_blk, k_blk, preferred_element_type=jnp.float32)
                if masked:
                    mask = _pair_mask(seg_q, idx_q, seg_k, idx_k, end_k, groups)[None]
                    s = jnp.where(mask, s, _NEG)
                m_new = jnp.maximum(m, s.max(-1))
                p = jnp.exp(s - m_new[..., None])
                if masked:
                    p = jnp.where(mask, p, 0.0)
                alpha = jnp.exp(m - m_new)
                pv = jnp.einsum("kqc,kcd->kqd", p.astype(v_blk.dtype), v_blk, preferred_element_type=jnp.float32)
                return m_new, alpha * l + p.sum(-1), alpha[..., None] * acc + pv

            return body

        z = _zeros(q_blk, qT, kT, vT, *bl)
        init = (z[..., 0] + _NEG, z[..., 0], z)
        m, l, acc = _two_loops(n_full, count, make_body, init)
        out = acc / jnp.where(l > 0, l, 1.0)[..., None]
        lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), 0.0)
        return out.astype(qT.dtype), lse

    return jax.lax.map(per_query_block, (qT, bl.seg_q, bl.idx_q, bl.kidx, bl.n_full, bl.count))


def _flash_bwd_impl(qT, kT, vT, bl: _Blocks, outT, lse, doT, groups: int):
    """One pass over query blocks: dq per block, dk/dv accumulated in place into the visible key blocks."""
    delta = jnp.einsum("nkqd,nkqd->nkq", doT.astype(jnp.float32), outT.astype(jnp.float32))

    def per_query_block(carry, xs):
        q_blk, do_blk, lse_blk, delta_blk, seg_q, idx_q, kidx, n_full, count = xs

        def make_body(masked: bool):
            def body(t, inner):
                dq, dk_all, dv_all = inner
                kj = kidx[t]
                k_blk, v_blk, (seg_k, idx_k, end_k) = _kv_block(bl, kT, vT, kj)
                s = jnp.einsum("kqd,kcd->kqc", q_blk, k_blk, preferred_element_type=jnp.float32)
                p = jnp.exp(s - lse_blk[..., None])
                if masked:
                    p = jnp.where(_pair_mask(seg_q, idx_q, seg_k, idx_k, end_k, groups)[None], p, 0.0)
                dp = jnp.einsum("kqd,kcd->kqc", do_blk, v_blk, preferred_element_type=jnp.float32)
                ds = p * (dp - delta_blk[..., None])
                f32 = jnp.float32
                dv_blk = jnp.einsum("kqc,kqd->kcd", p.astype(do_blk.dtype), do_blk, preferred_element_type=f32)
                dk_blk = jnp.einsum("kqc,kqd->kcd", ds.astype(q_blk.dtype), q_blk, preferred_element_type=f32)
                dq = dq + jnp.einsum("kqc,kcd->kqd", ds.astype(k_blk.dtype), k_blk, preferred_element_type=f32)
                return dq, dk_all.at[kj].add(dk_blk), dv_all.at[kj].add(dv_blk)

            return body

        dq0 = _zeros(q_blk, qT, kT, vT, doT, *bl)
        dq, dk_all, dv_all = _two_loops(n_full, count, make_body, (dq0, *carry))
        return (dk_all, dv_all), dq

    zeros_kv = _zeros(kT, qT, vT, doT, *bl)
    xs = (qT, doT, lse, delta, bl.seg_q, bl.idx_q, bl.kidx, bl.n_full, bl.count)
    (dk, dv), dq = jax.lax.scan(per_query_block, (zeros_kv, zeros_kv), xs)
    return dq.astype(qT.dtype), dk.astype(kT.dtype), dv.astype(vT.dtype)


def auto_impl() -> str:
    """What ``impl="auto"`` runs: the Pallas kernel where there is an accelerator to compile it for."""
    return "pallas" if jax.default_backend() in ("gpu", "tpu") else "blockwise"


def _fwd(qT, kT, vT, bl, groups, kernel):
    """kernel: "jnp" or ("pallas", form, interpret) (form/interpret None: the backend's)."""
    if kernel != "jnp":
        _, form, interpret = kernel
        return attention_pallas.flash_fwd_pallas(qT, kT, vT, bl, groups, form=form, interpret=interpret)
    return _flash_fwd_impl(qT, kT, vT, bl, groups)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash(qT, kT, vT, bl: _Blocks, groups: int, kernel: str):
    return _fwd(qT, kT, vT, bl, groups, kernel)[0]


def _flash_fwd(qT, kT, vT, bl, groups, kernel):
    out, lse = _fwd(qT, kT, vT, bl, groups, kernel)
    return out, (qT, kT, vT, bl, out, lse)


def _flash_bwd(groups, kernel, res, doT):
    qT, kT, vT, bl, out, lse = res
    dq, dk, dv = _flash_bwd_impl(qT, kT, vT, bl, out, lse, doT, groups)
    return dq, dk, dv, jax.tree.map(lambda _: None, bl)


_flash.defvjp(_flash_fwd, _flash_bwd)


def _blockwise(q, k, v, seg, end, *, bq: int, bk: int, causal: bool, skip: bool = True, kernel="jnp"):
    """Pad T, lay blocks out as [blocks, K, G*block, D] (kv-head-batched matmuls), run the flash kernel."""
    B, T, H, D = q.shape
    K = k.shape[2]
    G = H // K
    bq, bk = min(bq, T), min(bk, T)
    step = math.lcm(bq, bk)
    Tp = -(-T // step) * step
    if Tp != T:
        pad = [(0, 0), (0, Tp - T)]
        q, k, v = (jnp.pad(x, pad + [(0, 0), (0, 0)]) for x in (q, k, v))
        seg, end = jnp.pad(seg, pad), jnp.pad(end, pad)
    seg, end = seg.astype(jnp.int32), end.astype(jnp.int32)
    bl = _block_lists(seg, end, bq, bk, causal, skip)
    nq, nk = Tp // bq, Tp // bk
    qs = (q.astype(jnp.float32) * (1.0 / math.sqrt(D))).astype(q.dtype)  # one rounding for bf16 inputs
    qT = qs.reshape(B, nq, bq, K, G, D).transpose(0, 1, 3, 4, 2, 5).reshape(B * nq, K, G * bq, D)
    kT = k.reshape(B, nk, bk, K, D).transpose(0, 1, 3, 2, 4).reshape(B * nk, K, bk, D)
    vT = v.reshape(B, nk, bk, K, D).transpose(0, 1, 3, 2, 4).reshape(B * nk, K, bk, D)
    outT = _flash(qT, kT, vT, bl, G, kernel)
    out = outT.reshape(B, nq, K, G, bq, D).transpose(0, 1, 4, 2, 3, 5).reshape(B, Tp, H, D)
    return out[:, :T]


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
    interpret: bool | None = None,
) -> Float[Array, "B T H D"]:
    """Multi-head (GQA) attention under the packed-tree mask; softmax scale 1/sqrt(D), fp32 softmax.

    H must be a multiple of K (query head h uses kv head h // (H // K)). ``subtree_end_BxT=None`` means
    plain causal segments (contiguous runs of one segment id). ``impl="causal"`` ignores ``subtree_end``
    and uses the mask ``seg[i] == seg[j] != 0 and j <= i``. T need not be a multiple of the block sizes
    (rows are padded internally); blocks larger than T shrink to T. Output dtype = q's dtype; padding
    queries (seg 0) give exact zeros and zero gradients. ``interpret`` (Pallas impls only): run the kernel in
    Pallas interpret mode (default: on CPU only).
    """
    if q_BxTxHxD.shape[2] % k_BxTxKxD.shape[2]:
        raise ValueError(f"num heads {q_BxTxHxD.shape[2]} is not a multiple of num kv heads {k_BxTxKxD.shape[2]}")
    if subtree_end_BxT is None:
        subtree_end_BxT = segment_subtree_end(segment_ids_BxT)
    if impl == "reference":
        return _reference(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, visibility_mask(segment_ids_BxT, subtree_end_BxT))
    if impl == "auto":
        return attend_on_mesh(
            q_BxTxHxD,
            k_BxTxKxD,
            v_BxTxKxD,
            segment_ids_BxT=segment_ids_BxT,
            subtree_end_BxT=subtree_end_BxT,
            impl=auto_impl(),
            block_q=block_q,
            block_k=block_k,
            interpret=interpret,
        )
    if impl in ("blockwise", "causal", "dense_blocks", *_PALLAS):
        return _blockwise(
            q_BxTxHxD,
            k_BxTxKxD,
            v_BxTxKxD,
            segment_ids_BxT,
            subtree_end_BxT,
            bq=block_q,
            bk=block_k,
            causal=impl == "causal",
            skip=impl != "dense_blocks",
            kernel=("pallas", _PALLAS[impl], interpret) if impl in _PALLAS else "jnp",
        )
    raise ValueError(f"unknown attention impl {impl!r}; expected one of {IMPLS}")


def _live_axes(mesh, axes) -> tuple[str, ...]:
    axes = axes if isinstance(axes, tuple) else (axes,)
    return tuple(a for a in axes if a is not None and a in mesh.axis_names and mesh.shape[a] > 1)


def _dividing_prefix(mesh, axes: tuple[str, ...], size: int) -> tuple[str, ...]:
    n = 0
    while n < len(axes) and size % math.prod(mesh.shape[a] for a in axes[: n + 1]) == 0:
        n += 1
    return axes[:n]


def attend_on_mesh(
    q_BxTxHxD: Float[Array, "B T H D"],
    k_BxTxKxD: Float[Array, "B T K D"],
    v_BxTxKxD: Float[Array, "B T K D"],
    *,
    segment_ids_BxT: Int[Array, "B T"],
    subtree_end_BxT: Int[Array, "B T"] | None = None,
    batch_axes=("data", "fsdp", "expert"),
    head_axes="tensor",
    **kwargs,
) -> Float[Array, "B T H D"]:
    """``attend`` under ``shard_map`` on the ambient mesh: rows split over ``batch_axes`` (default: the
    "batch" rule of ``research.models.config.DEFAULT_RULES``), kv heads with their query groups over
    ``head_axes``.

    Why: attention is independent per row and per kv head, but the kernel's block loops and key-block
    lookups are not something the SPMD partitioner can split (it would gather the whole batch onto every
    device). Under shard_map each device runs the kernel on its own rows and heads, with no
    communication. Without an ambient mesh (or with all those axes of size 1) this is plain ``attend``.
    """
    if subtree_end_BxT is None:
        subtree_end_BxT = segment_subtree_end(segment_ids_BxT)
    run = functools.partial(attend, **kwargs)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.manual_axes:  # no mesh, or already inside a shard_map: the caller split the work
        return run(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT=segment_ids_BxT, subtree_end_BxT=subtree_end_BxT)
    # the longest prefix of each axis list that splits the dimension evenly (else that dim stays whole)
    b_axes = _dividing_prefix(mesh, _live_axes(mesh, batch_axes), q_BxTxHxD.shape[0])
    h_axes = _dividing_prefix(mesh, _live_axes(mesh, head_axes), k_BxTxKxD.shape[2])
    if not b_axes and not h_axes:
        return run(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT=segment_ids_BxT, subtree_end_BxT=subtree_end_BxT)
    P = jax.sharding.PartitionSpec
    heads, rows = P(b_axes or None, None, h_axes or None, None), P(b_axes or None, None)

    def local(q, k, v, seg, end):
        return run(q, k, v, segment_ids_BxT=seg, subtree_end_BxT=end)

    return jax.shard_map(local, in_specs=(heads, heads, heads, rows, rows), out_specs=heads, check_vma=False)(
        q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT, subtree_end_BxT
    )


def lower_for(platform: str, *, B: int = 1, T: int = 1024, H: int = 32, K: int = 4, D: int = 128, block: int = 256,
              dtype=jnp.bfloat16) -> str:
    """Lowers the compiled (not interpreted) forward kernel for ``platform`` ("cuda": Triton, "tpu": Mosaic) on
    this machine via ``jax.export``, returning the StableHLO text (defaults: Qwen3-30B-A3B's heads, attend's
    256-token blocks). Why: no GPU/TPU is needed to find a block shape, layout or op the Pallas lowering
    rejects; only the target's final compilation (Triton -> PTX, Mosaic -> TPU) and running it need one. Here,
    not in attention_pallas.py: it lowers the whole op (``attend``), which imports the kernels."""
    form = "tpu" if platform == "tpu" else "gpu"

    def fwd(q, k, v, seg, end):
        return attend(q, k, v, segment_ids_BxT=seg, subtree_end_BxT=end, impl=f"pallas_{form}", block_q=block,
                      block_k=block, interpret=False)

    s = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt)
    args = (s((B, T, H, D), dtype), s((B, T, K, D), dtype), s((B, T, K, D), dtype), s((B, T), jnp.int32),
            s((B, T), jnp.int32))
    # the kernels are custom calls without a serialization-stability promise: fine, nothing is stored
    checks = [export.DisabledSafetyCheck.custom_call(t) for t in ("__gpu$xla.gpu.triton", "tpu_custom_call")]
    return export.export(jax.jit(fwd), platforms=[platform], disabled_checks=checks)(*args).mlir_module()
