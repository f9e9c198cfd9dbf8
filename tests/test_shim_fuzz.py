"""Bad input never crashes the shim nor corrupts the capture log: fuzzed bodies, truncated SSE, oversize bodies."""

import asyncio
import json

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from research.capture import read_log
from research.models.tokenizer import load_tokenizer
from research.serving.replay import ReplayEngine
from research.shim.testing import running_shim

JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                    max_leaves=12)
ROLE = st.sampled_from(["user", "assistant", "system", "tool", "developer", "bogus"])
BLOCK = st.fixed_dictionaries({"type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image", "x"])},
                              optional={"text": JSON, "id": JSON, "name": JSON, "input": JSON, "content": JSON,
                                        "thinking": JSON, "tool_use_id": JSON})
MESSAGE = st.fixed_dictionaries({"role": ROLE}, optional={
    "content": st.text(max_size=20) | st.lists(BLOCK, max_size=3) | JSON, "tool_calls": JSON, "tool_call_id": JSON})
ITEM = st.fixed_dictionaries({"type": st.sampled_from(["message", "function_call", "function_call_output",
                                                       "reasoning", "custom_tool_call", "zzz"])},
                             optional={"role": ROLE, "content": JSON, "call_id": JSON, "name": JSON,
                                       "arguments": JSON, "output": JSON, "summary": JSON})
BODY = st.fixed_dictionaries({}, optional={
    "messages": st.lists(MESSAGE, max_size=4) | JSON, "input": st.text(max_size=10) | st.lists(ITEM, max_size=4),
    "tools": JSON | st.lists(st.dictionaries(st.sampled_from(["type", "function", "name", "input_schema"]), JSON)),
    "stream": st.booleans() | JSON, "max_tokens": JSON, "temperature": JSON, "system": JSON, "tool_choice": JSON,
    "thinking": JSON, "n": JSON, "instructions": JSON})
PATHS = ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/messages/count_tokens"]


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer_dir):
    return load_tokenizer(qwen3_tokenizer_dir)


def test_fuzzed_requests_never_5xx(tok, tmp_path):
    """Each fuzzed body gets a 2xx or a 4xx with an error body; the server stays up, the log stays valid."""
    engine = ReplayEngine(['x <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', "plain"], tok, cycle=True)

    async def go(bodies):
        async with running_shim(engine, tok, tmp_path / "log.jsonl", enforce_sessions=False) as srv, \
                aiohttp.ClientSession() as http:
            for path, body in bodies:
                async with http.post(srv.url + path, json=body) as r:
                    raw = await r.read()
                    assert r.status < 500, (path, body, raw[:300])
                    if r.status >= 400:
                        err = json.loads(raw)
                        assert "error" in err
            async with http.get(srv.url + "/") as r:
                assert r.status == 200

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.sampled_from(PATHS), BODY), min_size=1, max_size=5))
    def check(bodies):
        asyncio.run(asyncio.wait_for(go(bodies), 30))

    check()
    for rec in read_log(tmp_path / "log.jsonl"):
        rec.validate(vocab_size=tok.vocab_size)


def test_truncated_sse_clients_and_oversize_bodies(tok, tmp_path):
    engine = ReplayEngine(["a b c d e f g h i j k l m n o p " * 10], tok, cycle=True, delay_s=0.002)

    async def go():
        async with running_shim(engine, tok, tmp_path / "log.jsonl", max_body_bytes=4096) as srv:
            s = await srv.open_session("r", "g", "h")
            host, port = srv.host, srv.port
            body = json.dumps({"messages": [{"role": "user", "content": "go"}], "stream": True, "max_tokens": 999})
            for cut in (0, 10, 200, 2000):  # read `cut` bytes of the stream (or of the request) then vanish
                reader, writer = await asyncio.open_connection(host, port)
                req = (f"POST /s/{s.session_id}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                       f"Authorization: Bearer {s.api_key}\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
                writer.write(req if cut else req[: len(req) // 2])
                await writer.drain()
                if cut:
                    await reader.read(cut)
                writer.close()
            async with aiohttp.ClientSession() as http:
                big = {"messages": [{"role": "user", "content": "x" * 10000}]}
                hdr = {"Authorization": f"Bearer {s.api_key}"}
                async with http.post(f"{s.base_url}/v1/chat/completions", json=big, headers=hdr) as r:
                    oversize = (r.status, (await r.json())["error"]["param"])
                await asyncio.sleep(0.5)
                async with http.post(f"{s.base_url}/v1/chat/completions", headers=hdr,
                                     json={"messages": [{"role": "user", "content": "ok?"}], "max_tokens": 3}) as r:
                    after = r.status
            recs = await srv.close_session(s.session_id)
        return oversize, after, recs

    oversize, after, recs = asyncio.run(asyncio.wait_for(go(), 60))
    assert oversize == (413, "body") and after == 200
    on_disk = list(read_log(tmp_path / "log.jsonl"))
    assert [r.call_id for r in on_disk] == [r.call_id for r in recs]
    assert [r.status for r in recs].count("aborted") == 3 and recs[-1].status == "ok"
    for r in recs:
        r.validate(vocab_size=tok.vocab_size)
