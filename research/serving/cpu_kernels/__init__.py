"""CPU decode kernels for the JAX engine: packed-panel matmul, a top-k MoE and the fast path's attention, as XLA
FFI custom calls, and `OPS`, the engine fast path's ops on them (`research.models.decode.EngineOps`).

Why: at decode a step multiplies a handful of rows by every weight matrix once, so it is bound by reading
the weights. XLA:CPU's dot reads them at 4-5 GB/s for [8, K] x [K, N] (it repacks the weight on every
call), and the all-experts MoE kernel that avoids XLA's slow gathers computes E/top_k times the useful
flops. `kernels.cc` streams weights packed once at load time (`pack`) and runs only the picked
experts; see `python -m launch.bench --suite=engine` for the effect
(docs/experiments/2026-12-02-engine-shim-measurements.md has the numbers).

They live in the serving layer because only the engine serves on them; research/models holds XLA's ops and
takes these as injected `EngineOps`, so the model never depends on a compiled library.

Build: `python -m research.serving.cpu_kernels build` (the README's install command and CI run it) compiles
the library with the host's C++ compiler for the host CPU (`-march=native`, AVX2 + FMA required) against
jaxlib's FFI headers into ``$HRL_KERNEL_CACHE`` (default ``~/.cache/harness-rl/kernels``), keyed by a hash of
the source, compile line, jaxlib, compiler and CPU; a failure names what to install. The first use builds too
when the library is missing (same cache). ``HRL_CPU_KERNELS``: ``auto`` (default: use them for fp32 on the CPU
backend when they build, else XLA's ops with a warning), ``off``, ``on`` (same, but a build failure is an
error: CI sets it). ``HRL_KERNEL_THREADS=N`` caps the threads one call is split over (default: one per core,
from XLA's intra-op pool). Same math as the XLA path in fp32; only the summation order differs
(tests/test_cpu_kernels.py).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import pathlib
import platform
import subprocess
import tempfile

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from research.models import decode

SOURCE = pathlib.Path(__file__).with_name("kernels.cc")
PANEL = 16  # the panel width (two 8-float AVX2 vectors); the only definition: kernels.cc gets -DHRL_PANEL=PANEL


class KernelBuildError(RuntimeError):
    """The library cannot be built here; the message says what to install."""


class UnsupportedCPU(KernelBuildError):
    """The CPU lacks AVX2/FMA: nothing to install, the engine serves on XLA's ops (an error only under `on`)."""


@flax.struct.dataclass
class Packed:
    """A [K, N] weight as PANEL-column panels [ceil(N/PANEL), K, PANEL] (zero-padded), for `matmul`."""

    panels: Float[Array, "P K PANEL"]
    n: int = flax.struct.field(pytree_node=False)


def pack(w_KxN: Float[Array, "K N"]) -> Packed:
    K, N = w_KxN.shape
    P = -(-N // PANEL)
    w = jnp.pad(w_KxN.astype(jnp.float32), ((0, 0), (0, P * PANEL - N)))
    return Packed(w.reshape(K, P, PANEL).transpose(1, 0, 2), N)


def pack_experts(wg_ExDxI, wu_ExDxI, wo_ExIxD) -> dict:
    """Expert weights for `moe`: gate_up [E, 2, Pi, D, PANEL] and down [E, Pd, I, PANEL]."""
    per_expert = jax.vmap(lambda w: pack(w).panels)
    return {"gate_up": jnp.stack([per_expert(wg_ExDxI), per_expert(wu_ExDxI)], axis=1),
            "down": per_expert(wo_ExIxD)}


def mode() -> str:
    m = os.environ.get("HRL_CPU_KERNELS", "auto").lower()
    if m not in ("auto", "on", "off"):
        raise ValueError(f"HRL_CPU_KERNELS={m!r}: expected auto, on or off")
    return m


def wanted(dtype) -> bool:
    """Whether the engine should use the kernels: fp32 compute on the CPU backend, the mode allowing, and the
    library built. A build failure is a warning under ``auto`` (XLA dots serve instead), an error under ``on``."""
    m = mode()
    if m == "off" or jax.default_backend() != "cpu" or jnp.dtype(dtype) != jnp.float32:
        return False
    try:
        load()
    except KernelBuildError as e:
        if m == "on":
            raise
        logging.warning("CPU decode kernels unavailable, using XLA dots: %s", e)
        return False
    return True


def _cpu_id() -> str:
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text()
        return next((ln for ln in info.splitlines() if ln.startswith("flags")), platform.processor())
    except OSError:
        return platform.processor()


def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise KernelBuildError(f"no C++ compiler: CXX={cxx} does not run ({e}); install one "
                               "(apt-get install g++) or point CXX at one") from e


def _check_ffi_headers() -> None:
    header = pathlib.Path(jax.ffi.include_dir()) / "xla/ffi/api/ffi.h"
    if not header.is_file():
        v = jax.lib.__version__
        raise KernelBuildError(f"jaxlib {v} ships no XLA FFI headers ({header} is missing): "
                               f"pip install --force-reinstall 'jaxlib=={v}'")


def compile_command(cxx: str = "g++", *, werror: bool = False) -> list[str]:
    """The kernels' compile line: warnings on (jaxlib's FFI headers as system headers, so only ours show)."""
    return [cxx, "-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-Wall", "-Wextra",
            *(["-Werror"] if werror else []), f"-DHRL_PANEL={PANEL}", f"-isystem{jax.ffi.include_dir()}", str(SOURCE)]


def build() -> pathlib.Path:
    """Compiles kernels.cc for this host (once; cached by content), returns the shared library's path. Checks
    the CPU, the compiler and jaxlib's headers first, so a failure says what is missing, not just g++'s error."""
    cpu = _cpu_id()
    if "avx2" not in cpu or "fma" not in cpu:
        raise UnsupportedCPU("the CPU lacks AVX2/FMA: the engine serves on XLA's ops (nothing to install)")
    cxx = os.environ.get("CXX", "g++")
    version = _compiler_version(cxx)
    _check_ffi_headers()
    parts = [SOURCE.read_text(), " ".join(compile_command(cxx)), jax.lib.__version__, version, cpu]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    cache = pathlib.Path(os.environ.get("HRL_KERNEL_CACHE", pathlib.Path.home() / ".cache/harness-rl/kernels"))
    cache.mkdir(parents=True, exist_ok=True)
    lib = cache / f"cpu_kernels-{key[:16]}.so"
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time across processes
        if lib.exists():
            return lib
        logging.info("compiling the CPU decode kernels into %s (once per source and host)", lib)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
        os.close(fd)
        cmd = [*compile_command(cxx), "-o", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            os.unlink(tmp)
            raise KernelBuildError(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
        os.replace(tmp, lib)
    return lib


@functools.cache
def load() -> ctypes.CDLL:
    """Builds (if needed), loads and registers the FFI targets (`hrl_matmul`, `hrl_moe`, `hrl_attend`) once."""
    lib = ctypes.cdll.LoadLibrary(str(build()))
    if os.environ.get("HRL_KERNEL_THREADS"):  # cap the parts a call is split into (1: single-threaded)
        lib.hrl_set_threading(ctypes.c_int64(1 << 17), ctypes.c_int64(int(os.environ["HRL_KERNEL_THREADS"])))
    jax.ffi.register_ffi_target("hrl_matmul", jax.ffi.pycapsule(lib.HrlMatmul), platform="cpu")
    jax.ffi.register_ffi_target("hrl_moe", jax.ffi.pycapsule(lib.HrlMoe), platform="cpu")
    jax.ffi.register_ffi_target("hrl_attend", jax.ffi.pycapsule(lib.HrlAttend), platform="cpu")
    return lib


def matmul(x_MxK: Float[Array, "... K"], w: Packed) -> Float[Array, "... N"]:
    """x @ W for a packed W (fp32)."""
    load()
    out = jax.ShapeDtypeStruct(x_MxK.shape[:-1] + (w.n,), jnp.float32)
    return jax.ffi.ffi_call("hrl_matmul", out, vmap_method="sequential")(x_MxK.astype(jnp.float32), w.panels)


def moe(x_TxD: Float[Array, "T D"], ids_TxK: Int[Array, "T K"], gates_TxK: Float[Array, "T K"],
        experts: dict) -> Float[Array, "T D"]:
    """sum_k gates[t, k] * SwiGLU_{ids[t, k]}(x[t]): the dropless top-k MoE, reading only picked experts."""
    load()
    out = jax.ShapeDtypeStruct(x_TxD.shape, jnp.float32)
    return jax.ffi.ffi_call("hrl_moe", out, vmap_method="sequential")(
        x_TxD.astype(jnp.float32), ids_TxK.astype(jnp.int32), gates_TxK.astype(jnp.float32),
        experts["gate_up"], experts["down"])


def attend(q_BxTxHxD: Float[Array, "B T H D"], ctx_k_BxKxLxD: Float[Array, "B K L D"],
           ctx_v_BxKxLxD: Float[Array, "B K L D"], ctx_len_B: Int[Array, "B"], new_k_BxKxNxD: Float[Array, "B K N D"],
           new_v_BxKxNxD: Float[Array, "B K N D"], new_mask_BxTxN) -> Float[Array, "B T H D"]:
    """decode._attend in one kernel (fp32): softmax over the first ctx_len_B[b] cached keys + masked buffer keys."""
    load()
    f32 = lambda a: a.astype(jnp.float32)
    return jax.ffi.ffi_call("hrl_attend", jax.ShapeDtypeStruct(q_BxTxHxD.shape, jnp.float32), vmap_method="sequential")(
        f32(q_BxTxHxD), f32(ctx_k_BxKxLxD), f32(ctx_v_BxKxLxD), ctx_len_B.astype(jnp.int32), f32(new_k_BxKxNxD),
        f32(new_v_BxKxNxD), new_mask_BxTxN.astype(bool))


class KernelOps(decode.EngineOps):
    """The engine fast path on these kernels: every matrix and the LM head `Packed`, MoE experts as
    `pack_experts` under "experts" (any token count reads only the picked experts), attention in one call."""

    def pack(self, w_KxN):
        return pack(w_KxN)

    def pack_moe(self, m: dict) -> dict:
        return {"router": m["router"], "experts": pack_experts(m["wi_gate"], m["wi_up"], m["wo"])}

    def matmul(self, x, w):
        return matmul(x, w)

    def head(self, hidden_BxTxD, w):
        return matmul(hidden_BxTxD, w)

    def attend(self, q, ctx_k, *rest):
        # the kernel is fp32: a bf16 model served on the kernels keeps XLA's attention in its own dtype
        return attend(q, ctx_k, *rest) if ctx_k.dtype == jnp.float32 else super().attend(q, ctx_k, *rest)

    def experts(self, cfg, x_NxD, ids_NxK, w_NxK, mp):
        return moe(x_NxD, ids_NxK, w_NxK, mp["experts"])


OPS = KernelOps()
