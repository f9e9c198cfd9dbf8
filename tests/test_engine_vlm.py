"""The JAX engine serving a tiny Qwen3-VL (research/serving/qwen3_vl_runner.py): what it samples and the
log-probs it reports equal the trainer's full forward (Qwen3VL with the vision tower, 3-D RoPE, DeepStack) to
1e-5, with images cut across prefill chunks; equal images share cached K/V, different ones never do; a session's
next turn continues after its image."""

from __future__ import annotations

import asyncio
import base64
import functools
import io

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models import ModelConfig, mrope
from research.models.qwen3 import Qwen3
from research.models.qwen3 import logits as lm_logits
from research.models.qwen3_vl import Qwen3VL, dummy_inputs
from research.models.vision import VisionConfig, VisionTower
from research.serving.api import GenerateRequest, ImageInput, SamplingParams
from research.serving.jax_engine import EngineConfig, JaxEngine
from research.serving.qwen3_runner import Qwen3Runner
from research.serving.qwen3_vl_runner import Qwen3VLRunner

PAD, VS, VE = 60, 61, 62
VISION = VisionConfig(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=4, out_hidden_size=32,
                      num_position_embeddings=16, deepstack_indexes=(0, 1))
TEXT = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4, num_kv_heads=2,
                   head_dim=16, mrope_section=(2, 3, 3), deepstack_layers=2, dtype="float32", rope_theta=1e4)
GRIDS = {"a": (1, 4, 4), "b": (1, 4, 4), "c": (1, 8, 4)}  # merged tokens: 4, 4, 8
ECFG = EngineConfig(num_slots=4, max_len=96, prefill_chunk=8, decode_buckets=(2, 4))
REF_LEN = 64


def _img(name: str) -> list[int]:
    t, h, w = GRIDS[name]
    return [VS] + [PAD] * (t * h * w // 4) + [VE]


def _images(names) -> tuple[ImageInput, ...]:
    out = []
    for n in names:
        t, h, w = GRIDS[n]
        px = np.random.default_rng(ord(n)).normal(size=(t * h * w, VISION.patch_dim)).astype(np.float32)
        out.append(ImageInput(sha=f"{ord(n):064x}", grid_thw=GRIDS[n], pixels_NxP=px))
    return tuple(out)


def _prompt(names) -> list[int]:  # text, then each image with text after it: images cross the 8-token chunks
    ids = [1, 2, 3, 4, 5]
    for i, n in enumerate(names):
        ids += _img(n) + [10 + i, 11 + i, 12 + i]
    return ids


@pytest.fixture(scope="module")
def model():
    m = Qwen3VL(TEXT, VISION, PAD)
    args, kw = dummy_inputs(VISION, PAD)
    params = m.init(jax.random.key(3), *args, **kw)["params"]
    params = jax.tree.map(lambda a: a * 3.0 if a.ndim == 2 else a, params)  # sharper logits: distinct greedy tokens
    return m, params


_FWD: dict = {}


def _forward(p, s, q, mask, px, grid, text=TEXT):
    """Qwen3VL's forward (its two modules) with the image tokens given by position: a placeholder id the policy
    generates is text to the engine, as the next turn's 3-D positions treat it."""
    kw = {}
    if px is not None:
        merged, deep = VisionTower(VISION).apply({"params": p["visual"]}, px, grid)
        kw = {"visual_MxD": merged, "visual_mask_BxT": mask, "deepstack_KxMxD": jnp.stack(deep)}
    h = Qwen3(text).apply({"params": p["language_model"]}, s, q, jnp.ones_like(s), jnp.full_like(s, s.shape[1] - 1),
                          **kw)
    return jax.nn.log_softmax(lm_logits(p["language_model"], text, h)[0], -1)


def reference(model, prompt, completion, images, *, text=TEXT, pad=PAD, ref_len=REF_LEN):
    """(greedy next tokens, log-probs of `completion`) from one full forward of the trainer's model."""
    m, params = model
    seq = prompt + completion
    P, n = len(prompt), len(seq)
    padded = np.asarray([seq + [0] * (ref_len - n)], np.int32)
    types = (padded[0] == pad) & (np.arange(ref_len) < P)  # what the policy generates is text, whatever its id
    pos, _ = mrope.rope_index(types.astype(np.int32), [im.grid_thw for im in images], merge=2)
    grid = mrope.vision_grid([im.grid_thw for im in images], merge=2, side=VISION.side) if images else None
    px = np.concatenate([im.pixels_NxP for im in images]) if images else None
    fwd = _FWD.setdefault((text, grid and grid.merged_per_image), jax.jit(functools.partial(_forward, text=text)))
    logp = np.asarray(fwd(params, padded, pos[:, None], types[None], px, grid))
    steps = np.arange(P - 1, n - 1)
    return logp[steps].argmax(-1), logp[steps, np.asarray(seq[P:])]


def _req(prompt, images, n=6, **kw):
    return GenerateRequest(list(prompt), SamplingParams(temperature=0.0, max_new_tokens=n), images=images, **kw)


@pytest.fixture(scope="module", params=[None, False], ids=["default", "xla"])
def runner(request):
    return Qwen3VLRunner(TEXT, VISION, PAD, kernels=request.param)


def _engine(runner, model, **kw):
    return JaxEngine(runner, model[1], config=EngineConfig(**{**ECFG.__dict__, **kw}))


def test_engine_samples_and_scores_like_the_trainer_with_images(runner, model):
    cases = [["a"], ["a", "c"], []]  # one image, two of different sizes, and plain text on the same engine

    async def go():
        eng = _engine(runner, model)
        try:
            return await asyncio.gather(*(eng.generate(_req(_prompt(c), _images(c))) for c in cases))
        finally:
            await eng.close()

    for names, res in zip(cases, asyncio.run(go())):
        greedy, lp = reference(model, _prompt(names), res.token_ids, _images(names))
        assert res.token_ids == greedy.tolist(), names
        np.testing.assert_allclose(res.logprobs, lp, atol=1e-5, rtol=0)
        assert len(set(res.token_ids)) > 1  # a real sequence, not one repeated token


def test_moe_text_model_serves_images_like_the_trainer():
    """Qwen3-VL-MoE's text model (the 30B-A3B family's structure) behind the same runner."""
    text = TEXT.replace(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True)
    m = Qwen3VL(text, VISION, PAD)
    args, kw = dummy_inputs(VISION, PAD)
    params = m.init(jax.random.key(4), *args, **kw)["params"]
    names = ["c", "a"]

    async def go():
        eng = JaxEngine(Qwen3VLRunner(text, VISION, PAD), params, config=ECFG)
        try:
            return await eng.generate(_req(_prompt(names), _images(names), return_routed_experts=True))
        finally:
            await eng.close()

    res = asyncio.run(go())
    greedy, lp = reference((m, params), _prompt(names), res.token_ids, _images(names), text=text)
    assert res.token_ids == greedy.tolist()
    np.testing.assert_allclose(res.logprobs, lp, atol=1e-5, rtol=0)
    assert np.asarray(res.routed_experts).shape == (len(res.token_ids), text.num_layers, 2)


def test_prefix_reuse_follows_the_image_not_the_placeholder_tokens(runner, model):
    """Three samples of one prompt prefill it once; the same token ids with another image reuse only the text
    before it; a session's next turn continues after its image and generated tokens."""
    p_a, p_b = _prompt(["a"]), _prompt(["b"])
    assert p_a == p_b  # same ids: only the images tell them apart

    async def go():
        eng = _engine(runner, model, num_slots=4)
        try:
            group = await asyncio.gather(*(eng.generate(_req(p_a, _images("a"))) for _ in range(3)))
            before = eng.stats["reused_tokens"]
            other = await eng.generate(_req(p_b, _images("b")))
            reused_b = eng.stats["reused_tokens"] - before
            t1 = await eng.generate(_req(p_a, _images("a"), session_id="s"))
            p2 = p_a + t1.token_ids + [20, 21]
            before = eng.stats["reused_tokens"]
            t2 = await eng.generate(_req(p2, _images("a"), session_id="s"))
            return group, other, reused_b, t1, p2, t2, eng.stats["reused_tokens"] - before, eng.stats
        finally:
            await eng.close()

    group, other, reused_b, t1, p2, t2, reused_2, stats = asyncio.run(go())
    assert stats["prefill_tokens"] < 3 * len(p_a) + 2 * len(p_b) + len(p2)  # the group shared one prefill
    assert reused_b == p_a.index(PAD)  # up to the first placeholder, not through it
    for prompt, names, res in ((p_a, "a", group[0]), (p_b, "b", other), (p2, "a", t2)):
        greedy, lp = reference(model, prompt, res.token_ids, _images(names))
        assert res.token_ids == greedy.tolist(), names
        np.testing.assert_allclose(res.logprobs, lp, atol=1e-5, rtol=0)
    assert all(g.token_ids == group[0].token_ids for g in group)
    assert reused_2 >= len(p_a) + len(t1.token_ids) - 1  # the whole first turn stayed cached


def test_bad_image_requests_are_refused_before_any_work(model):
    text_engine = JaxEngine(Qwen3Runner(TEXT.replace(mrope_section=(), deepstack_layers=0)),
                            model[1]["language_model"], config=ECFG)
    vl_engine = _engine(Qwen3VLRunner(TEXT, VISION, PAD), model)

    async def go():
        try:
            with pytest.raises(ValueError, match="text-only model"):
                await text_engine.generate(_req(_prompt(["a"]), _images("a")))
            with pytest.raises(ValueError, match="image token runs"):
                await vl_engine.generate(_req(_prompt(["a"]), _images("ac")))
            bad = (ImageInput("0" * 64, (1, 4, 4), np.zeros((16, 3), np.float32)),)
            with pytest.raises(ValueError, match="pixels"):
                await vl_engine.generate(_req(_prompt(["a"]), bad))
        finally:
            await text_engine.close()
            await vl_engine.close()

    asyncio.run(go())


def test_through_the_shim_records_match_the_trainer_on_the_stored_images(qwen3_tokenizer_dir, tmp_path):
    """An OpenAI chat request with a PNG, answered by the engine serving the VLM: each record's log-probs equal
    the trainer's forward on the record's own tokens and its images read back from the store (2 sessions of one
    group: the second reuses the first's K/V)."""
    import aiohttp
    from PIL import Image

    from research.capture import read_log
    from research.models import image_processor as ip
    from research.models.tokenizer import load_tokenizer
    from research.shim.images import ImageStore, Vision
    from research.shim.session import ShimOptions
    from research.shim.testing import running_shim

    tok = load_tokenizer(qwen3_tokenizer_dir)
    pad = tok.token_to_id("<|image_pad|>")
    text = TEXT.replace(vocab_size=tok.vocab_size)
    m = Qwen3VL(text, VISION, pad)
    args, kw = dummy_inputs(VISION, pad)
    params = m.init(jax.random.key(5), *args, **kw)["params"]
    proc = ip.ImageProcessorConfig(patch_size=4, min_pixels=8 * 8, max_pixels=16 * 16)
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (13, 11, 3), dtype=np.uint8)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    body = {"model": "m", "max_tokens": 5, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Name the colour of"}, {"type": "image_url", "image_url": {"url": url}}]}]}
    eng = JaxEngine(Qwen3VLRunner(text, VISION, pad), params,
                    config=EngineConfig(num_slots=2, max_len=512, prefill_chunk=64, decode_buckets=(2,)))
    log = tmp_path / "log.jsonl"

    async def one(srv, i):
        s = await srv.open_session(f"r{i}", "g", "h")
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{s.base_url}/v1/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {s.api_key}"}) as r:
                assert r.status == 200, await r.text()
        await srv.close_session(s.session_id)

    async def go():
        try:
            async with running_shim(eng, tok, log, options=ShimOptions(vision=proc)) as srv:
                await one(srv, 0)
                await one(srv, 1)
        finally:
            await eng.close()
        return eng.stats

    stats = asyncio.run(asyncio.wait_for(go(), 300))
    recs = list(read_log(log))
    assert len(recs) == 2 and all(len(r.meta["images"]) == 1 for r in recs)
    assert stats["reused_tokens"] == len(recs[0].prompt_ids) - 1  # the second call reused the first's K/V
    vision = Vision(proc, ImageStore(tmp_path / "log.jsonl.images"))
    for r in recs:
        images = vision.inputs(r.meta["images"])
        greedy, lp = reference((m, params), r.prompt_ids, r.completion_ids, images, text=text, pad=pad,
                               ref_len=len(r.prompt_ids) + 8)
        assert r.completion_ids == greedy.tolist()
        np.testing.assert_allclose(r.logprobs, lp, atol=1e-5, rtol=0)


def test_factory_serves_a_qwen3_vl_checkpoint_with_its_processor(qwen3_tokenizer_dir, tmp_path):
    """`jax:DIR` of a Qwen3-VL checkpoint builds the VLM engine, which names its image processor (the shim
    launcher's ShimOptions.vision); a mismatched processor is refused."""
    import json

    from research.models.image_processor import ImageProcessorConfig
    from research.models.qwen3_vl import save_hf
    from research.models.tokenizer import load_tokenizer
    from research.serving.factory import build_engine

    tok = load_tokenizer(qwen3_tokenizer_dir)
    pad = tok.token_to_id("<|image_pad|>")
    text = TEXT.replace(vocab_size=tok.vocab_size)
    m = Qwen3VL(text, VISION, pad)
    args, kw = dummy_inputs(VISION, pad)
    params = nn.meta.unbox(m.init(jax.random.key(6), *args, **kw)["params"])
    ckpt = save_hf(params, text, VISION, pad, tmp_path / "ckpt")
    (ckpt / "preprocessor_config.json").write_text(json.dumps(
        {"patch_size": 4, "temporal_patch_size": 2, "merge_size": 2, "size": {"shortest_edge": 64,
                                                                             "longest_edge": 256}}))
    eng = build_engine(f"jax:{ckpt}", tok, max_len=256, num_slots=2)
    try:
        assert eng.image_processor == ImageProcessorConfig(patch_size=4, min_pixels=64, max_pixels=256)
        prompt = [1, 2] + [VS] + [pad] * 4 + [VE] + [3]
        res = asyncio.run(eng.generate(_req(prompt, _images("a"), n=3)))
        greedy, lp = reference((m, params), prompt, res.token_ids, _images("a"), text=text, pad=pad, ref_len=16)
        assert res.token_ids == greedy.tolist()
        # an HF dir is served in its config's compute dtype (bfloat16, as a real checkpoint), so not to 1e-5
        assert eng.runner.cfg.dtype == "bfloat16"
        np.testing.assert_allclose(res.logprobs, lp, atol=5e-3, rtol=0)
    finally:
        asyncio.run(eng.close())
    (ckpt / "preprocessor_config.json").write_text(json.dumps({"patch_size": 16}))
    with pytest.raises(ValueError, match="image processor patch"):
        build_engine(f"jax:{ckpt}", tok)
    assert build_engine("replay", tok).image_processor is None
