"""The Qwen3-VL vision tower in flax.linen: patch embedding, resampled learned positions, axial 2-D RoPE,
bidirectional blocks per frame, the 2x2 patch merger and the DeepStack mergers.

    VisionTower(vcfg).apply({"params": p}, pixels_NxP, grid)   # grid: mrope.vision_grid(...) arrays
      -> (merged_MxO, (deepstack_MxO, ...))     M = N / merge**2 tokens, O = the text model's hidden size

`pixels_NxP` is the HF image processor's output (one row per patch, P = channels * temporal_patch * patch**2,
spatial-merge-block order). The DeepStack features (one per `deepstack_indexes` block, taken after it) are added
to the text model's hidden states at the image tokens after its first len(deepstack_indexes) layers.

Why the blocks are scanned in runs that end at each DeepStack index: compile time does not grow with depth (as in
qwen3.py) and each DeepStack feature is a run's output, so no per-layer stack of activations is kept. Params
`blocks_{run}` carry a leading `layers` axis; `hf_leaves` maps them to `model.visual.*` keys.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from research.models import hf_io
from research.models.hf_io import Leaf
from research.models.mrope import VisionGrid, rotate, vision_angles


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    depth: int = 27
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    out_hidden_size: int = 2048
    num_position_embeddings: int = 2304
    deepstack_indexes: tuple[int, ...] = (8, 16, 24)
    rope_theta: float = 10000.0
    layer_norm_eps: float = 1e-6
    dtype: str = "float32"
    param_dtype: str = "float32"
    # attention over more patches than this runs in query chunks of it, each recomputed in the backward pass:
    # O(chunk x N) memory instead of the [heads, N, N] scores of every block (16 screenshots' 16k patches: 16 GiB
    # per block in fp32, kept for all 27 blocks by the scan's backward)
    attention_chunk: int = 1024
    # recompute each block in the backward pass, keeping only its input: the tower runs on every device (a step's
    # images are replicated), so what it saves is not divided by the mesh (16k patches: ~1 GiB instead of ~30)
    remat: bool = True

    def __post_init__(self):
        side = int(round(self.num_position_embeddings ** 0.5))
        if side * side != self.num_position_embeddings:
            raise ValueError(f"num_position_embeddings={self.num_position_embeddings} is not a square")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4:
            raise ValueError(f"hidden_size {self.hidden_size} / num_heads {self.num_heads}: head_dim must divide by 4")
        if list(self.deepstack_indexes) != sorted(set(self.deepstack_indexes)) or \
                any(not 0 <= i < self.depth for i in self.deepstack_indexes):
            raise ValueError(f"deepstack_indexes {self.deepstack_indexes}: increasing block indexes < depth")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def side(self) -> int:
        return int(round(self.num_position_embeddings ** 0.5))

    def block_runs(self) -> list[tuple[int, int]]:
        """(first block, blocks) per scanned run; every DeepStack index ends a run."""
        ends = [i + 1 for i in self.deepstack_indexes] + [self.depth]
        runs, first = [], 0
        for e in ends:
            if e > first:
                runs.append((first, e - first))
                first = e
        return runs

    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> VisionConfig:
        """From a Qwen3-VL config.json's `vision_config` (or a path to config.json)."""
        if isinstance(hf, str | pathlib.Path):
            hf = json.loads(pathlib.Path(hf).read_text())["vision_config"]
        rope = hf.get("rope_parameters") or {}
        return cls(depth=hf["depth"], hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
                   num_heads=hf["num_heads"], in_channels=hf.get("in_channels", 3), patch_size=hf["patch_size"],
                   temporal_patch_size=hf.get("temporal_patch_size", 2),
                   spatial_merge_size=hf.get("spatial_merge_size", 2), out_hidden_size=hf["out_hidden_size"],
                   num_position_embeddings=hf["num_position_embeddings"],
                   deepstack_indexes=tuple(hf.get("deepstack_visual_indexes", ())),
                   rope_theta=float(rope.get("rope_theta", 10000.0)), **overrides)


def _dense(mod: nn.Module, name: str, shape: tuple[int, ...], axes: tuple, cfg: VisionConfig, x: Array) -> Array:
    """x @ kernel + bias, the kernel stored [in, out] with logical `axes`."""
    pdt, dt = jnp.dtype(cfg.param_dtype), jnp.dtype(cfg.dtype)
    w = mod.param(f"{name}_kernel", nn.with_logical_partitioning(nn.initializers.normal(0.02), axes), shape, pdt)
    b = mod.param(f"{name}_bias", nn.with_logical_partitioning(nn.initializers.zeros, axes[-1:]), shape[-1:], pdt)
    return x @ w.astype(dt) + b.astype(dt)


class LayerNorm(nn.Module):
    eps: float
    param_dtype: str = "float32"

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (d,),
                           jnp.dtype(self.param_dtype))
        bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), (d,),
                          jnp.dtype(self.param_dtype))
        xf = x.astype(jnp.float32)
        mu = xf.mean(-1, keepdims=True)
        var = ((xf - mu) ** 2).mean(-1, keepdims=True)
        return ((xf - mu) * jax.lax.rsqrt(var + self.eps) * scale + bias).astype(x.dtype)


class VisionBlock(nn.Module):
    """Pre-LayerNorm bidirectional attention (within a frame) + GELU(tanh) MLP. Scan body: (x, inputs) -> (x, None)."""

    cfg: VisionConfig

    @nn.compact
    def __call__(self, x_NxD, angles_NxD2, frame_N):
        cfg = self.cfg
        D, H, Dh = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        h = LayerNorm(cfg.layer_norm_eps, cfg.param_dtype, name="norm1")(x_NxD)
        qkv = _dense(self, "qkv", (D, 3 * D), ("embed", "heads"), cfg, h).reshape(-1, 3, H, Dh)
        q, k = rotate(qkv[:, 0], angles_NxD2), rotate(qkv[:, 1], angles_NxD2)
        o = frame_attention(q, k, qkv[:, 2], frame_N, cfg.attention_chunk).reshape(-1, D)
        x_NxD = x_NxD + _dense(self, "proj", (D, D), ("heads", "embed"), cfg, o)
        h = LayerNorm(cfg.layer_norm_eps, cfg.param_dtype, name="norm2")(x_NxD)
        h = jax.nn.gelu(_dense(self, "fc1", (D, cfg.intermediate_size), ("embed", "mlp"), cfg, h), approximate=True)
        return x_NxD + _dense(self, "fc2", (cfg.intermediate_size, D), ("mlp", "embed"), cfg, h), None


def frame_attention(q_NxHxD: Array, k_NxHxD: Array, v_NxHxD: Array, frame_N: Array, chunk: int) -> Array:
    """Bidirectional attention of each patch to the patches of its own frame. Above `chunk` patches the queries go
    in chunks (the largest power-of-two divisor of N up to `chunk`) under `jax.checkpoint`: each chunk's softmax is
    over all keys, so the result is the dense one, and the backward pass keeps no [H, N, N] scores."""
    N, H, Dh = q_NxHxD.shape

    def rows(q_CxHxD, f_C):
        s = jnp.einsum("nhd,mhd->hnm", q_CxHxD, k_NxHxD, preferred_element_type=jnp.float32) / np.sqrt(Dh)
        p = jax.nn.softmax(jnp.where((f_C[:, None] == frame_N[None, :])[None], s, -1e30), axis=-1)
        return jnp.einsum("hnm,mhd->nhd", p.astype(v_NxHxD.dtype), v_NxHxD)

    if N <= chunk:
        return rows(q_NxHxD, frame_N)
    C = math.gcd(N, 1 << (chunk.bit_length() - 1))
    out = jax.lax.map(jax.checkpoint(lambda a: rows(*a)), (q_NxHxD.reshape(N // C, C, H, Dh), frame_N.reshape(-1, C)))
    return out.reshape(N, H, Dh)


class PatchMerger(nn.Module):
    """merge x merge neighbouring patches -> one text-model token. `postshuffle`: LayerNorm over the concatenated
    patches (the DeepStack mergers) instead of over each patch (the final merger)."""

    cfg: VisionConfig
    postshuffle: bool

    @nn.compact
    def __call__(self, x_NxD):
        cfg = self.cfg
        W = cfg.hidden_size * cfg.spatial_merge_size ** 2
        if self.postshuffle:
            x = LayerNorm(cfg.layer_norm_eps, cfg.param_dtype, name="norm")(x_NxD.reshape(-1, W))
        else:
            x = LayerNorm(cfg.layer_norm_eps, cfg.param_dtype, name="norm")(x_NxD).reshape(-1, W)
        x = jax.nn.gelu(_dense(self, "fc1", (W, W), ("embed", "mlp"), cfg, x), approximate=False)
        return _dense(self, "fc2", (W, cfg.out_hidden_size), ("mlp", "embed"), cfg, x)


class VisionTower(nn.Module):
    cfg: VisionConfig

    @nn.compact
    def __call__(self, pixels_NxP: Float[Array, "N P"], grid: VisionGrid):
        cfg = self.cfg
        dt = jnp.dtype(cfg.dtype)
        x = _dense(self, "patch_embed", (cfg.patch_dim, cfg.hidden_size), ("mlp", "embed"), cfg, pixels_NxP.astype(dt))
        table = self.param("pos_embed", nn.with_logical_partitioning(nn.initializers.normal(0.02), (None, "embed")),
                           (cfg.num_position_embeddings, cfg.hidden_size), jnp.dtype(cfg.param_dtype))
        pos = jnp.einsum("nk,nkd->nd", jnp.asarray(grid.weights_Nx4), jnp.take(table, jnp.asarray(grid.taps_Nx4), 0))
        x = x + pos.astype(dt)
        angles = vision_angles(jnp.asarray(grid.hw_Nx2), cfg.head_dim, cfg.rope_theta)
        frame = jnp.asarray(grid.frame_N)
        deep = []
        for r, (first, n) in enumerate(cfg.block_runs()):
            body = nn.remat(VisionBlock, policy=jax.checkpoint_policies.nothing_saveable, prevent_cse=False) \
                if cfg.remat else VisionBlock
            scan = nn.scan(body, variable_axes={"params": 0}, split_rngs={"params": True},
                           in_axes=(nn.broadcast, nn.broadcast), length=n,
                           metadata_params={nn.PARTITION_NAME: "layers"})
            x, _ = scan(cfg, name=f"blocks_{r}")(x, angles, frame)
            if first + n - 1 in cfg.deepstack_indexes:
                k = cfg.deepstack_indexes.index(first + n - 1)
                deep.append(PatchMerger(cfg, postshuffle=True, name=f"deepstack_merger_{k}")(x))
        return PatchMerger(cfg, postshuffle=False, name="merger")(x), tuple(deep)


def _linear(path: tuple[str, ...], key: str, n_in: int, n_out: int, stack=(), kfn=None) -> list[Leaf]:
    """A torch Linear [out, in] + bias as our [in, out] kernel and bias (stacked over `stack` blocks)."""
    k = kfn or (lambda s: lambda *i: s)
    return [Leaf(path[:-1] + (f"{path[-1]}_kernel",), stack + (n_in, n_out), stack, k(f"{key}.weight"),
                 (n_out, n_in), lambda a: a.T, lambda a: a.T),
            Leaf(path[:-1] + (f"{path[-1]}_bias",), stack + (n_out,), stack, k(f"{key}.bias"), (n_out,),
                 np.asarray, np.asarray)]


def _norm(path: tuple[str, ...], key: str, d: int, stack=(), kfn=None) -> list[Leaf]:
    k = kfn or (lambda s: lambda *i: s)
    return [Leaf(path + ("scale",), stack + (d,), stack, k(f"{key}.weight"), (d,), np.asarray, np.asarray),
            Leaf(path + ("bias",), stack + (d,), stack, k(f"{key}.bias"), (d,), np.asarray, np.asarray)]


def _merger(path: tuple[str, ...], key: str, cfg: VisionConfig, postshuffle: bool) -> list[Leaf]:
    W = cfg.hidden_size * cfg.spatial_merge_size ** 2
    return (_norm(path + ("norm",), f"{key}.norm", W if postshuffle else cfg.hidden_size)
            + _linear(path + ("fc1",), f"{key}.linear_fc1", W, W)
            + _linear(path + ("fc2",), f"{key}.linear_fc2", W, cfg.out_hidden_size))


def hf_leaves(cfg: VisionConfig, prefix: str = "model.visual.") -> list[Leaf]:
    """The tower's param layout with its HF counterpart (`prefix`: "model.visual." in Qwen3VLForConditionalGeneration
    checkpoints, "" for a bare Qwen3VLVisionModel)."""
    D, F, P = cfg.hidden_size, cfg.intermediate_size, cfg.patch_dim
    out = [Leaf(("patch_embed_kernel",), (P, D), (), lambda: f"{prefix}patch_embed.proj.weight",
                (D, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size),
                lambda a: a.reshape(D, P).T, lambda a: a.T.reshape(D, cfg.in_channels, cfg.temporal_patch_size,
                                                                   cfg.patch_size, cfg.patch_size)),
           Leaf(("patch_embed_bias",), (D,), (), lambda: f"{prefix}patch_embed.proj.bias", (D,), np.asarray,
                np.asarray),
           Leaf(("pos_embed",), (cfg.num_position_embeddings, D), (), lambda: f"{prefix}pos_embed.weight",
                (cfg.num_position_embeddings, D), np.asarray, np.asarray)]
    for r, (first, n) in enumerate(cfg.block_runs()):
        pre, kf = (f"blocks_{r}",), (lambda s, f=first: lambda j: f"{prefix}blocks.{f + j}.{s}")
        out += _norm(pre + ("norm1",), "norm1", D, (n,), kf) + _norm(pre + ("norm2",), "norm2", D, (n,), kf)
        out += _linear(pre + ("qkv",), "attn.qkv", D, 3 * D, (n,), kf) + _linear(pre + ("proj",), "attn.proj", D, D,
                                                                                  (n,), kf)
        out += _linear(pre + ("fc1",), "mlp.linear_fc1", D, F, (n,), kf) + _linear(pre + ("fc2",), "mlp.linear_fc2",
                                                                                    F, D, (n,), kf)
    out += _merger(("merger",), f"{prefix}merger", cfg, False)
    for k in range(len(cfg.deepstack_indexes)):
        out += _merger((f"deepstack_merger_{k}",), f"{prefix}deepstack_merger_list.{k}", cfg, True)
    return out


def params_from_state(cfg: VisionConfig, get, prefix: str = "model.visual.") -> dict:  # noqa: ANN001
    """The tower's params from an HF state (`get(key) -> numpy array`: a safetensors reader, a state_dict)."""
    return hf_io.params_from_state(hf_leaves(cfg, prefix), get, cfg.param_dtype)
