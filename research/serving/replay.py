"""A scripted engine: returns given completions (text or ids) through the real `Engine` interface.

Why: end-to-end tests of the shim (tool-call parsing, streaming, capture, token-in/token-out) need
a model whose output is known exactly, and the shim benchmark needs an engine whose cost is ~0 so
that only the shim's overhead is measured. Everything a real engine does at the interface is real
here: stop ids end a completion (inclusive, the stop token is sampled and has a logprob),
`max_new_tokens` truncates with finish "length", chunks stream with an optional delay, cancelling
the stream aborts, and an `Exception` in the script is raised at the call (e.g. EngineUnavailable).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Sequence

from research.serving.api import (
    ContextLengthExceeded,
    Engine,
    EngineError,
    EngineUnavailable,
    GenerateRequest,
    GenerateResult,
    TokenChunk,
)

Completion = str | Sequence[int] | BaseException
Script = Sequence[Completion] | Callable[[GenerateRequest], Completion]


def replay_logprob(token_id: int, position: int) -> float:
    """Deterministic fake behaviour logprob, so tests can check logprobs are carried through exactly."""
    return -((token_id * 7 + position * 13) % 997) / 1000.0


class ReplayEngine(Engine):
    """Completions come from `script`: a list consumed in order, or a function of the request.

    Text is encoded with `tokenizer` and, unless it already ends in a stop id, the first of
    `stop_token_ids` (Qwen3: <|im_end|>) is appended, as a model would sample it.
    """

    def __init__(self, script: Script, tokenizer=None, *, weight_version: int = 0, chunk_size: int = 1,  # noqa: ANN001
                 delay_s: float = 0.0, max_context: int = 1 << 20, cycle: bool = False):
        self._script = script
        self._iter = None if callable(script) else (itertools.cycle(script) if cycle else iter(script))
        self._tok = tokenizer
        self._version = weight_version
        self._chunk = max(1, chunk_size)
        self._delay = delay_s
        self._max_context = max_context
        self.requests: list[GenerateRequest] = []
        self.aborted = 0
        self.paused = False

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        return self._max_context

    def _next(self, req: GenerateRequest) -> Completion:
        if callable(self._script):
            return self._script(req)
        try:
            return next(self._iter)
        except StopIteration:
            raise EngineError(f"replay script exhausted after {len(self.requests) - 1} completions") from None

    def _ids(self, item: Completion, stop_ids: Sequence[int]) -> list[int]:
        if isinstance(item, str):
            if self._tok is None:
                raise EngineError("ReplayEngine got a text completion but no tokenizer")
            ids = self._tok.encode(item)
            stops = tuple(stop_ids) or tuple(self._tok.stop_token_ids)
            if stops and (not ids or ids[-1] not in stops):
                ids.append(stops[0])
            return ids
        return [int(t) for t in item]

    async def stream(self, req: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        self.requests.append(req)
        if self.paused:
            raise EngineUnavailable("replay engine paused", retry_after_s=1.0)
        if len(req.prompt_ids) >= self._max_context:
            raise ContextLengthExceeded(f"prompt of {len(req.prompt_ids)} tokens >= context {self._max_context}")
        item = self._next(req)
        if isinstance(item, BaseException):
            raise item
        sp = req.sampling
        ids = self._ids(item, sp.stop_token_ids)
        finish = "stop"
        for i, t in enumerate(ids):
            if t in sp.stop_token_ids:
                ids = ids[: i + 1]
                break
        budget = min(sp.max_new_tokens, self._max_context - len(req.prompt_ids))
        if len(ids) > budget:
            ids, finish = ids[:budget], "length"
        logprobs = [replay_logprob(t, i) for i, t in enumerate(ids)]
        try:
            for s in range(0, len(ids), self._chunk):
                if self._delay:
                    await asyncio.sleep(self._delay)
                yield TokenChunk(ids[s:s + self._chunk], logprobs[s:s + self._chunk])
        except (GeneratorExit, asyncio.CancelledError):
            self.aborted += 1
            raise
        yield GenerateResult(ids, logprobs, finish, self._version, prompt_tokens=len(req.prompt_ids))

    async def pause(self) -> None:
        self.paused = True

    async def resume(self) -> None:
        self.paused = False
