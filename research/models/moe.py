"""Qwen3-MoE sparse block: softmax top-k router (+ routing replay) and dropless expert FFNs.

Three interchangeable expert kernels, same math (``cfg.moe_impl``):
- ``"ragged"``: sort the (token, k) assignments by expert and run ``jax.lax.ragged_dot`` grouped matmuls.
  The fast path on TPU/GPU (megablox / cuBLAS grouped GEMM). XLA:CPU lowers it to a dense loop over all
  groups, so on CPU it costs ~E/K times the useful flops.
- ``"blocked"``: the CPU-fast path. Sorted assignments are padded per expert to a multiple of a row block,
  so each block belongs to exactly one expert, and a ``lax.map`` over blocks runs one [b, D] x [D, I]
  matmul per block. Dropless with a static worst-case block count (cdiv(A, b) + E); costs ~useful flops.
- ``"dense"``: every expert on every token, gated by a dense [N, E] combine matrix. The obviously-correct
  reference; fine for tiny tests.
- ``"auto"``: ragged on TPU/GPU, blocked on CPU.
- ``"shapes"``: compile-only, for AOT memory analysis on CPU (``research/train/aot.py``): ``"ragged"`` with each
  grouped matmul replaced by one dense matmul of the same operand, result and gradient shapes. Its numbers
  are WRONG; its buffers are those of a grouped GEMM on TPU/GPU, which XLA:CPU's dense lowering of
  ``ragged_dot`` (an [experts, assignments, D] array per matmul) and ``"blocked"`` (per-block weight copies
  saved for the backward) are not.

Expert parallelism (``cfg.expert_parallel``; used when an ambient mesh with an ``expert`` axis is set via
``jax.set_mesh``, else the identical single-device math runs): experts are sharded over the ``expert`` mesh axis and the
kernel runs under ``shard_map``: tokens are all-gathered over ``expert``, each shard runs only its local
experts (others' assignments are sent to a sentinel group that is never computed), partial outputs are
summed over ``tensor`` (the expert hidden dim is tensor-sharded) and reduce-scattered back over
``expert``. It uses only all_gather / psum / psum_scatter, so it runs on XLA:CPU (``ragged_all_to_all``
does not); on TPU the all-to-all dispatch is the natural upgrade for large expert counts.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float, Int

from research.models.config import ModelConfig

_BLOCK_ROWS = 128


def route(
    x_NxD: Float[Array, "N D"],
    router_DxE: Float[Array, "D E"],
    *,
    top_k: int,
    norm_topk_prob: bool,
    expert_ids_NxK: Int[Array, "N K"] | None = None,
) -> tuple[Float[Array, "N K"], Int[Array, "N K"]]:
    """Gate weights and expert ids. With ``expert_ids_NxK`` (routing replay) the ids are taken as given and
    the weights are still the router's softmax probabilities at those experts, so gradients flow to the
    router exactly as they would had it chosen them."""
    logits_NxE = jnp.einsum("nd,de->ne", x_NxD, router_DxE.astype(x_NxD.dtype), preferred_element_type=jnp.float32)
    probs_NxE = jax.nn.softmax(logits_NxE.astype(jnp.float32), axis=-1)
    if expert_ids_NxK is None:
        w_NxK, ids_NxK = jax.lax.top_k(probs_NxE, top_k)
    else:
        ids_NxK = expert_ids_NxK.astype(jnp.int32)
        w_NxK = jnp.take_along_axis(probs_NxE, ids_NxK, axis=-1)
    if norm_topk_prob:
        w_NxK = w_NxK / w_NxK.sum(-1, keepdims=True)
    return w_NxK, ids_NxK.astype(jnp.int32)


def _swiglu(x, wg, wu, wo):
    h = jax.nn.silu(x @ wg) * (x @ wu)
    return h @ wo


def _sort_assignments(ids_NxK, num_experts):
    """Stable sort of flat assignments by expert; ids >= num_experts (non-local) sort last, uncounted."""
    flat_e = ids_NxK.reshape(-1)
    order = jnp.argsort(flat_e, stable=True)
    counts_E = jax.ops.segment_sum(jnp.ones_like(flat_e), flat_e, num_segments=num_experts)
    return flat_e, order, counts_E


def experts_dense(x_NxD, ids_NxK, w_NxK, wg_ExDxI, wu_ExDxI, wo_ExIxD):
    E = wg_ExDxI.shape[0]
    combine_NxE = jnp.einsum("nk,nke->ne", w_NxK, jax.nn.one_hot(ids_NxK, E, dtype=w_NxK.dtype))
    h_ExNxI = jax.nn.silu(jnp.einsum("nd,edi->eni", x_NxD, wg_ExDxI)) * jnp.einsum("nd,edi->eni", x_NxD, wu_ExDxI)
    y_ExNxD = jnp.einsum("eni,eid->end", h_ExNxI, wo_ExIxD)
    return jnp.einsum("end,ne->nd", y_ExNxD, combine_NxE.astype(y_ExNxD.dtype))


def _unsort_combine(y_AxD, order, w_NxK):
    N, K = w_NxK.shape
    inv = jnp.argsort(order)
    y_NxKxD = y_AxD[inv].reshape(N, K, -1)
    return jnp.einsum("nkd,nk->nd", y_NxKxD, w_NxK.astype(y_NxKxD.dtype))


def experts_ragged(x_NxD, ids_NxK, w_NxK, wg_ExDxI, wu_ExDxI, wo_ExIxD, dot=jax.lax.ragged_dot):
    E = wg_ExDxI.shape[0]
    K = ids_NxK.shape[1]
    flat_e, order, counts_E = _sort_assignments(ids_NxK, E)
    xs_AxD = x_NxD[order // K]
    h = jax.nn.silu(dot(xs_AxD, wg_ExDxI, counts_E)) * dot(xs_AxD, wu_ExDxI, counts_E)
    y_AxD = dot(h, wo_ExIxD, counts_E)  # rows past sum(counts) (non-local) come out 0
    return _unsort_combine(y_AxD, order, w_NxK)


@jax.custom_vjp
def grouped_matmul_shapes(x_AxK, w_ExKxN, counts_E):
    """Memory stand-in of ``ragged_dot`` (moe_impl "shapes"): a grouped GEMM's operands, [A, N] result and
    [E, K, N] weight gradient, computed as if every row belonged to expert 0."""
    del counts_E
    return x_AxK @ w_ExKxN[0]


def _gms_fwd(x_AxK, w_ExKxN, counts_E):
    return x_AxK @ w_ExKxN[0], (x_AxK, w_ExKxN)


def _gms_bwd(res, dy_AxN):
    x_AxK, w_ExKxN = res
    dw = jnp.zeros_like(w_ExKxN).at[0].set((x_AxK.T @ dy_AxN).astype(w_ExKxN.dtype))
    return (dy_AxN @ w_ExKxN[0].T).astype(x_AxK.dtype), dw, None


grouped_matmul_shapes.defvjp(_gms_fwd, _gms_bwd)


def experts_blocked(x_NxD, ids_NxK, w_NxK, wg_ExDxI, wu_ExDxI, wo_ExIxD, block_rows: int = _BLOCK_ROWS):
    E = wg_ExDxI.shape[0]
    N, K = ids_NxK.shape
    A = N * K
    b = int(min(block_rows, max(1, pl2(-(-A // E)))))
    nb = -(-A // b) + E  # static worst case of sum_e cdiv(count_e, b)
    flat_e, order, counts_E = _sort_assignments(ids_NxK, E)
    padded_E = -(-counts_E // b) * b
    start_E = jnp.cumsum(counts_E) - counts_E
    pstart_E = jnp.cumsum(padded_E) - padded_E
    sorted_e = flat_e[order]
    local = sorted_e < E
    e_safe = jnp.where(local, sorted_e, 0)
    dest_A = jnp.where(local, pstart_E[e_safe] + jnp.arange(A) - start_E[e_safe], nb * b)  # non-local: dropped
    xs = jnp.zeros((nb * b, x_NxD.shape[1]), x_NxD.dtype).at[dest_A].set(x_NxD[order // K], mode="drop")
    block_e = jnp.searchsorted(jnp.cumsum(padded_E) // b, jnp.arange(nb), side="right")
    block_e = jnp.minimum(block_e, E - 1)

    def one_block(args):
        xb, e = args
        take = lambda w: jax.lax.dynamic_index_in_dim(w, e, keepdims=False)
        return _swiglu(xb, take(wg_ExDxI), take(wu_ExDxI), take(wo_ExIxD))

    y = jax.lax.map(one_block, (xs.reshape(nb, b, -1), block_e)).reshape(nb * b, -1)
    y_AxD = jnp.where(local[:, None], y.at[dest_A].get(mode="fill", fill_value=0), 0)
    return _unsort_combine(y_AxD, order, w_NxK)


def pl2(n: int) -> int:
    """Smallest power of two >= n (block sizes)."""
    return 1 << max(0, int(n - 1).bit_length())


_IMPLS = {"dense": experts_dense, "ragged": experts_ragged, "blocked": experts_blocked,
          "shapes": functools.partial(experts_ragged, dot=grouped_matmul_shapes)}


def resolve_impl(name: str) -> str:
    if name == "auto":
        return "blocked" if jax.default_backend() == "cpu" else "ragged"
    if name not in _IMPLS:
        raise ValueError(f"unknown moe_impl {name!r}; expected one of {sorted(_IMPLS) + ['auto']}")
    return name


def _mesh_axes(mesh, rule):
    axes = rule if isinstance(rule, tuple) else (rule,)
    return tuple(a for a in axes if a is not None and a in mesh.axis_names and mesh.shape[a] > 1)


def experts_expert_parallel(x_NxD, ids_NxK, w_NxK, wg, wu, wo, *, impl: str, batch_rule):
    """Expert-parallel dropless MoE under shard_map on the ambient mesh (see module docstring)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or "expert" not in mesh.axis_names:  # no mesh (init, eval_shape, 1 device): same math, local
        return _IMPLS[impl](x_NxD, ids_NxK, w_NxK, wg, wu, wo)
    batch_axes = _mesh_axes(mesh, batch_rule)
    if x_NxD.shape[0] % math.prod(mesh.shape[a] for a in batch_axes):
        batch_axes = ()  # too few tokens to split (e.g. a small decode batch): replicate them, psum the experts
    ep = mesh.shape["expert"]
    E = wg.shape[0]
    if E % ep:
        raise ValueError(f"num_experts={E} is not divisible by the expert mesh axis size {ep}")
    tp = "tensor" if "tensor" in mesh.axis_names and mesh.shape["tensor"] > 1 else None
    gather_ep = "expert" in batch_axes
    tok = P(batch_axes or None, None)
    fn = _IMPLS[impl]

    def local(x, ids, w, wg_l, wu_l, wo_l):
        if gather_ep:
            x, ids, w = (jax.lax.all_gather(a, "expert", axis=0, tiled=True) for a in (x, ids, w))
        e_loc = wg_l.shape[0]
        lid = ids - jax.lax.axis_index("expert") * e_loc
        lid = jnp.where((lid >= 0) & (lid < e_loc), lid, e_loc)  # e_loc = sentinel: not computed here
        y = fn(x, lid, w, wg_l, wu_l, wo_l)
        if tp:
            y = jax.lax.psum(y, tp)
        if gather_ep:
            return jax.lax.psum_scatter(y, "expert", scatter_dimension=0, tiled=True)
        return jax.lax.psum(y, "expert")

    return jax.shard_map(
        local,
        in_specs=(tok, tok, tok, P("expert", None, tp), P("expert", None, tp), P("expert", tp, None)),
        out_specs=tok,
        check_vma=False,
    )(x_NxD, ids_NxK, w_NxK, wg, wu, wo)


class MoEBlock(nn.Module):
    """Router + experts. Returns (y_BxTxD, expert_ids_BxTxK) so callers can record the routing."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BxTxD, expert_ids_BxTxK=None):
        cfg = self.cfg
        D, E, I = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
        pdt, dt = jnp.dtype(cfg.param_dtype), jnp.dtype(cfg.dtype)
        init = nn.initializers.normal(0.02)
        mk = lambda name, shape, axes: self.param(name, nn.with_logical_partitioning(init, axes), shape, pdt)
        router = mk("router", (D, E), ("embed", "router"))
        wg = mk("wi_gate", (E, D, I), ("exp", "embed", "expert_mlp")).astype(dt)
        wu = mk("wi_up", (E, D, I), ("exp", "embed", "expert_mlp")).astype(dt)
        wo = mk("wo", (E, I, D), ("exp", "expert_mlp", "embed")).astype(dt)
        B, T, _ = x_BxTxD.shape
        x_NxD = x_BxTxD.reshape(B * T, D)
        replay = None if expert_ids_BxTxK is None else expert_ids_BxTxK.reshape(B * T, -1)
        w_NxK, ids_NxK = route(
            x_NxD, router, top_k=cfg.num_experts_per_tok, norm_topk_prob=cfg.norm_topk_prob, expert_ids_NxK=replay
        )
        impl = resolve_impl(cfg.moe_impl)
        if cfg.expert_parallel:
            batch_rule = dict(cfg.logical_rules).get("batch")
            fn = functools.partial(experts_expert_parallel, impl=impl, batch_rule=batch_rule)
        else:
            fn = _IMPLS[impl]
        y_NxD = fn(x_NxD, ids_NxK, w_NxK.astype(dt), wg, wu, wo)
        return y_NxD.reshape(B, T, D).astype(dt), ids_NxK.reshape(B, T, -1)
