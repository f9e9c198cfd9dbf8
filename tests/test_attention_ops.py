"""Tree attention: the mask contract, blockwise/causal == reference (values and grads), no recompiles."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.benchmarks.attention import tree_row as session_tree_row
from research.models import attention_ops as ao


def random_tree(rng: np.random.Generator, budget: int):
    """A random prefix tree laid out in DFS order: (parent index or -1, depth, subtree_end) per token."""
    parent, depth, end = [], [], []

    def node(parent_tok: int, d0: int, remaining: int) -> int:
        start = len(parent)
        L = int(rng.integers(1, max(1, remaining // 2) + 1))
        for t in range(L):
            parent.append(parent_tok if t == 0 else start + t - 1)
            depth.append(d0 + t)
            end.append(-1)
        remaining -= L
        n_child = int(rng.integers(0, 4)) if remaining > 0 else 0
        for _ in range(n_child):
            if remaining <= 0:
                break
            remaining -= node(start + L - 1, d0 + L, int(rng.integers(1, remaining + 1)))
        for t in range(start, start + L):
            end[t] = len(parent) - 1
        return len(parent) - start

    node(-1, 0, budget)
    return np.array(parent), np.array(depth), np.array(end)


def random_rows(seed: int, B: int, T: int, max_trees: int = 3, causal: bool = False):
    """Rows with several trees (or causal segments) each, then padding. Returns numpy arrays + ancestor mask."""
    rng = np.random.default_rng(seed)
    seg = np.zeros((B, T), np.int32)
    pos = np.zeros((B, T), np.int32)
    end = np.arange(T, dtype=np.int32)[None].repeat(B, 0)
    mask = np.zeros((B, T, T), bool)
    for b in range(B):
        cur = 0
        for s in range(1, int(rng.integers(1, max_trees + 1)) + 1):
            room = T - cur - int(rng.integers(0, T // 8 + 1))
            if room <= 0:
                break
            budget = int(rng.integers(1, room + 1))
            if causal:
                par, dep, e = np.arange(budget) - 1, np.arange(budget), np.full(budget, budget - 1)
            else:
                par, dep, e = random_tree(rng, budget)
            n = len(par)
            seg[b, cur : cur + n], pos[b, cur : cur + n], end[b, cur : cur + n] = s, dep, e + cur
            for i in range(n):  # ancestors-or-self by walking parent pointers: independent of subtree_end
                j = i
                while j >= 0:
                    mask[b, cur + i, cur + j] = True
                    j = par[j]
            cur += n
    return seg, pos, end, mask


def qkv(seed: int, B: int, T: int, H: int, K: int, D: int, dtype=jnp.float32):
    ks = jax.random.split(jax.random.key(seed), 3)
    return (
        jax.random.normal(ks[0], (B, T, H, D), dtype),
        jax.random.normal(ks[1], (B, T, K, D), dtype),
        jax.random.normal(ks[2], (B, T, K, D), dtype),
    )


def naive_attention(q, k, v, mask):
    """Per-query numpy loop straight from the definition (float64)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, H, D = q.shape
    G = H // k.shape[2]
    out = np.zeros_like(q)
    for b in range(B):
        for i in range(T):
            js = np.nonzero(mask[b, i])[0]
            if len(js) == 0:
                continue
            for h in range(H):
                s = k[b, js, h // G] @ q[b, i, h] / np.sqrt(D)
                p = np.exp(s - s.max())
                out[b, i, h] = (p / p.sum()) @ v[b, js, h // G]
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_visibility_mask_matches_parent_pointers(seed):
    seg, _, end, mask = random_rows(seed, B=3, T=64)
    chex.assert_trees_all_equal(np.asarray(ao.visibility_mask(jnp.asarray(seg), jnp.asarray(end))), mask)


def test_segment_subtree_end():
    seg = jnp.array([[1, 1, 1, 2, 2, 0, 0], [3, 3, 3, 3, 3, 3, 3]])
    np.testing.assert_array_equal(ao.segment_subtree_end(seg), [[2, 2, 2, 4, 4, 5, 6], [6] * 7])


def test_reference_matches_naive_loop():
    seg, _, end, mask = random_rows(3, B=2, T=40)
    q, k, v = qkv(0, 2, 40, 4, 2, 8)
    out = ao.attend(q, k, v, segment_ids_BxT=jnp.asarray(seg), subtree_end_BxT=jnp.asarray(end), impl="reference")
    np.testing.assert_allclose(np.asarray(out), naive_attention(q, k, v, mask), atol=1e-5)
    assert np.all(np.asarray(out)[seg == 0] == 0)


def _grads(impl, q, k, v, seg, end, **kw):
    w = jnp.sin(jnp.arange(q.size, dtype=jnp.float32)).reshape(q.shape)

    def f(q, k, v):
        out = ao.attend(q, k, v, segment_ids_BxT=seg, subtree_end_BxT=end, impl=impl, **kw)
        return jnp.sum(out * w), out

    return jax.grad(f, argnums=(0, 1, 2), has_aux=True)(q, k, v)


BLOCKS = [(16, 16), (32, 16), (16, 32), (64, 64)]


@pytest.mark.parametrize("seed,blocks", list(enumerate(BLOCKS)))
def test_blockwise_matches_reference_on_random_trees(seed, blocks):
    B, T, H, K, D = 3, 120, 4, 2, 8  # T not a block multiple: exercises internal padding
    seg, _, end, _ = random_rows(seed, B, T)
    seg, end = jnp.asarray(seg), jnp.asarray(end)
    q, k, v = qkv(seed, B, T, H, K, D)
    g_ref, out_ref = _grads("reference", q, k, v, seg, end)
    g_blk, out_blk = _grads("blockwise", q, k, v, seg, end, block_q=blocks[0], block_k=blocks[1])
    chex.assert_trees_all_close(out_blk, out_ref, atol=1e-5)
    chex.assert_trees_all_close(g_blk, g_ref, atol=1e-5)
    chex.assert_tree_all_finite(g_blk)
    assert np.all(np.asarray(out_blk)[np.asarray(seg) == 0] == 0)


@pytest.mark.parametrize("impl", ["causal", "blockwise", "auto", "dense_blocks"])
def test_causal_segments(impl):
    B, T, H, K, D = 2, 96, 6, 3, 16
    seg, _, end, _ = random_rows(7, B, T, max_trees=4, causal=True)
    seg, end = jnp.asarray(seg), jnp.asarray(end)
    chex.assert_trees_all_equal(ao.segment_subtree_end(seg)[seg != 0], end[seg != 0])
    q, k, v = qkv(1, B, T, H, K, D)
    g_ref, out_ref = _grads("reference", q, k, v, seg, end)
    g_c, out_c = _grads(impl, q, k, v, seg, None if impl == "causal" else end, block_q=32, block_k=16)
    chex.assert_trees_all_close(out_c, out_ref, atol=1e-5)
    chex.assert_trees_all_close(g_c, g_ref, atol=1e-5)


def test_all_padding_row_is_zero_and_finite():
    q, k, v = qkv(2, 2, 32, 2, 1, 4)
    seg = jnp.zeros((2, 32), jnp.int32).at[0, :5].set(1)
    end = ao.segment_subtree_end(seg)
    g, out = _grads("blockwise", q, k, v, seg, end, block_q=8, block_k=8)
    chex.assert_tree_all_finite((g, out))
    assert float(jnp.abs(out[1]).max()) == 0.0 and float(jnp.abs(g[0][1]).max()) == 0.0


def test_blocks_are_skipped():
    """Two disjoint branches under a short prefix: branch-2 queries must not visit branch-1 key blocks."""
    T, b = 64, 16
    seg = jnp.ones((1, T), jnp.int32)
    end = jnp.concatenate([jnp.full((16,), T - 1), jnp.full((24,), 39), jnp.full((24,), T - 1)])[None]
    bl = ao._block_lists(seg, end.astype(jnp.int32), b, b, causal=False)
    # query blocks 0..3; block 3 covers [48, 64) in branch 2: sees the prefix block 0 and blocks 2 (40..47), 3
    np.testing.assert_array_equal(bl.count, [1, 2, 3, 3])
    np.testing.assert_array_equal(np.sort(np.asarray(bl.kidx[3, :3])), [0, 2, 3])
    # fully visible (unmasked) pairs come first: the prefix block for every later query block
    np.testing.assert_array_equal(bl.n_full, [0, 1, 1, 1])
    np.testing.assert_array_equal(bl.kidx[1:, 0], [0, 0, 0])


def test_session_tree_with_full_blocks_matches_reference():
    """A harness-shaped tree (shared prefix, sessions of appended turns): most visited pairs are unmasked."""
    seg, end, _ = session_tree_row(prefix=64, sessions=3, turns=4, turn_tokens=(5, 20), block=16, seed=0)
    seg, end = jnp.asarray(seg), jnp.asarray(end)
    bl = ao._block_lists(seg, end, 16, 16, causal=False)
    assert int(bl.n_full.sum()) > int(bl.count.sum()) // 3
    q, k, v = qkv(5, 1, seg.shape[1], 4, 2, 16)
    g_ref, out_ref = _grads("reference", q, k, v, seg, end)
    g_blk, out_blk = _grads("blockwise", q, k, v, seg, end, block_q=16, block_k=16)
    chex.assert_trees_all_close(out_blk, out_ref, atol=1e-5)
    chex.assert_trees_all_close(g_blk, g_ref, atol=1e-5)


def test_jit_once_for_different_trees():
    traces = []
    B, T, H, K, D = 2, 64, 2, 1, 8

    @jax.jit
    def step(q, k, v, seg, end):
        traces.append(1)
        f = lambda q: jnp.sum(ao.attend(q, k, v, segment_ids_BxT=seg, subtree_end_BxT=end, block_q=16, block_k=16))
        return jax.value_and_grad(f)(q)

    q, k, v = qkv(0, B, T, H, K, D)
    for seed in (0, 1, 2):
        seg, _, end, _ = random_rows(seed, B, T)
        step(q, k, v, jnp.asarray(seg), jnp.asarray(end))
    assert len(traces) == 1


def test_bf16_inputs_close_to_fp32():
    B, T, H, K, D = 1, 64, 4, 2, 16
    seg, _, end, _ = random_rows(4, B, T)
    seg, end = jnp.asarray(seg), jnp.asarray(end)
    q, k, v = qkv(3, B, T, H, K, D)
    ref = ao.attend(q, k, v, segment_ids_BxT=seg, subtree_end_BxT=end, impl="reference")
    out = ao.attend(*(x.astype(jnp.bfloat16) for x in (q, k, v)), segment_ids_BxT=seg, subtree_end_BxT=end)
    assert out.dtype == jnp.bfloat16
    chex.assert_trees_all_close(out.astype(jnp.float32), ref, atol=5e-2)


def test_unknown_impl():
    q, k, v = qkv(0, 1, 8, 2, 1, 4)
    with pytest.raises(ValueError, match="unknown attention impl 'flash'"):
        ao.attend(q, k, v, segment_ids_BxT=jnp.ones((1, 8), jnp.int32), impl="flash")
    with pytest.raises(ValueError, match="num heads 2 is not a multiple of num kv heads 3"):
        ao.attend(q, jnp.ones((1, 8, 3, 4)), jnp.ones((1, 8, 3, 4)), segment_ids_BxT=jnp.ones((1, 8), jnp.int32))


def _mesh():
    return jax.sharding.Mesh(np.asarray(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "tensor"))


@pytest.mark.parametrize("fn,B", [(ao.attend_on_mesh, 4), (ao.attend, 2)])
def test_attend_on_mesh_equals_single_device(fn, B):
    """8 fake devices, rows over (data, fsdp) (only data when B=2) and kv heads over tensor: same results."""
    mesh = _mesh()
    T, H, K, D = 48, 4, 2, 8
    seg, _, end, _ = random_rows(11, B, T)
    seg, end = jnp.asarray(seg), jnp.asarray(end)
    q, k, v = qkv(4, B, T, H, K, D)
    g_ref, out_ref = _grads("reference", q, k, v, seg, end)

    def f(q, k, v):
        out = fn(q, k, v, segment_ids_BxT=seg, subtree_end_BxT=end, block_q=16, block_k=16)
        return jnp.sum(out * jnp.sin(jnp.arange(q.size, dtype=jnp.float32)).reshape(q.shape)), out

    with jax.set_mesh(mesh):
        assert "shard_map" in str(jax.make_jaxpr(f)(q, k, v))  # really split, not the single-device fallback
        step = jax.jit(jax.grad(f, argnums=(0, 1, 2), has_aux=True))
        hlo = step.lower(q, k, v).compile().as_text()
        (g, out) = step(q, k, v)
    chex.assert_trees_all_close(out, out_ref, atol=1e-5)
    chex.assert_trees_all_close(g, g_ref, atol=1e-5)
    if B == 4:  # every mesh axis used: each device runs its own rows and heads, no communication at all
        assert " all-gather(" not in hlo and " all-reduce(" not in hlo


def test_auto_inside_a_users_shard_map():
    """Already split by the caller (manual axes): auto must not nest another shard_map."""
    B, T, H, K, D = 4, 32, 2, 1, 8
    seg, _, end, _ = random_rows(12, B, T)
    seg, end = jnp.asarray(seg), jnp.asarray(end)
    q, k, v = qkv(6, B, T, H, K, D)
    ref = ao.attend(q, k, v, segment_ids_BxT=seg, subtree_end_BxT=end, impl="reference")
    P = jax.sharding.PartitionSpec
    rows, heads = P("data"), P("data", None, None, None)
    local = lambda q, k, v, s, e: ao.attend(q, k, v, segment_ids_BxT=s, subtree_end_BxT=e, block_q=8, block_k=8)
    g_ref, _ = _grads("reference", q, k, v, seg, end)
    w = jnp.sin(jnp.arange(q.size, dtype=jnp.float32)).reshape(q.shape)
    with jax.set_mesh(_mesh()):
        split = jax.shard_map(local, in_specs=(heads, heads, heads, rows, rows), out_specs=heads)
        out = jax.jit(split)(q, k, v, seg, end)
        g = jax.jit(jax.grad(lambda q, k, v: jnp.sum(split(q, k, v, seg, end) * w), argnums=(0, 1, 2)))(q, k, v)
    chex.assert_trees_all_close(out, ref, atol=1e-5)
    chex.assert_trees_all_close(g, g_ref, atol=1e-5)
