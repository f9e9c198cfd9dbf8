"""Images -> the vision tower's input rows, as Qwen3-VL's image processor makes them (tested against transformers'
PIL Qwen2VL processor, which Qwen3-VL uses, in tests/test_image_processor.py).

Why our own: the shim must turn an API request's image into exactly the pixels and the number of placeholder
tokens the policy was trained on, on a host without torchvision, and refuse a bad image with a precise message
before anything is generated. The steps: decode (PIL), convert to RGB, resize to a multiple of patch*merge per side
with the area inside [min_pixels, max_pixels] (aspect kept), bicubic; scale to [0, 1], normalise by mean/std; cut
into patch rows in spatial-merge-block order, each patch repeated temporal_patch_size times (a still image is a
one-frame clip). grid (1, h/patch, w/patch); placeholder tokens = h*w / (patch*merge)**2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import pathlib

import numpy as np
from PIL import Image

FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP")


class ImageError(ValueError):
    """An image the processor refuses; the message says why (the shim answers it as a 4xx)."""


@dataclasses.dataclass(frozen=True)
class ImageProcessorConfig:
    """Qwen3-VL's preprocessor_config.json values by default (`from_hf` reads a checkpoint's own)."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 65536
    max_pixels: int = 16777216
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    max_bytes: int = 20 << 20  # an encoded image larger than this is refused before decoding
    max_source_pixels: int = 64 << 20  # and one that decodes to more pixels than this (a decompression bomb)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_hf(cls, path: str | pathlib.Path, **overrides) -> ImageProcessorConfig:
        p = pathlib.Path(path)
        d = json.loads((p / "preprocessor_config.json" if p.is_dir() else p).read_text())
        size = d.get("size") or {}
        return cls(patch_size=d.get("patch_size", 16), temporal_patch_size=d.get("temporal_patch_size", 2),
                   merge_size=d.get("merge_size", 2), min_pixels=size.get("shortest_edge", d.get("min_pixels", 65536)),
                   max_pixels=size.get("longest_edge", d.get("max_pixels", 16777216)),
                   image_mean=tuple(d.get("image_mean", (0.5,) * 3)), image_std=tuple(d.get("image_std", (0.5,) * 3)),
                   **overrides)


    def to_hf(self) -> dict:
        """preprocessor_config.json as a Qwen3-VL checkpoint ships it (`from_hf` reads it back unchanged)."""
        return {"image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor",
                "patch_size": self.patch_size, "temporal_patch_size": self.temporal_patch_size,
                "merge_size": self.merge_size,
                "size": {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
                "image_mean": list(self.image_mean), "image_std": list(self.image_std)}


def target_size(height: int, width: int, cfg: ImageProcessorConfig) -> tuple[int, int]:
    """(height, width) after resizing: multiples of patch*merge, area in [min_pixels, max_pixels], aspect kept."""
    f = cfg.factor
    if min(height, width) < 1:
        raise ImageError(f"image of {width}x{height} pixels: empty")
    if max(height, width) / min(height, width) > 200:
        raise ImageError(f"image of {width}x{height} pixels: aspect ratio above 200")
    h, w = round(height / f) * f, round(width / f) * f
    if h * w > cfg.max_pixels:
        scale = math.sqrt(height * width / cfg.max_pixels)
        h, w = max(f, math.floor(height / scale / f) * f), max(f, math.floor(width / scale / f) * f)
    elif h * w < cfg.min_pixels:
        scale = math.sqrt(cfg.min_pixels / (height * width))
        h, w = math.ceil(height * scale / f) * f, math.ceil(width * scale / f) * f
    return h, w


def decode(data: bytes, cfg: ImageProcessorConfig = ImageProcessorConfig()) -> tuple[Image.Image, str]:
    """Encoded bytes -> (an RGB PIL image, its format), or ImageError (too large, not an image, a format we do
    not take)."""
    if len(data) > cfg.max_bytes:
        raise ImageError(f"image of {len(data)} bytes: above the limit of {cfg.max_bytes}")
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.format not in FORMATS:
                raise ImageError(f"image format {im.format!r} not in {FORMATS}")
            if im.width * im.height > cfg.max_source_pixels:
                raise ImageError(f"image of {im.width}x{im.height} pixels: above {cfg.max_source_pixels} pixels")
            im.load()
            return im.convert("RGB"), im.format
    except ImageError:
        raise
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise ImageError(f"not a readable image ({type(e).__name__}: {e})") from None


def preprocess(image: Image.Image, cfg: ImageProcessorConfig = ImageProcessorConfig()
               ) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(pixels_NxP float32, grid (1, h, w) in patches) of one image."""
    rgb = image.convert("RGB")
    h, w = target_size(rgb.height, rgb.width, cfg)
    if (h, w) != (rgb.height, rgb.width):
        rgb = rgb.resize((w, h), resample=Image.Resampling.BICUBIC)
    x = (np.asarray(rgb, dtype=np.float64).transpose(2, 0, 1) * (1 / 255)).astype(np.float32)
    mean = np.asarray(cfg.image_mean, np.float32)[:, None, None]
    std = np.asarray(cfg.image_std, np.float32)[:, None, None]
    x = (x - mean) / std
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = h // p, w // p
    x = x.reshape(3, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)  # blocks, in-block, C, ph, pw
    x = np.broadcast_to(x[:, :, :, :, :, None], x.shape[:5] + (t, p, p))
    return np.ascontiguousarray(x.reshape(gh * gw, 3 * t * p * p)), (1, gh, gw)


def patch_rows(data: bytes, cfg: ImageProcessorConfig, grid: str, what: str) -> np.ndarray:
    """The patch rows of encoded image `data`, which its record names as of `grid` ("TxHxW"): another grid means
    another processor made the record, an error naming `what`."""
    im, _ = decode(data, cfg)
    with contextlib.closing(im):
        px, thw = preprocess(im, cfg)
    if "x".join(map(str, thw)) != grid:
        raise ValueError(f"{what}: preprocessed to grid {thw}, its record says {grid}")
    return px


def num_tokens(grid: tuple[int, int, int], cfg: ImageProcessorConfig = ImageProcessorConfig()) -> int:
    """Placeholder tokens of an image of `grid` in the rendered prompt."""
    t, h, w = grid
    return t * h * w // cfg.merge_size ** 2
