"""KV-cache prefill/decode for the engine, on the same Qwen3 module and weights as training.

Cache layout: ``KVCache`` with, per layer-run r, ``k[r]``/``v[r]`` of shape [layers_in_run, slots, max_len,
kv_heads, head_dim]. A *slot* is one row: one in-flight sequence. The cache stores no lengths: the caller
(the engine) owns each slot's position, and attention at position p sees exactly cache entries 0..p of that
slot (``j <= p``). Consequences the engine relies on:

- Continuous batching: to give slot i a new request, ``prefill(..., slots_B=[i], start_B=[0])``. It
  overwrites entries 0..len-1; whatever the previous request left beyond is never visible (j > p), so
  there is nothing to reset and other slots are untouched (only rows ``slots_B`` are written).
- Multi-turn continuation / chunked prefill: ``start_B=[n]`` appends after the n entries already there.
- ``decode_step`` is the T=1 case: token at ``positions_B`` is written at that index and attends to 0..p.
- Idle slots can ride along in a decode batch (their writes land in their own rows) or be left out via
  ``slots_B``. Writes past ``max_len`` are dropped (the engine must stop at max_len; see ``ContextLengthExceeded``).

Positions double as RoPE positions, as in ``transformers`` generation. Routing: every call returns the experts
chosen per token and layer (for the capture log / routing replay) and accepts ``expert_ids`` to replay.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from research.models.config import ModelConfig
from research.models.moe import _IMPLS as MOE_KERNELS
from research.models.moe import resolve_impl, route
from research.models.mrope import mrope_angles, rotate
from research.models.qwen3 import _NEG, KVCache, Qwen3, RMSNorm, head_weight, logits, rope


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """Zeroed cache for ``batch`` slots of ``max_len`` tokens (dtype defaults to the compute dtype)."""
    dt = jnp.dtype(dtype or cfg.dtype)
    shape = lambda n: (n, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    runs = cfg.layer_runs()
    return KVCache(k=tuple(jnp.zeros(shape(n), dt) for _, _, n in runs),
                   v=tuple(jnp.zeros(shape(n), dt) for _, _, n in runs))


def _extend(params, cfg, cache, tokens_BxT, start_B, lengths_B, slots_B, expert_ids_BxTxLxK):
    B, T = tokens_BxT.shape
    max_len = cache.k[0].shape[2]
    t = jnp.arange(T, dtype=jnp.int32)[None, :]
    positions_BxT = start_B[:, None] + t
    write_BxT = jnp.where(t < lengths_B[:, None], positions_BxT, max_len)  # padding: dropped, never written
    hidden, aux = Qwen3(cfg).apply(
        {"params": params}, tokens_BxT, positions_BxT, jnp.ones_like(tokens_BxT), None,
        expert_ids_BxTxLxK=expert_ids_BxTxLxK, kv_cache=cache, cache_slots_B=slots_B, cache_write_BxT=write_BxT,
    )
    last = jnp.maximum(lengths_B - 1, 0)
    h_last = jnp.take_along_axis(hidden, last[:, None, None], axis=1)
    return logits(params, cfg, h_last)[:, 0], aux["kv_cache"], aux["routed_experts"]


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def prefill(
    params,
    cfg: ModelConfig,
    cache: KVCache,
    tokens_BxT: Int[Array, "B T"],
    lengths_B: Int[Array, "B"],
    *,
    slots_B: Int[Array, "B"] | None = None,
    start_B: Int[Array, "B"] | None = None,
    expert_ids_BxTxLxK: Int[Array, "B T L K"] | None = None,
) -> tuple[Float[Array, "B V"], KVCache, Int[Array, "B T L K"]]:
    """Write ``tokens_BxT[b, :lengths_B[b]]`` into slot ``slots_B[b]`` at positions ``start_B[b] + t``.

    Returns (fp32 logits of each row's last valid token [B, V], new cache, routed experts [B, T, L, K]).
    ``slots_B`` defaults to 0..B-1 and ``start_B`` to 0 (a fresh request). The cache is donated.
    """
    B = tokens_BxT.shape[0]
    slots_B = jnp.arange(B, dtype=jnp.int32) if slots_B is None else slots_B.astype(jnp.int32)
    start_B = jnp.zeros((B,), jnp.int32) if start_B is None else start_B.astype(jnp.int32)
    return _extend(params, cfg, cache, tokens_BxT, start_B, lengths_B.astype(jnp.int32), slots_B,
                   expert_ids_BxTxLxK)


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def decode_step(
    params,
    cfg: ModelConfig,
    cache: KVCache,
    tokens_B: Int[Array, "B"],
    positions_B: Int[Array, "B"],
    *,
    slots_B: Int[Array, "B"] | None = None,
    expert_ids_BxLxK: Int[Array, "B L K"] | None = None,
) -> tuple[Float[Array, "B V"], KVCache, Int[Array, "B L K"]]:
    """One token per slot at ``positions_B``; returns (fp32 next-token logits [B, V], cache, routed [B, L, K])."""
    B = tokens_B.shape[0]
    slots_B = jnp.arange(B, dtype=jnp.int32) if slots_B is None else slots_B.astype(jnp.int32)
    eids = None if expert_ids_BxLxK is None else expert_ids_BxLxK[:, None]
    out, cache, routed = _extend(params, cfg, cache, tokens_B[:, None], positions_B.astype(jnp.int32),
                                 jnp.ones((B,), jnp.int32), slots_B, eids)
    return out, cache, routed[:, 0]


def greedy_generate(params, cfg: ModelConfig, prompt_T: list[int], max_new_tokens: int, max_len: int | None = None):
    """Greedy decoding of one prompt through the cache (reference loop for tests and examples)."""
    max_len = max_len or len(prompt_T) + max_new_tokens
    cache = init_cache(cfg, 1, max_len)
    lg, cache, _ = prefill(params, cfg, cache, jnp.array([prompt_T]), jnp.array([len(prompt_T)]))
    out = []
    for i in range(max_new_tokens):
        tok = int(jnp.argmax(lg[0]))
        out.append(tok)
        if i + 1 == max_new_tokens:
            break
        lg, cache, _ = decode_step(params, cfg, cache, jnp.array([tok]), jnp.array([len(prompt_T) + i]))
    return out



# ------------------------------------------------------------------------------------------------------
# The engine's fast path. `Qwen3.apply` in cache mode (above) writes new K/V into the stacked cache inside
# the layer scan and reads each slot's whole row: every call copies the whole [layers, slots, cache_len]
# cache and attends over cache_len keys, and XLA:CPU copies every layer's weights out of the stacked
# params before each matmul. The fast path instead
#   - keeps params per layer (`engine_params`: one tree per layer, matrices pre-cast to the compute dtype,
#     the LM head a contiguous [D, V]) and the cache per layer, head-major [rows, kv_heads, len, head_dim]
#     (`LayerKV`), and runs the layers unrolled: no per-step copies of weights or cache;
#   - attends over two key sets: ctx = the first `ctx_len` cached positions of each row (a static length
#     bucket, read only; key j visible iff j < ctx_len_B[b]) and new = the K/V of the tokens this call adds,
#     kept in a small buffer (a prefill chunk, or the tokens of a multi-step decode block) under a causal
#     mask; the buffer is written into the cache afterwards (one in-place update per layer).
# The layer math is the training module's: the same RMSNorm / MLP modules, `rope`, `moe.route` and expert
# kernels, the same projection einsums and dtypes; tests check it against the full forward to 1e-5.
# How the weights are stored and multiplied is an `EngineOps` (XLA's by default): the serving layer passes
# its CPU kernels' (research/serving/cpu_kernels) without this module depending on it.


@flax.struct.dataclass
class LayerKV:
    """Per-layer keys/values of the fast path: ``k[l]``, ``v[l]`` are [rows, kv_heads, len, head_dim]."""

    k: tuple
    v: tuple


class VisualChunk(NamedTuple):
    """A vision-language prompt's image tokens inside the T new tokens of a call (Qwen3-VL, research/models/
    qwen3_vl.py): token t takes merged vision token `index_BxT[b, t]` (-1: a text token) as its embedding, and
    after layer k < K gains DeepStack feature `deep_KxMxD[k]` there; M is padded to a bucket."""

    index_BxT: Int[Array, "B T"]
    rows_MxD: Float[Array, "M D"]
    deep_KxMxD: Float[Array, "K M D"]


def init_layer_cache(cfg: ModelConfig, slots: int, cache_len: int, dtype=None) -> LayerKV:
    dt = jnp.dtype(dtype or cfg.dtype)
    z = lambda: tuple(jnp.zeros((slots, cfg.num_kv_heads, cache_len, cfg.head_dim), dt) for _ in range(cfg.num_layers))
    return LayerKV(k=z(), v=z())


class EngineOps:
    """How the fast path stores its weights and computes on them: XLA's ops, on every backend. The model sits
    below the serving layer, so other implementations come from there as subclasses (the CPU kernels:
    research/serving/cpu_kernels.OPS), passed to `engine_params` and to the step functions alike (the layout
    `pack`/`pack_moe` produce is the one the other methods read). Use one instance per kind: jit closes over it."""

    def pack(self, w_KxN):
        """A projection matrix (compute dtype) in the layout `matmul` and `head` read."""
        return w_KxN

    def pack_moe(self, m: dict) -> dict:
        """A MoE layer's params for `experts` (with "router"): the [E, D, I] stacks the prefill kernels read,
        plus `w_gu` [D, 2, E, I] (every expert's gate and up side by side) for the decode kernel."""
        return {**m, "w_gu": jnp.stack([m["wi_gate"], m["wi_up"]]).transpose(2, 0, 1, 3)}

    def matmul(self, x, w):
        """x @ w over the last axis, in the compute dtype."""
        return x @ w

    def head(self, hidden_BxTxD, w) -> Float[Array, "B T V"]:
        """The LM head's fp32 logits."""
        return jnp.einsum("btd,dv->btv", hidden_BxTxD, w, preferred_element_type=jnp.float32)

    def attend(self, q_BxTxHxD, ctx_k_BxKxLxD, ctx_v_BxKxLxD, ctx_len_B, new_k_BxKxNxD, new_v_BxKxNxD,
               new_mask_BxTxN):
        """The fast path's attention over cached + buffer keys; `_attend` states the contract."""
        return _attend(q_BxTxHxD, ctx_k_BxKxLxD, ctx_v_BxKxLxD, ctx_len_B, new_k_BxKxNxD, new_v_BxKxNxD,
                       new_mask_BxTxN)

    def experts(self, cfg: ModelConfig, x_NxD, ids_NxK, w_NxK, mp):
        """The routed tokens' expert FFNs, gate-weighted and summed per token."""
        return _experts_by_count(cfg, x_NxD, ids_NxK, w_NxK, mp)


XLA_OPS = EngineOps()


def engine_params(params, cfg: ModelConfig, ops: EngineOps = XLA_OPS) -> dict:
    """The fast path's parameter layout (see above). Matrices are pre-cast to the compute dtype (the module
    casts them per call; same values), norm scales keep the param dtype as in the module. Projections that
    read the same input are concatenated into one matmul: `w_qkv` [D, (H + 2K) * Dh], the MLP's `w_gu`
    [D, 2F]; each then goes through `ops.pack`, MoE layers through `ops.pack_moe`, so the layout is the one
    `ops` computes on (pass the same `ops` to `prefill_slot` / `block_decode_step`)."""
    params = nn.meta.unbox(params)
    dt = jnp.dtype(cfg.dtype)
    D = cfg.hidden_size
    mat = ops.pack
    layers = []
    for r, (moe, _, n) in enumerate(cfg.layer_runs()):
        run = jax.tree.map(lambda a: a.astype(dt) if a.ndim >= 3 else a, params[f"layers_{r}"])  # [n, ...]
        for i in range(n):
            lp = jax.tree.map(lambda a, i=i: a[i], run)
            a = lp["attn"]
            layer = {
                "input_norm": lp["input_norm"]["scale"], "post_attn_norm": lp["post_attn_norm"]["scale"],
                "q_norm": a["q_norm"]["scale"], "k_norm": a["k_norm"]["scale"],
                "w_qkv": mat(jnp.concatenate([a[k].reshape(D, -1) for k in ("q_proj", "k_proj", "v_proj")], axis=1)),
                "o_proj": mat(a["o_proj"].reshape(-1, D)),
            }
            if moe:
                layer["moe"] = ops.pack_moe(lp["moe"])
            else:
                m = lp["mlp"]
                layer["mlp"] = {"w_gu": mat(jnp.concatenate([m["gate_proj"], m["up_proj"]], axis=1)),
                                "down": mat(m["down_proj"])}
            layers.append(layer)
    return {"embedding": params["embedding"], "final_norm": params["final_norm"]["scale"],
            "head": mat(head_weight(params, cfg).astype(dt)), "layers": tuple(layers)}


def _rms(scale, x, cfg: ModelConfig):
    return RMSNorm(cfg.rms_norm_eps, "embed", cfg.param_dtype).apply({"params": {"scale": scale}}, x)


def _attend(q_BxTxHxD, ctx_k_BxKxLxD, ctx_v_BxKxLxD, ctx_len_B, new_k_BxKxNxD, new_v_BxKxNxD, new_mask_BxTxN):
    """One softmax over [ctx keys j < ctx_len_B[b]] + [buffer keys where new_mask]; GQA rows m = g*T + t."""
    B, T, H, D = q_BxTxHxD.shape
    K, L = ctx_k_BxKxLxD.shape[1:3]
    G = H // K
    qg = q_BxTxHxD.reshape(B, T, K, G, D).transpose(0, 2, 3, 1, 4).reshape(B, K, G * T, D)
    dots = lambda k: jnp.einsum("bkmd,bkld->bkml", qg, k, preferred_element_type=jnp.float32) / jnp.sqrt(D)
    m_ctx = (jnp.arange(L)[None, :] < ctx_len_B[:, None])[:, None, None, :]
    m_new = jnp.tile(new_mask_BxTxN, (1, G, 1))[:, None]
    s_ctx = jnp.where(m_ctx, dots(ctx_k_BxKxLxD), _NEG)
    s_new = jnp.where(m_new, dots(new_k_BxKxNxD), _NEG)
    mx = jnp.maximum(s_ctx.max(-1, keepdims=True), s_new.max(-1, keepdims=True))
    p_ctx, p_new = jnp.exp(s_ctx - mx) * m_ctx, jnp.exp(s_new - mx) * m_new
    denom = jnp.maximum(p_ctx.sum(-1, keepdims=True) + p_new.sum(-1, keepdims=True), 1e-30)
    pv = lambda p, v: jnp.einsum("bkml,bkld->bkmd", (p / denom).astype(v.dtype), v, preferred_element_type=jnp.float32)
    o = pv(p_ctx, ctx_v_BxKxLxD) + pv(p_new, new_v_BxKxNxD)
    return o.reshape(B, K, G, T, D).transpose(0, 3, 1, 2, 4).reshape(B, T, H, D).astype(q_BxTxHxD.dtype)


def _experts_all(x_NxD, ids_NxK, w_NxK, mp):
    """moe.experts_dense's math (every expert on every token, weighted by the gate, which is 0 off the chosen
    experts) as two plain [N, D] x [D, 2EI] and [N, EI] x [EI, D] matmuls over the decode layout (`w_gu`,
    `wo`): XLA:CPU would otherwise transpose the [E, D, I] expert weights for every decode step."""
    _, _, E, I = mp["w_gu"].shape
    N, D = x_NxD.shape
    gu = (x_NxD @ mp["w_gu"].reshape(D, 2 * E * I)).reshape(N, 2, E, I)
    combine_NxE = jnp.einsum("nk,nke->ne", w_NxK, jax.nn.one_hot(ids_NxK, E, dtype=w_NxK.dtype))
    h = jax.nn.silu(gu[:, 0]) * gu[:, 1] * combine_NxE[:, :, None].astype(gu.dtype)
    return h.reshape(N, E * I) @ mp["wo"].reshape(E * I, D)


def _experts_sliced(x_NxD, ids_NxK, w_NxK, mp):
    """Only the chosen experts' weights, sliced out per (token, k) (contiguous [D, I] blocks; an XLA gather
    of them is much slower on CPU): reads K of E experts' weights per token, not all of them."""
    N, K = ids_NxK.shape
    take = lambda w, e: jax.lax.dynamic_index_in_dim(w, e, keepdims=False)
    out = jnp.zeros_like(x_NxD)
    for n in range(N):
        for k in range(K):
            e = ids_NxK[n, k]
            x = x_NxD[n : n + 1]
            h = jax.nn.silu(x @ take(mp["wi_gate"], e)) * (x @ take(mp["wi_up"], e))
            out = out.at[n].add(w_NxK[n, k] * (h @ take(mp["wo"], e))[0])
    return out


def _experts_capacity(x_NxD, ids_NxK, w_NxK, mp, capacity: int, fallback):
    """Only the chosen experts' work: the (token, k) assignments grouped per expert into `capacity` rows each,
    one batched [E, capacity, D] x [E, D, I] matmul per projection (no weight copies), results gathered
    back. Exact as long as no expert got more than `capacity` assignments; otherwise `fallback` (an exact
    kernel) runs instead (lax.cond), so the result never depends on the routing's balance."""
    N, K = ids_NxK.shape
    E = mp["wi_gate"].shape[0]
    flat_A = ids_NxK.reshape(-1)
    order_A = jnp.argsort(flat_A, stable=True)
    counts_E = jnp.zeros(E, jnp.int32).at[flat_A].add(1)
    expert_A = flat_A[order_A]
    rank_A = jnp.arange(flat_A.size, dtype=jnp.int32) - (jnp.cumsum(counts_E) - counts_E)[expert_A]

    def grouped():
        rows_ExC = jnp.full((E, capacity), N, jnp.int32).at[expert_A, rank_A].set(order_A // K, mode="drop")
        x_ExCxD = jnp.concatenate([x_NxD, jnp.zeros_like(x_NxD[:1])])[rows_ExC]  # row N: zeros (empty seats)
        g = jnp.einsum("ecd,edi->eci", x_ExCxD, mp["wi_gate"])
        h = jax.nn.silu(g) * jnp.einsum("ecd,edi->eci", x_ExCxD, mp["wi_up"])
        y_ExCxD = jnp.einsum("eci,eid->ecd", h, mp["wo"])
        rank_NxK = jnp.zeros_like(flat_A).at[order_A].set(rank_A).reshape(N, K)
        return jnp.einsum("nkd,nk->nd", y_ExCxD[ids_NxK, rank_NxK], w_NxK)

    return jax.lax.cond(counts_E.max() <= capacity, grouped, lambda: fallback(x_NxD, ids_NxK, w_NxK, mp))


def _experts_by_count(cfg: ModelConfig, x_NxD, ids_NxK, w_NxK, mp):
    """XLA's expert FFNs, the kernel picked for the token count. Decode is bound by reading weights, so: the
    picked experts' weights only while the tokens pick at most E/2 (a decode batch of a token or two); all
    experts on every token up to E picks, or up to 4E picks when every token picks at least a quarter of the
    experts (E <= 4K: the extra work is <= 2x the grouped kernel's, whose sort/gather/batched dots cost more
    than that on small batches: bench c8 1.6 -> 1.9x transformers); else the grouped kernel with twice the mean
    load as capacity, falling back to all experts (up to 4E picks) or to `cfg.moe_impl` (long prefill chunks)
    when the routing overflows it."""
    A, E = ids_NxK.size, cfg.num_experts
    if 2 * A <= E:
        return _experts_sliced(x_NxD, ids_NxK, w_NxK, mp)
    if A <= E or (A <= 4 * E and E <= 4 * ids_NxK.shape[1]):
        return _experts_all(x_NxD, ids_NxK, w_NxK, mp)
    impl = MOE_KERNELS[resolve_impl(cfg.moe_impl)]
    fallback = _experts_all if A <= 4 * E else lambda x, i, w, m: impl(x, i, w, m["wi_gate"], m["wi_up"], m["wo"])
    return _experts_capacity(x_NxD, ids_NxK, w_NxK, mp, min(x_NxD.shape[0], 2 * -(-A // E)), fallback)


def _moe(cfg: ModelConfig, mp, h_BxTxD, ops: EngineOps = XLA_OPS):
    """MoEBlock's math: the same router, then `ops.experts` (the same expert FFN)."""
    B, T, D = h_BxTxD.shape
    dt = jnp.dtype(cfg.dtype)
    x_NxD = h_BxTxD.reshape(B * T, D)
    w_NxK, ids_NxK = route(x_NxD, mp["router"], top_k=cfg.num_experts_per_tok, norm_topk_prob=cfg.norm_topk_prob)
    y = ops.experts(cfg, x_NxD, ids_NxK, w_NxK.astype(dt), mp)
    return y.reshape(B, T, D).astype(dt), ids_NxK.reshape(B, T, -1)


def _layer(ops: EngineOps, cfg: ModelConfig, moe: bool, lp, x_BxTxD, positions_BxT, ctx_k, ctx_v, ctx_len_B, buf_k,
           buf_v, at, new_mask_BxTxN):
    """One decoder layer (qwen3.DecoderLayer's math) on T new tokens per row; their K/V go into the buffer at
    columns at..at+T-1, in the cache dtype (exactly what a later read of the cache sees)."""
    dt = jnp.dtype(cfg.dtype)
    B, T, D = x_BxTxD.shape
    H, K, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    with jax.named_scope("attn_proj"):
        h = _rms(lp["input_norm"], x_BxTxD, cfg)
        qkv = ops.matmul(h, lp["w_qkv"]).reshape(B, T, H + 2 * K, Dh)
        q, k = _rope_qk(cfg, _rms(lp["q_norm"], qkv[:, :, :H], cfg), _rms(lp["k_norm"], qkv[:, :, H : H + K], cfg),
                        positions_BxT)
        put = lambda buf, t: jax.lax.dynamic_update_slice_in_dim(buf, jnp.swapaxes(t, 1, 2).astype(buf.dtype), at, 2)
        buf_k, buf_v = put(buf_k, k), put(buf_v, qkv[:, :, H + K :])
    with jax.named_scope("attention"):
        o = ops.attend(q, ctx_k.astype(dt), ctx_v.astype(dt), ctx_len_B, buf_k.astype(dt), buf_v.astype(dt),
                   new_mask_BxTxN)
    with jax.named_scope("attn_proj"):
        x = x_BxTxD + ops.matmul(o.reshape(B, T, H * Dh), lp["o_proj"])
        h = _rms(lp["post_attn_norm"], x, cfg)
    if moe:
        with jax.named_scope("moe"):
            y, ids = _moe(cfg, lp["moe"], h, ops)
    else:
        with jax.named_scope("mlp"):
            g, u = jnp.split(ops.matmul(h, lp["mlp"]["w_gu"]), 2, axis=-1)
            y = ops.matmul(jax.nn.silu(g) * u, lp["mlp"]["down"])
        ids = jnp.full(x.shape[:2] + (cfg.num_experts_per_tok,), -1, jnp.int32)
    return x + y, ids, buf_k, buf_v


def _rope_qk(cfg: ModelConfig, q, k, positions):
    """RoPE of one call's queries and keys: 1-D positions [B, T], or Qwen3-VL's 3-D ones [3, B, T] (a prompt's
    image tokens). A text token's three components are equal, and 3-D RoPE with equal components is 1-D RoPE,
    so decode runs on 1-D positions (each slot's rope offset added) for either model."""
    if positions.ndim == 2:
        return rope(q, positions, cfg.rope_theta), rope(k, positions, cfg.rope_theta)
    ang = mrope_angles(positions, cfg.head_dim, cfg.rope_theta, cfg.mrope_section)
    return rotate(q, ang), rotate(k, ang)


def _visual_at(vis: VisualChunk, rows_MxD, x_BxTxD):
    """x with each image token's row of `rows_MxD` put in (where=True) or added (the DeepStack features)."""
    at = vis.index_BxT >= 0
    return jnp.where(at[..., None], jnp.take(rows_MxD, jnp.maximum(vis.index_BxT, 0), axis=0).astype(x_BxTxD.dtype),
                     0)


def _forward(ops: EngineOps, ep, cfg: ModelConfig, ctx: LayerKV, ctx_len_B, buf: LayerKV, at, tokens_BxT,
             positions_BxT, new_mask_BxTxN, visual: VisualChunk | None = None):
    """All layers (unrolled) over T new tokens per row: (final hidden [B, T, D], routed [B, T, L, K], buffer)."""
    x = jnp.take(ep["embedding"], tokens_BxT, axis=0).astype(jnp.dtype(cfg.dtype))
    if visual is not None:
        x = jnp.where((visual.index_BxT >= 0)[..., None], _visual_at(visual, visual.rows_MxD, x), x)
    ids, bk, bv = [], [], []
    for i, lp in enumerate(ep["layers"]):
        x, ids_i, k, v = _layer(ops, cfg, cfg.layer_is_moe(i), lp, x, positions_BxT, ctx.k[i], ctx.v[i], ctx_len_B,
                                buf.k[i], buf.v[i], at, new_mask_BxTxN)
        if visual is not None and i < visual.deep_KxMxD.shape[0]:
            x = x + _visual_at(visual, visual.deep_KxMxD[i], x)
        ids.append(ids_i)
        bk.append(k)
        bv.append(v)
    return _rms(ep["final_norm"], x, cfg), jnp.stack(ids, axis=2), LayerKV(k=tuple(bk), v=tuple(bv))


@jax.named_scope("lm_head")
def _head(ops: EngineOps, ep, hidden_BxTxD) -> Float[Array, "B T V"]:
    return ops.head(hidden_BxTxD, ep["head"])


def prefill_slot(
    ep, cfg: ModelConfig, cache: LayerKV, slot: Int[Array, ""], tokens_C: Int[Array, "C"], start: Int[Array, ""],
    n_valid: Int[Array, ""], *, ctx_len: int, ops: EngineOps = XLA_OPS, rope_3xC: Int[Array, "3 C"] | None = None,
    visual: VisualChunk | None = None,
) -> tuple[Float[Array, "V"], LayerKV, Int[Array, "C L K"]]:
    """Writes K/V of `tokens_C` (the first n_valid real, the rest padding) at positions start..start+C-1 of row
    `slot`; query i sees the row's cached keys j < start and chunk keys <= i. `ctx_len` (static) is a length
    bucket >= start: only that much of the row is read. Needs start + C <= cache_len (no clamping). A
    vision-language prompt's chunk brings its 3-D RoPE positions `rope_3xC` and its image tokens `visual`
    ([1, C] index); the cache index stays start + i.

    Returns (fp32 logits of token n_valid-1 [V], cache, routed experts [C, L, K])."""
    C = tokens_C.shape[0]
    positions = (start + jnp.arange(C, dtype=jnp.int32))[None] if rope_3xC is None else rope_3xC[:, None]
    ctx = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, slot, 0)[:, :, :ctx_len], cache)
    buf = jax.tree.map(lambda a: jnp.zeros((1, a.shape[1], C, a.shape[3]), a.dtype), cache)
    causal = (jnp.arange(C)[None, :] <= jnp.arange(C)[:, None])[None]

    def forward():
        return _forward(ops, ep, cfg, ctx, start[None], buf, 0, tokens_C[None], positions, causal, visual)

    # The forward runs as one opaque step (a conditional XLA cannot fold: n_valid >= 0 always holds) so the
    # cache is written only after every layer has read its row. Inline, XLA writes layer i's keys as soon as
    # they exist, unordered with the read of layer i's row, and XLA:CPU copies the whole cache (all slots,
    # twice per layer) to keep that read safe: ~40% of a 32-token prefill at 32 slots, and O(cache) per chunk.
    never = lambda: jax.tree.map(jnp.zeros_like, jax.eval_shape(forward))
    hidden, routed, buf = jax.lax.cond(n_valid >= 0, forward, never)
    cache = jax.tree.map(lambda c, b: jax.lax.dynamic_update_slice(c, b, (slot, 0, start, 0)), cache, buf)
    h_last = jax.lax.dynamic_index_in_dim(hidden[0], n_valid - 1, axis=0, keepdims=True)
    return _head(ops, ep, h_last[None])[0, 0], cache, routed[0]


def block_context(cache: LayerKV, batch: int, ctx_len: int) -> LayerKV:
    """The read-only part of the cache a decode block attends to: rows 0..batch-1, positions 0..ctx_len-1."""
    return jax.tree.map(lambda a: a[:batch, :, :ctx_len], cache)


def block_buffer(cache: LayerKV, batch: int, steps: int) -> LayerKV:
    """Zeroed K/V buffer for the `steps` tokens a decode block may add per row."""
    return jax.tree.map(lambda a: jnp.zeros((batch, a.shape[1], steps, a.shape[3]), a.dtype), cache)


def block_decode_step(
    ep, cfg: ModelConfig, ctx: LayerKV, ctx_len_B: Int[Array, "B"], buf: LayerKV, step: Int[Array, ""],
    tokens_B: Int[Array, "B"], positions_B: Int[Array, "B"], *, ops: EngineOps = XLA_OPS,
) -> tuple[Float[Array, "B V"], LayerKV, Int[Array, "B L K"]]:
    """Step `step` of a decode block: token b at positions_B[b] sees its row's ctx keys j < ctx_len_B[b] (the
    cached prefix when the block began) and buffer columns 0..step (the block's earlier tokens, then itself).
    Returns (fp32 next-token logits [B, V], buffer with column `step` written, routed experts [B, L, K])."""
    N = buf.k[0].shape[2]
    mask = jnp.broadcast_to(jnp.arange(N) <= step, (tokens_B.shape[0], 1, N))
    hidden, routed, buf = _forward(ops, ep, cfg, ctx, ctx_len_B, buf, step, tokens_B[:, None], positions_B[:, None],
                                   mask)
    return _head(ops, ep, hidden)[:, 0], buf, routed[:, 0]


def block_commit(cache: LayerKV, buf: LayerKV, start_B: Int[Array, "B"], count_B: Int[Array, "B"]) -> LayerKV:
    """Writes buffer columns 0..count_B[b]-1 of row b at cache positions start_B[b].. (one in-place scatter per
    layer; columns past count_B[b] are dropped)."""
    B, _, N, _ = buf.k[0].shape
    cache_len = cache.k[0].shape[2]
    j = jnp.arange(N, dtype=jnp.int32)[None, :]
    pos_BxN = jnp.where(j < count_B[:, None], start_B[:, None] + j, cache_len)
    rows = jnp.arange(B, dtype=jnp.int32)[:, None]
    return jax.tree.map(lambda c, b: c.at[rows, :, pos_BxN].set(jnp.swapaxes(b, 1, 2), mode="drop"), cache, buf)


def copy_row(cache: LayerKV, src: Int[Array, ""], dst: Int[Array, ""]) -> LayerKV:
    return jax.tree.map(lambda a: a.at[dst].set(a[src]), cache)
