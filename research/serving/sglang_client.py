"""`Engine` backed by a running SGLang server's native API (GPU path), or by launch/serve.py's clone of it.

Generation: `POST /generate` with `input_ids`, `sampling_params` (only keys SGLang knows: an unknown key is a
400 there), `return_logprob`, `return_routed_experts`, `stream`, `rid`. Token ids and behaviour logprobs
are read from `meta_info.output_token_logprobs` ([logprob, token_id, text]): the one list that carries
every sampled token, stop token included, whatever `no_stop_trim` did to `output_ids`/`text`. Streamed
chunks may be cumulative (SGLang's default) or incremental (`--incremental-streaming-output`): the
client tells them apart with `meta_info.completion_tokens`.

Weight sync: `pause()` -> `POST /pause_generation`, `update_weights_from_disk(path, version)`,
`resume()` -> `POST /continue_generation`; `flush_cache()`, `healthy()` (`/health_generate`).

Images (a vision-language policy, `image_token_id` given): each image's placeholder run goes as one token, its
bytes in `image_data`; the server's expanded prompt must have the recorded length (research/serving/image_wire.py).

Errors: 400 naming the context length -> ContextLengthExceeded; 503/connection refused/reset ->
EngineUnavailable (retry later); anything else -> EngineError with the server's message.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator

import aiohttp
import numpy as np

from research.serving import image_wire
from research.serving.api import (
    ContextLengthExceeded,
    Engine,
    EngineError,
    EngineUnavailable,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    TokenChunk,
)

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


def sampling_params_json(sp: SamplingParams) -> dict:
    """SamplingParams -> SGLang `sampling_params` (valid SGLang keys only)."""
    out = {
        "temperature": sp.temperature,
        "top_p": sp.top_p,
        "top_k": sp.top_k,
        "max_new_tokens": sp.max_new_tokens,
        "stop_token_ids": list(sp.stop_token_ids),
        "no_stop_trim": True,  # keep the stop token: the next turn's prompt contains it
        "skip_special_tokens": False,
    }
    if sp.seed is not None:
        out["sampling_seed"] = sp.seed
    return out


def decode_routed_experts(b64: str, *, n_out: int, n_prompt: int, routing_shape: tuple[int, int]) -> np.ndarray:
    """base64 int32 -> [n_out, L, K]: the routing of the forward step that produced each output token.

    SGLang returns one row per forward position of prompt + output except the last token
    (n_prompt + n_out - 1 rows); launch/serve.py returns only the n_out output rows. Both accepted."""
    L, K = routing_shape
    flat = np.frombuffer(base64.b64decode(b64), dtype=np.int32)
    if flat.size % (L * K):
        raise EngineError(f"routed_experts has {flat.size} ids, not a multiple of layers*top_k={L * K}")
    rows = flat.reshape(-1, L, K)
    if rows.shape[0] == n_out:
        return rows.copy()
    if rows.shape[0] == n_prompt + n_out - 1:
        return rows[n_prompt - 1 :].copy()
    raise EngineError(
        f"routed_experts has {rows.shape[0]} rows; expected {n_out} (outputs) or {n_prompt + n_out - 1} "
        f"(prompt + outputs - 1)"
    )


class SGLangClient(Engine):
    def __init__(
        self,
        base_url: str,
        *,
        routing_shape: tuple[int, int] | None = None,
        max_context: int | None = None,
        timeout_s: float = 3600.0,
        api_key: str | None = None,
        weight_version: int = 0,
        image_token_id: int | None = None,
        image_processor=None,  # noqa: ANN001 - research.models.image_processor.ImageProcessorConfig | None
    ):
        """A vision-language policy's server: `image_token_id` (its <|image_pad|>) and `image_processor` (as its
        checkpoint's preprocessor_config.json says, so the shim renders images as the server will expand them)."""
        self.base_url = base_url.rstrip("/")
        self.image_token_id, self._image_processor = image_token_id, image_processor
        self.routing_shape = routing_shape
        self._max_context = max_context
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._version = weight_version
        self._session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------------ plumbing
    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def image_processor(self):  # noqa: ANN201
        return self._image_processor

    @property
    def max_context(self) -> int:
        return self._max_context or (1 << 30)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _post(self, path: str, body: dict | None = None) -> tuple[int, str]:
        try:
            async with self._http().post(self.base_url + path, json=body or {}) as resp:
                return resp.status, await resp.text()
        except (TimeoutError, aiohttp.ClientConnectionError) as e:
            raise EngineUnavailable(f"SGLang server {self.base_url} unreachable: {e!r}") from e

    async def _get(self, path: str) -> tuple[int, str]:
        try:
            async with self._http().get(self.base_url + path) as resp:
                return resp.status, await resp.text()
        except (TimeoutError, aiohttp.ClientConnectionError) as e:
            raise EngineUnavailable(f"SGLang server {self.base_url} unreachable: {e!r}") from e

    @staticmethod
    def _raise_for(status: int, text: str, retry_after: str | None = None) -> None:
        try:
            msg = json.loads(text).get("message") or text
        except (json.JSONDecodeError, AttributeError):
            msg = text
        if status in (502, 503, 504, 529):
            raise EngineUnavailable(f"SGLang {status}: {msg}", retry_after_s=float(retry_after or 1.0))
        low = str(msg).lower()
        if status == 400 and (("context" in low and "length" in low) or "longer than" in low):
            raise ContextLengthExceeded(str(msg))
        raise EngineError(f"SGLang {status}: {msg}")

    # ------------------------------------------------------------------ generation
    def _body(self, req: GenerateRequest) -> dict:
        body = {
            "input_ids": list(req.prompt_ids),
            "sampling_params": sampling_params_json(req.sampling),
            "return_logprob": True,
            "stream": True,
            "rid": req.request_id or uuid.uuid4().hex,
        }
        if req.return_routed_experts:
            body["return_routed_experts"] = True
        if req.images:
            body["input_ids"], body["image_data"] = self._images(req)
        return body

    def _images(self, req: GenerateRequest) -> tuple[list[int], list[str]]:
        if self.image_token_id is None:
            raise EngineError("the request has images but this SGLangClient was built without image_token_id "
                              "(a text-only policy's shim omits images)")
        ids, lengths = image_wire.collapse(list(req.prompt_ids), self.image_token_id)
        if len(lengths) != len(req.images):
            raise EngineError(f"prompt has {len(lengths)} image placeholder runs for {len(req.images)} images")
        if not all(im.data for im in req.images):
            raise EngineError("an image has no encoded bytes (ImageInput.data): SGLang preprocesses images itself")
        return ids, [image_wire.data_url(im.data) for im in req.images]

    async def stream(self, req: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        body = self._body(req)
        if self._max_context is not None and len(req.prompt_ids) >= self._max_context:
            raise ContextLengthExceeded(f"prompt has {len(req.prompt_ids)} tokens; context is {self._max_context}")
        ids: list[int] = []
        lps: list[float] = []
        try:
            async with self._http().post(self.base_url + "/generate", json=body) as resp:
                if resp.status != 200:
                    self._raise_for(resp.status, await resp.text(), resp.headers.get("Retry-After"))
                async for data in _sse_events(resp):
                    if data == "[DONE]":
                        break
                    out = json.loads(data)
                    if "error" in out:
                        raise EngineError(f"SGLang stream error: {out['error']}")
                    meta = out.get("meta_info") or {}
                    if req.images and int(meta.get("prompt_tokens", -1)) != len(req.prompt_ids):
                        raise EngineError(
                            f"the server expanded the prompt's images to {meta.get('prompt_tokens')} prompt tokens, "
                            f"the shim's processor to {len(req.prompt_ids)}: their image processors differ, so the "
                            "record's image tokens would not be what the policy saw")
                    new = self._new_tokens(meta, len(ids))
                    if new:
                        ids += [t for _, t in new]
                        lps += [lp for lp, _ in new]
                        yield TokenChunk(token_ids=[t for _, t in new], logprobs=[lp for lp, _ in new])
                    if meta.get("finish_reason"):
                        yield self._result(req, meta, ids, lps)
                        return
        except (TimeoutError, aiohttp.ClientConnectionError) as e:
            raise EngineUnavailable(f"SGLang server {self.base_url}: {e!r}") from e
        raise EngineError(f"SGLang stream for rid {body['rid']} ended without a finish_reason")

    @staticmethod
    def _new_tokens(meta: dict, have: int) -> list[tuple[float, int]]:
        """(logprob, id) pairs not yet seen, for cumulative and incremental streams alike."""
        entries = meta.get("output_token_logprobs") or []
        total = meta.get("completion_tokens", have + len(entries))
        if len(entries) == total:  # cumulative
            entries = entries[have:]
        elif len(entries) != total - have:
            raise EngineError(f"stream out of sync: have {have} tokens, chunk has {len(entries)} of {total}")
        return [(float(e[0]), int(e[1])) for e in entries]

    def _result(self, req: GenerateRequest, meta: dict, ids: list[int], lps: list[float]) -> GenerateResult:
        fr = meta["finish_reason"]
        kind = fr.get("type") if isinstance(fr, dict) else str(fr)
        if kind not in _FINISH:
            raise EngineError(f"unknown finish_reason {fr!r}")
        experts = None
        if req.return_routed_experts and meta.get("routed_experts") is not None:
            if self.routing_shape is None:
                raise EngineError("routed experts requested but SGLangClient(routing_shape=...) was not given")
            experts = decode_routed_experts(
                meta["routed_experts"], n_out=len(ids), n_prompt=len(req.prompt_ids), routing_shape=self.routing_shape
            )
        version = meta.get("weight_version")
        try:
            version = int(version)
        except (TypeError, ValueError):
            version = self._version
        return GenerateResult(
            token_ids=ids, logprobs=lps, finish_reason=_FINISH[kind], weight_version=version,
            routed_experts=experts, prompt_tokens=int(meta.get("prompt_tokens", len(req.prompt_ids))),
        )

    # ------------------------------------------------------------------ weight sync / control
    async def pause(self) -> None:
        status, text = await self._post("/pause_generation", {})
        if status != 200:
            self._raise_for(status, text)

    async def resume(self) -> None:
        status, text = await self._post("/continue_generation", {})
        if status != 200:
            self._raise_for(status, text)

    async def update_weights_from_disk(self, model_path: str, version: int, *, flush_cache: bool = True) -> None:
        body = {"model_path": model_path, "weight_version": str(version), "flush_cache": flush_cache}
        status, text = await self._post("/update_weights_from_disk", body)
        try:
            ok = status == 200 and json.loads(text).get("success", False)
        except json.JSONDecodeError:
            ok = False
        if not ok:
            raise EngineError(f"update_weights_from_disk({model_path!r}) failed: {status} {text}")
        self._version = version

    async def flush_cache(self) -> None:
        status, text = await self._post("/flush_cache")
        if status != 200:
            self._raise_for(status, text)

    async def healthy(self) -> bool:
        try:
            status, _ = await self._get("/health_generate")
        except EngineUnavailable:
            return False
        return status == 200

    async def server_weight_version(self) -> str:
        status, text = await self._get("/get_weight_version")
        if status != 200:
            self._raise_for(status, text)
        return str(json.loads(text)["weight_version"])


async def _sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """`data:` payloads of an SSE body (one JSON per event, blank-line separated).

    Splits raw chunks itself: a cumulative SGLang chunk of a long completion easily exceeds aiohttp's
    per-line read limit."""
    buf = b""
    async for chunk in resp.content.iter_any():
        buf += chunk
        while True:
            sep = buf.find(b"\n\n")
            if sep < 0:
                break
            event, buf = buf[:sep], buf[sep + 2 :]
            data = [ln[5:].lstrip() for ln in event.decode().replace("\r", "").split("\n") if ln.startswith("data:")]
            if data:
                yield "\n".join(data)
    tail = [ln[5:].lstrip() for ln in buf.decode().split("\n") if ln.startswith("data:")]
    if tail:
        yield "\n".join(tail)
