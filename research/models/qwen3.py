"""Qwen3 / Qwen3-MoE in flax.linen: one layer body for training (packed trees) and KV-cache decoding.

Forward contract (trainer, tree packer, engine code against it):

    Qwen3(cfg).apply({"params": p}, tokens_BxT, positions_BxT, segment_ids_BxT, subtree_end_BxT,
                     *, expert_ids_BxTxLxK=None, return_routing=False)
      -> hidden_BxTxD                       (final-RMSNorm hidden states, compute dtype)
      -> (hidden_BxTxD, {"routed_experts": int32[B, T, L, K]})   when return_routing

Mask: key j is visible to query i iff ``seg[i] == seg[j] != 0 and j <= i <= subtree_end[j]`` (a prefix tree
in DFS order; a causal sequence has subtree_end = its segment's last index); RoPE uses ``positions`` (depth
in the tree). ``expert_ids_BxTxLxK`` replays routing (dense layers of mixed models ignore it and report -1).
Logits: ``head_weight(params, cfg)`` is the [D, V] LM head (tied or not) for the fused chunked logprobs;
``logits(params, cfg, hidden)`` materialises them (tests, decoding).

The same module serves the KV-cache path (``research/models/decode.py``) through the keyword-only
``kv_cache``/``cache_slots_B``/``cache_write_BxT`` arguments: the attention then writes the new keys/values
into the cache rows ``cache_slots_B`` at indices ``cache_write_BxT`` and attends over the cache with the
causal rule ``j <= positions[b, t]``. Everything else (projections, norms, RoPE, MLP/MoE) is shared code.

Qwen3-VL's text model is this module too (research/models/qwen3_vl.py): with ``cfg.mrope_section`` the positions
are [3, B, T] (3-D RoPE; training path only), ``visual_MxD`` replaces the embeddings at ``visual_mask_BxT`` and
``deepstack_KxMxD[k]`` is added there after layer k < ``cfg.deepstack_layers`` (either as [M, D] rows in row-major
order, or already at their slots, [B, T, D]).

Layers are ``nn.scan``-ned: compile time does not grow with depth. A model whose layers differ in kind
(``mlp_only_layers`` / ``decoder_sparse_step``) is split into maximal runs of equal layers, one scan each
(``ModelConfig.layer_runs``), params ``layers_{run}`` with a leading ``layers`` axis.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from research.models.attention_ops import attend
from research.models.config import ModelConfig
from research.models.moe import MoEBlock
from research.models.mrope import mrope_angles, rotate

_NEG = -1e30

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


@flax.struct.dataclass
class KVCache:
    """Per layer-run stacked keys/values: ``k[r]``, ``v[r]`` are [layers_in_run, slots, max_len, K, Dh]."""

    k: tuple
    v: tuple


def _init(cfg):
    return nn.initializers.normal(0.02)


class RMSNorm(nn.Module):
    eps: float
    axis_name: str
    param_dtype: str = "float32"

    @nn.compact
    def __call__(self, x):
        scale = self.param(
            "scale", nn.with_logical_partitioning(nn.initializers.ones, (self.axis_name,)), (x.shape[-1],),
            jnp.dtype(self.param_dtype),
        )
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (scale * xf.astype(x.dtype)).astype(x.dtype)


def rope(x_BxTxHxD: Float[Array, "B T H D"], positions_BxT: Int[Array, "B T"], theta: float) -> Array:
    """Rotary embedding, HF "rotate_half" layout (first/second halves of head_dim pair up), fp32 angles."""
    D = x_BxTxHxD.shape[-1]
    inv = 1.0 / (theta ** (jnp.arange(0, D, 2, dtype=jnp.float32) / D))
    return rotate(x_BxTxHxD, positions_BxT.astype(jnp.float32)[..., None] * inv)  # angles [B, T, D/2]


def _masked_attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, mask_BxTxS):
    B, T, H, D = q_BxTxHxD.shape
    K = k_BxSxKxD.shape[2]
    qg = q_BxTxHxD.reshape(B, T, K, H // K, D)
    s = jnp.einsum("btkgd,bskd->bkgts", qg, k_BxSxKxD, preferred_element_type=jnp.float32) / jnp.sqrt(D)
    m = mask_BxTxS[:, None, None]
    s = jnp.where(m, s, _NEG)
    p = jnp.exp(s - s.max(-1, keepdims=True)) * m
    p = p / jnp.maximum(p.sum(-1, keepdims=True), 1e-30)
    o = jnp.einsum("bkgts,bskd->btkgd", p.astype(v_BxSxKxD.dtype), v_BxSxKxD, preferred_element_type=jnp.float32)
    return o.reshape(B, T, H, D).astype(q_BxTxHxD.dtype)


def cached_attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, positions_BxT):
    """Decode/prefill attention over a slot's cache: key j visible to query t iff j <= positions[b, t]."""
    S = k_BxSxKxD.shape[1]
    mask = jnp.arange(S)[None, None, :] <= positions_BxT[:, :, None]
    return _masked_attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, mask)


class Attention(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, positions, segment_ids, subtree_end, kv_cache=None, slots=None, write=None):
        cfg = self.cfg
        D, H, K, Dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        pdt, dt = jnp.dtype(cfg.param_dtype), jnp.dtype(cfg.dtype)
        mk = lambda n, s, a: self.param(n, nn.with_logical_partitioning(_init(cfg), a), s, pdt).astype(dt)
        wq = mk("q_proj", (D, H, Dh), ("embed", "heads", "head_dim"))
        wk = mk("k_proj", (D, K, Dh), ("embed", "kv_heads", "head_dim"))
        wv = mk("v_proj", (D, K, Dh), ("embed", "kv_heads", "head_dim"))
        wo = mk("o_proj", (H, Dh, D), ("heads", "head_dim", "embed"))
        rules = cfg.logical_rules
        q = nn.with_logical_constraint(jnp.einsum("btd,dhk->bthk", x, wq), ("batch", "length", "heads", "head_dim"),
                                       rules=rules)
        k = nn.with_logical_constraint(jnp.einsum("btd,dhk->bthk", x, wk),
                                       ("batch", "length", "kv_heads", "head_dim"), rules=rules)
        v = nn.with_logical_constraint(jnp.einsum("btd,dhk->bthk", x, wv),
                                       ("batch", "length", "kv_heads", "head_dim"), rules=rules)
        q = RMSNorm(cfg.rms_norm_eps, "head_dim", cfg.param_dtype, name="q_norm")(q)
        k = RMSNorm(cfg.rms_norm_eps, "head_dim", cfg.param_dtype, name="k_norm")(k)
        if cfg.mrope_section:  # positions [3, B, T]: Qwen3-VL's 3-D RoPE
            if kv_cache is not None:
                raise ValueError("the KV-cache path takes 1-D positions [B, T]; it does not serve 3-D (Qwen3-VL) RoPE")
            ang = mrope_angles(positions, Dh, cfg.rope_theta, cfg.mrope_section)
            q, k = rotate(q, ang), rotate(k, ang)
        else:
            q, k = rope(q, positions, cfg.rope_theta), rope(k, positions, cfg.rope_theta)
        new_cache = None
        if kv_cache is None:
            o = attend(q, k, v, segment_ids_BxT=segment_ids, subtree_end_BxT=subtree_end, impl=cfg.attention_impl)
        else:
            ck, cv = kv_cache
            ck = ck.at[slots[:, None], write].set(k.astype(ck.dtype), mode="drop")
            cv = cv.at[slots[:, None], write].set(v.astype(cv.dtype), mode="drop")
            o = cached_attention(q, ck[slots].astype(dt), cv[slots].astype(dt), positions)
            new_cache = (ck, cv)
        return jnp.einsum("bthk,hkd->btd", o, wo), new_cache


class MLP(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        D, F = cfg.hidden_size, cfg.intermediate_size
        pdt, dt = jnp.dtype(cfg.param_dtype), jnp.dtype(cfg.dtype)
        mk = lambda n, s, a: self.param(n, nn.with_logical_partitioning(_init(cfg), a), s, pdt).astype(dt)
        wg, wu = mk("gate_proj", (D, F), ("embed", "mlp")), mk("up_proj", (D, F), ("embed", "mlp"))
        wd = mk("down_proj", (F, D), ("mlp", "embed"))
        h = jax.nn.silu(x @ wg) * (x @ wu)
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"), rules=cfg.logical_rules)
        return h @ wd


class DecoderLayer(nn.Module):
    """Pre-norm attention + (MLP | MoE). Scan body: (x, per-layer inputs) -> (x, (routed ids, new cache)).

    `layer` is the layer's index in the model; `deep_KxBxTxD` (a VL model's DeepStack features at their slots, zero
    elsewhere) adds feature `layer` after layers < K, so the DeepStack layers share their run's scan."""

    cfg: ModelConfig
    moe: bool

    @nn.compact
    def __call__(self, x, positions, segment_ids, subtree_end, expert_ids, kv_cache, slots, write, layer=None,
                 deep_KxBxTxD=None):
        cfg = self.cfg
        h = RMSNorm(cfg.rms_norm_eps, "embed", cfg.param_dtype, name="input_norm")(x)
        a, new_cache = Attention(cfg, name="attn")(h, positions, segment_ids, subtree_end, kv_cache, slots, write)
        x = x + a
        h = RMSNorm(cfg.rms_norm_eps, "embed", cfg.param_dtype, name="post_attn_norm")(x)
        if self.moe:
            y, ids = MoEBlock(cfg, name="moe")(h, expert_ids)
        else:
            y = MLP(cfg, name="mlp")(h)
            ids = jnp.full(x.shape[:2] + (cfg.num_experts_per_tok,), -1, jnp.int32)
        x = x + y
        if deep_KxBxTxD is not None:
            K = deep_KxBxTxD.shape[0]
            x = x + jnp.where(layer < K, deep_KxBxTxD[jnp.minimum(layer, K - 1)], 0).astype(x.dtype)
        x = nn.with_logical_constraint(x, ("batch", "length", "act_embed"), rules=cfg.logical_rules)
        return x, (ids, new_cache)


def _scanned_layer(cfg: ModelConfig, moe: bool, length: int, name: str):
    body = DecoderLayer
    policy = REMAT_POLICIES[cfg.remat_policy] if cfg.remat_policy in REMAT_POLICIES else None
    if cfg.remat_policy not in REMAT_POLICIES:
        raise ValueError(f"unknown remat_policy {cfg.remat_policy!r}; expected one of {sorted(REMAT_POLICIES)}")
    if cfg.remat_policy != "none":
        body = nn.remat(DecoderLayer, policy=policy, prevent_cse=False)
    scanned = nn.scan(
        body,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, 0, 0, nn.broadcast, nn.broadcast, 0, nn.broadcast),
        length=length,
        metadata_params={nn.PARTITION_NAME: "layers"},
    )
    return scanned(cfg, moe, name=name)


class Qwen3(nn.Module):
    """The policy. See the module docstring for the call contract."""

    cfg: ModelConfig

    @nn.compact
    def __call__(
        self,
        tokens_BxT: Int[Array, "B T"],
        positions_BxT: Int[Array, "B T"],
        segment_ids_BxT: Int[Array, "B T"],
        subtree_end_BxT: Int[Array, "B T"] | None,
        *,
        expert_ids_BxTxLxK: Int[Array, "B T L K"] | None = None,
        return_routing: bool = False,
        kv_cache: KVCache | None = None,
        cache_slots_B: Int[Array, "B"] | None = None,
        cache_write_BxT: Int[Array, "B T"] | None = None,
        visual_MxD: Float[Array, "M D"] | None = None,
        visual_mask_BxT: Array | None = None,
        deepstack_KxMxD: Float[Array, "K M D"] | None = None,
    ):
        cfg = self.cfg
        pdt, dt = jnp.dtype(cfg.param_dtype), jnp.dtype(cfg.dtype)
        emb = self.param(
            "embedding",
            nn.with_logical_partitioning(nn.initializers.normal(cfg.embedding_init_std), ("vocab", "embed")),
            (cfg.vocab_size, cfg.hidden_size), pdt,
        )
        if not cfg.tie_word_embeddings:
            self.param("lm_head", nn.with_logical_partitioning(_init(cfg), ("embed", "vocab")),
                       (cfg.hidden_size, cfg.vocab_size), pdt)
        x = jnp.take(emb, tokens_BxT, axis=0).astype(dt)
        if visual_MxD is not None:  # the image tokens' embeddings are the vision tower's merged tokens, in order
            x = jnp.where(visual_mask_BxT[..., None], _at_visual(visual_mask_BxT, visual_MxD).astype(dt), x)
        x = nn.with_logical_constraint(x, ("batch", "length", "act_embed"), rules=cfg.logical_rules)
        if subtree_end_BxT is None and kv_cache is None:
            raise ValueError("subtree_end_BxT is required (use attention_ops.segment_subtree_end for sequences)")
        deep = _deepstack_at_slots(cfg, visual_mask_BxT, deepstack_KxMxD, dt)
        ids_runs, k_runs, v_runs = [], [], []
        for r, (moe, first, n) in enumerate(cfg.layer_runs()):
            eids = None
            if expert_ids_BxTxLxK is not None:
                eids = jnp.moveaxis(expert_ids_BxTxLxK[:, :, first : first + n], 2, 0)
            cache_r = None if kv_cache is None else (kv_cache.k[r], kv_cache.v[r])
            x, (ids, new_cache) = _scanned_layer(cfg, moe, n, f"layers_{r}")(
                x, positions_BxT, segment_ids_BxT, subtree_end_BxT, eids, cache_r, cache_slots_B, cache_write_BxT,
                jnp.arange(first, first + n, dtype=jnp.int32), None if deep is None or first >= deep.shape[0] else deep
            )
            ids_runs.append(ids)
            if new_cache is not None:
                k_runs.append(new_cache[0])
                v_runs.append(new_cache[1])
        hidden = RMSNorm(cfg.rms_norm_eps, "embed", cfg.param_dtype, name="final_norm")(x)
        if not return_routing and kv_cache is None:
            return hidden
        aux = {"routed_experts": jnp.moveaxis(jnp.concatenate(ids_runs, axis=0), 0, 2)}
        if kv_cache is not None:
            aux["kv_cache"] = KVCache(k=tuple(k_runs), v=tuple(v_runs))
        return hidden, aux


def _deepstack_at_slots(cfg: ModelConfig, mask_BxT, deep_KxMxD, dt) -> Float[Array, "K B T D"] | None:
    """The first min(cfg.deepstack_layers, K) DeepStack features laid out at the image slots, zero elsewhere."""
    if deep_KxMxD is None or min(cfg.deepstack_layers, deep_KxMxD.shape[0]) == 0:
        return None
    feats = [jnp.where(mask_BxT[..., None], _at_visual(mask_BxT, deep_KxMxD[k]), 0).astype(dt)
             for k in range(min(cfg.deepstack_layers, deep_KxMxD.shape[0]))]
    return jnp.stack(feats)


def _at_visual(mask_BxT: Array, rows_MxD: Float[Array, "M D"]) -> Float[Array, "B T D"]:
    """rows_MxD laid out at the True entries of mask_BxT in row-major order (torch's masked_scatter order). Rows
    given as [B, T, D] are already at their slots (the trainer's packed rows: each row's features stay on the
    devices holding that row, where M rows in order would be the whole batch's on every device)."""
    if rows_MxD.ndim == mask_BxT.ndim + 1:
        return rows_MxD
    idx = jnp.cumsum(mask_BxT.reshape(-1).astype(jnp.int32)) - 1
    out = jnp.take(rows_MxD, jnp.clip(idx, 0, rows_MxD.shape[0] - 1), axis=0)
    return out.reshape(mask_BxT.shape + rows_MxD.shape[-1:])


def head_weight(params, cfg: ModelConfig) -> Float[Array, "D V"]:
    """The [D, V] LM-head weight (the transposed embedding when tied), for fused chunked logprobs."""
    p = params.get("params", params)
    w = p["embedding"].T if cfg.tie_word_embeddings else p["lm_head"]
    return nn.meta.unbox(w)


def logits(params, cfg: ModelConfig, hidden_BxTxD: Float[Array, "B T D"]) -> Float[Array, "B T V"]:
    """Full fp32 logits (tests/decoding only; training uses the chunked logprobs with head_weight)."""
    w = head_weight(params, cfg).astype(hidden_BxTxD.dtype)
    return jnp.einsum("btd,dv->btv", hidden_BxTxD, w, preferred_element_type=jnp.float32)
