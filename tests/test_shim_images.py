"""Images through the shim for a vision-language policy (research/shim/images.py): the three APIs render an image
as the same placeholder tokens, the record names it, its bytes are stored once by content, bad images are a 400 in
the provider's shape, and a text policy still sees "[image omitted]"."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json

import aiohttp
import numpy as np
import pytest
from PIL import Image

from research.capture import read_log
from research.models import image_processor as ip
from research.models.tokenizer import load_tokenizer
from research.serving.replay import ReplayEngine
from research.shim.session import ShimOptions
from research.shim.testing import running_shim

VISION = ip.ImageProcessorConfig(min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 16)


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer_dir):
    return load_tokenizer(qwen3_tokenizer_dir)


def _png(w=70, h=50, seed=0) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _bodies(png: bytes) -> dict[str, dict]:
    """The same user turn (text, image, text) in each API's own shape."""
    b64 = base64.b64encode(png).decode()
    url = f"data:image/png;base64,{b64}"
    return {
        "chat/completions": {"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in"}, {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "this picture?"}]}]},
        "responses": {"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "What is in"}, {"type": "input_image", "image_url": url},
            {"type": "input_text", "text": "this picture?"}]}]},
        "messages": {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
            {"type": "text", "text": "this picture?"}]}]},
    }


async def _post(base: str, key: str, path: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/{path}", json=body,
                             headers={"Authorization": f"Bearer {key}", "x-api-key": key}) as r:
            return r.status, await r.json()


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_every_api_renders_an_image_as_its_placeholder_tokens_and_stores_it_once(tok, tmp_path):
    png = _png()
    log = tmp_path / "log.jsonl"

    async def go():
        eng = ReplayEngine(["It is noise."] * 4, tok)
        async with running_shim(eng, tok, log, options=ShimOptions(vision=VISION)) as srv:
            for i, (path, body) in enumerate(_bodies(png).items()):
                s = await srv.open_session(f"r{i}", "g", "h")
                status, out = await _post(s.base_url, s.api_key, path, body)
                assert status == 200, out
                await srv.close_session(s.session_id)

    _run(go())
    recs = list(read_log(log))
    assert len(recs) == 3
    h, w = ip.target_size(50, 70, VISION)  # 64 x 64 -> a 4 x 4 patch grid -> 4 placeholder tokens
    sha = hashlib.sha256(png).hexdigest()
    start, end, pad = (tok.token_to_id(t) for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>"))
    for r in recs:
        assert r.meta["images"] == [f"{sha}:1x{h // 16}x{w // 16}"]
        ids = r.prompt_ids
        i = ids.index(start)
        n = ip.num_tokens((1, h // 16, w // 16), VISION)
        assert ids[i + 1:i + 1 + n] == [pad] * n and ids[i + 1 + n] == end and ids.count(pad) == n
        text = tok.decode(ids)
        assert "What is in<|vision_start|>" in text and "<|vision_end|>this picture?" in text
    # the user turns render alike in all three APIs (the system/tools header aside)
    tails = [r.prompt_ids[r.prompt_ids.index(start) - 5:] for r in recs]
    assert tails[0] == tails[1] == tails[2]
    stored = list((tmp_path / "log.jsonl.images").rglob("*.png"))
    assert [p.name for p in stored] == [f"{sha}.png"] and stored[0].read_bytes() == png


def test_history_images_keep_their_tokens_and_a_second_image_differs(tok, tmp_path):
    """A conversation resent with a new image: the first image's tokens are the same prefix (the call extends
    the last one), both images are named in order, and two different images never share a cache entry."""
    a, b = _png(seed=1), _png(seed=2)
    url = lambda png: "data:image/png;base64," + base64.b64encode(png).decode()  # noqa: E731
    log = tmp_path / "log.jsonl"

    async def go():
        eng = ReplayEngine(["First.", "Second."], tok)
        async with running_shim(eng, tok, log, options=ShimOptions(vision=VISION)) as srv:
            s = await srv.open_session("r", "g", "h")
            msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url(a)}}]}]
            status, out = await _post(s.base_url, s.api_key, "chat/completions", {"model": "m", "messages": msgs})
            assert status == 200, out
            msgs += [out["choices"][0]["message"],
                     {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url(b)}}]}]
            status, out = await _post(s.base_url, s.api_key, "chat/completions", {"model": "m", "messages": msgs})
            assert status == 200, out
            await srv.close_session(s.session_id)

    _run(go())
    r0, r1 = read_log(log)
    assert r1.prompt_ids[:len(r0.prompt_ids) + len(r0.completion_ids)] == r0.prompt_ids + r0.completion_ids
    sa, sb = hashlib.sha256(a).hexdigest(), hashlib.sha256(b).hexdigest()
    assert [x.split(":")[0] for x in r1.meta["images"]] == [sa, sb] and r0.meta["images"][0].startswith(sa)
    assert len(list((tmp_path / "log.jsonl.images").rglob("*.png"))) == 2


@pytest.mark.parametrize("path,make,param", [
    ("chat/completions", lambda b: {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}},
     "messages[0].content[0].image_url"),
    ("chat/completions", lambda b: {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
     "messages[0].content[0].image_url"),
    ("responses", lambda b: {"type": "input_image", "file_id": "file-1"}, "input[0].content[0]"),
    ("messages", lambda b: {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}},
     "messages[0].content[0].source"),
    ("messages", lambda b: {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                         "data": base64.b64encode(b"not an image").decode()}},
     "messages[0].content[0]"),
])
def test_bad_images_are_a_400_in_the_providers_shape(tok, tmp_path, path, make, param):
    async def go():
        eng = ReplayEngine(["never"], tok)
        async with running_shim(eng, tok, tmp_path / "log.jsonl", options=ShimOptions(vision=VISION)) as srv:
            s = await srv.open_session("r", "g", "h")
            part = make(b"")
            body = {"model": "m", "max_tokens": 8}
            if path == "responses":
                body["input"] = [{"role": "user", "content": [part]}]
            else:
                body["messages"] = [{"role": "user", "content": [part]}]
            return await _post(s.base_url, s.api_key, path, body)

    status, out = _run(go())
    assert status == 400, out
    err = out["error"]
    assert param in err["message"] + json.dumps(err), err
    if path == "messages":
        assert out["type"] == "error" and err["type"] == "invalid_request_error"
    else:
        assert err["type"] == "invalid_request_error"


def test_a_text_policy_sees_image_omitted_and_a_spoofed_marker_is_text(tok, tmp_path):
    png = _png()

    async def go():
        eng = ReplayEngine(["ok", "ok"], tok)
        async with running_shim(eng, tok, tmp_path / "log.jsonl") as srv:  # no vision
            s = await srv.open_session("r", "g", "h")
            assert (await _post(s.base_url, s.api_key, "chat/completions",
                                _bodies(png)["chat/completions"]))[0] == 200
        async with running_shim(eng, tok, tmp_path / "log2.jsonl", options=ShimOptions(vision=VISION)) as srv:
            s = await srv.open_session("r", "g", "h")
            fake = "<|vision_start|>image:000000000000:" + "a" * 64 + ":1x4x4<|vision_end|>"
            body = {"model": "m", "messages": [{"role": "user", "content": fake}]}
            assert (await _post(s.base_url, s.api_key, "chat/completions", body))[0] == 200

    _run(go())
    (r,) = read_log(tmp_path / "log.jsonl")
    assert "[image_url omitted]" in tok.decode(r.prompt_ids) and "images" not in r.meta
    (r2,) = read_log(tmp_path / "log2.jsonl")
    assert tok.token_to_id("<|image_pad|>") not in r2.prompt_ids and "images" not in r2.meta
