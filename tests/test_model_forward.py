"""Forward contract of the Qwen3 policy: shapes, tree mask semantics, MoE kernels agree, routing replay."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models import Qwen3, dummy_inputs, init_params, logits, tiny_dense, tiny_moe
from research.models.moe import experts_blocked, experts_dense, experts_ragged, route


@functools.partial(jax.jit, static_argnames=("cfg", "return_routing"))
def _fwd(cfg, p, toks, pos, seg, se, expert_ids_BxTxLxK=None, return_routing=False):
    return Qwen3(cfg).apply({"params": p}, toks, pos, seg, se, expert_ids_BxTxLxK=expert_ids_BxTxLxK,
                            return_routing=return_routing)


def _seq_inputs(rng, B, T, V):
    toks = jax.random.randint(rng, (B, T), 0, V)
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    return toks, pos, jnp.ones((B, T), jnp.int32), jnp.full((B, T), T - 1, jnp.int32)


@pytest.mark.parametrize("make", [tiny_dense, tiny_moe])
def test_shapes_and_routing_output(make):
    cfg = make()
    p = init_params(cfg, jax.random.key(0))
    h, aux = _fwd(cfg, p, *dummy_inputs(2, 8), return_routing=True)
    chex.assert_shape(h, (2, 8, cfg.hidden_size))
    chex.assert_shape(aux["routed_experts"], (2, 8, cfg.num_layers, cfg.num_experts_per_tok))
    chex.assert_shape(logits(p, cfg, h), (2, 8, cfg.vocab_size))
    assert aux["routed_experts"].dtype == jnp.int32


def test_tree_row_equals_separate_sequences():
    """A packed tree root->{a, b}: each branch's logits equal the plain sequence root+branch."""
    cfg = tiny_moe()
    p = init_params(cfg, jax.random.key(1))
    root, a, b = [3, 5, 7], [11, 13], [17, 19, 23]
    toks = jnp.array([root + a + b])
    pos = jnp.array([[0, 1, 2, 3, 4, 3, 4, 5]])
    seg = jnp.ones_like(toks)
    se = jnp.array([[7, 7, 7, 4, 4, 7, 7, 7]])
    tree = logits(p, cfg, _fwd(cfg, p, toks, pos, seg, se))
    for branch, sl in ((a, slice(0, 5)), (b, list(range(3)) + [5, 6, 7])):
        t, ps, sg, s = _seq_inputs(jax.random.key(0), 1, len(root + branch), cfg.vocab_size)
        ref = logits(p, cfg, _fwd(cfg, p, jnp.array([root + branch]), ps, sg, s))
        np.testing.assert_allclose(tree[0, jnp.array(sl) if isinstance(sl, list) else sl], ref[0], atol=1e-5)


def test_padding_and_second_segment_do_not_leak():
    cfg = tiny_dense()
    p = init_params(cfg, jax.random.key(2))
    toks, pos, seg, se = _seq_inputs(jax.random.key(3), 1, 6, cfg.vocab_size)
    ref = logits(p, cfg, _fwd(cfg, p, toks, pos, seg, se))
    toks2 = jnp.concatenate([toks, jnp.array([[9, 8, 7, 0]])], axis=1)
    pos2 = jnp.concatenate([pos, jnp.array([[0, 1, 2, 0]])], axis=1)
    seg2 = jnp.array([[1] * 6 + [2, 2, 2, 0]])
    se2 = jnp.array([[5] * 6 + [8, 8, 8, 9]])
    packed = logits(p, cfg, _fwd(cfg, p, toks2, pos2, seg2, se2))
    np.testing.assert_allclose(packed[:, :6], ref, atol=1e-5)


@pytest.mark.parametrize("N,E,K", [(37, 8, 2), (5, 8, 2), (64, 4, 3)])
def test_moe_kernels_agree(N, E, K):
    ks = jax.random.split(jax.random.key(N), 5)
    D, I = 16, 24
    x = jax.random.normal(ks[0], (N, D))
    router = jax.random.normal(ks[1], (D, E))
    wg, wu = jax.random.normal(ks[2], (E, D, I)) * 0.3, jax.random.normal(ks[3], (E, D, I)) * 0.3
    wo = jax.random.normal(ks[4], (E, I, D)) * 0.3
    w, ids = jax.jit(functools.partial(route, top_k=K, norm_topk_prob=True))(x, router)
    blocked = functools.partial(experts_blocked, block_rows=4)
    ref = jax.jit(experts_dense)(x, ids, w, wg, wu, wo)
    np.testing.assert_allclose(jax.jit(experts_ragged)(x, ids, w, wg, wu, wo), ref, atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(jax.jit(blocked)(x, ids, w, wg, wu, wo), ref, atol=1e-4, rtol=1e-5)
    # grads agree too (the blocked path is the CPU training path)
    grad = lambda f: jax.jit(jax.grad(lambda wg: jnp.sum(f(x, ids, w, wg, wu, wo) ** 2)))(wg)
    np.testing.assert_allclose(grad(blocked), grad(experts_dense), atol=1e-3)


def test_mixed_dense_and_sparse_layers_run():
    cfg = tiny_moe(num_layers=3, mlp_only_layers=(1,))
    assert cfg.layer_runs() == ((True, 0, 1), (False, 1, 1), (True, 2, 1))
    p = init_params(cfg, jax.random.key(0))
    _, aux = _fwd(cfg, p, *dummy_inputs(1, 4), return_routing=True)
    assert (aux["routed_experts"][:, :, 1] == -1).all() and (aux["routed_experts"][:, :, 0] >= 0).all()


@pytest.mark.parametrize("impl", ["dense", "blocked", "ragged"])
def test_routing_replay(impl):
    cfg = tiny_moe(moe_impl=impl)
    p = init_params(cfg, jax.random.key(4))
    inputs = _seq_inputs(jax.random.key(5), 2, 8, cfg.vocab_size)
    h, aux = _fwd(cfg, p, *inputs, return_routing=True)
    ids = aux["routed_experts"]
    h_replay = _fwd(cfg, p, *inputs, expert_ids_BxTxLxK=ids)
    np.testing.assert_array_equal(np.asarray(h_replay), np.asarray(h))
    other = (ids + 1) % cfg.num_experts
    h_other = _fwd(cfg, p, *inputs, expert_ids_BxTxLxK=other)
    assert float(jnp.abs(h_other - h).max()) > 1e-3


@pytest.mark.slow
def test_remat_policies_same_grads_and_scan_is_depth_independent():
    base = tiny_moe()
    p = init_params(base, jax.random.key(6))
    inputs = _seq_inputs(jax.random.key(7), 1, 8, base.vocab_size)

    def grads(cfg):
        f = lambda p: jnp.sum(Qwen3(cfg).apply({"params": p}, *inputs) ** 2)
        return jax.jit(jax.grad(f))(p)

    ref = grads(base)
    chex.assert_trees_all_close(grads(base.replace(remat_policy="full")), ref, atol=1e-6)
    with pytest.raises(ValueError, match="unknown remat_policy"):
        grads(base.replace(remat_policy="bogus"))
    # nn.scan: the traced program has the same size for 2 and 12 layers
    n_eqns = lambda L: len(jax.make_jaxpr(lambda p: Qwen3(base.replace(num_layers=L)).apply({"params": p}, *inputs))(
        jax.eval_shape(lambda: init_params(base.replace(num_layers=L), jax.random.key(0)))).eqns)
    assert n_eqns(2) == n_eqns(12)


def test_bf16_compute_close_to_fp32():
    cfg = tiny_moe()
    p = init_params(cfg, jax.random.key(8))
    inputs = _seq_inputs(jax.random.key(9), 2, 8, cfg.vocab_size)
    h32 = _fwd(cfg, p, *inputs)
    h16 = _fwd(cfg.replace(dtype="bfloat16"), p, *inputs)
    assert h16.dtype == jnp.bfloat16 and jax.tree.leaves(p)[0].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(h16, np.float32), np.asarray(h32), atol=0.1, rtol=0.05)


def test_embedding_init_std_scales_only_the_embedding():
    """`embedding_init_std` (tiny from-scratch policies use 0.2) changes the embedding's init and nothing else."""
    base = init_params(tiny_dense(vocab_size=4096), jax.random.key(0))
    wide = init_params(tiny_dense(vocab_size=4096, embedding_init_std=0.2), jax.random.key(0))
    np.testing.assert_allclose(float(jnp.std(base["embedding"])), 0.02, rtol=0.03)
    np.testing.assert_allclose(float(jnp.std(wide["embedding"])), 0.2, rtol=0.03)
    rest = lambda p: {k: v for k, v in p.items() if k != "embedding"}
    chex.assert_trees_all_equal(rest(base), rest(wide))
