"""The model side of the JAX engine: a small runner interface plus the jitted step functions.

The engine (jax_engine.py) needs a handful of pure functions of a model; `ModelRunner` names them so the
scheduler, sampling and asyncio plumbing never depend on a particular model. `Qwen3Runner` (qwen3_runner.py)
implements it on top of `research.models.decode`.

Cache layout contract: the cache is a pytree allocated once with `cache_len` positions per slot. The engine
keeps `cache_len = max_len + prefill_chunk`, so a padded last prefill chunk is never shifted by
dynamic_update_slice clamping; positions past a slot's valid prefix hold garbage that no query ever reads.

Decode runs in *blocks*: one jitted call runs up to `steps` decode steps of the first B slots in an
on-device `while_loop` (sampling, per-slot stop-token and length checks, early exit when every slot is
done), so the host syncs once per block, not once per token. The slots' decode state (`DecodeState`: last
token, position, tokens left, sampling step) lives on device between calls; the host only overrides the
slots it changed (a request that finished or was cancelled on the host side is switched off). A block
attends over a static length bucket `ctx_len` of the cache plus its own new tokens (see decode.py), so its
cost follows the sequences' lengths, not the cache's.
"""

from __future__ import annotations

import abc
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, UInt32

from research.serving.sampling import sample_tokens


class ModelRunner(abc.ABC):
    """Pure model functions the engine jits; `params` and `cache` are pytrees of jax arrays."""

    vocab_size: int
    routing_shape: tuple[int, int] | None  # (layers, top_k) for MoE models, None for dense

    @abc.abstractmethod
    def init_cache(self, slots: int, cache_len: int): ...

    def prepare_params(self, params):
        """The served params in the runner's own layout (jitted once per weight update). Default: as given."""
        return params

    @abc.abstractmethod
    def prefill(self, params, cache, slot: Int[Array, ""], tokens_C: Int[Array, "C"], start: Int[Array, ""],
                n_valid: Int[Array, ""], *, ctx_len: int):
        """Writes K/V of `tokens_C` at positions start..start+C-1 of `slot`; query i sees keys 0..start+i
        (reading only the first `ctx_len` >= start cached positions). Tokens from `n_valid` on are padding.

        Returns (cache, logits_V fp32 of token n_valid-1, its routed experts LxK int32 or None)."""

    @abc.abstractmethod
    def block_context(self, cache, batch: int, ctx_len: int):
        """The read-only cache part a decode block of the first `batch` slots attends to."""

    @abc.abstractmethod
    def block_buffer(self, cache, batch: int, steps: int):
        """A zeroed buffer for the K/V of the up to `steps` tokens a block adds per slot."""

    @abc.abstractmethod
    def block_step(self, params, ctx, ctx_len_B, buf, step, tokens_B, positions_B):
        """Decode step `step` of a block: token b at positions_B[b] sees its slot's cached keys j < ctx_len_B[b]
        and buffer columns 0..step. Returns (logits_BxV fp32, buf, experts_BxLxK or None)."""

    @abc.abstractmethod
    def block_commit(self, cache, buf, start_B, count_B):
        """Writes buffer columns 0..count_B[b]-1 into slot b's cache from position start_B[b]."""

    def copy_slot(self, cache, src: Int[Array, ""], dst: Int[Array, ""]):
        """Copies slot `src`'s whole cache row into `dst` (prefix sharing between slots).

        Default: every cache leaf has the slot axis first."""
        return jax.tree.map(lambda a: a.at[dst].set(a[src]), cache)


class DecodeState(NamedTuple):
    """Per-slot decode state kept on device between blocks ([S] each).

    tok: the token to feed next (the last one sampled); pos: the position it is fed at (= the slot's valid
    cache length); left: tokens the slot may still produce (0 = not decoding); step: the sampling step index
    of the next token (the request's token count: seeds fold it in)."""

    tok: Int[Array, "S"]
    pos: Int[Array, "S"]
    left: Int[Array, "S"]
    step: Int[Array, "S"]

    @classmethod
    def zeros(cls, slots: int) -> DecodeState:
        return cls(*(jnp.zeros(slots, jnp.int32) for _ in range(4)))


class SlotSampling(NamedTuple):
    """Per-slot sampling parameters ([S] each; host arrays passed with every call)."""

    temperature: Float[Array, "S"]
    top_p: Float[Array, "S"]
    top_k: Int[Array, "S"]
    key: UInt32[Array, "S 2"]
    stops: Int[Array, "S M"]  # stop token ids, padded with -1


class BlockOutput(NamedTuple):
    tokens: Int[Array, "N B"]  # token i of slot b (rows past count[b] are garbage)
    logprobs: Float[Array, "N B"]
    experts: Int[Array, "N B L K"]
    count: Int[Array, "B"]  # tokens slot b produced in this block
    overflow: Bool[Array, ""]  # a decoding slot's prefix exceeded ctx_len (an engine bug; never expected)


def _no_experts(shape: tuple[int, ...], routing_shape: tuple[int, int] | None):
    L, K = routing_shape or (0, 0)
    return jnp.zeros(shape + (L, K), jnp.int32)


class StepFunctions:
    """The jitted functions of the engine loop, compiled once per (slots, cache_len, chunk) and bucket.

    Use `StepFunctions.of(runner)`: engines built on the same runner share compilations."""

    @classmethod
    def of(cls, runner: ModelRunner) -> StepFunctions:
        fns = runner.__dict__.get("_step_functions")
        if fns is None:
            fns = runner.__dict__["_step_functions"] = cls(runner)
        return fns

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.prepare = jax.jit(runner.prepare_params)
        self.prefill = jax.jit(functools.partial(_prefill_and_sample, runner), static_argnames=("ctx_len",),
                               donate_argnums=(1, 2))
        self.decode = jax.jit(functools.partial(_decode_block, runner),
                              static_argnames=("batch", "ctx_len", "steps"), donate_argnums=(1, 2))
        self.copy_slot = jax.jit(runner.copy_slot, donate_argnums=(0,))

    def compiled(self) -> int:
        """How many executables the step functions hold (tests: no recompiles across requests)."""
        return sum(f._cache_size() for f in (self.prepare, self.prefill, self.decode, self.copy_slot))


def _prefill_and_sample(
    runner: ModelRunner, params, cache, state: DecodeState, slot, tokens_C, start, n_valid, temperature, top_p,
    top_k, key, stops_M, max_new, images=None, *, ctx_len: int,
):
    """Prefills one chunk into one slot; on the prompt's last chunk (`max_new` > 0) samples the first token
    from its last valid position and starts the slot decoding in `state` (unless that token already ends it).
    `images`: a vision-language runner's inputs of this chunk (research/serving/qwen3_vl_runner.py)."""
    kw = {} if images is None else {"images": images}
    cache, logits_V, experts_LxK = runner.prefill(params, cache, slot, tokens_C, start, n_valid, ctx_len=ctx_len,
                                                  **kw)
    tok_1, lp_1 = sample_tokens(
        logits_V[None], temperature_B=temperature[None], top_p_B=top_p[None], top_k_B=top_k[None],
        keys_Bx2=key[None], steps_B=jnp.zeros(1, jnp.int32),
    )
    tok = tok_1[0]
    left = jnp.where(jnp.any(stops_M == tok) | (max_new <= 1), 0, max_new - 1)
    last = max_new > 0
    state = DecodeState(
        tok=state.tok.at[slot].set(jnp.where(last, tok, state.tok[slot])),
        pos=state.pos.at[slot].set(jnp.where(last, start + n_valid, state.pos[slot])),
        left=state.left.at[slot].set(jnp.where(last, left, state.left[slot])),
        step=state.step.at[slot].set(jnp.where(last, 1, state.step[slot])),
    )
    if experts_LxK is None:
        experts_LxK = _no_experts((), runner.routing_shape)
    return cache, state, tok, lp_1[0], experts_LxK


def _decode_block(
    runner: ModelRunner, params, cache, state: DecodeState, override_S: Bool[Array, "S"], host: DecodeState,
    sampling: SlotSampling, n_steps: Int[Array, ""], *, batch: int, ctx_len: int, steps: int,
):
    """Up to `n_steps` (<= `steps`, static buffer size) decode steps of slots 0..batch-1 in one on-device loop.

    Slots with `override_S` take their state from `host` first (the host switched them off or on). A slot
    decodes while `left > 0`: each step feeds its token, samples the next, and stops it at a stop token or
    when `left` runs out; the loop ends early once no slot is left. K/V of the block's tokens are written
    into the cache once at the end. Returns (cache, state, BlockOutput)."""
    state = DecodeState(*(jnp.where(override_S, h, s) for h, s in zip(host, state)))
    B = batch
    tok0, start_B, left0, step0 = (a[:B] for a in state)
    samp = SlotSampling(*(a[:B] for a in sampling))
    live0 = left0 > 0
    overflow = jnp.any(live0 & (start_B > ctx_len))
    with jax.named_scope("cache_io"):
        ctx = runner.block_context(cache, B, ctx_len)
    ctx_len_B = jnp.where(live0, start_B, 0)
    out = BlockOutput(
        tokens=jnp.zeros((steps, B), jnp.int32), logprobs=jnp.zeros((steps, B), jnp.float32),
        experts=_no_experts((steps, B), runner.routing_shape), count=jnp.zeros(B, jnp.int32), overflow=overflow,
    )

    def cond(carry):
        i, _, _, left, _, _, _ = carry
        return (i < n_steps) & jnp.any(left > 0)

    def body(carry):
        i, tok, pos, left, step, buf, out = carry
        logits_BxV, buf, experts = runner.block_step(params, ctx, ctx_len_B, buf, i, tok, pos)
        with jax.named_scope("sampling"):
            new, lp = sample_tokens(logits_BxV, temperature_B=samp.temperature, top_p_B=samp.top_p,
                                    top_k_B=samp.top_k, keys_Bx2=samp.key, steps_B=step)
        live = left > 0
        stopped = jnp.any(samp.stops == new[:, None], axis=-1)
        if experts is None:
            experts = _no_experts((B,), runner.routing_shape)
        out = out._replace(tokens=out.tokens.at[i].set(new), logprobs=out.logprobs.at[i].set(lp),
                           experts=out.experts.at[i].set(experts), count=out.count + live)
        left = jnp.where(live, jnp.where(stopped, 0, left - 1), 0)
        inc = live.astype(jnp.int32)
        return i + 1, jnp.where(live, new, tok), pos + inc, left, step + inc, buf, out

    carry = (jnp.int32(0), tok0, start_B, left0, step0, runner.block_buffer(cache, B, steps), out)
    _, tok, pos, left, step, buf, out = jax.lax.while_loop(cond, body, carry)
    with jax.named_scope("cache_io"):
        cache = runner.block_commit(cache, buf, start_B, out.count)
    state = DecodeState(*(s.at[:B].set(n) for s, n in zip(state, (tok, pos, left, step))))
    return cache, state, out
