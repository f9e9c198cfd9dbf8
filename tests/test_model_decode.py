"""KV-cache paths == full forward: per-position logits, greedy tokens, independent slots, routing; the engine's
fast path (chunks, multi-step blocks, commits) and its MoE kernels."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models import Qwen3, init_params, logits, tiny_dense, tiny_moe
from research.models import decode as decode_lib
from research.models.decode import decode_step, greedy_generate, init_cache, prefill

_PAD = 16


@functools.partial(jax.jit, static_argnames=("cfg",))
def _padded_logits(p, cfg, toks_1xP):
    """Causal forward over a fixed padded length: one compilation; trailing pad cannot affect earlier logits."""
    h = Qwen3(cfg).apply({"params": p}, toks_1xP, jnp.arange(_PAD)[None], jnp.ones((1, _PAD), jnp.int32),
                         jnp.full((1, _PAD), _PAD - 1))
    return logits(p, cfg, h)[0]


def _full_logits(p, cfg, toks):
    return _padded_logits(p, cfg, jnp.array([list(toks) + [0] * (_PAD - len(toks))]))[: len(toks)]


def _greedy_full(p, cfg, prompt, n):
    toks = list(prompt)
    for _ in range(n):
        toks.append(int(jnp.argmax(_full_logits(p, cfg, toks)[-1])))
    return toks[len(prompt):]


@pytest.mark.parametrize("make", [tiny_dense, tiny_moe])
def test_decode_logits_match_forward_each_position(make):
    cfg = make()
    p = init_params(cfg, jax.random.key(0))
    toks = [int(t) for t in jax.random.randint(jax.random.key(1), (10,), 0, cfg.vocab_size)]
    ref = _full_logits(p, cfg, toks)
    cache = init_cache(cfg, 1, 16)
    lg, cache, _ = prefill(p, cfg, cache, jnp.array([toks[:4]]), jnp.array([4]))
    np.testing.assert_allclose(lg[0], ref[3], atol=1e-5)
    for i in range(4, 10):
        lg, cache, _ = decode_step(p, cfg, cache, jnp.array([toks[i]]), jnp.array([i]))
        np.testing.assert_allclose(lg[0], ref[i], atol=1e-5)


@pytest.mark.parametrize("make", [tiny_dense, tiny_moe])
def test_greedy_cache_equals_greedy_forward(make):
    cfg = make()
    p = init_params(cfg, jax.random.key(2))
    prompt = [1, 7, 42, 3, 99]
    assert greedy_generate(p, cfg, prompt, 8) == _greedy_full(p, cfg, prompt, 8)


def test_slots_are_independent_and_reusable():
    """Slot 0 gets a new (shorter) request mid-flight; slot 1 keeps decoding unaffected; padding is ignored."""
    cfg = tiny_moe()
    p = init_params(cfg, jax.random.key(3))
    a, b, c = [5, 6, 7, 8, 9, 10], [20, 21, 22], [30, 31]
    cache = init_cache(cfg, 2, 12)
    pad = lambda s: s + [0] * (6 - len(s))
    lg, cache, routed = prefill(p, cfg, cache, jnp.array([pad(a), pad(b)]), jnp.array([6, 3]))
    np.testing.assert_allclose(lg[1], _full_logits(p, cfg, b)[-1], atol=1e-5)
    assert routed.shape == (2, 6, cfg.num_layers, cfg.num_experts_per_tok)
    # slot 0 restarts with request c while slot 1 continues with token 23 at position 3
    lg, cache, _ = prefill(p, cfg, cache, jnp.array([c]), jnp.array([2]), slots_B=jnp.array([0]))
    np.testing.assert_allclose(lg[0], _full_logits(p, cfg, c)[-1], atol=1e-5)
    lg, cache, _ = decode_step(p, cfg, cache, jnp.array([32, 23]), jnp.array([2, 3]))
    np.testing.assert_allclose(lg[0], _full_logits(p, cfg, c + [32])[-1], atol=1e-5)
    np.testing.assert_allclose(lg[1], _full_logits(p, cfg, b + [23])[-1], atol=1e-5)
    # continuation: append two tokens to slot 1 at start 4 (multi-turn)
    lg, cache, _ = prefill(p, cfg, cache, jnp.array([[24, 25]]), jnp.array([2]), slots_B=jnp.array([1]),
                           start_B=jnp.array([4]))
    np.testing.assert_allclose(lg[0], _full_logits(p, cfg, b + [23, 24, 25])[-1], atol=1e-5)


@pytest.mark.slow
def test_decode_routing_replay():
    cfg = tiny_moe(num_layers=3, mlp_only_layers=(1,))  # two layer runs: the cache holds one stack per run
    p = init_params(cfg, jax.random.key(4))
    cache = init_cache(cfg, 1, 8)
    lg, cache, routed = prefill(p, cfg, cache, jnp.array([[1, 2, 3]]), jnp.array([3]))
    cache2 = init_cache(cfg, 1, 8)
    lg2, _, _ = prefill(p, cfg, cache2, jnp.array([[1, 2, 3]]), jnp.array([3]), expert_ids_BxTxLxK=routed)
    np.testing.assert_array_equal(np.asarray(lg2), np.asarray(lg))
    lg3, _, r3 = decode_step(p, cfg, cache, jnp.array([4]), jnp.array([3]))
    cache4 = init_cache(cfg, 1, 8)
    _, cache4, _ = prefill(p, cfg, cache4, jnp.array([[1, 2, 3]]), jnp.array([3]))
    lg4, _, _ = decode_step(p, cfg, cache4, jnp.array([4]), jnp.array([3]), expert_ids_BxLxK=(r3 + 1) % 8)
    assert float(jnp.abs(lg4 - lg3).max()) > 1e-4
    np.testing.assert_allclose(lg3[0], _full_logits(p, cfg, [1, 2, 3, 4])[-1], atol=1e-5)


# ---------------------------------------------------------------- the engine's fast path (per-layer cache)
from research.models import moe as moe_lib  # noqa: E402
from research.models.decode import (  # noqa: E402
    block_buffer,
    block_commit,
    block_context,
    block_decode_step,
    engine_params,
    init_layer_cache,
    prefill_slot,
)
from research.serving import cpu_kernels  # noqa: E402


@functools.partial(jax.jit, static_argnames=("cfg",))
def _padded_forward(p, cfg, toks_1xP):
    h, aux = Qwen3(cfg).apply({"params": p}, toks_1xP, jnp.arange(_PAD)[None], jnp.ones((1, _PAD), jnp.int32),
                              jnp.full((1, _PAD), _PAD - 1), return_routing=True)
    return logits(p, cfg, h)[0], aux["routed_experts"][0]


@pytest.mark.slow
def test_fast_path_chunks_and_blocks_match_forward():
    """Row 2 of 3: two prefill chunks (one padded), a 4-step decode block next to idle rows, the block's K/V
    committed, then another chunk reading them back; every position's logits and routing == full forward.
    (A MoE model with a dense middle layer: both layer kinds, two layer runs.)"""
    cfg = tiny_moe(num_layers=3, mlp_only_layers=(1,))
    p = init_params(cfg, jax.random.key(5))
    ep = engine_params(p, cfg)
    toks = [int(t) for t in jax.random.randint(jax.random.key(6), (_PAD,), 0, cfg.vocab_size)]
    ref, routed = _padded_forward(p, cfg, jnp.array([toks]))
    cache = init_layer_cache(cfg, 3, 32)
    pf = jax.jit(functools.partial(prefill_slot, cfg=cfg), static_argnames=("ctx_len",))
    step = jax.jit(functools.partial(block_decode_step, cfg=cfg))

    def chunk(start, n):
        nonlocal cache
        t = np.zeros(4, np.int32)
        t[:n] = toks[start : start + n]
        lg, cache, r = pf(ep, cache=cache, slot=jnp.int32(2), tokens_C=t, start=jnp.int32(start), n_valid=jnp.int32(n),
                          ctx_len=8 if start <= 8 else 16)  # a length bucket >= start
        np.testing.assert_allclose(lg, ref[start + n - 1], atol=1e-5)
        np.testing.assert_array_equal(r[:n], routed[start : start + n])

    chunk(0, 4)
    chunk(4, 3)
    ctx, buf = block_context(cache, 3, 8), block_buffer(cache, 3, 4)
    for i in range(4):
        pos = 7 + i
        lg, buf, r = step(ep, ctx=ctx, ctx_len_B=jnp.array([0, 0, 7]), buf=buf, step=jnp.int32(i),
                          tokens_B=jnp.array([1, 2, toks[pos]]), positions_B=jnp.array([0, 5, pos]))
        np.testing.assert_allclose(lg[2], ref[pos], atol=1e-5)
        np.testing.assert_array_equal(r[2], routed[pos])
    cache = block_commit(cache, buf, jnp.array([0, 5, 7]), jnp.array([0, 0, 4]))
    chunk(11, 4)


def test_moe_decode_kernels_match_moe_dense():
    """Every kernel `decode._moe` picks (sliced experts, all experts, per-expert capacity, and the capacity
    kernel's overflow fallback) equals moe.experts_dense on the same routing."""
    cfg = tiny_moe()
    p = init_params(cfg, jax.random.key(7))
    mp = engine_params(p, cfg)["layers"][0]["moe"]

    kernels = {  # name -> (kernel, token counts to check it at)
        "sliced": (decode_lib._experts_sliced, (1, 3)),
        "all": (decode_lib._experts_all, (3, 8)),
        "capacity": (lambda x, i, w, m: decode_lib._experts_capacity(x, i, w, m, x.shape[0], decode_lib._experts_all),
                     (8,)),
        "overflow": (lambda x, i, w, m: decode_lib._experts_capacity(x, i, w, m, 1, decode_lib._experts_all), (8,)),
    }
    for name, (fn, sizes) in kernels.items():
        for n in sizes:
            x = jax.random.normal(jax.random.key(n), (n, cfg.hidden_size))
            w, ids = moe_lib.route(x, mp["router"], top_k=2, norm_topk_prob=True)
            want = moe_lib.experts_dense(x, ids, w, mp["wi_gate"], mp["wi_up"], mp["wo"])
            np.testing.assert_allclose(jax.jit(fn)(x, ids, w, mp), want, atol=1e-5, err_msg=f"{name} n={n}")
    # the dispatcher at a prefill-sized count: capacity kernel whose overflow falls back to cfg.moe_impl
    x = jax.random.normal(jax.random.key(24), (1, 24, cfg.hidden_size))
    y, routed = jax.jit(lambda x: decode_lib._moe(cfg, mp, x))(x)
    w, ids = moe_lib.route(x[0], mp["router"], top_k=2, norm_topk_prob=True)
    np.testing.assert_array_equal(routed[0], ids)
    np.testing.assert_allclose(y[0], moe_lib.experts_dense(x[0], ids, w, mp["wi_gate"], mp["wi_up"], mp["wo"]),
                               atol=1e-5)


@pytest.mark.parametrize("kernels", [False, True])
def test_prefill_writes_the_cache_in_place(kernels):
    """A prefill chunk's compiled program never copies the (donated) cache: a copy costs O(slots x cache_len)
    per chunk (it was ~40% of a 32-token prefill at 32 slots), whatever the chunk's size."""
    if kernels and jax.default_backend() != "cpu":
        pytest.skip("CPU kernels")
    cfg = tiny_moe(num_layers=2, dtype="float32")
    ops = cpu_kernels.OPS if kernels else decode_lib.XLA_OPS
    ep = engine_params(init_params(cfg, jax.random.key(0)), cfg, ops)
    cache = init_layer_cache(cfg, 8, 48)
    fn = jax.jit(functools.partial(prefill_slot, cfg=cfg, ops=ops), static_argnames=("ctx_len",),
                 donate_argnames=("cache",))
    hlo = fn.lower(ep, cache=cache, slot=jnp.int32(1), tokens_C=jnp.zeros(8, jnp.int32), start=jnp.int32(0),
                   n_valid=jnp.int32(8), ctx_len=16).compile().as_text()
    k = cache.k[0]
    shape = f"f32[{','.join(map(str, k.shape))}]"
    copies = [ln for ln in hlo.splitlines() if f"= {shape}" in ln and " copy(" in ln]
    assert not copies, copies
