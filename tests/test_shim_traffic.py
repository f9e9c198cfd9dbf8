"""The shim under real traffic: large valid bodies on every API, clients that vanish at random points
(every started call ends as exactly one record, agreeing with what the client saw), and a handler
cancelled again while it records its abort."""

import asyncio
import base64
import json
import random
import zlib

import pytest

from research.capture import read_log
from research.models.tokenizer import load_tokenizer
from research.serving.api import Engine
from research.serving.replay import ReplayEngine
from research.shim.render import Message
from research.shim.session import Call, ChatRequest, Session, ShimOptions
from research.shim.testing import raw_http, running_shim

CHAT, RESP, MSGS = "/v1/chat/completions", "/v1/responses", "/v1/messages"
MB = 1 << 20


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer_dir):
    return load_tokenizer(qwen3_tokenizer_dir)


def big_body(path: str, size: int, marker: str, *, stream: bool = False) -> bytes:
    """A valid request of ~`size` bytes: up to 400 KB of text (ending in `marker`), the rest an image
    (base64, as Claude Code and Codex send screenshots)."""
    rng = random.Random(size)
    n_text = min(size, 400_000) - 400
    words = " ".join(f"w{rng.randrange(5000)}" for _ in range(n_text // 5))
    text = words[:n_text - len(marker) - 1] + " " + marker
    pad = max(0, size - n_text - 1000) * 3 // 4
    data = base64.b64encode(rng.randbytes(pad)).decode() if pad else ""
    if path == CHAT:
        parts = [{"type": "text", "text": text}]
        parts += [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + data}}] if data else []
        body = {"model": "m", "messages": [{"role": "user", "content": parts}], "max_tokens": 8}
    elif path == RESP:
        parts = [{"type": "input_text", "text": text}]
        parts += [{"type": "input_image", "image_url": "data:image/png;base64," + data}] if data else []
        body = {"model": "m", "input": [{"type": "message", "role": "user", "content": parts}], "max_output_tokens": 8}
    else:
        parts = [{"type": "text", "text": text}]
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
        parts += [image] if data else []
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": parts}]}
    return json.dumps({**body, "stream": stream}).encode()


@pytest.mark.slow
def test_large_valid_bodies_every_api(tok, tmp_path):
    """0.2, 0.4, 1, 10 and 30 MB bodies, sent piecemeal over a bare socket (plus one chunked), are
    read whole and answered 200 on every API; each record's prompt ends with the body's text."""
    sizes = [int(x * MB) for x in (0.2, 0.4, 1, 10, 30)]

    async def go():
        eng = ReplayEngine(["done"], tok, cycle=True)
        out = []
        async with running_shim(eng, tok, tmp_path / "log.jsonl", enforce_sessions=False) as srv:
            for path in (CHAT, RESP, MSGS):
                for size in sizes:
                    marker = f"MARK{path.count('/')}{size}END"
                    body = big_body(path, size, marker)
                    st, _, resp = await raw_http(srv.host, srv.port, "POST", path, body, chunk=256 << 10,
                                                 pause_s=0.001, chunked=size == sizes[2],
                                                 headers={"x-session-id": f"{path}-{size}"})
                    out.append((path, size, len(body), marker, st, resp[:300]))
        return out

    out = asyncio.run(asyncio.wait_for(go(), 240))
    recs = {r.session_id: r for r in read_log(tmp_path / "log.jsonl")}
    for path, size, n, marker, status, resp in out:
        assert status == 200, (path, size, resp)
        assert abs(n - size) < 0.02 * size
        rec = recs[f"open-{path}-{size}".replace("/", "_")]
        assert rec.status == "ok" and len(rec.prompt_ids) > 10_000
        assert marker in tok.decode(rec.prompt_ids[-40:]), (path, size)


def _complete(path: str, stream: bool, data: bytes) -> bool:
    """Did the client receive the whole answer (the final event / the whole JSON)?"""
    if not stream:
        try:
            json.loads(data.partition(b"\r\n\r\n")[2])
            return data.startswith(b"HTTP/1.1 200")
        except ValueError:
            return False
    final = {CHAT: b"data: [DONE]", RESP: b"event: response.completed", MSGS: b"event: message_stop"}[path]
    return final in data


async def _vanishing_client(host, port, session, path, i, stream, rng) -> tuple[str, bool]:
    """One request that the client abandons at a random point (or reads to the end)."""
    marker = f"req{i}x"
    if path == RESP:
        body = {"input": f"count please {marker}", "stream": stream}
    else:
        body = {"messages": [{"role": "user", "content": f"count please {marker}"}], "stream": stream,
                "max_tokens": 400}
    raw = json.dumps(body).encode()
    head = (f"POST /s/{session.session_id}{path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {session.api_key}\r\n"
            f"x-api-key: {session.api_key}\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
            "Connection: close\r\n\r\n").encode()
    req = head + raw
    mode = rng.choice(["mid_request", "after_send", "first_chunk", "first_chunk", "read_some", "read_some", "read_all"])
    reader, writer = await asyncio.open_connection(host, port)
    got = b""
    try:
        writer.write(req[: rng.randrange(1, len(req))] if mode == "mid_request" else req)
        await writer.drain()
        if mode == "after_send":
            await asyncio.sleep(rng.uniform(0, 0.05))
        elif mode == "read_some":
            want = rng.randrange(1, 6000)
            deadline = asyncio.get_running_loop().time() + rng.uniform(0.0, 0.4)
            while len(got) < want and asyncio.get_running_loop().time() < deadline:
                try:
                    chunk = await asyncio.wait_for(reader.read(want - len(got)), 0.05)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                got += chunk
        elif mode == "first_chunk":  # headers and the first event, then gone
            while b"\r\n\r\n" not in got or got.endswith(b"\r\n\r\n"):
                chunk = await reader.read(4096)
                if not chunk:
                    break
                got += chunk
        elif mode == "read_all":
            got = await reader.read()
    finally:
        writer.close()
    return marker, _complete(path, stream, got)


@pytest.mark.parametrize("path", [CHAT, RESP, MSGS])
def test_random_disconnects_exactly_one_record(tok, tmp_path, path):
    """Clients vanish mid-request, mid-stream, while waiting, or read everything: every call that
    passed validation has exactly one record (every engine request among them), ok whenever the
    client got the final event, aborted with what was sampled otherwise."""
    rng = random.Random(zlib.crc32(path.encode()))  # the same clients in every process (hash() is salted)
    n = 40

    async def go():
        eng = ReplayEngine(["one two three four five six seven eight nine ten " * 20], tok, cycle=True,
                           delay_s=0.002)
        async with running_shim(eng, tok, tmp_path / "log.jsonl") as srv:
            s = await srv.open_session("r", "g", "h")
            outcomes = await asyncio.gather(*(
                _vanishing_client(srv.host, srv.port, s, path, i, i % 2 == 0, rng) for i in range(n)))
            sess = srv.sessions[s.session_id]
            for _ in range(400):  # handlers of vanished clients finish in the background
                if not sess.inflight:
                    break
                await asyncio.sleep(0.01)
            recs = await srv.close_session(s.session_id)
        return outcomes, recs, [r.request_id for r in eng.requests]

    outcomes, recs, engine_ids = asyncio.run(asyncio.wait_for(go(), 60))
    on_disk = list(read_log(tmp_path / "log.jsonl"))
    assert sorted(r.call_id for r in on_disk) == sorted(r.call_id for r in recs)  # group commit: any order
    ids = [r.call_id for r in recs]
    assert len(set(ids)) == len(ids) and set(engine_ids) <= set(ids)  # one record per started call
    for r in recs:  # calls whose client left before the engine got them: recorded, nothing sampled
        assert r.call_id in engine_ids or (r.status == "aborted" and not r.completion_ids)
    assert sorted(r.call_index for r in recs) == list(range(len(recs)))
    by_marker = {}
    for r in recs:
        r.validate(vocab_size=tok.vocab_size)
        marker = next(m for m, _ in outcomes if m in tok.decode(r.prompt_ids[-20:]))
        assert marker not in by_marker
        by_marker[marker] = r
    for marker, complete in outcomes:
        if complete:  # the client got the final event: the call was recorded ok before it
            assert by_marker[marker].status == "ok", marker
    aborted = [r for r in recs if r.status == "aborted"]
    assert aborted and any(r.status == "ok" for r in recs)
    for r in aborted:
        assert r.finish_reason == "abort" and len(r.completion_ids) < 201


def test_client_gone_while_the_prompt_is_tokenized(tok, tmp_path):
    """A long first prompt is tokenized off the event loop; the client leaves meanwhile: the call is
    still recorded once (aborted, nothing sampled), and the engine never sees it."""
    async def go():
        eng = ReplayEngine(["fine"], tok, cycle=True)
        async with running_shim(eng, tok, tmp_path / "log.jsonl") as srv:
            s = await srv.open_session("r", "g", "h")
            body = json.dumps({"messages": [{"role": "user", "content": "word " * 60_000}]}).encode()
            reader, writer = await asyncio.open_connection(srv.host, srv.port)
            writer.write(f"POST /s/{s.session_id}{CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {s.api_key}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
            sess = srv.sessions[s.session_id]
            while not sess.inflight:
                await asyncio.sleep(0.001)
            writer.close()
            for _ in range(500):
                if sess.n_calls:
                    break
                await asyncio.sleep(0.01)
            return await srv.close_session(s.session_id), len(eng.requests)

    recs, n_engine = asyncio.run(asyncio.wait_for(go(), 60))
    assert [(r.status, len(r.completion_ids)) for r in recs] == [("aborted", 0)] and len(recs[0].prompt_ids) > 50_000
    assert n_engine == 0


class SlowCloseEngine(Engine):
    """A replay engine whose stream takes a while to clean up after a cancel (like freeing a slot)."""

    def __init__(self, inner: ReplayEngine):
        self.inner = inner

    @property
    def weight_version(self) -> int:
        return 0

    async def stream(self, req):
        try:
            async for item in self.inner.stream(req):
                yield item
        finally:
            await asyncio.sleep(0.05)


def test_abort_survives_repeated_cancellation(tok, tmp_path):
    """A second (third...) cancel while the abort is closing the engine stream and writing the record
    does not lose the record; the cancellation still reaches the caller."""
    from research.capture import CaptureLog

    async def go():
        eng = SlowCloseEngine(ReplayEngine(["a b c d e f g h " * 50], tok, delay_s=0.005))
        log = CaptureLog(tmp_path / "log.jsonl")
        sess = Session("s", "k", "r", "g", "h", tok)
        req = ChatRequest(messages=[Message("user", "go")], tools=[], stream=True)
        call = Call(session=sess, req=req, api="openai_chat", engine=eng, tokenizer=tok, capture=log,
                    options=ShimOptions())

        async def handler():
            try:
                await call.start()
                async for _ in call.events():
                    pass
            except asyncio.CancelledError:
                await call.abort()
                raise

        task = asyncio.create_task(handler())
        await asyncio.sleep(0.05)
        for _ in range(5):  # keep cancelling while the abort runs
            task.cancel()
            await asyncio.sleep(0.015)
        with pytest.raises(asyncio.CancelledError):
            await task
        log.close()
        return sess

    sess = asyncio.run(asyncio.wait_for(go(), 30))
    recs = list(read_log(tmp_path / "log.jsonl"))
    assert [r.status for r in recs] == ["aborted"] and sess.n_calls == 1
    assert 0 < len(recs[0].completion_ids) < 400
