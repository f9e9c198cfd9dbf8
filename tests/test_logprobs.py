"""Chunked fused-head log-probs: == full-logits values and gradients; compiled memory far below [T, V]."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models.logprobs import token_logprobs


def full_logprobs(h, w, t, temperature=1.0):
    """The naive computation the chunked one must equal: materialise all fp32 logits."""
    z = jnp.einsum("btd,dv->btv", h, w, precision="highest") / temperature
    logp_all = jax.nn.log_softmax(z, axis=-1)
    logp = jnp.take_along_axis(logp_all, t[..., None], axis=-1)[..., 0]
    ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return logp, ent


def _inputs(seed, B=2, T=37, D=16, V=101):
    ks = jax.random.split(jax.random.key(seed), 3)
    h = jax.random.normal(ks[0], (B, T, D))
    w = jax.random.normal(ks[1], (D, V)) * 0.5
    t = jax.random.randint(ks[2], (B, T), 0, V)
    return h, w, t


def _loss_and_grads(fn, h, w, t):
    """A loss that uses both outputs with per-token weights, so every gradient path is exercised."""
    a = jnp.cos(jnp.arange(t.size, dtype=jnp.float32)).reshape(t.shape)

    def loss(h, w):
        logp, ent = fn(h, w, t)
        return jnp.sum(a * logp) + 0.3 * jnp.sum(a[:, ::-1] * ent), (logp, ent)

    return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(h, w)


@pytest.mark.parametrize("chunk_size,temperature", [(8, 1.0), (5, 0.7), (1000, 1.3)])
def test_chunked_equals_full_values_and_grads(chunk_size, temperature):
    h, w, t = _inputs(0)
    with jax.default_matmul_precision("highest"):
        (l_c, (lp_c, ent_c)), g_c = _loss_and_grads(
            lambda h, w, t: token_logprobs(h, w, t, chunk_size=chunk_size, temperature=temperature), h, w, t
        )
        (l_f, (lp_f, ent_f)), g_f = _loss_and_grads(lambda h, w, t: full_logprobs(h, w, t, temperature), h, w, t)
    chex.assert_trees_all_close((lp_c, ent_c), (lp_f, ent_f), atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(l_c, l_f, rtol=1e-5)
    chex.assert_trees_all_close(g_c, g_f, atol=1e-5, rtol=1e-5)


def test_logprobs_are_normalised():
    h, w, _ = _inputs(1, B=1, T=3, V=11)
    lp = jnp.stack([token_logprobs(h, w, jnp.full((1, 3), v), chunk_size=2)[0] for v in range(11)])
    np.testing.assert_allclose(jnp.exp(lp).sum(0), 1.0, rtol=1e-5)


def test_grads_without_entropy():
    h, w, t = _inputs(3)
    a = jnp.sin(jnp.arange(t.size, dtype=jnp.float32)).reshape(t.shape)
    with jax.default_matmul_precision("highest"):
        g_c = jax.grad(
            lambda h, w: jnp.sum(a * token_logprobs(h, w, t, chunk_size=7, return_entropy=False)[0]), argnums=(0, 1)
        )(h, w)
        g_f = jax.grad(lambda h, w: jnp.sum(a * full_logprobs(h, w, t)[0]), argnums=(0, 1))(h, w)
    chex.assert_trees_all_close(g_c, g_f, atol=1e-5, rtol=1e-5)


def test_no_entropy_and_bf16():
    h, w, t = _inputs(2)
    lp, ent = token_logprobs(h, w, t, chunk_size=16, return_entropy=False)
    assert ent is None
    lp_bf, _ = token_logprobs(h, w, t, chunk_size=16, compute_dtype=jnp.bfloat16)
    assert lp_bf.dtype == jnp.float32
    chex.assert_trees_all_close(lp_bf, lp, atol=0.25)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(h, w, t, temperature=0.0)


def test_compiled_memory_at_32k_tokens_real_vocab():
    """AOT-compile fwd+bwd at T=32k, V=151936, D=2048: temp memory must be far below the 19 GB of logits."""
    T, V, D = 32768, 151936, 2048
    full_logits_bytes = T * V * 4

    def loss(h, w, t):
        logp, ent = token_logprobs(h, w, t, chunk_size=1024)
        return jnp.sum(logp) + 0.01 * jnp.sum(ent)

    args = (
        jax.ShapeDtypeStruct((1, T, D), jnp.bfloat16),
        jax.ShapeDtypeStruct((D, V), jnp.float32),
        jax.ShapeDtypeStruct((1, T), jnp.int32),
    )
    fwd = jax.jit(loss).lower(*args).compile().memory_analysis()
    bwd = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile().memory_analysis()
    print(
        f"\ntoken_logprobs T={T} V={V} D={D}: full fp32 logits {full_logits_bytes / 1e9:.1f} GB; "
        f"compiled temp fwd {fwd.temp_size_in_bytes / 1e9:.2f} GB, fwd+bwd {bwd.temp_size_in_bytes / 1e9:.2f} GB "
        f"(+ d(head) output {bwd.output_size_in_bytes / 1e9:.2f} GB)"
    )
    # O(chunk), not O(T): the forward holds a chunk's logits and their exp (one exp pass feeds the
    # log-sum-exp and the entropy), the backward a few more; 32 chunks' logits would be the unchunked cost.
    chunk_logits_bytes = 1024 * V * 4
    assert fwd.temp_size_in_bytes < 4 * chunk_logits_bytes and fwd.temp_size_in_bytes <= bwd.temp_size_in_bytes
    assert bwd.temp_size_in_bytes < 6 * chunk_logits_bytes
