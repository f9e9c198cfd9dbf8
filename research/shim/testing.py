"""Test/bench helper: a shim over a given engine with a fresh capture log, as an async context manager."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator

from research.capture import CaptureLog
from research.models.tokenizer import Tokenizer
from research.serving.api import Engine
from research.shim.server import ShimServer


@contextlib.asynccontextmanager
async def running_shim(engine: Engine, tokenizer: Tokenizer, log_path: str | pathlib.Path, *, fsync: bool = True,
                       **kwargs) -> AsyncIterator[ShimServer]:
    capture = CaptureLog(log_path, fsync=fsync)
    server = ShimServer(engine, tokenizer, capture, **kwargs)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
        capture.close()


async def raw_http(host: str, port: int, method: str, path: str, body: bytes = b"", *,
                   headers: dict[str, str | bytes] | None = None, chunk: int = 0, chunked: bool = False,
                   pause_s: float = 0.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request over a bare socket: (status, headers, body). What aiohttp's client
    will not do: send the body in `chunk`-byte writes with pauses (so the server sees it arrive
    piecemeal), Transfer-Encoding: chunked, header values as raw bytes (non-ASCII)."""
    reader, writer = await asyncio.open_connection(host, port)
    hdrs = {"Host": "shim", "Connection": "close", "Content-Type": "application/json", **(headers or {})}
    if chunked:
        hdrs["Transfer-Encoding"] = "chunked"
    else:
        hdrs["Content-Length"] = str(len(body))
    head = f"{method} {path} HTTP/1.1\r\n".encode()
    for k, v in hdrs.items():
        head += k.encode() + b": " + (v if isinstance(v, bytes) else v.encode()) + b"\r\n"
    try:
        writer.write(head + b"\r\n")
        step = chunk or max(1, len(body))
        for i in range(0, len(body), step):
            part = body[i:i + step]
            writer.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
            await writer.drain()
            if pause_s:
                await asyncio.sleep(pause_s)
        if chunked:
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    head_b, _, payload = raw.partition(b"\r\n\r\n")
    lines = head_b.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    out_headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if out_headers.get("transfer-encoding") == "chunked":
        payload = _dechunk(payload)
    return status, out_headers, payload


def _dechunk(data: bytes) -> bytes:
    out, i = bytearray(), 0
    while True:
        j = data.index(b"\r\n", i)
        n = int(data[i:j].split(b";")[0], 16)
        if n == 0:
            return bytes(out)
        out += data[j + 2:j + 2 + n]
        i = j + 2 + n + 2
