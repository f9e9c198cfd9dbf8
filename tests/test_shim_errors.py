"""Bad input gets a 4xx in the shape of the API that was called, and no record disagrees with the client.

One request per row of a matrix over raw sockets (deep nesting, deep tool arguments, lone surrogates,
invalid UTF-8, non-ASCII Authorization, unknown paths and methods, bad sampling values, bad sizes).
"""

import asyncio
import json

import pytest

from research.capture import read_log
from research.models.tokenizer import load_tokenizer
from research.serving.replay import ReplayEngine
from research.shim.testing import raw_http, running_shim

CHAT, RESP, MSGS, COUNT = "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"
PROVIDER = {CHAT: "openai", RESP: "openai", MSGS: "anthropic", COUNT: "anthropic"}


def shaped(provider: str, body: bytes) -> dict:
    """The provider's error object (asserting its exact shape); returns the inner error."""
    d = json.loads(body)
    if provider == "anthropic":
        assert set(d) == {"type", "error"} and d["type"] == "error", d
        assert set(d["error"]) == {"type", "message"} and isinstance(d["error"]["message"], str), d
    else:
        assert set(d) == {"error"} and set(d["error"]) == {"message", "type", "param", "code"}, d
        assert isinstance(d["error"]["message"], str) and isinstance(d["error"]["type"], str), d
    return d["error"]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def msg_body(path: str, text: str = "hi", **extra) -> dict:
    if path == RESP:
        return {"model": "m", "input": text, **extra}
    body = {"model": "m", "messages": [{"role": "user", "content": text}], **extra}
    return {"max_tokens": 5, **body} if path in (MSGS, COUNT) else body


def raw(path: str, **extra) -> bytes:
    return json.dumps(msg_body(path, **extra)).encode()


def splice(path: str, key: str, literal: str) -> bytes:
    """A body with `key` set to a raw JSON literal json.dumps would not write (deep, NaN, \\ud800)."""
    return raw(path)[:-1] + f', "{key}": {literal}}}'.encode()


TOOL_ARGS_5000 = json.dumps({"messages": [
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "f", "arguments": "{\"a\": " + nested(5000) + "}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}).encode()

# (name, path, body, extra headers, expected status, expected param or message fragment)
CASES = [
    *[(f"deep1000-{p}", p, splice(p, "metadata", nested(1000)), {}, 400, "nested deeper than 128") for p in PROVIDER],
    ("deep100k-chat", CHAT, splice(CHAT, "x", nested(100_000)), {}, 400, "nested deeper than 128"),
    *[(f"deep-tools-{p}", p, splice(p, "tools", nested(300)), {}, 400, "nested deeper than 128") for p in PROVIDER],
    ("deep-tool-input-msgs", MSGS, json.dumps({"max_tokens": 5, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                           "input": {"a": json.loads(nested(200))}}]}]}).encode(), {}, 400,
     "nested deeper than 128"),
    *[(f"surrogate-content-{p}", p, raw(p).replace(b'"hi"', b'"a\\ud800b"'), {}, 400, "surrogate") for p in PROVIDER],
    *[(f"surrogate-model-{p}", p, raw(p).replace(b'"m"', b'"\\udfff"'), {}, 400, "surrogate") for p in PROVIDER],
    ("invalid-utf8", MSGS, raw(MSGS).replace(b'"hi"', b'"\xff\xfe"'), {}, 400, "not valid UTF-8: byte"),
    ("not-an-object", CHAT, b"[1, 2]", {}, 400, "must be a JSON object"),
    ("empty-body", RESP, b"", {}, 400, "not valid JSON"),
    ("nan-temperature", CHAT, splice(CHAT, "temperature", "NaN"), {}, 400, "not valid JSON"),
    ("inf-top-p", MSGS, splice(MSGS, "top_p", "1e999"), {}, 400, "not valid JSON"),
    ("temperature-5", CHAT, raw(CHAT, temperature=5), {}, 400, "temperature"),
    ("temperature-1.5-anthropic", MSGS, raw(MSGS, temperature=1.5), {}, 400, "temperature"),
    ("temperature-negative-responses", RESP, raw(RESP, temperature=-0.1), {}, 400, "temperature"),
    ("top-k-negative", MSGS, raw(MSGS, top_k=-5), {}, 400, "top_k"),
    ("top-k-huge", CHAT, raw(CHAT, top_k=1 << 40), {}, 400, "top_k"),
    ("top-p-zero", RESP, raw(RESP, top_p=0), {}, 400, "top_p"),
    ("seed-huge", CHAT, raw(CHAT, seed=1 << 64), {}, 400, "seed"),
    ("seed-float", CHAT, raw(CHAT, seed=1.5), {}, 400, "seed"),
    ("max-tokens-zero", MSGS, raw(MSGS, max_tokens=0), {}, 400, "max_tokens"),
    ("stream-string", CHAT, raw(CHAT, stream="yes"), {}, 400, "stream"),
    ("unknown-path", "/v1/chat/complete", raw(CHAT), {}, 404, "unknown path"),
    ("unknown-path-anthropic", "/v1/messages/batches", raw(MSGS), {}, 404, "unknown path"),
    ("unknown-root", "/v2/whatever", b"{}", {}, 404, "unknown path"),
    ("too-large", CHAT, raw(CHAT, text="x" * 300_000), {}, 413, "exceeds"),
    ("too-large-chunked", MSGS, raw(MSGS, text="x" * 300_000), {"X-Chunked": "1"}, 413, "exceeds"),
    ("unknown-role", RESP, json.dumps({"input": [{"role": "robot", "content": "x"}]}).encode(), {}, 400, "role"),
]


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer_dir):
    return load_tokenizer(qwen3_tokenizer_dir)


def test_bad_input_matrix(tok, tmp_path):
    """Every row: the expected 4xx, the called API's error shape, a precise message, no record."""
    async def go():
        eng = ReplayEngine(["fine"], tok, cycle=True)
        out = {}
        async with running_shim(eng, tok, tmp_path / "log.jsonl", enforce_sessions=False,
                                max_body_bytes=256 << 10) as srv:
            for name, path, body, hdr, *_ in CASES:
                hdr = dict(hdr)
                chunked = bool(hdr.pop("X-Chunked", None))
                out[name] = await raw_http(srv.host, srv.port, "POST", path, body, headers=hdr, chunked=chunked,
                                           chunk=8192)
            # the server is still fine afterwards
            out["after"] = await raw_http(srv.host, srv.port, "POST", CHAT, raw(CHAT))
        return out

    out = asyncio.run(asyncio.wait_for(go(), 60))
    for name, path, _, _, status, fragment in CASES:
        got, headers, body = out[name]
        assert got == status, (name, got, body[:300])
        provider = "anthropic" if "/messages" in path else "openai"
        err = shaped(provider, body)
        assert fragment in err["message"] or fragment == err.get("param"), (name, err)
        assert headers["content-type"].startswith("application/json"), name
    assert out["after"][0] == 200
    recs = list(read_log(tmp_path / "log.jsonl"))
    assert [r.status for r in recs] == ["ok"]  # only the final good call left a record


def test_auth_method_and_session_errors_are_shaped(tok, tmp_path):
    async def go():
        eng = ReplayEngine(["fine"], tok, cycle=True)
        async with running_shim(eng, tok, tmp_path / "log.jsonl") as srv:
            s = await srv.open_session("r", "g", "h")
            base = f"/s/{s.session_id}"
            h, p = srv.host, srv.port
            return {
                "non_ascii_bearer": await raw_http(h, p, "POST", base + CHAT, raw(CHAT),
                                                   headers={"Authorization": "Bearer ключ".encode()}),
                "non_ascii_x_api_key": await raw_http(h, p, "POST", base + MSGS, raw(MSGS),
                                                      headers={"x-api-key": b"\xff\xfe"}),
                "latin1_key": await raw_http(h, p, "POST", base + COUNT, raw(COUNT),
                                             headers={"x-api-key": "clé".encode("latin-1")}),
                "get_on_post_route": await raw_http(h, p, "GET", base + CHAT),
                "put_messages": await raw_http(h, p, "PUT", base + MSGS, raw(MSGS)),
                "no_session_url": await raw_http(h, p, "POST", CHAT, raw(CHAT)),
                "delete_in_enforced_mode": await raw_http(h, p, "DELETE", base),
                "ok": await raw_http(h, p, "POST", base + CHAT, raw(CHAT),
                                     headers={"Authorization": f"Bearer {s.api_key}"}),
            }

    out = asyncio.run(asyncio.wait_for(go(), 60))
    expect = {"non_ascii_bearer": (401, "openai"), "non_ascii_x_api_key": (401, "anthropic"),
              "latin1_key": (401, "anthropic"), "get_on_post_route": (405, "openai"),
              "put_messages": (405, "anthropic"), "no_session_url": (401, "openai"),
              "delete_in_enforced_mode": (405, "openai")}
    for name, (status, provider) in expect.items():
        got, headers, body = out[name]
        assert got == status, (name, got, body[:200])
        shaped(provider, body)
    assert out["get_on_post_route"][1]["allow"] == "POST"
    assert out["ok"][0] == 200


def test_deep_and_odd_tool_arguments_are_not_errors(tok, tmp_path):
    """Tool arguments nested 5000 deep inside a JSON string (a valid request: rendered verbatim) and
    model tool calls the shim could not send back as JSON (nested 300 deep, a \\ud800 escape, NaN)
    are answered 200 on every API, the bad model calls as text, each with an ok record."""
    deep = '<tool_call>\n{"name": "f", "arguments": {"a": ' + nested(300) + '}}\n</tool_call>'
    lone = '<tool_call>\n{"name": "f", "arguments": {"a": "\\ud800"}}\n</tool_call>'
    nan = '<tool_call>\n{"name": "f", "arguments": {"a": NaN}}\n</tool_call>'
    tools = {CHAT: [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
             MSGS: [{"name": "f", "input_schema": {"type": "object"}}],
             RESP: [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}
    resp_body = json.dumps({"input": [{"role": "user", "content": "go"},
                                      {"type": "function_call", "call_id": "c1", "name": "f",
                                       "arguments": "{\"a\": " + nested(5000) + "}"},
                                      {"type": "function_call_output", "call_id": "c1", "output": "ok"}]}).encode()

    async def go():
        eng = ReplayEngine(["fine", "fine", deep, lone, nan], tok, cycle=True)
        out = []
        async with running_shim(eng, tok, tmp_path / "log.jsonl", enforce_sessions=False) as srv:
            out.append(await raw_http(srv.host, srv.port, "POST", CHAT, TOOL_ARGS_5000))
            out.append(await raw_http(srv.host, srv.port, "POST", RESP, resp_body))
            for path, stream in [(CHAT, False), (MSGS, True), (RESP, False)]:
                body = msg_body(path, stream=stream, tools=tools[path])
                out.append(await raw_http(srv.host, srv.port, "POST", path, json.dumps(body).encode()))
        return out

    out = asyncio.run(asyncio.wait_for(go(), 60))
    assert [st for st, _, _ in out] == [200] * 5, [b[:200] for _, _, b in out]
    chat = json.loads(out[2][2])["choices"][0]
    assert chat["finish_reason"] == "stop" and "tool_calls" not in chat["message"]
    assert chat["message"]["content"].startswith("<tool_call>")
    assert b'"type":"tool_use"' not in out[3][2] and b"text_delta" in out[3][2]
    assert [o["type"] for o in json.loads(out[4][2])["output"]] == ["message"]
    recs = list(read_log(tmp_path / "log.jsonl"))
    assert [r.status for r in recs] == ["ok"] * 5
    assert recs[0].meta["retokenized_turns"] == 1  # the deep-argument turn was rendered, verbatim


def test_sampling_checked_once_for_every_engine(tok, tmp_path):
    """Forced sampling values are checked when the shim is configured; request values at the shim; the
    engine gets top_k -1 for "no top-k" whichever of 0 / -1 the client sent."""
    from research.shim.session import ShimOptions

    for bad in ({"temperature": float("nan")}, {"top_p": 0.0}, {"top_k": -3}, {"seed": 1 << 64}, {"typo": 1}):
        with pytest.raises(ValueError, match="sampling_override"):
            ShimOptions(sampling_override=bad)

    async def go():
        eng = ReplayEngine(["fine"], tok, cycle=True)
        async with running_shim(eng, tok, tmp_path / "log.jsonl", enforce_sessions=False) as srv:
            for top_k in (0, -1, 7):
                assert (await raw_http(srv.host, srv.port, "POST", CHAT, raw(CHAT, top_k=top_k, temperature=1,
                                                                              top_p=0.5, seed=-3)))[0] == 200
        return [(r.sampling.top_k, r.sampling.temperature, r.sampling.top_p, r.sampling.seed) for r in eng.requests]

    assert asyncio.run(asyncio.wait_for(go(), 30)) == [(-1, 1, 0.5, -3), (-1, 1, 0.5, -3), (7, 1, 0.5, -3)]
