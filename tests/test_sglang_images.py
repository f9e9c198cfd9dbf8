"""Images on SGLang's native wire (research/serving/image_wire.py): the client sends one placeholder per image and
the bytes, the server (launch/serve.py's clone, over the JAX engine serving a tiny Qwen3-VL) expands them with its
processor; the round trip samples and scores exactly what the engine does on the shim's expanded prompt, and a
server whose expansion differs from the record is an error, never a silent misalignment."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json

import aiohttp
import jax
import numpy as np
import pytest
from PIL import Image

from research.models import ModelConfig
from research.models import image_processor as ip
from research.models.qwen3_vl import Qwen3VL, dummy_inputs
from research.models.vision import VisionConfig
from research.serving import image_wire
from research.serving.api import EngineError, GenerateRequest, ImageInput, SamplingParams
from research.serving.jax_engine import EngineConfig, JaxEngine
from research.serving.native_server import NativeServer
from research.serving.qwen3_vl_runner import Qwen3VLRunner
from research.serving.replay import ReplayEngine
from research.serving.sglang_client import SGLangClient

PAD, VS, VE = 60, 61, 62
VISION = VisionConfig(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=4, out_hidden_size=32,
                      num_position_embeddings=16, deepstack_indexes=(0, 1))
TEXT = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=16, mrope_section=(2, 3, 3), deepstack_layers=2, dtype="float32", rope_theta=1e4)
PROC = ip.ImageProcessorConfig(patch_size=4, min_pixels=8 * 8, max_pixels=16 * 16)


def _png(seed: int, hw=(13, 11)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*hw, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _image(data: bytes) -> ImageInput:
    """What the shim's Vision.inputs makes of an image: pixels, grid and the bytes as sent."""
    im, _ = ip.decode(data, PROC)
    px, thw = ip.preprocess(im, PROC)
    return ImageInput(hashlib.sha256(data).hexdigest(), thw, px, data)


def _req(images, extra_pads: int = 0) -> GenerateRequest:
    ids = [1, 2, 3]
    for i, im in enumerate(images):
        ids += [VS] + [PAD] * (ip.num_tokens(im.grid_thw, PROC) + extra_pads) + [VE, 10 + i]
    return GenerateRequest(ids, SamplingParams(temperature=0.0, max_new_tokens=6), images=tuple(images))


def test_collapse_expand_and_data_urls():
    ids = [1, PAD, PAD, PAD, 2, PAD, 3, PAD, PAD]
    short, lengths = image_wire.collapse(ids, PAD)
    assert short == [1, PAD, 2, PAD, 3, PAD] and lengths == [3, 1, 2]
    assert image_wire.expand(short, PAD, lengths) == ids
    with pytest.raises(ValueError, match="hold 3 image tokens .* for 2 image_data"):
        image_wire.expand(short, PAD, [3, 1])
    png = _png(0)
    url = image_wire.data_url(png)
    assert url.startswith("data:image/png;base64,") and image_wire.image_bytes(url, "x") == png
    assert image_wire.image_bytes(base64.b64encode(png).decode(), "x") == png  # bare base64, as SGLang takes
    with pytest.raises(ValueError, match="unknown kind"):
        image_wire.data_url(b"hello")
    with pytest.raises(ValueError, match=r"image_data\[0\]: only inline"):
        image_wire.image_bytes("http://example.com/a.png", "image_data[0]")
    with pytest.raises(ValueError, match="not valid base64"):
        image_wire.image_bytes("data:image/png;base64,@@@", "image_data[0]")


@pytest.fixture(scope="module")
def vl_engine():
    m = Qwen3VL(TEXT, VISION, PAD)
    args, kw = dummy_inputs(VISION, PAD)
    params = m.init(jax.random.key(3), *args, **kw)["params"]
    params = jax.tree.map(lambda a: a * 3.0 if a.ndim == 2 else a, params)  # sharper logits: distinct tokens
    eng = JaxEngine(Qwen3VLRunner(TEXT, VISION, PAD, image_processor=PROC), params,
                    config=EngineConfig(num_slots=2, max_len=96, prefill_chunk=16, decode_buckets=(2,)))
    yield eng
    asyncio.run(eng.close())


def test_client_and_server_round_trip_equals_the_engine(vl_engine):
    """Two images of different sizes: the wire holds one placeholder each; the engine behind the server samples and
    scores what it does on the expanded prompt directly (same tokens, log-probs to 1e-5)."""
    images = [_image(_png(1)), _image(_png(2, hw=(9, 17)))]
    assert images[0].grid_thw != images[1].grid_thw
    req = _req(images)

    async def go():
        direct = await vl_engine.generate(req)
        server = NativeServer(vl_engine)
        url = await server.start("127.0.0.1", 0)
        client = SGLangClient(url, image_token_id=PAD, image_processor=PROC)
        try:
            body = client._body(req)
            via = await client.generate(req)
        finally:
            await client.close()
            await server.stop()
        return direct, body, via

    direct, body, via = asyncio.run(asyncio.wait_for(go(), 300))
    assert body["input_ids"].count(PAD) == 2 and len(body["image_data"]) == 2
    assert all(u.startswith("data:image/png;base64,") for u in body["image_data"])
    assert via.token_ids == direct.token_ids and len(via.token_ids) == 6
    np.testing.assert_allclose(via.logprobs, direct.logprobs, atol=1e-5, rtol=0)
    assert via.prompt_tokens == len(req.prompt_ids)


def test_a_differing_expansion_and_bad_images_are_errors(vl_engine, qwen3_tokenizer_dir):
    """The shim's processor made one more token per image than the server's: EngineError naming both lengths.
    Bad image_data is a 400 naming the entry; a text-only engine refuses images; a client built without the image
    token refuses to send them."""
    from research.models.tokenizer import load_tokenizer

    img = _image(_png(3))
    text_server = NativeServer(ReplayEngine(["ok"], load_tokenizer(qwen3_tokenizer_dir), cycle=True))

    async def post(url, body):
        async with aiohttp.ClientSession() as http, http.post(url + "/generate", json=body) as r:
            return r.status, await r.text()

    async def go():
        server = NativeServer(vl_engine)
        url, turl = await server.start("127.0.0.1", 0), await text_server.start("127.0.0.1", 0)
        client = SGLangClient(url, image_token_id=PAD, image_processor=PROC)
        try:
            with pytest.raises(EngineError, match=r"expanded the prompt's images to \d+ prompt tokens.*differ"):
                await client.generate(_req([img], extra_pads=1))
            base = {"input_ids": [1, VS, PAD, VE], "sampling_params": {"max_new_tokens": 2}}
            out = [await post(url, {**base, "image_data": ["data:image/png;base64," + base64.b64encode(
                       b"\x89PNG\r\n\x1a\nbroken").decode()]}),
                   await post(url, {**base, "image_data": ["http://host/a.png"]}),
                   await post(url, {**base, "image_data": [image_wire.data_url(img.data)] * 2}),
                   await post(turl, {**base, "image_data": [image_wire.data_url(img.data)]})]
        finally:
            await client.close()
            await server.stop()
            await text_server.stop()
        return out

    out = asyncio.run(asyncio.wait_for(go(), 300))
    msgs = [json.loads(t)["message"] if s == 400 else f"{s}: {t}" for s, t in out]
    assert "image_data[0]: not a readable image" in msgs[0]
    assert "only inline images" in msgs[1]
    assert "hold 1 image tokens (60) for 2 image_data entries" in msgs[2]
    assert "takes no images" in msgs[3]
    with pytest.raises(EngineError, match="without image_token_id"):
        SGLangClient("http://127.0.0.1:1")._body(_req([img]))


def test_factory_sglang_vl_reads_the_checkpoints_image_settings(qwen3_tokenizer_dir, tmp_path):
    """`sglang:URL,vl=DIR`: the client takes DIR's image token and processor (what the server expands with); a
    text checkpoint or one without preprocessor_config.json is refused at build time, naming the file."""
    import flax.linen as nn

    from research.models.qwen3_vl import save_hf
    from research.models.tokenizer import load_tokenizer
    from research.serving.factory import build_engine

    tok = load_tokenizer(qwen3_tokenizer_dir)
    pad = tok.token_to_id("<|image_pad|>")
    text = TEXT.replace(vocab_size=tok.vocab_size)
    args, kw = dummy_inputs(VISION, pad)
    params = nn.meta.unbox(Qwen3VL(text, VISION, pad).init(jax.random.key(0), *args, **kw)["params"])
    ckpt = save_hf(params, text, VISION, pad, tmp_path / "ckpt")
    with pytest.raises(ValueError, match="no preprocessor_config.json"):
        build_engine(f"sglang:http://127.0.0.1:1,vl={ckpt}", tok)
    (ckpt / "preprocessor_config.json").write_text(json.dumps({"patch_size": 4, "temporal_patch_size": 2,
                                                                "merge_size": 2,
                                                                "size": {"shortest_edge": 64, "longest_edge": 256}}))
    eng = build_engine(f"sglang:http://127.0.0.1:1,vl={ckpt}", tok)
    assert isinstance(eng, SGLangClient) and eng.base_url == "http://127.0.0.1:1" and eng.image_token_id == pad
    assert eng.image_processor == PROC
    assert build_engine("sglang:http://127.0.0.1:1", tok).image_processor is None  # a text policy: images omitted
    with pytest.raises(ValueError, match="not a Qwen3-VL checkpoint"):
        build_engine(f"sglang:http://127.0.0.1:1,vl={tmp_path}", tok)
