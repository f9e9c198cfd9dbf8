"""The model side of the JAX engine: a small runner interface plus the jitted step functions.

The engine (jax_engine.py) only needs four pure functions of a model; `ModelRunner` names them so the
scheduler, sampling and asyncio plumbing never depend on a particular model. `Qwen3Runner` (qwen3_runner.py)
implements it on top of `research.models`.

Cache layout contract: the cache is a pytree allocated once with `cache_len` positions per slot. The
engine keeps `cache_len = max_len + prefill_chunk`: positions >= max_len are scratch, written by idle
decode slots and by the padding of a last prefill chunk, and never read by a real query (a query at
position p reads keys 0..p only). So an idle slot never clobbers a parked cache, and a padded chunk is
never shifted by dynamic_update_slice clamping.
"""

from __future__ import annotations

import abc
import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from research.serving.sampling import sample_tokens


class ModelRunner(abc.ABC):
    """Pure model functions the engine jits; `params` and `cache` are pytrees of jax arrays."""

    vocab_size: int
    routing_shape: tuple[int, int] | None  # (layers, top_k) for MoE models, None for dense

    @abc.abstractmethod
    def init_cache(self, slots: int, cache_len: int): ...

    @abc.abstractmethod
    def prefill(
        self, params, cache, slot: Int[Array, ""], tokens_C: Int[Array, "C"], start: Int[Array, ""],
        n_valid: Int[Array, ""],
    ):
        """Writes K/V of `tokens_C` at positions start..start+C-1 of `slot`; query i sees keys 0..start+i.
        Tokens from `n_valid` on are padding (their K/V land in positions that are rewritten later).

        Returns (cache, logits_V fp32 of token n_valid-1, its routed experts LxK int32 or None): only the
        last valid token's head is needed, and [C, V] logits at V=152k would dominate a prefill chunk."""

    @abc.abstractmethod
    def decode(self, params, cache, tokens_B: Int[Array, "B"], positions_B: Int[Array, "B"]):
        """One token per slot at its own position. Returns (cache, logits_BxV fp32, experts_BxLxK or None)."""

    def copy_slot(self, cache, src: Int[Array, ""], dst: Int[Array, ""]):
        """Copies slot `src`'s whole cache row into `dst` (prefix sharing between slots).

        Default: every cache leaf has the slot axis first."""
        return jax.tree.map(lambda a: a.at[dst].set(a[src]), cache)


def _no_experts(n: int, shape: tuple[int, int] | None):
    L, K = shape or (0, 0)
    return jnp.zeros((n, L, K), jnp.int32)


class StepFunctions:
    """The three jitted functions of the engine loop, compiled once per (slots, cache_len, chunk).

    Use `StepFunctions.of(runner)`: engines built on the same runner share compilations."""

    @classmethod
    def of(cls, runner: ModelRunner) -> StepFunctions:
        fns = runner.__dict__.get("_step_functions")
        if fns is None:
            fns = runner.__dict__["_step_functions"] = cls(runner)
        return fns

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.prefill = jax.jit(functools.partial(_prefill_and_sample, runner), donate_argnums=(1,))
        self.decode = jax.jit(functools.partial(_decode_and_sample, runner), donate_argnums=(1, 2))
        self.copy_slot = jax.jit(runner.copy_slot, donate_argnums=(0,))


def _prefill_and_sample(
    runner: ModelRunner, params, cache, slot, tokens_C, start, n_valid, temperature, top_p, top_k, key, step
):
    """Prefills one chunk into one slot and samples from the logits of its last valid token."""
    cache, logits_V, experts_LxK = runner.prefill(params, cache, slot, tokens_C, start, n_valid)
    tok_1, lp_1 = sample_tokens(
        logits_V[None],
        temperature_B=temperature[None],
        top_p_B=top_p[None],
        top_k_B=top_k[None],
        keys_Bx2=key[None],
        steps_B=step[None],
    )
    if experts_LxK is None:
        experts_LxK = _no_experts(1, runner.routing_shape)[0]
    return cache, tok_1[0], lp_1[0], experts_LxK


def _decode_and_sample(
    runner: ModelRunner,
    params,
    cache,
    tok_buf_S: Int[Array, "S"],
    host_tok_S: Int[Array, "S"],
    use_host_S,
    positions_B: Int[Array, "B"],
    temperature_B: Float[Array, "B"],
    top_p_B: Float[Array, "B"],
    top_k_B: Int[Array, "B"],
    keys_Bx2,
    steps_B: Int[Array, "B"],
):
    """One decode step of the first B slots (B = the bucket, static via positions_B's shape).

    Input tokens come from `tok_buf_S` — the previous step's samples, still on device, so the engine
    can dispatch step n+1 before it has fetched step n — except where `use_host_S` (slots whose last
    token the host set: the first token after a prefill). Returns the updated buffer too."""
    B = positions_B.shape[0]
    tokens_B = jnp.where(use_host_S, host_tok_S, tok_buf_S)[:B]
    cache, logits_BxV, experts = runner.decode(params, cache, tokens_B, positions_B)
    tok_B, lp_B = sample_tokens(
        logits_BxV,
        temperature_B=temperature_B,
        top_p_B=top_p_B,
        top_k_B=top_k_B,
        keys_Bx2=keys_Bx2,
        steps_B=steps_B,
    )
    if experts is None:
        experts = _no_experts(B, runner.routing_shape)
    return cache, tok_buf_S.at[:B].set(tok_B), tok_B, lp_B, experts
