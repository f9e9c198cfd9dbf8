"""Sharded == single device on 8 fake CPU devices, incl. the expert-parallel MoE path; sharded init."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from research.models import Qwen3, head_weight, logits, tiny_dense, tiny_moe
from research.models.logprobs import token_logprobs
from research.models.sharding import batch_sharding, init_sharded, make_mesh, param_shardings, use_mesh

B, T = 4, 16


def _inputs(V):
    toks = jax.random.randint(jax.random.key(7), (B, T), 0, V)
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    seg = jnp.ones((B, T), jnp.int32).at[1, 12:].set(2).at[3, 10:].set(0)
    end = jnp.where(seg == 2, T - 1, jnp.full((B, T), 11)).at[0].set(T - 1).at[2].set(T - 1).at[3].set(9)
    return toks, pos, seg, end


def _loss_and_logits(cfg, p, toks, pos, seg, end):
    h = Qwen3(cfg).apply({"params": p}, toks, pos, seg, end)
    tgt = jnp.roll(toks, -1, axis=1)
    logp, _ = token_logprobs(h, head_weight(p, cfg), tgt, chunk_size=32, return_entropy=False)
    mask = (seg > 0).astype(jnp.float32)
    return -(logp * mask).sum() / mask.sum(), logits(p, cfg, h)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _step(cfg, p, toks, pos, seg, end):
    (loss, lg), g = jax.value_and_grad(lambda p: _loss_and_logits(cfg, p, toks, pos, seg, end), has_aux=True)(p)
    return loss, lg, g


@pytest.mark.parametrize(
    "make,mesh_sizes,moe_impl",
    [
        (tiny_moe, dict(data=2, fsdp=1, expert=2, tensor=2), "blocked"),
        (tiny_moe, dict(data=1, fsdp=2, expert=2, tensor=2), "ragged"),
        (tiny_dense, dict(data=2, fsdp=2, expert=1, tensor=2), "blocked"),
    ],
)
@pytest.mark.slow
def test_sharded_equals_single_device(make, mesh_sizes, moe_impl):
    cfg1 = make(moe_impl=moe_impl)
    cfgN = cfg1.replace(expert_parallel=cfg1.is_moe)
    mesh = make_mesh(**mesh_sizes)
    pN = init_sharded(cfgN, mesh, jax.random.key(0))
    # params really are sharded per the rules table
    if cfg1.is_moe:
        assert pN["layers_0"]["moe"]["wi_gate"].sharding.spec == P(None, "expert", "fsdp", "tensor")
    assert pN["layers_0"]["attn"]["q_proj"].sharding.spec == P(None, "fsdp", "tensor", None)
    p1 = jax.tree.map(lambda a: jnp.asarray(np.asarray(a)), pN)
    inputs = _inputs(cfg1.vocab_size)
    loss1, lg1, g1 = _step(cfg1, p1, *inputs)
    shard_in = [jax.device_put(x, batch_sharding(cfgN, mesh)) for x in inputs]
    with use_mesh(mesh):
        lossN, lgN, gN = _step(cfgN, pN, *shard_in)
        if cfgN.expert_parallel:  # the expert-parallel shard_map really ran (not the no-mesh fallback)
            assert "shard_map" in str(jax.make_jaxpr(functools.partial(_step, cfgN))(pN, *shard_in))
    valid = np.asarray(inputs[2] > 0)
    np.testing.assert_allclose(np.asarray(lgN)[valid], np.asarray(lg1)[valid], atol=1e-5)
    np.testing.assert_allclose(float(lossN), float(loss1), atol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(gN), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, err_msg=jax.tree_util.keystr(path))


def test_param_shardings_cover_every_leaf():
    cfg = tiny_moe()
    mesh = make_mesh(data=2, fsdp=1, expert=2, tensor=2)
    sh = param_shardings(cfg, mesh)
    specs = {jax.tree_util.keystr(k): s.spec for k, s in jax.tree_util.tree_leaves_with_path(sh)}
    assert specs["['embedding']"] == P("tensor", "fsdp")
    assert specs["['lm_head']"] == P("fsdp", "tensor")
    assert specs["['layers_0']['moe']['router']"] == P(None, "fsdp", None)
    with pytest.raises(ValueError, match="needs 16 devices"):
        make_mesh(data=2, fsdp=2, expert=2, tensor=2)


def test_expert_parallel_with_indivisible_token_count():
    """3 tokens on a 4-way batch mesh: the EP kernel replicates tokens instead of failing."""
    from research.models.moe import experts_dense, experts_expert_parallel, route

    ks = jax.random.split(jax.random.key(3), 5)
    N, D, I, E = 3, 16, 8, 8
    x, router = jax.random.normal(ks[0], (N, D)), jax.random.normal(ks[1], (D, E))
    wg, wu, wo = (jax.random.normal(k, s) * 0.3 for k, s in zip(ks[2:], [(E, D, I), (E, D, I), (E, I, D)]))
    w, ids = route(x, router, top_k=2, norm_topk_prob=True)
    mesh = make_mesh(data=2, fsdp=1, expert=2, tensor=2)
    with use_mesh(mesh):
        y = jax.jit(functools.partial(experts_expert_parallel, impl="blocked", batch_rule=("data", "fsdp", "expert")))(
            x, ids, w, wg, wu, wo)
    np.testing.assert_allclose(np.asarray(y), np.asarray(experts_dense(x, ids, w, wg, wu, wo)), atol=1e-5)
