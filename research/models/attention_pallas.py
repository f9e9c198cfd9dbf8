"""Pallas forward kernels of the block-sparse tree attention (``attend(..., impl="pallas")``).

The algorithm of ``attention_ops._flash_fwd_impl`` (online softmax over the visible key blocks of each query
block, unmasked blocks first), in the two shapes the accelerators want, selected by ``form``:

- ``"gpu"`` (Triton): one program per (query block, kv head, query head x row tile) that loops over the
  query block's compacted key-block list (``kidx``, ``n_full``, ``count`` from ``attention_ops._block_lists``)
  and loads each visible key block straight from HBM in [64, D] tiles: block-sparse FlashAttention with the
  usual 64-row working set, whatever the (256-token) blocks of the lists.
- ``"tpu"`` (Mosaic): splash attention's layout. The grid is (query block, kv head, list position); the
  lists are scalar-prefetch operands (``PrefetchScalarGridSpec``) read by the key/value ``index_map``, so
  the pipeline DMAs exactly the visible key blocks into VMEM; positions past a block's ``count`` repeat the
  previous block index (no new DMA) and skip the compute. Running max/sum/accumulator live in VMEM scratch.
  A tree differs per batch, so unlike stock splash (a static mask's ``MaskInfo`` built on the host) the
  tables are computed on device; the per-element mask comes from the O(T) vectors (segment, index,
  subtree end) of the two blocks.

The mask vectors enter as columns (query side: [bq, 1], for the TPU form tiled over the G query heads of a
kv head, [G*bq, 1]) and rows (key side: [1, bk]) so the mask is one broadcast compare in both forms. The
backward is the jnp kernel (``_flash_bwd_impl``) on the saved (out, lse), so gradients equal
``impl="blockwise"``'s.

Status: both forms run in Pallas interpret mode on CPU against the reference (tests/test_attention_pallas.py)
and are lowered for real targets on CPU (``attention_ops.lower_for``: Triton for ``cuda``, Mosaic for
``tpu``), which checks every block shape and op against the compilers' rules; neither has run on a GPU or TPU
here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

_NEG = -1e30
FORMS = ("gpu", "tpu")


def _mask(segq, idxq, segk, idxk, endk):
    """[GQ, bk] visibility of one block pair from [GQ, 1] query columns and [1, bk] key rows."""
    return (segq == segk) & (segq != 0) & (idxk <= idxq) & (idxq <= endk)


def _online_step(q, k, v, mask, m, l, acc):
    """One key block of the online softmax; m, l are [GQ, 1], acc [GQ, D] (all fp32)."""
    s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    if mask is not None:
        s = jnp.where(mask, s, _NEG)
    m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    p = jnp.exp(s - m_new)
    if mask is not None:
        p = jnp.where(mask, p, 0.0)
    alpha = jnp.exp(m - m_new)
    pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return m_new, alpha * l + jnp.sum(p, axis=1, keepdims=True), alpha * acc + pv


def _finish(m, l, acc):
    safe = jnp.where(l > 0, l, 1.0)
    return acc / safe, jnp.where(l > 0, m + jnp.log(safe), 0.0)


# ---------------------------------------------------------------------------------------------- gpu form
GPU_TILE = 64  # rows of q and columns of k per dot in the gpu form: FlashAttention-2's tile on A100/H100


def _gpu_kernel(kidx_ref, nfull_ref, count_ref, q_ref, segq_ref, idxq_ref, k_ref, v_ref, segk_ref, idxk_ref, endk_ref,
                o_ref, lse_ref, *, tile_k: int):
    i, h = pl.program_id(0), pl.program_id(1)
    q = q_ref[0, 0]  # [tile_q, D]: a tile of one query head's rows of this query block
    segq, idxq = segq_ref[0], idxq_ref[0]  # [tile_q, 1]
    bk = k_ref.shape[2]

    def step(t, carry, masked: bool):
        kj = kidx_ref[i, t]
        for c in range(bk // tile_k):  # the key block in [tile_k, D] tiles loaded from HBM
            cols = pl.ds(c * tile_k, tile_k)
            k, v = k_ref[kj, h, cols], v_ref[kj, h, cols]
            mask = None
            if masked:
                mask = _mask(segq, idxq, segk_ref[kj, :, cols], idxk_ref[kj, :, cols], endk_ref[kj, :, cols])
            carry = _online_step(q, k, v, mask, *carry)
        return carry

    rows, D = q.shape
    init = (jnp.full((rows, 1), _NEG, jnp.float32), jnp.zeros((rows, 1), jnp.float32),
            jnp.zeros((rows, D), jnp.float32))
    carry = jax.lax.fori_loop(0, nfull_ref[i], functools.partial(step, masked=False), init)
    out, lse = _finish(*jax.lax.fori_loop(nfull_ref[i], count_ref[i], functools.partial(step, masked=True), carry))
    o_ref[0, 0] = out.astype(o_ref.dtype)
    lse_ref[0, 0] = lse


def _gpu_call(ops, NQ, K, GQ, D, dtype, interpret, tile: int):
    """Grid (query block, kv head, query head x row tile): a program holds a [tile, D] slice of q and a
    [tile, D] fp32 accumulator and walks the query block's key-block list in [tile, D] key tiles: the usual
    FlashAttention working set, whatever the block sizes of the lists (G*bq rows would not fit a GPU's
    registers). Tiles shrink to the block sizes when those are smaller."""
    kidx, nfull, count, qT, segq, idxq, kT, vT, segk, idxk, endk = ops
    bq, bk = segq.shape[1], kT.shape[2]
    tq, tk = min(tile, bq), min(tile, bk)
    if bq % tq or bk % tk:
        raise ValueError(f"gpu form: blocks ({bq}, {bk}) are not multiples of the tile {tile}")
    nt = bq // tq
    whole = lambda x: pl.BlockSpec(x.shape, lambda i, h, r, n=x.ndim: (0,) * n)
    rows = pl.BlockSpec((1, 1, tq, D), lambda i, h, r: (i, h, r, 0))  # r = query head * nt + row tile
    col = pl.BlockSpec((1, tq, 1), lambda i, h, r: (i, r % nt, 0))
    in_specs = [whole(kidx), whole(nfull), whole(count), rows, col, col, whole(kT), whole(vT), whole(segk),
                whole(idxk), whole(endk)]
    out_specs = [rows, pl.BlockSpec((1, 1, tq, 1), lambda i, h, r: (i, h, r, 0))]
    kw = {}
    if not interpret:
        from jax.experimental.pallas import triton as pl_triton

        kw["compiler_params"] = pl_triton.CompilerParams(num_warps=4, num_stages=2)
    return pl.pallas_call(functools.partial(_gpu_kernel, tile_k=tk), grid=(NQ, K, GQ // tq), in_specs=in_specs,
                          out_specs=out_specs, out_shape=_out_shape(NQ, K, GQ, D, dtype), interpret=interpret,
                          **kw)(*ops)


# ---------------------------------------------------------------------------------------------- tpu form
def _tpu_kernel(kidx_ref, nfull_ref, count_ref, q_ref, segq_ref, idxq_ref, k_ref, v_ref, segk_ref, idxk_ref, endk_ref,
                o_ref, lse_ref, m_sc, l_sc, acc_sc):
    i, t = pl.program_id(0), pl.program_id(2)

    @pl.when(t == 0)
    def _():
        m_sc[...] = jnp.full(m_sc.shape, _NEG, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    def run(masked: bool):
        mask = _mask(segq_ref[0], idxq_ref[0], segk_ref[0], idxk_ref[0], endk_ref[0]) if masked else None
        m, l, acc = _online_step(q_ref[0, 0], k_ref[0, 0], v_ref[0, 0], mask, m_sc[...], l_sc[...], acc_sc[...])
        m_sc[...], l_sc[...], acc_sc[...] = m, l, acc

    pl.when(t < nfull_ref[i])(lambda: run(False))
    pl.when((t >= nfull_ref[i]) & (t < count_ref[i]))(lambda: run(True))

    @pl.when(t == pl.num_programs(2) - 1)
    def _():
        out, lse = _finish(m_sc[...], l_sc[...], acc_sc[...])
        o_ref[0, 0] = out.astype(o_ref.dtype)
        lse_ref[0, 0] = lse


def _tpu_call(ops, NQ, K, GQ, D, dtype, interpret):
    from jax.experimental.pallas import tpu as pltpu

    kidx, nfull, count, qT, segq, idxq, kT, vT, segk, idxk, endk = ops
    nk = kidx.shape[1]
    bk = kT.shape[2]

    def kv_block(i, t, kidx, nfull, count):
        """The t-th visible key block of query block i; past the list, the last one again (no new DMA)."""
        return kidx[i, jnp.maximum(jnp.minimum(t, count[i] - 1), 0)]

    kv = pl.BlockSpec((1, 1, bk, D), lambda i, h, t, *tabs: (kv_block(i, t, *tabs), h, 0, 0))
    row = pl.BlockSpec((1, 1, bk), lambda i, h, t, *tabs: (kv_block(i, t, *tabs), 0, 0))
    col = pl.BlockSpec((1, GQ, 1), lambda i, h, t, *tabs: (i, 0, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(NQ, K, nk),
        in_specs=[pl.BlockSpec((1, 1, GQ, D), lambda i, h, t, *tabs: (i, h, 0, 0)), col, col, kv, kv, row, row, row],
        out_specs=[pl.BlockSpec((1, 1, GQ, D), lambda i, h, t, *tabs: (i, h, 0, 0)),
                   pl.BlockSpec((1, 1, GQ, 1), lambda i, h, t, *tabs: (i, h, 0, 0))],
        scratch_shapes=[pltpu.VMEM((GQ, 1), jnp.float32), pltpu.VMEM((GQ, 1), jnp.float32),
                        pltpu.VMEM((GQ, D), jnp.float32)],
    )
    params = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"))
    return pl.pallas_call(_tpu_kernel, grid_spec=grid_spec, out_shape=_out_shape(NQ, K, GQ, D, dtype),
                          compiler_params=params, interpret=interpret)(*ops)


def _out_shape(NQ, K, GQ, D, dtype):
    return [jax.ShapeDtypeStruct((NQ, K, GQ, D), dtype), jax.ShapeDtypeStruct((NQ, K, GQ, 1), jnp.float32)]


# ---------------------------------------------------------------------------------------------- entry
def default_form() -> str:
    return "tpu" if jax.default_backend() == "tpu" else "gpu"


def flash_fwd_pallas(qT, kT, vT, bl, groups: int, *, form: str | None = None, interpret: bool | None = None,
                     gpu_tile: int = GPU_TILE):
    """(out [NQ, K, G*bq, D], lse [NQ, K, G*bq]) like ``attention_ops._flash_fwd_impl``.

    ``form``: "gpu" | "tpu" (default: the backend's); ``interpret`` defaults to True on CPU; ``gpu_tile``:
    the gpu form's q-row / k-column tile.
    """
    form = form or default_form()
    if form not in FORMS:
        raise ValueError(f"pallas form {form!r} not in {FORMS}")
    interpret = jax.default_backend() == "cpu" if interpret is None else interpret
    NQ, K, GQ, D = qT.shape
    # query-side columns: [NQ, bq, 1] (gpu: one query head per program) or tiled over the G query heads of a kv
    # head, [NQ, G*bq, 1] (tpu: rows ordered (group, query) like qT's); key-side rows [NK, 1, bk]
    col = lambda x: (x if form == "gpu" else jnp.tile(x, (1, groups)))[..., None]
    row = lambda x: x[:, None, :]
    ops = (bl.kidx, bl.n_full, bl.count, qT, col(bl.seg_q), col(bl.idx_q), kT, vT, row(bl.seg_k), row(bl.idx_k),
           row(bl.end_k))
    if form == "tpu":
        out, lse = _tpu_call(ops, NQ, K, GQ, D, qT.dtype, interpret)
    else:
        out, lse = _gpu_call(ops, NQ, K, GQ, D, qT.dtype, interpret, gpu_tile)
    return out, lse[..., 0]
