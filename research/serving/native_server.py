"""SGLang's native HTTP API in front of any `Engine` (aiohttp), so one client serves both backends.

`launch/serve.py` runs it over the JAX engine: the SGLang client is then tested against a real server
in CI, and a GPU run swaps in real SGLang with no client change. Only the subset RL needs is served,
with SGLang's shapes:

  POST /generate            input_ids, sampling_params, return_logprob, return_routed_experts, stream, rid,
                            image_data (a vision-language engine: each image's one placeholder token expanded
                            with the engine's processor, as SGLang does; research/serving/image_wire.py)
  POST /update_weights_from_disk   model_path, weight_version, flush_cache (+ SGLang's other keys, ignored)
  GET|POST /flush_cache, GET /health, GET /health_generate, POST /pause_generation, POST /continue_generation
  POST /abort_request, GET /get_model_info, GET /get_server_info, GET /get_weight_version

Like SGLang: unknown `sampling_params` keys are a 400; streamed chunks are `data: {json}` with cumulative
`output_ids` / `meta_info.output_token_logprobs` ([logprob, token_id, text]) then `data: [DONE]`; a client
that goes away aborts its generation. Keys SGLang accepts but this engine cannot honour (stop strings,
penalties, n > 1, grammars) are a 400 naming the key when set to a non-default value, never ignored.
`routed_experts` is base64 of int32 [completion_tokens, layers, top_k] (SGLang sends prompt + completion
- 1 rows; the client accepts both).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable

import numpy as np
from aiohttp import web

from research.serving import image_wire
from research.serving.api import (
    ContextLengthExceeded,
    Engine,
    EngineError,
    EngineUnavailable,
    GenerateRequest,
    GenerateResult,
    ImageInput,
    SamplingParams,
)

log = logging.getLogger(__name__)

# SGLang's SamplingParams fields (python/sglang/srt/sampling/sampling_params.py): anything else is a 400.
SGLANG_SAMPLING_KEYS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
    "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "custom_params", "stream_interval", "logit_bias", "sampling_seed",
})
# Keys we accept only at their no-op value.
_NOOP_VALUES = {
    "stop": (None, "", []), "stop_regex": (None, "", []), "min_p": (0, 0.0), "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0), "repetition_penalty": (1, 1.0), "min_new_tokens": (0,), "n": (1,),
    "json_schema": (None,), "regex": (None,), "ebnf": (None,), "structural_tag": (None,),
    "custom_params": (None, {}), "logit_bias": (None, {}),
}


class BadRequest(ValueError):
    pass


def _error(status: int, message: str, headers: dict | None = None) -> web.Response:
    kind = {400: "BadRequest", 500: "InternalServerError", 503: "ServiceUnavailable"}.get(status, "Error")
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return web.json_response(body, status=status, headers=headers)


def parse_sampling(sp: object, *, default_stop: tuple[int, ...], max_new_default: int) -> SamplingParams:
    """SGLang sampling_params dict -> SamplingParams; unknown keys and unsupported values are a 400."""
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise BadRequest("sampling_params must be an object")
    unknown = sorted(set(sp) - SGLANG_SAMPLING_KEYS)
    if unknown:
        raise BadRequest(f"sampling_params: unexpected keyword argument(s) {unknown}")
    for k, ok in _NOOP_VALUES.items():
        if k in sp and sp[k] not in ok:
            raise BadRequest(f"sampling_params.{k}={sp[k]!r} is not supported by this engine")
    try:
        stop = tuple(int(t) for t in (sp.get("stop_token_ids") or ()))
        if not sp.get("ignore_eos", False):
            stop = tuple(dict.fromkeys(stop + default_stop))
        seed = sp.get("sampling_seed")
        out = SamplingParams(
            temperature=float(sp.get("temperature", 1.0)),
            top_p=float(sp.get("top_p", 1.0)),
            top_k=int(sp.get("top_k", -1)),
            max_new_tokens=int(sp.get("max_new_tokens") or max_new_default),
            stop_token_ids=stop,
            seed=None if seed is None else int(seed),
        )
    except (TypeError, ValueError) as e:
        raise BadRequest(f"sampling_params: {e}") from e
    if not 0.0 < out.top_p <= 1.0:
        raise BadRequest(f"sampling_params.top_p must be in (0, 1], got {out.top_p}")
    if out.temperature < 0:
        raise BadRequest(f"sampling_params.temperature must be >= 0, got {out.temperature}")
    return out


def finish_reason_json(res: GenerateResult) -> dict:
    if res.finish_reason == "stop":
        return {"type": "stop", "matched": res.token_ids[-1] if res.token_ids else None}
    if res.finish_reason == "length":
        return {"type": "length", "length": len(res.token_ids)}
    return {"type": "abort", "message": "request aborted"}


class NativeServer:
    """aiohttp app serving SGLang's native API over `engine`.

    `load_weights(model_path) -> params` backs /update_weights_from_disk (e.g. hf_io's loader);
    `decode(ids) -> str` fills the `text` fields when a tokenizer is available (else "")."""

    def __init__(
        self,
        engine: Engine,
        *,
        model_path: str = "",
        load_weights: Callable[[str], object] | None = None,
        decode: Callable[[list[int]], str] | None = None,
        eos_token_ids: tuple[int, ...] = (),
        routing_shape: tuple[int, int] | None = None,
        max_new_tokens_default: int = 128,
        incremental_streaming_output: bool = False,
        image_token_id: int | None = None,
    ):
        """`image_token_id`: a vision-language engine's <|image_pad|> (default: its runner's, if it has one)."""
        self.engine, self.model_path = engine, model_path
        self.image_token_id = image_token_id if image_token_id is not None else getattr(
            getattr(engine, "runner", None), "image_token_id", None)
        self._load_weights, self._decode = load_weights, decode or (lambda ids: "")
        self.eos, self.routing_shape = tuple(eos_token_ids), routing_shape
        self.max_new_default, self.incremental = max_new_tokens_default, incremental_streaming_output
        self._tasks: dict[str, asyncio.Task] = {}
        self._aborted: set[str] = set()
        self._runner: web.AppRunner | None = None
        self.app = self._make_app()

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        r = app.router
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        for path, h in (("/flush_cache", self.flush_cache), ("/health", self.health),
                        ("/health_generate", self.health_generate)):
            r.add_get(path, h)
            r.add_post(path, h)
        r.add_post("/pause_generation", self.pause_generation)
        r.add_post("/continue_generation", self.continue_generation)
        r.add_post("/abort_request", self.abort_request)
        r.add_get("/get_model_info", self.get_model_info)
        r.add_get("/get_server_info", self.get_server_info)
        r.add_get("/get_weight_version", self.get_weight_version)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serves on host:port (0 = a free port); returns the base URL."""
        self._runner = web.AppRunner(self.app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return f"http://{host}:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ /generate
    async def _json(self, request: web.Request) -> dict:
        try:
            body = await request.json() if request.can_read_body else {}
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(f"body is not valid JSON: {e}") from e
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        return body

    def _parse_generate(self, body: dict) -> tuple[GenerateRequest, dict]:
        ids = body.get("input_ids")
        if ids is None:
            raise BadRequest("input_ids is required (this server does not tokenize text)")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool)
                                                          for t in ids):
            raise BadRequest("input_ids must be a non-empty list of ints (batched input is not supported)")
        if body.get("top_logprobs_num") not in (None, 0):
            raise BadRequest("top_logprobs_num is not supported by this engine")
        sampling = parse_sampling(body.get("sampling_params"), default_stop=self.eos,
                                  max_new_default=self.max_new_default)
        rid = body.get("rid") or uuid.uuid4().hex
        if not isinstance(rid, str):
            raise BadRequest("rid must be a string")
        session = body.get("session_params") or {}
        req = GenerateRequest(
            prompt_ids=ids, sampling=sampling, request_id=rid,
            session_id=session.get("id") if isinstance(session, dict) else None,
            return_routed_experts=bool(body.get("return_routed_experts", False)),
        )
        opts = {"logprob": bool(body.get("return_logprob", False)), "stream": bool(body.get("stream", False)),
                "text_in_logprobs": bool(body.get("return_text_in_logprobs", False))}
        return req, opts

    def _out(self, req: GenerateRequest, ids: list[int], lps: list[float], opts: dict, res: GenerateResult | None,
             t0: float, offset: int = 0) -> dict:
        meta = {
            "id": req.request_id, "finish_reason": finish_reason_json(res) if res else None,
            "prompt_tokens": len(req.prompt_ids), "completion_tokens": len(ids),
            "cached_tokens": 0, "weight_version": str(res.weight_version if res else self.engine.weight_version),
            "e2e_latency": time.monotonic() - t0,
        }
        if opts["logprob"]:
            text = (lambda t: self._decode([t])) if opts["text_in_logprobs"] else (lambda t: None)
            meta["output_token_logprobs"] = [[lp, t, text(t)] for lp, t in zip(lps[offset:], ids[offset:])]
            meta["input_token_logprobs"] = []
        if res is not None and res.routed_experts is not None:
            meta["routed_experts"] = base64.b64encode(np.ascontiguousarray(res.routed_experts, np.int32)
                                                      .tobytes()).decode()
        return {"text": self._decode(ids[offset:]), "output_ids": ids[offset:], "meta_info": meta}

    def _with_images(self, req: GenerateRequest, image_data: object) -> GenerateRequest:
        """`req` with its images decoded and preprocessed by the engine's processor, each placeholder expanded."""
        from research.models import image_processor as ip

        proc = self.engine.image_processor
        if proc is None or self.image_token_id is None:
            raise BadRequest("image_data given, but this model takes no images (a text-only engine)")
        items = image_data if isinstance(image_data, list) else [image_data]
        images, counts = [], []
        for i, item in enumerate(items):
            try:
                data = image_wire.image_bytes(item, f"image_data[{i}]")
                im, _ = ip.decode(data, proc)
                px, thw = ip.preprocess(im, proc)
            except ip.ImageError as e:
                raise BadRequest(f"image_data[{i}]: {e}") from None
            except ValueError as e:
                raise BadRequest(str(e)) from None
            images.append(ImageInput(hashlib.sha256(data).hexdigest(), thw, px, data))
            counts.append(ip.num_tokens(thw, proc))
        try:
            ids = image_wire.expand(list(req.prompt_ids), self.image_token_id, counts)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        return dataclasses.replace(req, prompt_ids=ids, images=tuple(images))

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._json(request)
            req, opts = self._parse_generate(body)
            if body.get("image_data") not in (None, []):
                req = await asyncio.to_thread(self._with_images, req, body["image_data"])
        except BadRequest as e:
            return _error(400, str(e))
        task = asyncio.current_task()
        self._tasks[req.request_id] = task
        try:
            if opts["stream"]:
                return await self._generate_stream(request, req, opts)
            return await self._generate_once(req, opts)
        except ContextLengthExceeded as e:
            return _error(400, f"context_length_exceeded: {e}")
        except EngineUnavailable as e:
            return _error(503, str(e), {"Retry-After": str(max(1, round(e.retry_after_s)))})
        except ValueError as e:
            return _error(400, str(e))
        except EngineError as e:
            return _error(500, str(e))
        finally:
            self._tasks.pop(req.request_id, None)

    async def _generate_once(self, req: GenerateRequest, opts: dict) -> web.Response:
        t0 = time.monotonic()
        try:
            res = await self.engine.generate(req)
        except asyncio.CancelledError:
            if not self._take_abort(req.request_id):
                raise
            res = GenerateResult([], [], "abort", self.engine.weight_version)
        return web.json_response(self._out(req, res.token_ids, res.logprobs, opts, res, t0))

    async def _generate_stream(self, request: web.Request, req: GenerateRequest, opts: dict) -> web.StreamResponse:
        t0 = time.monotonic()
        agen = self.engine.stream(req)
        # Pull the first item before committing to a 200, so admission errors are proper HTTP errors.
        item = await agen.__anext__()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        ids: list[int] = []
        lps: list[float] = []
        sent = 0
        try:
            while True:
                res = item if isinstance(item, GenerateResult) else None
                if res is None:
                    ids += item.token_ids
                    lps += item.logprobs
                else:
                    ids, lps = list(res.token_ids), list(res.logprobs)
                out = self._out(req, ids, lps, opts, res, t0, offset=sent if self.incremental else 0)
                sent = len(ids)
                await resp.write(b"data: " + json.dumps(out).encode() + b"\n\n")
                if res is not None:
                    break
                try:
                    item = await agen.__anext__()
                except asyncio.CancelledError:
                    if not self._take_abort(req.request_id):
                        raise  # the client went away: closing `agen` below aborts the generation
                    item = GenerateResult(ids, lps, "abort", self.engine.weight_version)
                except EngineError as e:  # after the 200: report in-band, as SGLang does
                    await resp.write(b"data: " + json.dumps({"error": {"message": str(e)}}).encode() + b"\n\n")
                    break
        finally:
            await agen.aclose()
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _take_abort(self, rid: str) -> bool:
        """True (once) when `rid` was cancelled by /abort_request rather than by a disconnect."""
        if rid in self._aborted:
            self._aborted.discard(rid)
            asyncio.current_task().uncancel()
            return True
        return False

    # ------------------------------------------------------------------ control endpoints
    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = await self._json(request)
        except BadRequest as e:
            return _error(400, str(e))
        rids = list(self._tasks) if body.get("abort_all") else [body.get("rid")]
        for rid in rids:
            task = self._tasks.get(rid)
            if task is not None:
                self._aborted.add(rid)
                task.cancel()
        return web.Response(status=200)

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        try:
            body = await self._json(request)
            path = body.get("model_path")
            if not isinstance(path, str) or not path:
                raise BadRequest("model_path is required")
            version = body.get("weight_version")
            version = self.engine.weight_version + 1 if version is None else int(version)
        except (BadRequest, ValueError, TypeError) as e:
            return _error(400, f"update_weights_from_disk: {e}")
        if self._load_weights is None:
            return web.json_response({"success": False, "message": "this server has no weight loader",
                                      "num_paused_requests": 0}, status=400)
        try:
            params = await asyncio.to_thread(self._load_weights, path)
            await self.engine.update_weights(params, version)
            if body.get("flush_cache", True) and hasattr(self.engine, "flush_cache"):
                await self.engine.flush_cache()
        except Exception as e:  # report like SGLang: success false + message, 400
            log.exception("weight update from %s failed", path)
            return web.json_response({"success": False, "message": f"{type(e).__name__}: {e}",
                                      "num_paused_requests": 0}, status=400)
        self.model_path = path
        return web.json_response({"success": True, "message": f"Succeeded to update model weights. Weight "
                                  f"version updated to {version}.", "num_paused_requests": 0})

    async def flush_cache(self, request: web.Request) -> web.Response:
        if hasattr(self.engine, "flush_cache"):
            await self.engine.flush_cache()
        return web.Response(text="Cache flushed.\n")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        req = GenerateRequest(prompt_ids=[0], sampling=SamplingParams(temperature=0.0, max_new_tokens=1))
        try:
            await asyncio.wait_for(self.engine.generate(req), timeout=20)
        except (EngineUnavailable, TimeoutError):
            return web.Response(status=503)
        return web.Response(status=200)

    async def pause_generation(self, request: web.Request) -> web.Response:
        await self.engine.pause()
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        await self.engine.resume()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def get_model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.model_path, "is_generation": True,
                                  "weight_version": str(self.engine.weight_version)})

    async def get_server_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.model_path, "weight_version": str(self.engine.weight_version),
                                  "context_length": self.engine.max_context, "routing_shape": self.routing_shape,
                                  "engine": type(self.engine).__name__,
                                  "incremental_streaming_output": self.incremental})

    async def get_weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": str(self.engine.weight_version)})
