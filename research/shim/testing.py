"""Test/bench helper: a shim over a given engine with a fresh capture log, as an async context manager."""

from __future__ import annotations

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
