"""Sampling (temperature/top-k/top-p/seeds/logprob convention) and the slot table's prefix reuse."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.serving.sampling import _inverse_cdf, request_key, sample_tokens
from research.serving.scheduler import BUSY, FREE, PARKED, SlotTable, common_prefix_len

_sample_jit = jax.jit(sample_tokens)


def _sample(logits, temperature, top_p=1.0, top_k=-1, seed=0, step=0):
    """Row b uses seed `seed + b`; pass a [n, V] broadcast of one row to draw n samples at once."""
    B = logits.shape[0]
    return _sample_jit(
        jnp.asarray(logits, jnp.float32),
        temperature_B=jnp.full((B,), temperature, jnp.float32),
        top_p_B=jnp.full((B,), top_p, jnp.float32),
        top_k_B=jnp.full((B,), top_k, jnp.int32),
        keys_Bx2=jax.vmap(request_key)(seed + jnp.arange(B, dtype=jnp.uint32)),
        steps_B=jnp.full((B,), step, jnp.int32),
    )


def test_greedy_is_argmax_with_temperature_one_logprob():
    logits = np.random.default_rng(0).normal(size=(4, 50)).astype(np.float32)
    tok, lp = _sample(logits, 0.0)
    np.testing.assert_array_equal(tok, logits.argmax(-1))
    ref = jax.nn.log_softmax(logits, -1)[np.arange(4), logits.argmax(-1)]
    np.testing.assert_allclose(lp, ref, atol=1e-6)


def test_logprob_is_after_temperature_before_truncation():
    logits = np.random.default_rng(1).normal(size=(3, 40)).astype(np.float32) * 3
    for T, top_p, top_k in [(0.7, 1.0, -1), (1.3, 0.9, -1), (0.5, 1.0, 5)]:
        tok, lp = _sample(logits, T, top_p, top_k, seed=7)
        ref = jax.nn.log_softmax(logits / T, -1)[np.arange(3), np.asarray(tok)]
        np.testing.assert_allclose(lp, ref, atol=1e-6)


def test_seeded_sampling_is_reproducible_and_steps_differ():
    logits = np.zeros((1, 1000), np.float32)
    a = [int(_sample(logits, 1.0, seed=3, step=s)[0][0]) for s in range(4)]
    b = [int(_sample(logits, 1.0, seed=3, step=s)[0][0]) for s in range(4)]
    c = [int(_sample(logits, 1.0, seed=4, step=s)[0][0]) for s in range(4)]
    assert a == b and a != c and len(set(a)) > 1


def test_top_k_and_top_p_restrict_support():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(1, 30)).astype(np.float32) * 2
    order = np.argsort(-logits[0])
    top3 = set(order[:3].tolist())
    many = np.repeat(logits, 200, axis=0)
    seen_k = set(np.asarray(_sample(many, 1.0, top_k=3)[0]).tolist())
    assert seen_k <= top3 and len(seen_k) > 1
    p = np.exp(logits[0] - logits[0].max())
    p /= p.sum()
    cum = np.cumsum(p[order])
    nucleus = set(order[: int(np.searchsorted(cum, 0.5) + 1)].tolist())
    seen_p = set(np.asarray(_sample(many, 1.0, top_p=0.5)[0]).tolist())
    assert seen_p <= nucleus


def test_sampling_matches_the_distribution():
    """Empirical frequencies of 4000 draws (different steps) are within 4 sigma of softmax(l / T)."""
    logits = np.array([[2.0, 1.0, 0.0, -1.0, 0.5]], np.float32)
    T, n = 0.8, 4000
    steps = jnp.arange(n, dtype=jnp.int32)
    toks, _ = _sample_jit(
        jnp.broadcast_to(jnp.asarray(logits), (n, 5)), temperature_B=jnp.full((n,), T), top_p_B=jnp.ones(n),
        top_k_B=jnp.full((n,), -1, jnp.int32), keys_Bx2=jnp.broadcast_to(request_key(11), (n, 2)), steps_B=steps,
    )
    freq = np.bincount(np.asarray(toks), minlength=5) / n
    p = np.asarray(jax.nn.softmax(logits[0] / T))
    assert np.all(np.abs(freq - p) < 4 * np.sqrt(p * (1 - p) / n) + 1e-3)


def test_inverse_cdf_edges_never_pick_zero_mass():
    """u at 0 and just below 1, zero-mass tails and whole zero blocks (V = 700: blocks of 256, the last padded):
    the draw is the first / last token with mass, never a masked one; u in between lands where the mass is."""
    p = np.zeros((4, 700), np.float32)
    p[:, 300] = 1.0  # the only mass in block 1
    p[:, 5] = 2.0    # block 0
    p[3] = 0.0
    p[3, 699] = 1.0  # last token, in the padded block
    u = np.array([0.0, 0.9999999, 0.5, 0.5], np.float32)
    got = jax.jit(_inverse_cdf)(jnp.asarray(p), jnp.asarray(u))
    np.testing.assert_array_equal(got, [5, 300, 5, 699])
    assert int(jax.jit(_inverse_cdf)(jnp.asarray(p[:1]), jnp.asarray([0.7], np.float32))[0]) == 300


def test_common_prefix_len():
    a = list(range(1000))
    assert common_prefix_len(a, a) == 1000
    assert common_prefix_len(a, a[:700] + [-1]) == 700
    assert common_prefix_len(a, []) == 0


def test_slot_table_prefix_reuse_copy_and_eviction():
    t = SlotTable(2)
    p1 = [1, 2, 3, 4, 5]
    pl = t.place(p1, "s1", version=0)
    assert pl.slot == 0 and pl.reuse == 0 and pl.copy_from is None
    t.acquire(pl, p1, "s1", 0)
    t.extend(0, p1 + [9])  # prompt + first generated token fed back
    # A second prompt sharing 5 tokens with a BUSY slot is copied into the free slot.
    p2 = p1 + [9, 7]
    pl2 = t.place(p2, "s2", version=0)
    assert (pl2.slot, pl2.reuse, pl2.copy_from) == (1, 6, 0)
    t.acquire(pl2, p2, "s2", 0)
    assert t.slots[1].cached == p1 + [9] and not t.has_room()
    assert t.place([1, 2], None, 0) is None  # everything busy
    t.release(0, keep=True)
    assert t.slots[0].state == PARKED
    # Next turn of session s1 takes its parked slot over in place (at least one token left to prefill).
    pl3 = t.place(p1 + [9], "s1", version=0)
    assert (pl3.slot, pl3.reuse, pl3.copy_from) == (0, 5, None)
    # A newer weight version never reuses old caches.
    pl4 = t.place(p1 + [9], "s1", version=1)
    assert (pl4.slot, pl4.reuse) == (0, 0)
    t.flush()
    assert t.slots[0].state == FREE and t.slots[1].state == BUSY


def test_slot_table_evicts_least_recently_used_parked():
    t = SlotTable(2)
    for i, prompt in enumerate(([1, 1, 1], [2, 2, 2])):
        pl = t.place(prompt, None, 0)
        t.acquire(pl, prompt, None, 0)
        t.extend(pl.slot, prompt)
        t.release(pl.slot, keep=True)
        assert pl.slot == i
    pl = t.place([3, 3, 3], None, 0)
    assert pl.slot == 0 and pl.reuse == 0  # slot 0 was parked first


@pytest.mark.parametrize("min_reuse,expect", [(1, 2), (3, 0)])
def test_slot_table_min_reuse(min_reuse, expect):
    t = SlotTable(2, min_reuse=min_reuse)
    pl = t.place([5, 6, 7], None, 0)
    t.acquire(pl, [5, 6, 7], None, 0)
    t.extend(pl.slot, [5, 6, 7])
    t.release(pl.slot, keep=True)
    assert t.place([5, 6, 8, 9], None, 0).reuse == expect
