"""research/models/image_processor.py against transformers' PIL Qwen2VL image processor (the one Qwen3-VL uses)
with Qwen3-VL's settings: the same pixel rows, grids and placeholder counts; bad images refused precisely."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from research.models import image_processor as ip

hf_mod = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
CFG = ip.ImageProcessorConfig(min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 64)  # small limits: both branches run


def _hf():
    return hf_mod.Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2,
                                           size={"shortest_edge": CFG.min_pixels, "longest_edge": CFG.max_pixels},
                                           image_mean=[0.5] * 3, image_std=[0.5] * 3)


def _image(w, h, mode="RGB", seed=0):
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (h, w, len(mode) if mode != "L" else 1), dtype=np.uint8)
    return Image.fromarray(arr[..., 0] if mode == "L" else arr, mode)


@pytest.mark.parametrize("w,h,mode", [(64, 64, "RGB"), (40, 30, "RGB"), (500, 120, "RGB"), (333, 517, "RGBA"),
                                      (97, 61, "L"), (1000, 20, "RGB")])
def test_pixels_and_grid_match_transformers(w, h, mode):
    im = _image(w, h, mode)
    ours, grid = ip.preprocess(im, CFG)
    theirs = _hf()(images=[im.convert("RGB")], return_tensors="np")
    assert grid == tuple(int(v) for v in theirs["image_grid_thw"][0])
    np.testing.assert_allclose(ours, theirs["pixel_values"], atol=1e-6, rtol=0)
    side_h, side_w = grid[1] * 16, grid[2] * 16
    assert side_h % 32 == side_w % 32 == 0 and CFG.min_pixels <= side_h * side_w <= CFG.max_pixels
    assert ip.num_tokens(grid, CFG) == grid[1] * grid[2] // 4 == ours.shape[0] // 4


def _encoded(im, fmt):
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return buf.getvalue()


def test_decode_takes_common_formats_and_refuses_bad_images():
    im = _image(50, 40)
    for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP"):
        out, got = ip.decode(_encoded(im, fmt))
        assert out.mode == "RGB" and out.size == (50, 40) and got == fmt
    with pytest.raises(ip.ImageError, match="not a readable image"):
        ip.decode(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)  # a PNG signature, then garbage
    with pytest.raises(ip.ImageError, match="not a readable image"):
        ip.decode(b"plain text, not an image")
    with pytest.raises(ip.ImageError, match="above the limit"):
        ip.decode(_encoded(im, "PNG"), ip.ImageProcessorConfig(max_bytes=100))
    with pytest.raises(ip.ImageError, match="pixels: above"):
        ip.decode(_encoded(_image(300, 300), "PNG"), ip.ImageProcessorConfig(max_source_pixels=10_000))
    with pytest.raises(ip.ImageError, match="format 'TIFF'"):
        ip.decode(_encoded(im, "TIFF"))
    with pytest.raises(ip.ImageError, match="aspect ratio"):
        ip.preprocess(_image(1000, 4), CFG)
