"""`ModelRunner` for Qwen3-VL (research/models/qwen3_vl.py): the JAX engine serving a vision-language policy.

What differs from the text runner, and why it stays small:
* Images are encoded once per request (per weight version) on the engine thread: the vision tower over the
  request's patches, its merged tokens and DeepStack features padded to a power-of-two bucket of rows (a few
  compilations, not one per image size). Each prefill chunk then carries its image tokens' row indices and its
  3-D RoPE positions (`mrope.rope_index` of the whole prompt, sliced), the text fast path does the rest.
* Decode needs no 3-D positions: every generated token is text, whose three RoPE components are equal, and
  3-D RoPE with equal components is 1-D RoPE at that position. Only the offset differs (an image of h x w
  merged tokens advances the position by max(h, w), not h * w), so the cache carries one int per slot, the
  rope offset (`rope_index`'s delta) set by each prefill and copied with the slot; decode adds it.
* Prefix reuse must tell images apart although their placeholder tokens are the same id: the engine matches
  prompts on a key in which each image's placeholders are a negative id derived from the image's sha256
  (`match_key`), so two prompts share cached K/V only up to where their images differ.
"""

from __future__ import annotations

import dataclasses
import hashlib

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from research.models import ModelConfig
from research.models import decode as model_decode
from research.models.decode import LayerKV, VisualChunk
from research.models.image_processor import ImageProcessorConfig
from research.models.mrope import IMAGE, TEXT, rope_index, vision_grid
from research.models.vision import VisionConfig, VisionTower
from research.serving.api import GenerateRequest
from research.serving.qwen3_runner import Qwen3Runner

_MIN_ROWS = 16


@flax.struct.dataclass
class VLCache:
    kv: LayerKV
    rope_delta_S: Int[Array, " S"]  # each slot's 3-D RoPE offset: decode position = cache index + delta


@flax.struct.dataclass
class ChunkImages:
    """One prefill chunk's multimodal inputs (a pytree the jitted prefill takes)."""

    rope_3xC: Int[Array, "3 C"]
    visual: VisualChunk
    delta: Int[Array, ""]


@dataclasses.dataclass
class RequestImages:
    """A request's images, encoded: its prompt's 3-D positions, each token's row (-1: text) and the rows."""

    positions_3xT: np.ndarray
    index_T: np.ndarray
    delta: int
    rows_MxD: jax.Array
    deep_KxMxD: jax.Array


def match_key(req: GenerateRequest, image_token_id: int) -> list[int]:
    """The prompt with each image's placeholder tokens replaced by a negative id of its sha256."""
    ids = list(req.prompt_ids)
    marks = iter(-(1 + int.from_bytes(hashlib.sha256(im.sha.encode()).digest()[:7], "big")) for im in req.images)
    mark, prev = None, False
    for i, t in enumerate(ids):
        is_img = t == image_token_id
        if is_img and not prev:
            mark = next(marks, -1)
        if is_img:
            ids[i] = mark
        prev = is_img
    return ids


class Qwen3VLRunner(Qwen3Runner):
    serves_images = True

    def __init__(self, text: ModelConfig, vision: VisionConfig, image_token_id: int, cache_dtype: str | None = None,
                 kernels: bool | None = None, image_processor: ImageProcessorConfig | None = None):
        if not text.mrope_section:
            raise ValueError("Qwen3VLRunner: the text config has no mrope_section (build it with configs_from_hf)")
        super().__init__(text, cache_dtype, kernels)
        self.vision, self.image_token_id = vision, int(image_token_id)
        self.image_processor = image_processor or processor_of(vision)
        p = self.image_processor
        if (p.patch_size, p.temporal_patch_size, p.merge_size) != (vision.patch_size, vision.temporal_patch_size,
                                                                    vision.spatial_merge_size):
            raise ValueError(f"image processor patch/temporal/merge {p.patch_size}/{p.temporal_patch_size}/"
                             f"{p.merge_size} != the tower's {vision.patch_size}/{vision.temporal_patch_size}/"
                             f"{vision.spatial_merge_size}")
        self.merge = vision.spatial_merge_size
        self._tower = jax.jit(lambda vp, px, grid: VisionTower(vision).apply({"params": vp}, px, grid))

    # ---- host side: checks and encoding (engine thread) ------------------------------------------------
    def check_images(self, req: GenerateRequest) -> None:
        """ValueError naming what is wrong with a request's images (the shim answers it as a 400)."""
        runs = _runs(np.asarray(req.prompt_ids) == self.image_token_id)
        want = [t * h * w // self.merge ** 2 for t, h, w in (im.grid_thw for im in req.images)]
        if [n for _, n in runs] != want:
            raise ValueError(f"the prompt's image token runs {[n for _, n in runs]} do not match its images' grids "
                             f"{[im.grid_thw for im in req.images]} (t*h*w/{self.merge ** 2} tokens each)")
        for i, im in enumerate(req.images):
            t, h, w = im.grid_thw
            if im.pixels_NxP.shape != (t * h * w, self.vision.patch_dim):
                raise ValueError(f"images[{i}]: pixels {im.pixels_NxP.shape}, its grid {im.grid_thw} needs "
                                 f"{(t * h * w, self.vision.patch_dim)}")

    def match_key(self, req: GenerateRequest) -> list[int]:
        return match_key(req, self.image_token_id)

    def encode_images(self, params, req: GenerateRequest) -> RequestImages:
        grids = [im.grid_thw for im in req.images]
        is_img = np.asarray(req.prompt_ids) == self.image_token_id
        positions, delta = rope_index(np.where(is_img, IMAGE, TEXT), grids, merge=self.merge)
        pixels = np.concatenate([im.pixels_NxP for im in req.images]).astype(np.float32)
        merged, deep = self._tower(params["visual"], pixels, vision_grid(grids, merge=self.merge,
                                                                         side=self.vision.side))
        m = merged.shape[0]
        rows = max(_MIN_ROWS, 1 << (m - 1).bit_length())
        pad = lambda a: jnp.pad(a, ((0, rows - m), (0, 0)))  # noqa: E731
        deep_K = jnp.stack([pad(d) for d in deep]) if deep else jnp.zeros((0, rows, merged.shape[1]), merged.dtype)
        index = np.where(is_img, np.cumsum(is_img) - 1, -1).astype(np.int32)
        return RequestImages(positions, index, delta, pad(merged), deep_K)

    def chunk_images(self, enc: RequestImages, start: int, chunk: int) -> ChunkImages:
        """The inputs of prefill chunk start..start+chunk-1 (padding past the prompt: text, the last position)."""
        T = enc.index_T.shape[0]
        take = np.minimum(np.arange(start, start + chunk), T - 1)
        index = np.where(np.arange(start, start + chunk) < T, enc.index_T[take], -1).astype(np.int32)
        return ChunkImages(enc.positions_3xT[:, take].astype(np.int32),
                           VisualChunk(index[None], enc.rows_MxD, enc.deep_KxMxD), np.int32(enc.delta))

    # ---- device side --------------------------------------------------------------------------------------
    def init_cache(self, slots: int, cache_len: int) -> VLCache:
        return VLCache(super().init_cache(slots, cache_len), jnp.zeros(slots, jnp.int32))

    def prepare_params(self, params):
        return {"lm": super().prepare_params(params["language_model"]), "visual": params["visual"]}

    def prefill(self, params, cache: VLCache, slot, tokens_C, start, n_valid, *, ctx_len: int,
                images: ChunkImages | None = None):
        logits_V, kv, routed_CxLxK = model_decode.prefill_slot(
            params["lm"], self.cfg, cache.kv, slot, tokens_C, start, n_valid, ctx_len=ctx_len, ops=self.ops,
            rope_3xC=None if images is None else images.rope_3xC, visual=None if images is None else images.visual)
        delta = cache.rope_delta_S.at[slot].set(0 if images is None else images.delta)
        experts = jax.lax.dynamic_index_in_dim(routed_CxLxK, n_valid - 1, axis=0, keepdims=False)
        return VLCache(kv, delta), logits_V, experts if self.routing_shape else None

    def block_context(self, cache: VLCache, batch: int, ctx_len: int):
        return model_decode.block_context(cache.kv, batch, ctx_len), cache.rope_delta_S[:batch]

    def block_buffer(self, cache: VLCache, batch: int, steps: int):
        return model_decode.block_buffer(cache.kv, batch, steps)

    def block_step(self, params, ctx, ctx_len_B, buf, step, tokens_B, positions_B: Int[Array, " B"]):
        kv, delta_B = ctx
        return super().block_step(params["lm"], kv, ctx_len_B, buf, step, tokens_B, positions_B + delta_B)

    def block_commit(self, cache: VLCache, buf, start_B, count_B) -> VLCache:
        return VLCache(model_decode.block_commit(cache.kv, buf, start_B, count_B), cache.rope_delta_S)

    def copy_slot(self, cache: VLCache, src, dst) -> VLCache:
        return VLCache(model_decode.copy_row(cache.kv, src, dst), cache.rope_delta_S.at[dst].set(
            cache.rope_delta_S[src]))


def _runs(mask_T: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each run of True."""
    edges = np.diff(np.concatenate([[0], mask_T.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return list(zip(starts.tolist(), (ends - starts).tolist()))


def processor_of(vision: VisionConfig) -> ImageProcessorConfig:
    """The image processor settings matching a vision tower (patch, temporal patch and merge sizes)."""
    return ImageProcessorConfig(patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
                                merge_size=vision.spatial_merge_size)

