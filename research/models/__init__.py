"""The Qwen3 policy model: config, flax module, KV-cache decoding, sharding and HF interop.

Public API (others code against it):
- ``ModelConfig`` (+ ``ModelConfig.from_hf_config``), presets ``tiny_dense()``, ``tiny_moe()``;
- ``Qwen3`` (flax.linen Module; call contract in ``research/models/qwen3.py``), ``head_weight``, ``logits``,
  ``init_params``;
- decode: ``init_cache``, ``prefill``, ``decode_step`` (``research/models/decode.py``).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from research.models.config import ConfigError, ModelConfig, tiny_dense, tiny_moe
from research.models.qwen3 import KVCache, Qwen3, head_weight, logits


def dummy_inputs(batch: int = 1, length: int = 8):
    """Abstract-friendly placeholder inputs for init / eval_shape: (tokens, positions, segment_ids, subtree_end)."""
    pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    return (jnp.zeros((batch, length), jnp.int32), pos, jnp.ones((batch, length), jnp.int32),
            jnp.full((batch, length), length - 1, jnp.int32))


def init_params(cfg: ModelConfig, rng: jax.Array):
    """Unboxed fp32 params on the default device (use sharding.init_sharded for a mesh)."""
    return nn.meta.unbox(jax.jit(Qwen3(cfg).init)(rng, *dummy_inputs())["params"])


__all__ = [
    "ConfigError", "KVCache", "ModelConfig", "Qwen3", "dummy_inputs", "head_weight", "init_params", "logits",
    "tiny_dense", "tiny_moe",
]
