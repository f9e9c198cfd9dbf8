"""The SGLang client against launch/serve.py's SGLang-native server (in-process, and as a subprocess)."""

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import time

import aiohttp
import flax.serialization
import jax
import numpy as np
import pytest

from research.models import init_params, tiny_moe
from research.models.hf_io import save_hf
from research.serving.api import (
    ContextLengthExceeded,
    EngineError,
    EngineUnavailable,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
)
from research.serving.jax_engine import EngineConfig
from research.serving.native_server import SGLANG_SAMPLING_KEYS, NativeServer
from research.serving.serve import build
from research.serving.sglang_client import SGLangClient, decode_routed_experts, sampling_params_json

ECFG = EngineConfig(num_slots=4, max_len=64, prefill_chunk=16, decode_buckets=(4,))
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def served():
    engine, server = build("tiny_moe", engine_config=ECFG, eos_token_ids=())
    yield engine, server
    asyncio.run(engine.close())


@contextlib.asynccontextmanager
async def client_for(served, **server_kw):
    engine, base = served
    server = NativeServer(engine, load_weights=base._load_weights, routing_shape=base.routing_shape, **server_kw)
    url = await server.start("127.0.0.1", 0)
    client = SGLangClient(url, routing_shape=base.routing_shape)
    try:
        yield client, url, engine
    finally:
        await client.close()
        await server.stop()


def greedy(prompt, n=8, **kw):
    return GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=n), return_routed_experts=True, **kw)


@pytest.mark.parametrize("incremental", [False, True])
def test_client_stream_equals_direct_engine(served, incremental):
    async def go():
        async with client_for(served, incremental_streaming_output=incremental) as (client, _, engine):
            req = greedy([5, 9, 2, 7, 1, 3, 11, 4, 8, 6, 10, 12, 13, 14, 15, 16, 17, 18], n=12)
            items = [x async for x in client.stream(req)]
            sampled = GenerateRequest([1, 2, 3], SamplingParams(temperature=0.8, top_p=0.9, seed=4, max_new_tokens=9))
            return items, await engine.generate(req), await client.generate(sampled), await engine.generate(sampled)

    items, direct, via_http, direct_sampled = asyncio.run(go())
    res = items[-1]
    assert isinstance(res, GenerateResult)
    assert [t for c in items[:-1] for t in c.token_ids] == res.token_ids == direct.token_ids
    assert res.logprobs == direct.logprobs  # float32 -> JSON -> float is exact
    np.testing.assert_array_equal(res.routed_experts, direct.routed_experts)
    assert (res.finish_reason, res.weight_version, res.prompt_tokens) == ("length", direct.weight_version, 18)
    # Two engine runs of one seeded request: the second reuses the first's cached prefix, and the engine's
    # attention sums cached and new keys separately, so logprobs agree to fp32 rounding, not bit for bit.
    assert via_http.token_ids == direct_sampled.token_ids
    np.testing.assert_allclose(via_http.logprobs, direct_sampled.logprobs, rtol=0, atol=1e-5)


def test_client_sends_only_valid_sampling_keys_and_server_rejects_unknown(served):
    body = sampling_params_json(SamplingParams(temperature=0.5, top_k=3, seed=1, stop_token_ids=(7,)))
    assert set(body) <= SGLANG_SAMPLING_KEYS and body["sampling_seed"] == 1 and body["stop_token_ids"] == [7]

    async def go():
        async with client_for(served) as (_, url, _):
            async with aiohttp.ClientSession() as http:
                out = []
                for sp in ({"temprature": 0.5}, {"n": 2}, {"stop": ["x"]}, {"top_p": 0}):
                    async with http.post(url + "/generate", json={"input_ids": [1, 2], "sampling_params": sp}) as r:
                        out.append((r.status, (await r.json())["message"]))
                async with http.post(url + "/generate", data=b"{not json") as r:
                    out.append((r.status, (await r.json())["message"]))
                ok = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, "temperature": 0},
                      "return_logprob": True}
                async with http.post(url + "/generate", json=ok) as r:
                    out.append((r.status, await r.json()))
                return out

    out = asyncio.run(go())
    assert [s for s, _ in out[:5]] == [400] * 5
    assert "temprature" in out[0][1] and "n=2" in out[1][1] and "stop" in out[2][1] and "top_p" in out[3][1]
    status, body = out[5]
    assert status == 200 and len(body["output_ids"]) == 2
    assert [e[1] for e in body["meta_info"]["output_token_logprobs"]] == body["output_ids"]
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 2}


def test_pause_update_weights_from_disk_resume(served, tmp_path):
    engine, _ = served
    cfg = tiny_moe()
    new = jax.jit(lambda k: init_params(cfg, k))(jax.random.PRNGKey(7))
    (tmp_path / "w.msgpack").write_bytes(flax.serialization.to_bytes(new))
    save_hf(jax.jit(lambda k: init_params(cfg, k))(jax.random.PRNGKey(8)), cfg, tmp_path / "hf")
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]

    async def go():
        async with client_for(served) as (client, _, _):
            before = await client.generate(greedy(prompt))
            await client.pause()
            with pytest.raises(EngineUnavailable):
                await client.generate(greedy(prompt))
            await client.update_weights_from_disk(str(tmp_path / "w.msgpack"), 5)
            await client.resume()
            after = await client.generate(greedy(prompt))
            version = await client.server_weight_version()
            await client.update_weights_from_disk(str(tmp_path / "hf"), 6)
            hf = await client.generate(greedy(prompt))
            with pytest.raises(EngineError, match="update_weights_from_disk"):
                await client.update_weights_from_disk(str(tmp_path / "missing.bin"), 7)
            return before, after, version, hf, client.weight_version

    before, after, version, hf, client_version = asyncio.run(go())
    assert before.weight_version == 0 and after.weight_version == 5 and hf.weight_version == 6
    assert version == "5" and client_version == 6
    assert after.token_ids != before.token_ids and hf.token_ids != after.token_ids
    direct = asyncio.run(_direct(engine, greedy(prompt)))
    assert direct.token_ids == hf.token_ids  # the engine really serves the loaded HF weights


async def _direct(engine, req):
    return await engine.generate(req)


def test_errors_abort_health_and_flush(served):
    async def go():
        async with client_for(served) as (client, url, engine):
            assert await client.healthy()
            await client.flush_cache()
            with pytest.raises(ContextLengthExceeded):
                await client.generate(greedy(list(range(70))))
            # A client that goes away mid-stream aborts the generation on the server.
            stream = client.stream(greedy([1, 2, 3], n=50))
            await stream.__anext__()
            await stream.aclose()
            for _ in range(200):
                if not engine._active:
                    break
                await asyncio.sleep(0.02)
            idle_after_disconnect = not engine._active
            # /abort_request ends a stream with finish_reason abort.
            req = greedy([4, 5, 6], n=55, request_id="abort-me")
            stream = client.stream(req)
            await stream.__anext__()
            async with aiohttp.ClientSession() as http:
                async with http.post(url + "/abort_request", json={"rid": "abort-me"}) as r:
                    assert r.status == 200
            aborted = [x async for x in stream][-1]
        down = SGLangClient(url)
        with pytest.raises(EngineUnavailable):
            await down.generate(greedy([1]))
        await down.close()
        return idle_after_disconnect, aborted

    idle, aborted = asyncio.run(go())
    assert idle
    assert aborted.finish_reason == "abort" and len(aborted.token_ids) < 55


class _FailsMidStream:
    """Wraps the real engine; its stream breaks after the first chunk (a device error mid-generation)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def stream(self, req):
        async for item in self.inner.stream(req):
            yield item
            raise EngineError("device fell over")


def test_engine_error_mid_stream_is_reported_in_band(served):
    engine, base = served

    async def go():
        server = NativeServer(_FailsMidStream(engine))
        url = await server.start("127.0.0.1", 0)
        client = SGLangClient(url)
        try:
            with pytest.raises(EngineError, match="device fell over"):
                await client.generate(greedy([1, 2], n=20))
        finally:
            await client.close()
            await server.stop()

    asyncio.run(go())


def test_decode_routed_experts_accepts_sglang_layout():
    L, K, P, n = 3, 2, 5, 4
    full = np.arange((P + n - 1) * L * K, dtype=np.int32).reshape(P + n - 1, L, K)
    b64 = base64.b64encode(full.tobytes()).decode()
    np.testing.assert_array_equal(decode_routed_experts(b64, n_out=n, n_prompt=P, routing_shape=(L, K)), full[P - 1 :])
    ours = base64.b64encode(full[P - 1 :].tobytes()).decode()
    np.testing.assert_array_equal(decode_routed_experts(ours, n_out=n, n_prompt=P, routing_shape=(L, K)), full[P - 1 :])
    with pytest.raises(EngineError, match="rows"):
        decode_routed_experts(b64, n_out=2, n_prompt=P, routing_shape=(L, K))


@pytest.mark.slow
def test_client_against_launch_serve_subprocess(tmp_path):
    url_file = tmp_path / "url"
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch.serve", "--model=tiny_moe", "--port=0", f"--url_file={url_file}",
         "--num_slots=2", "--max_len=64", "--prefill_chunk=16"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.time() + 240
        while not url_file.exists():
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.time() < deadline, "launch.serve did not come up"
            time.sleep(0.2)
        url = url_file.read_text()

        async def go():
            client = SGLangClient(url, routing_shape=(2, 2))
            try:
                res = await client.generate(greedy([1, 2, 3, 4], n=6))
                info = json.loads((await client._get("/get_server_info"))[1])
                return res, info, await client.healthy()
            finally:
                await client.close()

        res, info, healthy = asyncio.run(go())
        assert len(res.token_ids) == 6 and res.routed_experts.shape == (6, 2, 2) and healthy
        assert info["routing_shape"] == [2, 2] and info["context_length"] == 64
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_build_with_a_tokenizer_takes_its_stop_ids(qwen3_tokenizer_dir):
    """No --eos_token_ids: the server stops on the tokenizer's end-of-turn ids (Qwen3: <|im_end|>, <|endoftext|>)."""
    from research.models.tokenizer import load_tokenizer

    # no warm-up: only the stop ids are checked (compiling the 152k-vocab blocks costs a minute on 2 cores)
    engine, server = build("tiny_moe", vocab_size=151936, tokenizer=str(qwen3_tokenizer_dir),
                           engine_config=EngineConfig(warmup=False))
    try:
        assert server.eos == load_tokenizer(qwen3_tokenizer_dir).stop_token_ids == (151645, 151643)
    finally:
        asyncio.run(engine.close())
