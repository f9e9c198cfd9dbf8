"""`ModelRunner` for the project's Qwen3 / Qwen3-MoE (research.models), used by the JAX engine.

Prefill and decode are `research.models.decode.prefill` / `decode_step`: the very module the trainer
calls (`Qwen3.apply`) in its KV-cache mode, so projections, norms, RoPE and MoE routing are shared code
and the engine's logprobs equal the trainer's `token_logprobs` on the full forward (tested to 1e-5).
Only the last valid token of a prefill chunk goes through the LM head.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from research.models import KVCache, ModelConfig
from research.models import decode as model_decode
from research.serving.runner import ModelRunner


class Qwen3Runner(ModelRunner):
    def __init__(self, cfg: ModelConfig, cache_dtype: str | None = None):
        self.cfg = cfg
        self.vocab_size = cfg.vocab_size
        self.routing_shape = (cfg.num_layers, cfg.num_experts_per_tok) if cfg.is_moe else None
        self.cache_dtype = jnp.dtype(cache_dtype or cfg.dtype)

    def init_cache(self, slots: int, cache_len: int) -> KVCache:
        return model_decode.init_cache(self.cfg, slots, cache_len, self.cache_dtype)

    def prefill(self, params, cache, slot: Int[Array, ""], tokens_C, start, n_valid):
        logits_1xV, cache, routed_1xCxLxK = model_decode.prefill(
            params, self.cfg, cache, tokens_C[None], n_valid[None], slots_B=slot[None], start_B=start[None]
        )
        experts = jax.lax.dynamic_index_in_dim(routed_1xCxLxK[0], n_valid - 1, axis=0, keepdims=False)
        return cache, logits_1xV[0], experts if self.routing_shape else None

    def decode(self, params, cache, tokens_B, positions_B):
        logits_BxV, cache, routed_BxLxK = model_decode.decode_step(params, self.cfg, cache, tokens_B, positions_B)
        return cache, logits_BxV, routed_BxLxK if self.routing_shape else None

    def copy_slot(self, cache: KVCache, src, dst) -> KVCache:
        """Cache leaves are [layers, slots, len, K, Dh]: the slot axis is 1."""
        return jax.tree.map(lambda a: a.at[:, dst].set(a[:, src]), cache)


def unbox(params):
    """Engines take plain arrays: strip flax's logical-partitioning boxes if present."""
    return nn.meta.unbox(params)
