"""Load client of the shim benchmark, run in its own process (a harness is another process; the shim
keeps its event loop to itself): many concurrent agent sessions with long prompts, each turn
appending the assistant's reply and a tool result, so the shim sees append-only sessions.

Run as `python -m research.benchmarks.shim_load` with its job as one JSON line on stdin; imports
only aiohttp and orjson (starts in well under a second). The parent serves while the child runs and
reads its stdout: `start` when every session has made its warm-up call (the timed part begins),
then `done {result JSON}` (or `error ...`).
"""

from __future__ import annotations

import asyncio
import sys
import time

import aiohttp
import orjson


async def _session(http: aiohttp.ClientSession, url: str, key: str, first: list[dict], spec: dict,
                   warm: asyncio.Barrier, lat_ms: list[float]) -> int:
    msgs = list(first)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    for t in range(spec["warmup"] + spec["turns"]):
        if t == spec["warmup"]:
            await warm.wait()
        body = orjson.dumps({"model": "p", "messages": msgs, "tools": spec["tools"], "max_tokens": 64,
                             "stream": spec["stream"]})
        t0 = time.perf_counter()
        async with http.post(url, data=body, headers=headers) as r:
            data = await r.read()
        if r.status != 200 or (spec["stream"] and not data.rstrip().endswith(b"data: [DONE]")):
            raise RuntimeError(f"turn {t}: HTTP {r.status}: {data[:300]!r}")
        if t >= spec["warmup"]:
            lat_ms.append((time.perf_counter() - t0) * 1e3)
        # the reply is always the engine's scripted tool call: send it back as the harness would
        msgs += [{**spec["reply"], "tool_calls": [{**spec["reply"]["tool_calls"][0], "id": f"call_{t}"}]},
                 {"role": "tool", "tool_call_id": f"call_{t}", "content": f"result of turn {t}: " + "ok " * 60}]
    return spec["turns"]


async def _client(sessions: list[tuple[str, str]], base_text: str, spec: dict) -> dict:
    warm = asyncio.Barrier(len(sessions) + 1)
    lat_ms: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        tasks = [asyncio.create_task(_session(
            http, url, key, [{"role": "system", "content": "You are a coding agent."},
                             {"role": "user", "content": f"[session {k}] " + base_text}], spec, warm, lat_ms))
            for k, (url, key) in enumerate(sessions)]
        await warm.wait()
        t0 = time.monotonic()
        print("start", flush=True)
        n = sum(await asyncio.gather(*tasks))
        t1 = time.monotonic()
    return {"calls": n, "seconds": t1 - t0, "latency_ms": lat_ms}


def main() -> None:
    job = orjson.loads(sys.stdin.buffer.readline())
    try:
        res = asyncio.run(_client([tuple(x) for x in job["sessions"]], job["base_text"], job["spec"]))
        print("done", orjson.dumps(res).decode(), flush=True)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        print("error", f"{type(e).__name__}: {e}".replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()
