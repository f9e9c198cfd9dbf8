"""A scripted mock model endpoint speaking Anthropic Messages, OpenAI Responses and Chat Completions.

Why: to run a real harness CLI headless without any model (and without the shim) — to check an
adapter's command and config, to record the CLI's real requests, and to capture its real output
formats for the parser tests. It is *not* the shim: no tokens, no capture; the shim is the
production path. The script is a list of steps, each a tool call `{"tool": name, "arguments": {}}`
or a final `{"text": "..."}`; the step served is the number of tool results already in the request,
so side calls (title generation, requests without tools) never consume a step.

    python -m harness_env.harnesses.mock_endpoint --port 8765 --script steps.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from typing import Any

from aiohttp import web

_ids = itertools.count(1)


def _tool_results(api: str, body: dict) -> int:
    if api == "anthropic_messages":
        return sum(1 for m in body.get("messages", []) if isinstance(m.get("content"), list)
                   for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result")
    if api == "openai_responses":
        items = body.get("input") if isinstance(body.get("input"), list) else []
        return sum(1 for it in items if isinstance(it, dict) and str(it.get("type", "")).endswith("call_output"))
    return sum(1 for m in body.get("messages", []) if m.get("role") == "tool")


class MockEndpoint:
    """Serves `script` to any caller; records every request (path, headers, body) in `requests`."""

    def __init__(self, script: list[dict[str, Any]], *, title: str = "Mock session"):
        self.script = script
        self.title = title
        self.requests: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    def step_for(self, api: str, body: dict) -> dict[str, Any]:
        if not body.get("tools"):  # side call (title/summary): never consumes a step
            return {"text": self.title}
        n = _tool_results(api, body)
        return self.script[n] if n < len(self.script) else {"text": "Done."}

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application(client_max_size=64 << 20)
        for prefix in ("", "/v1"):
            app.router.add_post(prefix + "/messages", self._anthropic)
            app.router.add_post(prefix + "/responses", self._responses)
            app.router.add_post(prefix + "/chat/completions", self._chat)
            app.router.add_get(prefix + "/models", self._models)
        app.router.add_route("*", "/{tail:.*}", self._other)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _record(self, request: web.Request, api: str) -> dict:
        body = await request.json()
        self.requests.append({"api": api, "path": request.path_qs, "headers": dict(request.headers), "body": body})
        return body

    def _error(self, api: str, body: dict) -> web.Response | None:
        """A step {"http_error": 400, "message": "..."} answers with an error in the provider's shape."""
        step = self.step_for(api, body)
        if "http_error" not in step:
            return None
        msg = str(step.get("message", "mock error"))
        err = ({"type": "error", "error": {"type": "invalid_request_error", "message": msg}}
               if api == "anthropic_messages" else
               {"error": {"message": msg, "type": "invalid_request_error", "code": step.get("code")}})
        return web.json_response(err, status=int(step["http_error"]))

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "me"}]})

    async def _other(self, request: web.Request) -> web.Response:
        self.requests.append({"api": "other", "path": request.path_qs, "headers": dict(request.headers), "body": None})
        return web.json_response({"error": {"message": f"mock: no route {request.path}"}}, status=404)

    @staticmethod
    async def _sse(request: web.Request, events: list[tuple[str | None, dict | str]]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for name, data in events:
            payload = data if isinstance(data, str) else json.dumps(data)
            head = f"event: {name}\n" if name else ""
            await resp.write(f"{head}data: {payload}\n\n".encode())
        await resp.write_eof()
        return resp

    # ---- Anthropic Messages ---------------------------------------------------------------------
    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request, "anthropic_messages")
        if (err := self._error("anthropic_messages", body)) is not None:
            return err
        step, n = self.step_for("anthropic_messages", body), next(_ids)
        model = body.get("model", "policy")
        if "tool" in step:
            block = {"type": "tool_use", "id": f"toolu_{n:06d}", "name": step["tool"], "input": step["arguments"]}
            stop = "tool_use"
        else:
            block, stop = {"type": "text", "text": step["text"]}, "end_turn"
        usage = {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        msg = {"id": f"msg_{n:06d}", "type": "message", "role": "assistant", "model": model, "content": [block],
               "stop_reason": stop, "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            return web.json_response(msg)
        start = {**block, "input": {}} if block["type"] == "tool_use" else {"type": "text", "text": ""}
        delta = ({"type": "input_json_delta", "partial_json": json.dumps(step["arguments"])} if "tool" in step
                 else {"type": "text_delta", "text": step["text"]})
        events = [
            ("message_start", {"type": "message_start", "message": {**msg, "content": [], "stop_reason": None}}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": 5}}),
            ("message_stop", {"type": "message_stop"}),
        ]
        return await self._sse(request, events)

    # ---- OpenAI Responses -------------------------------------------------------------------------
    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request, "openai_responses")
        if (err := self._error("openai_responses", body)) is not None:
            return err
        step, n = self.step_for("openai_responses", body), next(_ids)
        if "tool" in step:
            args = json.dumps(step["arguments"])
            item = {"type": "function_call", "id": f"fc_{n:06d}", "call_id": f"call_{n:06d}", "name": step["tool"],
                    "arguments": args, "status": "completed"}
        else:
            item = {"type": "message", "id": f"msg_{n:06d}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": step["text"], "annotations": []}]}
        usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}
        resp = {"id": f"resp_{n:06d}", "object": "response", "created_at": 0, "model": body.get("model", "policy"),
                "status": "completed", "output": [item], "usage": usage}
        if not body.get("stream"):
            return web.json_response(resp)
        seq = itertools.count()
        ev = lambda t, **kw: (t, {"type": t, "sequence_number": next(seq), **kw})
        events = [ev("response.created", response={**resp, "status": "in_progress", "output": []}),
                  ev("response.in_progress", response={**resp, "status": "in_progress", "output": []})]
        if "tool" in step:
            events += [
                ev("response.output_item.added", output_index=0,
                   item={**item, "arguments": "", "status": "in_progress"}),
                ev("response.function_call_arguments.delta", output_index=0, item_id=item["id"],
                   delta=item["arguments"]),
                ev("response.function_call_arguments.done", output_index=0, item_id=item["id"],
                   arguments=item["arguments"]),
            ]
        else:
            part = {"type": "output_text", "text": "", "annotations": []}
            loc = {"output_index": 0, "item_id": item["id"], "content_index": 0}
            events += [
                ev("response.output_item.added", output_index=0, item={**item, "status": "in_progress", "content": []}),
                ev("response.content_part.added", **loc, part=part),
                ev("response.output_text.delta", **loc, delta=step["text"]),
                ev("response.output_text.done", **loc, text=step["text"]),
                ev("response.content_part.done", **loc, part={**part, "text": step["text"]}),
            ]
        events += [ev("response.output_item.done", output_index=0, item=item), ev("response.completed", response=resp)]
        return await self._sse(request, events)

    # ---- OpenAI Chat Completions ---------------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request, "openai_chat")
        if (err := self._error("openai_chat", body)) is not None:
            return err
        step, n = self.step_for("openai_chat", body), next(_ids)
        model = body.get("model", "policy")
        if "tool" in step:
            call = {"id": f"call_{n:06d}", "type": "function",
                    "function": {"name": step["tool"], "arguments": json.dumps(step["arguments"])}}
            message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": step["text"]}, "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        base = {"id": f"chatcmpl-{n:06d}", "created": 0, "model": model}
        if not body.get("stream"):
            return web.json_response({**base, "object": "chat.completion", "usage": usage,
                                      "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
        chunk = lambda delta, fin=None: (None, {**base, "object": "chat.completion.chunk",
                                                "choices": [{"index": 0, "delta": delta, "finish_reason": fin}]})
        if "tool" in step:
            delta = {"role": "assistant", "content": None, "tool_calls": [{"index": 0, **call}]}
        else:
            delta = {"role": "assistant", "content": step["text"]}
        events = [chunk(delta), chunk({}, finish)]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append((None, {**base, "object": "chat.completion.chunk", "choices": [], "usage": usage}))
        events.append((None, "[DONE]"))
        return await self._sse(request, events)


async def _serve(port: int, script: list[dict]) -> None:
    mock = MockEndpoint(script)
    url = await mock.start(port=port)
    print(f"mock endpoint on {url} (Anthropic: {url}, OpenAI: {url}/v1)", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--script", help="JSON file: list of steps", default=None)
    args = ap.parse_args()
    script = json.load(open(args.script)) if args.script else [{"text": "Hello from the mock."}]
    asyncio.run(_serve(args.port, script))


if __name__ == "__main__":
    main()
