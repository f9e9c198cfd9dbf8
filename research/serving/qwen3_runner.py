"""`ModelRunner` for the project's Qwen3 / Qwen3-MoE (research.models), used by the JAX engine.

Prefill and decode are the engine fast path of `research.models.decode` (`prefill_slot`, `block_*`): the
training module's layer math (the same RMSNorm / MLP / MoEBlock modules, `rope`, projections) over a length
bucket of the cache plus the tokens being added, so the engine's logprobs equal the trainer's
`token_logprobs` on the full forward (tested to 1e-5). Only the last valid token of a prefill chunk goes
through the LM head.
"""

from __future__ import annotations

import flax.linen as nn
import jax
from jaxtyping import Array, Int

from research.models import ModelConfig
from research.models import decode as model_decode
from research.models.decode import LayerKV
from research.serving import cpu_kernels
from research.serving.runner import ModelRunner


class Qwen3Runner(ModelRunner):
    """`kernels`: serve with the CPU decode kernels (`research.serving.cpu_kernels`, passed to the fast path as
    its `EngineOps`); None = decide by `cpu_kernels.wanted` (fp32 on the CPU backend, `HRL_CPU_KERNELS` not off,
    the library builds). Otherwise the fast path runs on XLA's ops."""

    def __init__(self, cfg: ModelConfig, cache_dtype: str | None = None, kernels: bool | None = None):
        self.cfg = cfg
        self.kernels = cpu_kernels.wanted(cfg.dtype) if kernels is None else kernels
        self.ops = cpu_kernels.OPS if self.kernels else model_decode.XLA_OPS
        self.vocab_size = cfg.vocab_size
        self.routing_shape = (cfg.num_layers, cfg.num_experts_per_tok) if cfg.is_moe else None
        self.cache_dtype = jax.numpy.dtype(cache_dtype or cfg.dtype)

    def init_cache(self, slots: int, cache_len: int) -> LayerKV:
        return model_decode.init_layer_cache(self.cfg, slots, cache_len, self.cache_dtype)

    def prepare_params(self, params):
        return model_decode.engine_params(params, self.cfg, self.ops)

    def prefill(self, params, cache, slot: Int[Array, ""], tokens_C, start, n_valid, *, ctx_len: int):
        logits_V, cache, routed_CxLxK = model_decode.prefill_slot(params, self.cfg, cache, slot, tokens_C, start,
                                                                  n_valid, ctx_len=ctx_len, ops=self.ops)
        experts = jax.lax.dynamic_index_in_dim(routed_CxLxK, n_valid - 1, axis=0, keepdims=False)
        return cache, logits_V, experts if self.routing_shape else None

    def block_context(self, cache, batch: int, ctx_len: int):
        return model_decode.block_context(cache, batch, ctx_len)

    def block_buffer(self, cache, batch: int, steps: int):
        return model_decode.block_buffer(cache, batch, steps)

    def block_step(self, params, ctx, ctx_len_B, buf, step, tokens_B, positions_B):
        logits_BxV, buf, routed_BxLxK = model_decode.block_decode_step(params, self.cfg, ctx, ctx_len_B, buf, step,
                                                                       tokens_B, positions_B, ops=self.ops)
        return logits_BxV, buf, routed_BxLxK if self.routing_shape else None

    def block_commit(self, cache, buf, start_B, count_B):
        return model_decode.block_commit(cache, buf, start_B, count_B)

    def copy_slot(self, cache: LayerKV, src, dst) -> LayerKV:
        return model_decode.copy_row(cache, src, dst)


def unbox(params):
    """Engines take plain arrays: strip flax's logical-partitioning boxes if present."""
    return nn.meta.unbox(params)
