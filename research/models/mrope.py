"""Positions for Qwen3-VL: the vision tower's per-patch grid (host side) and the text model's multimodal RoPE.

Why host side: every quantity here follows from the images' grids `(t, h, w)` (patches per side), which the shim
knows when it renders a request. Computing them in numpy keeps the jitted tower's shapes a function of the patch
count alone and lets the same arrays travel with a packed batch.

Layout conventions (those of `transformers`' qwen3_vl, tested against it in tests/test_qwen3_vl.py):
* patches arrive in spatial-merge-block order: for each frame, blocks of `merge x merge` patches row-major over
  the block grid, and inside a block row-major; each frame attends only to itself;
* the learned position table is a square `side x side` grid, resampled to each image's `(h, w)` bilinearly with
  aligned corners (4 taps per patch);
* text RoPE is 3-D (temporal, height, width). Text tokens carry the same index on all three axes; an image's
  tokens carry `start + (t, row, col)` on its merged grid, and the text after it resumes at
  `start + max(h, w) / merge`. The frequencies are interleaved: frequency i rotates by the H position when
  i % 3 == 1 and i < 3 * section[1], by W when i % 3 == 2 and i < 3 * section[2], else by T.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.struct
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

TEXT, IMAGE = 0, 1  # token types of a rendered sequence


def rotate(x_NxHxD: Float[Array, "... H D"], angles_NxD2: Float[Array, "... D2"]) -> Array:
    """RoPE in the HF "rotate_half" layout (first and second halves of head_dim pair up) with given angles."""
    D = x_NxHxD.shape[-1]
    cos, sin = jnp.cos(angles_NxD2)[..., None, :], jnp.sin(angles_NxD2)[..., None, :]
    xf = x_NxHxD.astype(jnp.float32)
    x1, x2 = xf[..., : D // 2], xf[..., D // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x_NxHxD.dtype)


@flax.struct.dataclass
class VisionGrid:
    """Per-patch inputs of the vision tower for a list of images (or video frames): a pytree of arrays (built as
    host numpy by `vision_grid`), so a jitted tower takes it as an argument."""

    hw_Nx2: np.ndarray  # (row, col) of each patch in its image: the tower's 2-D RoPE positions
    taps_Nx4: np.ndarray  # indices into the flattened side x side learned position table
    weights_Nx4: np.ndarray  # their bilinear weights
    frame_N: np.ndarray  # which frame a patch belongs to (attention stays inside a frame)
    merged_per_image: tuple[int, ...] = flax.struct.field(pytree_node=False)  # t * h * w / merge**2 per image

    @property
    def num_patches(self) -> int:
        return int(self.hw_Nx2.shape[0])


def _check_grid(grid_thw: Sequence[Sequence[int]], merge: int) -> list[tuple[int, int, int]]:
    out = []
    for i, g in enumerate(grid_thw):
        t, h, w = (int(v) for v in g)
        if min(t, h, w) < 1 or h % merge or w % merge:
            raise ValueError(f"grid_thw[{i}] = {(t, h, w)}: need t, h, w >= 1 and h, w multiples of merge={merge}")
        out.append((t, h, w))
    return out


def _block_order(h: int, w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of each patch of an h x w frame in spatial-merge-block order."""
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    return rows.reshape(shape).transpose(0, 2, 1, 3).ravel(), cols.reshape(shape).transpose(0, 2, 1, 3).ravel()


def _bilinear(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Two taps per target index into a `side`-long axis resampled to `size` (align_corners=True) and weights."""
    src = index.astype(np.float64) * (side - 1) / max(size - 1, 1)
    floor = np.floor(src)
    raw = floor[:, None] + np.arange(2)
    weights = np.clip(1.0 - np.abs(src[:, None] - raw), 0.0, None)
    return np.clip(raw, 0, side - 1).astype(np.int64), weights


def vision_grid(grid_thw: Sequence[Sequence[int]], *, merge: int, side: int) -> VisionGrid:
    """The tower's per-patch inputs for images of `grid_thw` (patches per axis; `side`: sqrt of the learned
    position table's size)."""
    hw, taps, weights, frames, merged = [], [], [], [], []
    frame = 0
    for t, h, w in _check_grid(grid_thw, merge):
        rows, cols = _block_order(h, w, merge)
        ht, hw_ = _bilinear(rows, h, side)
        wt, ww = _bilinear(cols, w, side)
        tap = (ht[:, :, None] * side + wt[:, None, :]).reshape(-1, 4)
        wgt = (hw_[:, :, None] * ww[:, None, :]).reshape(-1, 4)
        for _ in range(t):
            hw.append(np.stack([rows, cols], -1))
            taps.append(tap)
            weights.append(wgt)
            frames.append(np.full(h * w, frame))
            frame += 1
        merged.append(t * h * w // merge**2)
    cat = lambda xs, dt: np.concatenate(xs).astype(dt)  # noqa: E731
    return VisionGrid(cat(hw, np.int32), cat(taps, np.int32), cat(weights, np.float32), cat(frames, np.int32),
                      tuple(merged))


def vision_angles(hw_Nx2: Int[Array, "N 2"], head_dim: int, theta: float) -> Float[Array, "N D2"]:
    """The tower's axial 2-D RoPE angles: head_dim/4 frequencies for the row, the same ones for the column."""
    half = head_dim // 2
    inv = 1.0 / (theta ** (jnp.arange(0, half, 2, dtype=jnp.float32) / half))
    ang = hw_Nx2.astype(jnp.float32)[:, :, None] * inv  # [N, 2, head_dim/4]
    return jnp.concatenate([ang[:, 0], ang[:, 1]], axis=-1)


def rope_index(token_type_T: Sequence[int], grid_thw: Sequence[Sequence[int]], *, merge: int) -> tuple[np.ndarray, int]:
    """(positions_3xT, delta) of one rendered sequence: `token_type_T` marks each image placeholder token IMAGE
    (one run of t*h*w/merge**2 tokens per image of `grid_thw`, in order), everything else TEXT. `delta`
    (max position + 1 - length) continues the positions of tokens generated after the sequence."""
    types = np.asarray(token_type_T)
    grids = iter(_check_grid(grid_thw, merge))
    out, pos, i = [], 0, 0
    while i < len(types):
        j = i
        while j < len(types) and types[j] == types[i]:
            j += 1
        if types[i] == TEXT:
            out.append(np.broadcast_to(np.arange(pos, pos + j - i), (3, j - i)))
            pos += j - i
            i = j
            continue
        try:
            t, h, w = next(grids)
        except StopIteration:
            raise ValueError(f"token_type_T: an image run at {i} beyond the {len(grid_thw)} grids given") from None
        lh, lw = h // merge, w // merge
        if j - i < t * lh * lw:
            raise ValueError(f"token_type_T: the image run at {i} has {j - i} tokens, its grid needs {t * lh * lw}")
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(lh), np.arange(lw), indexing="ij")
        out.append(np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + pos)
        pos += max(h, w) // merge
        i += t * lh * lw  # a longer run is the next image right after this one
    positions = np.concatenate(out, axis=1) if out else np.zeros((3, 0), np.int64)
    return positions.astype(np.int32), int(positions.max() + 1 - len(types)) if len(types) else 0


def mrope_angles(positions_3xBxT: Int[Array, "3 B T"], head_dim: int, theta: float,
                 section: Sequence[int]) -> Float[Array, "B T D2"]:
    """The text model's interleaved multimodal RoPE angles (see the module docstring for the layout)."""
    inv = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    ang = positions_3xBxT.astype(jnp.float32)[..., None] * inv  # [3, B, T, head_dim/2]
    i = np.arange(head_dim // 2)
    axis = np.where((i % 3 == 1) & (i < 3 * section[1]), 1, np.where((i % 3 == 2) & (i < 3 * section[2]), 2, 0))
    return jnp.where(axis == 0, ang[0], jnp.where(axis == 1, ang[1], ang[2]))
