"""Tree attention: the mask contract, blockwise/causal == reference (values and grads), no recompiles."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
