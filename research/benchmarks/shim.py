"""Shim overhead and throughput against a ~zero-cost scripted engine (one run, two measurements).

1. Added latency per call: 20-turn OpenAI-chat sessions whose first prompt is ~20k tokens (tools,
   system, a long user message; each turn appends the assistant reply and a tool result). Every call
   goes through HTTP -> parse -> incremental render -> engine -> parse -> capture (fsync) -> JSON, and
   is compared with calling the same engine directly on the same prompt ids (same run):
   overhead = t_shim - t_direct. `overhead_ms_p50/p99` are over turns 2..20 (the steady state of a
   session: cost ~ new tokens); turn 1 (tokenizing the whole 20k-token prompt) is reported apart, and
   so is `capture_to_json_ms_p50`, the time research/capture.py's `to_json` takes per record (it is
   part of the overhead: the record is serialized and fsync'd before the response completes).
2. `calls_per_s`: 64 concurrent streaming sessions (short multi-turn chats) against the same engine,
   client in the same process (so the number includes the client's CPU).
"""

from __future__ import annotations

import asyncio
import pathlib
import statistics
import tempfile
import time

import aiohttp
import numpy as np

from research.capture import to_json
from research.models.tokenizer import load_tokenizer
from research.serving.api import GenerateRequest, SamplingParams
from research.serving.replay import ReplayEngine
from research.shim.testing import running_shim

DEFAULT_TOKENIZER = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "qwen3"
TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": f"does thing number {i}",
                                           "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}}}}
         for i in range(8)]
REPLY = '<tool_call>\n{"name": "tool_1", "arguments": {"arg": "next step please"}}\n</tool_call>'


def _long_text(tok, n_tokens: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    words = [f"w{int(x)}" for x in rng.integers(0, 5000, size=n_tokens // 2)]
    text = " ".join(words)
    while len(tok.encode(text)) > n_tokens:
        words = words[: int(len(words) * 0.95)]
        text = " ".join(words)
    return text


async def _post(http: aiohttp.ClientSession, url: str, key: str, body: dict) -> dict:
    async with http.post(url, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        r.raise_for_status()
        return await r.json()


async def _overhead(tok, engine, log: pathlib.Path, sessions: int, turns: int, prompt_tokens: int, fsync: bool):
    per_turn: dict[int, list[float]] = {t: [] for t in range(turns)}
    prompt_lens, to_json_ms = [], []
    async with running_shim(engine, tok, log, fsync=fsync) as srv, aiohttp.ClientSession() as http:
        for k in range(sessions):
            s = await srv.open_session(f"r{k}", "bench", "bench")
            url = s.base_url + "/v1/chat/completions"
            msgs = [{"role": "system", "content": "You are a coding agent."},
                    {"role": "user", "content": _long_text(tok, prompt_tokens, k)}]
            for t in range(turns):
                body = {"model": "p", "messages": msgs, "tools": TOOLS, "max_tokens": 64}
                t0 = time.perf_counter()
                r = await _post(http, url, s.api_key, body)
                t_shim = time.perf_counter() - t0
                rec = srv.sessions[s.session_id].records[-1]
                t0 = time.perf_counter()
                await engine.generate(GenerateRequest(list(rec.prompt_ids), SamplingParams(max_new_tokens=64)))
                t_direct = time.perf_counter() - t0
                per_turn[t].append((t_shim - t_direct) * 1e3)
                prompt_lens.append(len(rec.prompt_ids))
                m = r["choices"][0]["message"]
                msgs.append({"role": "assistant", "content": m["content"] or "", "tool_calls": m["tool_calls"]})
                msgs.append({"role": "tool", "tool_call_id": m["tool_calls"][0]["id"],
                             "content": f"result of turn {t}: " + "ok " * 60})
            recs = await srv.close_session(s.session_id)
            for rec in recs[1:]:  # the capture schema's serializer, timed alone (it runs inside every call)
                t0 = time.perf_counter()
                to_json(rec)
                to_json_ms.append((time.perf_counter() - t0) * 1e3)
            assert all(b.parent_call_id == a.call_id and b.prefix_match_len == len(a.prompt_ids + a.completion_ids)
                       for a, b in zip(recs, recs[1:])), "bench session was not append-only"
    steady = [x for t in range(1, turns) for x in per_turn[t]]
    return {"overhead_ms_p50": float(np.percentile(steady, 50)), "overhead_ms_p99": float(np.percentile(steady, 99)),
            "overhead_ms_p50_last_turn": statistics.median(per_turn[turns - 1]),
            "first_call_overhead_ms_p50": statistics.median(per_turn[0]),
            "capture_to_json_ms_p50": statistics.median(to_json_ms),
            # what the shim itself adds once capture.to_json is fast (it runs inside every call, see above)
            "overhead_ms_p50_minus_to_json": float(np.percentile(steady, 50)) - statistics.median(to_json_ms),
            "prompt_tokens_first": min(prompt_lens), "prompt_tokens_last": max(prompt_lens)}


async def _throughput(tok, engine, log: pathlib.Path, concurrent: int, calls_per_session: int, fsync: bool):
    async with running_shim(engine, tok, log, fsync=fsync) as srv:
        conn = aiohttp.TCPConnector(limit=concurrent)
        async with aiohttp.ClientSession(connector=conn) as http:

            async def one(k: int) -> int:
                s = await srv.open_session(f"t{k}", "bench", "bench")
                msgs = [{"role": "user", "content": f"session {k}: please do the task"}]
                for t in range(calls_per_session):
                    body = {"model": "p", "messages": msgs, "tools": TOOLS, "stream": True, "max_tokens": 64}
                    async with http.post(s.base_url + "/v1/chat/completions", json=body,
                                         headers={"Authorization": f"Bearer {s.api_key}"}) as r:
                        r.raise_for_status()
                        async for _ in r.content:
                            pass
                    msgs = msgs + [{"role": "assistant", "content": f"step {t}"}, {"role": "user", "content": "go"}]
                return len(await srv.close_session(s.session_id))

            t0 = time.perf_counter()
            n = sum(await asyncio.gather(*(one(k) for k in range(concurrent))))
            dt = time.perf_counter() - t0
    return {"calls_per_s": n / dt, "throughput_calls": n}


def run(sessions: int = 3, turns: int = 20, prompt_tokens: int = 20000, concurrent: int = 64,
        calls_per_session: int = 8, fsync: bool = True, tokenizer: str | None = None) -> dict:
    tok = load_tokenizer(tokenizer or DEFAULT_TOKENIZER)
    reply = tok.encode(REPLY) + [tok.eos_token_id]
    engine = ReplayEngine(lambda req: reply, tok, chunk_size=4)
    with tempfile.TemporaryDirectory() as d:
        out = asyncio.run(_overhead(tok, engine, pathlib.Path(d) / "a.jsonl", sessions, turns, prompt_tokens, fsync))
        out.update(asyncio.run(_throughput(tok, engine, pathlib.Path(d) / "b.jsonl", concurrent, calls_per_session,
                                           fsync)))
    out.update(sessions=sessions, turns=turns, concurrent=concurrent, fsync=fsync)
    return out
