"""OpenAI Chat Completions (`/v1/chat/completions`), streaming and not, tools + parallel tool calls."""

from __future__ import annotations

import time

from aiohttp import web

from research.shim.common import SSE, BadRequest, RequestCache, cached_tools, field, json_dumps, new_id, text_of
from research.shim.parse import Delta, ParsedToolCall
from research.shim.render import Message, ToolCall
from research.shim.session import Call, ChatRequest, finish_json

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
         "function": "tool"}


def parse_tools(body: dict) -> list[dict]:
    tools = field(body, "tools", list, "", default=[])
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise BadRequest(f"tools[{i}]", "must be an object")
        if t.get("type", "function") != "function":
            continue  # non-function tools (web search etc.) have no meaning for the policy
        fn = field(t, "function", dict, f"tools[{i}]", required=True)
        field(fn, "name", str, f"tools[{i}].function", required=True)
        out.append({"type": "function", "function": fn})
    return out


def _assistant(m: dict, where: str) -> Message:
    calls = []
    for j, tc in enumerate(field(m, "tool_calls", list, where, default=[])):
        w = f"{where}.tool_calls[{j}]"
        if not isinstance(tc, dict):
            raise BadRequest(w, "must be an object")
        fn = field(tc, "function", dict, w, required=True)
        args = field(fn, "arguments", (str, dict), f"{w}.function", default="{}")
        calls.append(ToolCall(field(tc, "id", str, w, default=""), field(fn, "name", str, f"{w}.function",
                                                                         required=True), args))
    reasoning = field(m, "reasoning_content", str, where) or field(m, "reasoning", str, where)
    return Message("assistant", text_of(m.get("content"), f"{where}.content"), reasoning, calls)


def _message(m, i: int, out: list[Message], _open: None) -> None:
    w = f"messages[{i}]"
    if not isinstance(m, dict):
        raise BadRequest(w, "must be an object")
    role = ROLES.get(field(m, "role", str, w, required=True))
    if role is None:
        raise BadRequest(f"{w}.role", f"unknown role {m['role']!r}")
    if role == "assistant":
        out.append(_assistant(m, w))
    else:
        out.append(Message(role, text_of(m.get("content"), f"{w}.content"),
                           tool_call_id=m.get("tool_call_id") if role == "tool" else None))


def parse_messages(raw: list, cache: RequestCache | None = None) -> list[Message]:
    return (cache or RequestCache()).parse(raw, _message, "messages")


def thinking_switch(body: dict) -> bool | None:
    kw = field(body, "chat_template_kwargs", dict, "", default={})
    if "enable_thinking" in kw:
        return bool(kw["enable_thinking"])
    effort = body.get("reasoning_effort")
    return False if effort in ("none", "minimal") else None


def parse_request(body: dict, cache: RequestCache | None = None) -> ChatRequest:
    """`cache`: the session's RequestCache for this API (history already parsed last call)."""
    msgs = field(body, "messages", list, "", required=True)
    if not msgs:
        raise BadRequest("messages", "must not be empty")
    if field(body, "n", int, "", default=1) != 1:
        raise BadRequest("n", "only n=1 is supported (one sample per call; the rollout runner makes groups)")
    max_tokens = field(body, "max_completion_tokens", int, "") or field(body, "max_tokens", int, "")
    if max_tokens is not None and max_tokens < 1:
        raise BadRequest("max_tokens", "must be >= 1")
    tool_choice = body.get("tool_choice", "auto")
    return ChatRequest(
        messages=parse_messages(msgs, cache), tools=cached_tools(body, cache, parse_tools),
        model=field(body, "model", str, "", default="policy"),
        stream=bool(field(body, "stream", bool, "", default=False)), max_tokens=max_tokens,
        temperature=field(body, "temperature", float, ""), top_p=field(body, "top_p", float, ""),
        top_k=field(body, "top_k", int, ""), seed=field(body, "seed", int, ""),
        enable_thinking=thinking_switch(body), parse_tools=tool_choice != "none",
        meta={"tool_choice": tool_choice if isinstance(tool_choice, str) else json_dumps(tool_choice),
              "include_usage": bool((field(body, "stream_options", dict, "", default={})).get("include_usage"))})


def _tool_call_json(c: ParsedToolCall, cid: str, index: int | None = None) -> dict:
    d = {"id": cid, "type": "function", "function": {"name": c.name, "arguments": json_dumps(c.arguments)}}
    return d if index is None else {"index": index, **d}


def _finish(call: Call) -> str:
    """An engine-side abort (e.g. weight update in "abort" mode) looks like a truncation to the harness."""
    return "length" if call.finish_reason == "abort" else call.finish_reason


def _usage(call: Call) -> dict:
    p, c = len(call.prompt.ids), len(call.completion_ids)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


async def respond(call: Call, request: web.Request) -> web.StreamResponse:
    """Runs a started call and writes the OpenAI answer (JSON or SSE chunks)."""
    cid, created, model = f"chatcmpl-{new_id(32)}", int(time.time()), call.req.model
    if not call.req.stream:
        out = await call.generate_all()
        msg = {"role": "assistant", "content": out.content or (None if out.tool_calls else "")}
        if out.reasoning is not None:
            msg["reasoning_content"] = out.reasoning
        if out.tool_calls:
            msg["tool_calls"] = [_tool_call_json(c, f"call_{new_id(24)}") for c in out.tool_calls]
        body = {"id": cid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": msg, "finish_reason": _finish(call), "logprobs": None}],
                "usage": _usage(call)}
        return await finish_json(call, body)

    sse = call.sse = await SSE.open(request)

    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    await sse.send(chunk({"role": "assistant", "content": ""}))
    n_calls = 0
    async for ev in call.events():
        if isinstance(ev, Delta):
            await sse.send(chunk({"content": ev.text} if ev.kind == "text" else {"reasoning_content": ev.text}))
        else:
            await sse.send(chunk({"tool_calls": [_tool_call_json(ev, f"call_{new_id(24)}", n_calls)]}))
            n_calls += 1
    await call.finish()
    await sse.send(chunk({}, _finish(call)))
    if call.req.meta.get("include_usage"):
        await sse.send({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": [], "usage": _usage(call)})
    await sse.send("[DONE]")
    await sse.close()
    return sse.resp


async def stream_error(call: Call, message: str, kind: str) -> None:
    """Mid-stream failure: an error object in the stream (what OpenAI's servers send), then [DONE]."""
    await call.sse.send({"error": {"message": message, "type": "server_error", "param": None, "code": kind}})
    await call.sse.send("[DONE]")
    await call.sse.close()
