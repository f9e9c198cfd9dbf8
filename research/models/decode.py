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

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from research.models.config import ModelConfig
from research.models.qwen3 import KVCache, Qwen3, logits


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
