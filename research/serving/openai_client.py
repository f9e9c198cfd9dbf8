"""An `Engine` over any OpenAI-compatible /v1/completions server that takes and returns token ids.

Lets an `openai:URL` engine spec (research/serving/factory.py, e.g. `launch.eval --endpoint=openai:URL`)
use a policy served elsewhere (e.g. vLLM) while the shim still sits in front of every harness and
captures exact ids: the prompt goes out as token ids, and generated tokens come back as ids
(`return_tokens_as_token_ids`, tokens spelled `token_id:N`) with their logprobs. A server that can only return text is
refused with a clear error: re-tokenizing generated text would make the captured data wrong for training.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp

from research.serving.api import (
    ContextLengthExceeded,
    Engine,
    EngineError,
    EngineUnavailable,
    GenerateRequest,
    GenerateResult,
    TokenChunk,
)


def _token_id(tok: str) -> int:
    if not tok.startswith("token_id:"):
        raise EngineError(f"endpoint returned token {tok[:40]!r}, not 'token_id:N': it must support "
                          "return_tokens_as_token_ids (text would have to be re-tokenized)")
    return int(tok.split(":", 1)[1])


class OpenAICompletionsEngine(Engine):
    def __init__(self, base_url: str, *, model: str = "policy", api_key: str | None = None,
                 max_context: int = 1 << 20, weight_version: int = 0, timeout_s: float = 600.0):
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model, self.api_key = model, api_key
        self._max_context, self._version = max_context, weight_version
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        return self._max_context

    def body(self, req: GenerateRequest) -> dict:
        sp = req.sampling
        body = {"model": self.model, "prompt": list(req.prompt_ids), "max_tokens": sp.max_new_tokens,
                "temperature": sp.temperature, "top_p": sp.top_p, "logprobs": 1,
                "return_tokens_as_token_ids": True, "skip_special_tokens": False, "include_stop_str_in_output": True}
        if sp.top_k > 0:
            body["top_k"] = sp.top_k
        if sp.stop_token_ids:
            body["stop_token_ids"] = list(sp.stop_token_ids)
        if sp.seed is not None:
            body["seed"] = sp.seed
        return body

    async def _post(self, body: dict) -> dict:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            async with self._session.post(f"{self.base_url}/v1/completions", json=body, headers=headers) as resp:
                text = await resp.text()
                if resp.status == 400 and "context" in text.lower():
                    raise ContextLengthExceeded(text[:300])
                if resp.status in (429, 502, 503, 504):
                    raise EngineUnavailable(f"endpoint {resp.status}: {text[:200]}")
                if resp.status != 200:
                    raise EngineError(f"endpoint {resp.status}: {text[:300]}")
                return await resp.json(content_type=None)
        except aiohttp.ClientError as e:
            raise EngineUnavailable(f"endpoint {self.base_url} unreachable: {e}") from e

    async def stream(self, req: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        if len(req.prompt_ids) + req.sampling.max_new_tokens > self._max_context:
            raise ContextLengthExceeded(f"{len(req.prompt_ids)} prompt tokens + {req.sampling.max_new_tokens} "
                                        f"new > {self._max_context}")
        data = await self._post(self.body(req))
        try:
            choice = data["choices"][0]
            lp = choice["logprobs"]
            ids = [_token_id(t) for t in lp["tokens"]]
            logprobs = [float(x) for x in lp["token_logprobs"]]
        except (KeyError, IndexError, TypeError) as e:
            raise EngineError(f"endpoint response lacks choices[0].logprobs tokens/token_logprobs: {e!r}") from e
        finish = {"stop": "stop", "length": "length"}.get(choice.get("finish_reason"), "stop")
        yield TokenChunk(ids, logprobs)
        yield GenerateResult(ids, logprobs, finish, self._version, prompt_tokens=len(req.prompt_ids))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
