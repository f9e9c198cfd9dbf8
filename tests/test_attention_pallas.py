"""The Pallas tree-attention kernels (research/models/attention_pallas.py), both forms (gpu: Triton block-sparse
loop; tpu: Mosaic splash-style grid over the visible-block lists), in Pallas interpret mode on CPU against the
reference: values and gradients, random trees, padding, several block sizes. Plus: lowering for the real
targets (Triton for cuda, Mosaic for tpu) on this CPU machine, and what impl="auto" picks per backend."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention_ops import _grads, qkv, random_rows

from research.benchmarks.attention import tree_row as session_tree_row
from research.models import attention_ops as ao
from research.models import attention_pallas as ap

# (form, seed, B, T, H, K, blocks); T not a block multiple -> internal padding. Interpret mode compiles a
# large program (~10-30 s per case on a shared 2-core machine), so two cases are marked slow.
CASES = [
    ("gpu", 0, 2, 48, 4, 2, (16, 16)),
    ("tpu", 3, 2, 40, 6, 3, (16, 32)),
    pytest.param("gpu", 1, 2, 40, 4, 1, (32, 16), marks=pytest.mark.slow),
    pytest.param("tpu", 2, 2, 48, 4, 2, (32, 16), marks=pytest.mark.slow),
]


@pytest.mark.parametrize("form,seed,B,T,H,K,blocks", CASES)
def test_interpret_matches_reference_on_random_trees(form, seed, B, T, H, K, blocks):
    seg, _, end, _ = random_rows(seed, B, T)
    seg[-1, T // 2:] = 0  # the last row ends in padding
    end[-1, T // 2:] = np.arange(T // 2, T)
    seg, end = jnp.asarray(seg), jnp.asarray(end)
    q, k, v = qkv(seed, B, T, H, K, 8)
    g_ref, out_ref = _grads("reference", q, k, v, seg, end)
    g, out = _grads(f"pallas_{form}", q, k, v, seg, end, block_q=blocks[0], block_k=blocks[1])
    chex.assert_trees_all_close(out, out_ref, atol=1e-5)
    chex.assert_trees_all_close(g, g_ref, atol=1e-5)
    assert np.all(np.asarray(out)[np.asarray(seg) == 0] == 0)


@pytest.mark.parametrize("form", ap.FORMS)
def test_interpret_session_tree_and_all_padding_row(form):
    """A harness-shaped tree (most visited pairs unmasked) next to a row that is all padding."""
    seg1, end1, _ = session_tree_row(prefix=16, sessions=2, turns=3, turn_tokens=(3, 8), block=16, seed=1)
    T = seg1.shape[1]
    seg = jnp.asarray(np.concatenate([seg1, np.zeros_like(seg1)]))
    end = jnp.asarray(np.concatenate([end1, np.arange(T, dtype=np.int32)[None]]))
    q, k, v = qkv(5, 2, T, 4, 2, 16)
    g_ref, out_ref = _grads("reference", q, k, v, seg, end)
    g, out = _grads(f"pallas_{form}", q, k, v, seg, end, block_q=16, block_k=16)
    chex.assert_trees_all_close(out, out_ref, atol=1e-5)
    chex.assert_trees_all_close(g, g_ref, atol=1e-5)
    chex.assert_tree_all_finite(g)
    assert float(jnp.abs(out[1]).max()) == 0.0


def test_pallas_forward_equals_jnp_forward_with_lse():
    """The kernel's (out, lse) residuals are what the shared jnp backward consumes: equal to the jnp forward's."""
    seg, _, end, _ = random_rows(9, 1, 64)
    bl = ao._block_lists(jnp.asarray(seg), jnp.asarray(end), 16, 16, causal=False)
    qT, kT, vT = (jax.random.normal(jax.random.key(i), (n, 2, g * 16, 8)) for i, (n, g) in
                  enumerate([(4, 3), (4, 1), (4, 1)]))
    ref = ao._flash_fwd_impl(qT, kT, vT, bl, 3)
    for form in ap.FORMS:
        got = ap.flash_fwd_pallas(qT, kT, vT, bl, 3, form=form)
        chex.assert_trees_all_close(got, ref, atol=1e-5)
    # the gpu form's row/column tiles smaller than the 16-token blocks: 2 x 2 tiles per block pair
    chex.assert_trees_all_close(ap.flash_fwd_pallas(qT, kT, vT, bl, 3, form="gpu", gpu_tile=8), ref, atol=1e-5)
    with pytest.raises(ValueError, match="not multiples of the tile 12"):
        ap.flash_fwd_pallas(qT, kT, vT, bl, 3, form="gpu", gpu_tile=12)
    with pytest.raises(ValueError, match="pallas form 'cuda' not in"):
        ap.flash_fwd_pallas(qT, kT, vT, bl, 3, form="cuda")


@pytest.mark.parametrize("platform,marker", [("cuda", "__gpu$xla.gpu.triton"), ("tpu", "tpu_custom_call")])
def test_kernels_lower_for_the_real_targets(platform, marker):
    """Compiled (not interpreted) lowering at Qwen3-30B-A3B's head shapes and attend's 256-token blocks, bf16:
    the Pallas -> Triton / Mosaic lowering checks block shapes and ops without the hardware."""
    text = ao.lower_for(platform)
    assert marker in text and "interpret" not in text.lower()


def test_auto_picks_pallas_on_accelerators_and_blockwise_on_cpu(monkeypatch):
    assert jax.default_backend() == "cpu" and ao.auto_impl() == "blockwise"
    seg, _, end, _ = random_rows(4, 1, 32)
    q, k, v = qkv(0, 1, 32, 2, 1, 8)

    def jaxpr():  # a fresh function each time: jax caches traces per function
        f = lambda q: ao.attend(q, k, v, segment_ids_BxT=jnp.asarray(seg), subtree_end_BxT=jnp.asarray(end),
                                block_q=16, block_k=16)
        return str(jax.make_jaxpr(f)(q))

    assert "pallas_call" not in jaxpr()
    for backend, form in (("gpu", "gpu"), ("tpu", "tpu")):
        monkeypatch.setattr(jax, "default_backend", lambda b=backend: b)
        assert ao.auto_impl() == "pallas" and ap.default_form() == form
        assert "pallas_call" in jaxpr()  # traced only: nothing to compile it for here
