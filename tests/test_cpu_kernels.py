"""The CPU decode kernels (research/serving/cpu_kernels) == the XLA path they replace, the engine's fast path on
them == the full forward, and their build step fails saying what to install."""

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models import decode as decode_lib
from research.models import init_params, logits, tiny_moe
from research.models import moe as moe_lib
from research.models.qwen3 import Qwen3
from research.serving import cpu_kernels
from research.serving.cpu_kernels import __main__ as build_cli
from research.serving.qwen3_runner import Qwen3Runner

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU kernels")


def _rand(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape, np.float32))


@pytest.mark.parametrize("lead,K,N", [((1,), 256, 512), ((8,), 256, 2048), ((7,), 100, 37), ((40,), 64, 300),
                                      ((2, 5), 32, 16), ((3,), 17, 4097)])
def test_matmul_equals_xla_dot(lead, K, N):
    """Every row-tile size (1..6 and their mixes), partial last panels, leading batch axes, multi-threaded sizes."""
    rng = np.random.default_rng(K * N)
    x, w = _rand(rng, *lead, K), _rand(rng, K, N)
    packed = cpu_kernels.pack(w)
    assert packed.panels.shape == (-(-N // cpu_kernels.PANEL), K, cpu_kernels.PANEL) and packed.n == N
    y = jax.jit(cpu_kernels.matmul)(x, packed)
    assert y.shape == (*lead, N)
    np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-4 * np.sqrt(K))


@pytest.mark.parametrize("T", [1, 3, 9, 64])
def test_moe_equals_experts_dense(T):
    """Top-2 of 8 at decode and prefill sizes; a replayed routing that picks one expert twice counts it twice."""
    rng = np.random.default_rng(T)
    D, I, E, K = 64, 40, 8, 2
    x = _rand(rng, T, D)
    wg, wu, wo = _rand(rng, E, D, I) * 0.1, _rand(rng, E, D, I) * 0.1, _rand(rng, E, I, D) * 0.1
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32)
    ids[0] = [3, 3]
    gates = jnp.asarray(rng.random((T, K), np.float32))
    y = jax.jit(cpu_kernels.moe)(x, jnp.asarray(ids), gates, cpu_kernels.pack_experts(wg, wu, wo))
    np.testing.assert_allclose(y, moe_lib.experts_dense(x, jnp.asarray(ids), gates, wg, wu, wo), atol=2e-5)


def test_moe_rejects_out_of_range_expert():
    rng = np.random.default_rng(0)
    experts = cpu_kernels.pack_experts(_rand(rng, 4, 16, 16), _rand(rng, 4, 16, 16), _rand(rng, 4, 16, 16))
    with pytest.raises(Exception, match="expert id out of range"):
        jax.block_until_ready(cpu_kernels.moe(_rand(rng, 2, 16), jnp.array([[0, 4], [1, 2]], jnp.int32),
                                              jnp.ones((2, 2)), experts))


def test_attend_equals_xla_attend():
    """GQA, rows with no cached keys / all cached keys / a ctx_len past the bucket, a query with no visible key."""
    rng = np.random.default_rng(1)
    B, T, H, Kv, L, N, D = 4, 3, 8, 4, 10, 4, 32
    q, ck, cv, nk, nv = (_rand(rng, *s) for s in [(B, T, H, D), (B, Kv, L, D), (B, Kv, L, D), (B, Kv, N, D),
                                                   (B, Kv, N, D)])
    ctx_len = jnp.array([0, 5, 10, 12], jnp.int32)
    mask = jnp.asarray(rng.random((B, T, N)) < 0.5).at[0, 0].set(False).at[1, 1].set(True)
    got = jax.jit(cpu_kernels.attend)(q, ck, cv, ctx_len, nk, nv, mask)
    np.testing.assert_allclose(got, decode_lib._attend(q, ck, cv, ctx_len, nk, nv, mask), atol=1e-5)
    np.testing.assert_array_equal(got[0, 0], 0.0)  # nothing visible: zeros, like the XLA path


def test_modes_and_build_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("HRL_CPU_KERNELS", "off")
    assert not cpu_kernels.wanted("float32") and not Qwen3Runner(tiny_moe(dtype="float32")).kernels
    monkeypatch.setenv("HRL_CPU_KERNELS", "auto")
    assert cpu_kernels.wanted("float32") and not cpu_kernels.wanted("bfloat16")
    monkeypatch.setenv("HRL_CPU_KERNELS", "yes")
    with pytest.raises(ValueError, match="expected auto, on or off"):
        cpu_kernels.mode()
    monkeypatch.setenv("HRL_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(cpu_kernels.KernelBuildError, match="no C\\+\\+ compiler.*apt-get install g\\+\\+"):
        cpu_kernels.build()
    monkeypatch.setenv("CXX", "g++")
    monkeypatch.setattr(cpu_kernels, "SOURCE", tmp_path / "broken.cc")
    (tmp_path / "broken.cc").write_text("this is not C++\n")
    with pytest.raises(cpu_kernels.KernelBuildError, match="failed"):
        cpu_kernels.build()
    assert not list(tmp_path.glob("*.so"))  # nothing half-built left in the cache


def test_fast_path_on_kernels_matches_forward():
    """A MoE model with a dense middle layer: a prefill chunk and a 3-step decode block on the packed layout
    (every kernel: matmul, moe, attend, LM head) == the training module's full forward, logits and routing."""
    cfg = tiny_moe(num_layers=3, mlp_only_layers=(1,), dtype="float32")
    p = init_params(cfg, jax.random.key(5))
    ep = decode_lib.engine_params(p, cfg, cpu_kernels.OPS)
    assert isinstance(ep["head"], cpu_kernels.Packed) and "experts" in ep["layers"][0]["moe"]
    toks = [int(t) for t in jax.random.randint(jax.random.key(6), (8,), 0, cfg.vocab_size)]
    h, aux = Qwen3(cfg).apply({"params": p}, jnp.array([toks]), jnp.arange(8)[None], jnp.ones((1, 8), jnp.int32),
                              jnp.full((1, 8), 7), return_routing=True)
    ref, routed = logits(p, cfg, h)[0], aux["routed_experts"][0]
    cache = decode_lib.init_layer_cache(cfg, 2, 16)
    pf = jax.jit(functools.partial(decode_lib.prefill_slot, cfg=cfg, ops=cpu_kernels.OPS), static_argnames=("ctx_len",))
    lg, cache, r = pf(ep, cache=cache, slot=jnp.int32(1), tokens_C=jnp.array(toks[:5]), start=jnp.int32(0),
                      n_valid=jnp.int32(5), ctx_len=8)
    np.testing.assert_allclose(lg, ref[4], atol=1e-5)
    np.testing.assert_array_equal(r, routed[:5])
    step = jax.jit(functools.partial(decode_lib.block_decode_step, cfg=cfg, ops=cpu_kernels.OPS))
    ctx, buf = decode_lib.block_context(cache, 2, 8), decode_lib.block_buffer(cache, 2, 3)
    for i in range(3):
        pos = 5 + i
        lg, buf, r = step(ep, ctx=ctx, ctx_len_B=jnp.array([0, 5]), buf=buf, step=jnp.int32(i),
                          tokens_B=jnp.array([1, toks[pos]]), positions_B=jnp.array([0, pos]))
        np.testing.assert_allclose(lg[1], ref[pos], atol=1e-5)
        np.testing.assert_array_equal(r[1], routed[pos])


def test_shape_mismatches_are_precise_errors():
    """A call whose operands disagree fails with the target's message, never reads out of bounds."""
    cpu_kernels.load()
    x, panels = jnp.ones((2, 32)), jnp.ones((1, 32, 16))
    with pytest.raises(Exception, match="hrl_matmul: x, weight panels and result shapes disagree"):
        jax.block_until_ready(jax.ffi.ffi_call("hrl_matmul", jax.ShapeDtypeStruct((2, 20), jnp.float32))(x, panels))
    with pytest.raises(Exception, match="hrl_matmul: x, weight panels and result shapes disagree"):
        jax.block_until_ready(jax.ffi.ffi_call("hrl_matmul", jax.ShapeDtypeStruct((3, 16), jnp.float32))(x, panels))
    experts = cpu_kernels.pack_experts(jnp.ones((4, 16, 16)), jnp.ones((4, 16, 16)), jnp.ones((4, 16, 16)))
    with pytest.raises(Exception, match="hrl_moe: x, ids and expert weight shapes disagree"):
        jax.block_until_ready(cpu_kernels.moe(jnp.ones((2, 16)), jnp.zeros((2, 2), jnp.int32), jnp.ones((2, 3)),
                                              experts))


def test_concurrent_calls_from_several_threads_split_work_and_agree():
    """Calls big enough to be split over the intra-op pool, from four threads at once (an engine thread and a
    learner share the pool): each part is claimed once, a caller never waits on a task still queued behind
    another caller's, and every result equals the single-call one."""
    import concurrent.futures

    rng = np.random.default_rng(3)
    x, w = _rand(rng, 8, 256), _rand(rng, 256, 2048)
    packed = cpu_kernels.pack(w)
    fn = jax.jit(lambda x: cpu_kernels.matmul(x, packed))
    want = np.asarray(fn(x))

    def many(i):
        return [np.asarray(fn(x * 1.0)) for _ in range(25)]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for results in pool.map(many, range(4)):
            for got in results:
                np.testing.assert_array_equal(got, want)


def test_the_kernels_compile_warning_free_with_the_panel_from_python(tmp_path):
    """-Wall -Wextra -Werror (jaxlib's headers as system headers); the panel width comes from PANEL only."""
    cmd = cpu_kernels.compile_command(werror=True)
    assert f"-DHRL_PANEL={cpu_kernels.PANEL}" in cmd
    done = subprocess.run([*cmd, "-o", str(tmp_path / "k.so")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    no_panel = [a for a in cmd if not a.startswith("-DHRL_PANEL")]
    done = subprocess.run([*no_panel, "-o", str(tmp_path / "k2.so")], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "HRL_PANEL" in done.stderr


def _python(code_or_args: list[str], **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *code_or_args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_the_panel_width_is_pythons_panel_only(tmp_path):
    """PANEL is the one definition: built at another width (8: one AVX2 vector per panel row), every kernel that
    reads panels still equals the XLA path, partial last panels included."""
    script = """
import jax.numpy as jnp, numpy as np
from research.models import moe
from research.serving import cpu_kernels as k
k.PANEL = 8
rng = np.random.default_rng(0)
r = lambda *s: jnp.asarray(rng.standard_normal(s, np.float32))
x, w = r(5, 40), r(40, 37)
packed = k.pack(w)
assert packed.panels.shape == (5, 40, 8), packed.panels.shape
np.testing.assert_allclose(k.matmul(x, packed), x @ w, rtol=1e-5, atol=1e-3)
wg, wu, wo = r(4, 24, 20) * 0.1, r(4, 24, 20) * 0.1, r(4, 20, 24) * 0.1
ids, gates = jnp.array([[0, 3], [1, 1], [2, 0]], jnp.int32), jnp.asarray(rng.random((3, 2), np.float32))
np.testing.assert_allclose(k.moe(x[:3, :24], ids, gates, k.pack_experts(wg, wu, wo)),
                           moe.experts_dense(x[:3, :24], ids, gates, wg, wu, wo), atol=2e-5)
print(k.build())
"""
    done = _python(["-c", script], HRL_KERNEL_CACHE=str(tmp_path))
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().startswith(str(tmp_path))


def test_the_build_command_builds_into_the_cache_the_engine_loads():
    """`python -m research.serving.cpu_kernels build` (the install step) prints the library `load()` uses."""
    done = _python(["-m", "research.serving.cpu_kernels", "build"])
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip() == str(cpu_kernels.build())


def test_the_build_command_fails_naming_what_to_install(tmp_path):
    done = _python(["-m", "research.serving.cpu_kernels", "build"], CXX=str(tmp_path / "no-such-compiler"),
                   HRL_KERNEL_CACHE=str(tmp_path))
    assert done.returncode == 1
    assert "no C++ compiler" in done.stderr and "apt-get install g++" in done.stderr, done.stderr
    assert not list(tmp_path.glob("*.so"))


def test_missing_ffi_headers_name_the_jaxlib_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("HRL_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(jax.ffi, "include_dir", lambda: str(tmp_path / "include"))
    want = f"pip install --force-reinstall 'jaxlib=={jax.lib.__version__}'"
    with pytest.raises(cpu_kernels.KernelBuildError, match=want):
        cpu_kernels.build()


def test_a_cpu_without_avx2_serves_on_xla_unless_kernels_are_required(monkeypatch, capsys):
    """Nothing to install there: the build step succeeds and says XLA's ops serve, except under `on` (CI)."""
    monkeypatch.setattr(cpu_kernels, "_cpu_id", lambda: "flags : fpu sse sse2")
    monkeypatch.setenv("HRL_CPU_KERNELS", "auto")
    assert build_cli.main(["build"]) == 0
    assert "lacks AVX2/FMA: the engine serves on XLA's ops" in capsys.readouterr().err
    monkeypatch.setenv("HRL_CPU_KERNELS", "on")
    assert build_cli.main(["build"]) == 1
    monkeypatch.setenv("HRL_CPU_KERNELS", "off")
    assert build_cli.main(["build"]) == 0
    assert "not building" in capsys.readouterr().out
