"""Anthropic Messages (`/v1/messages`, also `?beta=true` as Claude Code sends it), streaming and not.

Claude Code's requests carry many fields the policy has no use for (thinking, output_config,
context_management, cache_control, metadata, betas...): unknown fields are ignored, never an error.
One block assembler serves both the SSE stream and the JSON answer, so both carry identical blocks.
"""

from __future__ import annotations

from aiohttp import web

from research.shim.common import (
    SSE,
    BadRequest,
    RequestCache,
    cached_tools,
    field,
    image_text,
    join_parts,
    json_dumps,
    new_id,
    text_of,
)
from research.shim.parse import Delta, ParsedToolCall
from research.shim.render import Message, ToolCall
from research.shim.session import Call, ChatRequest, finish_json

SIGNATURE = "harness-rl-shim"  # thinking blocks must carry a signature; Claude Code sends it back verbatim
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "abort": "max_tokens"}


def _user_blocks(content: list, where: str) -> list[Message]:
    out: list[Message] = []
    texts: list[str] = []

    def flush():
        if texts:
            out.append(Message("user", join_parts(texts)))
            texts.clear()

    for j, b in enumerate(content):
        w = f"{where}[{j}]"
        if not isinstance(b, dict):
            raise BadRequest(w, "must be an object")
        kind = b.get("type")
        if kind == "tool_result":
            flush()
            out.append(Message("tool", text_of(b.get("content"), f"{w}.content"),
                               tool_call_id=field(b, "tool_use_id", str, w, default="")))
        elif kind == "text":
            texts.append(field(b, "text", str, w, required=True))
        elif kind == "image":
            texts.append(image_text(b, kind, w))
        elif kind == "document":
            texts.append(f"[{kind} omitted]")
    flush()
    return out


def _assistant_blocks(content: list, where: str) -> Message:
    texts, thoughts, calls = [], [], []
    for j, b in enumerate(content):
        w = f"{where}[{j}]"
        if not isinstance(b, dict):
            raise BadRequest(w, "must be an object")
        kind = b.get("type")
        if kind == "text":
            texts.append(field(b, "text", str, w, required=True))
        elif kind == "thinking":
            thoughts.append(field(b, "thinking", str, w, default=""))
        elif kind == "tool_use":
            calls.append(ToolCall(field(b, "id", str, w, default=""), field(b, "name", str, w, required=True),
                                  field(b, "input", dict, w, default={})))
    return Message("assistant", "".join(texts), "".join(thoughts) if thoughts else None, calls)


def _message(m, i: int, out: list[Message], _open: None) -> None:
    w = f"messages[{i}]"
    if not isinstance(m, dict):
        raise BadRequest(w, "must be an object")
    role = field(m, "role", str, w, required=True)
    content = m.get("content", "")
    if role not in ("user", "assistant", "system"):
        raise BadRequest(f"{w}.role", f"unknown role {role!r}")
    if isinstance(content, str):
        out.append(Message(role, content))
    elif not isinstance(content, list):
        raise BadRequest(f"{w}.content", "must be a string or an array of content blocks")
    elif role == "assistant":
        out.append(_assistant_blocks(content, f"{w}.content"))
    else:
        out += _user_blocks(content, f"{w}.content") if role == "user" else [
            Message("system", text_of(content, f"{w}.content"))]


def parse_messages(raw: list, cache: RequestCache | None = None) -> list[Message]:
    return (cache or RequestCache()).parse(raw, _message, "messages")


def parse_tools(body: dict) -> list[dict]:
    out = []
    for i, t in enumerate(field(body, "tools", list, "", default=[])):
        if not isinstance(t, dict):
            raise BadRequest(f"tools[{i}]", "must be an object")
        if "input_schema" not in t:
            continue  # server tools (web_search_2025..., bash_2025...) are executed by Anthropic, not here
        fn = {"name": field(t, "name", str, f"tools[{i}]", required=True)}
        if t.get("description") is not None:
            fn["description"] = field(t, "description", str, f"tools[{i}]")
        fn["parameters"] = field(t, "input_schema", dict, f"tools[{i}]", required=True)
        out.append({"type": "function", "function": fn})
    return out


def parse_request(body: dict, cache: RequestCache | None = None, *, count_only: bool = False) -> ChatRequest:
    """`cache`: the session's RequestCache for this API (history already parsed last call)."""
    msgs = field(body, "messages", list, "", required=True)
    if not msgs and not count_only:
        raise BadRequest("messages", "must not be empty")
    system = body.get("system")
    cache = cache or RequestCache()
    messages = parse_messages(msgs, cache)
    if system:
        messages.insert(0, cache.single("system", system, lambda: Message("system", text_of(system, "system"))))
    max_tokens = field(body, "max_tokens", int, "")
    if max_tokens is not None and max_tokens < 1 and not count_only:
        raise BadRequest("max_tokens", "must be >= 1")
    thinking = field(body, "thinking", dict, "", default={})
    tool_choice = field(body, "tool_choice", dict, "", default={})
    return ChatRequest(
        messages=messages, tools=cached_tools(body, cache, parse_tools),
        model=field(body, "model", str, "", default="policy"),
        stream=bool(field(body, "stream", bool, "", default=False)), max_tokens=max_tokens,
        temperature=field(body, "temperature", float, ""), top_p=field(body, "top_p", float, ""),
        top_k=field(body, "top_k", int, ""),
        enable_thinking=False if thinking.get("type") == "disabled" else None,
        parse_tools=tool_choice.get("type") != "none", meta={"tool_choice": tool_choice.get("type", "auto")})


class _Blocks:
    """Turns parser events into content blocks and the SSE events that build them."""

    def __init__(self):
        self.blocks: list[dict] = []
        self.open_kind: str | None = None

    def _close(self) -> list[tuple[str, dict]]:
        if self.open_kind is None:
            return []
        i, evs = len(self.blocks) - 1, []
        if self.open_kind == "thinking":
            evs.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                "delta": {"type": "signature_delta", "signature": SIGNATURE}}))
        self.open_kind = None
        return evs + [("content_block_stop", {"type": "content_block_stop", "index": i})]

    def add(self, ev: Delta | ParsedToolCall) -> list[tuple[str, dict]]:
        if isinstance(ev, ParsedToolCall):
            evs = self._close()
            block = {"type": "tool_use", "id": f"toolu_{new_id(24)}", "name": ev.name, "input": {}}
            i = len(self.blocks)
            self.blocks.append({**block, "input": ev.arguments})
            return evs + [("content_block_start", {"type": "content_block_start", "index": i, "content_block": block}),
                          ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                              "type": "input_json_delta", "partial_json": json_dumps(ev.arguments)}}),
                          ("content_block_stop", {"type": "content_block_stop", "index": i})]
        kind = "thinking" if ev.kind == "reasoning" else "text"
        evs = []
        if self.open_kind != kind:
            evs = self._close()
            start = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {
                "type": "text", "text": ""}
            self.blocks.append(dict(start))
            self.open_kind = kind
            evs.append(("content_block_start", {"type": "content_block_start", "index": len(self.blocks) - 1,
                                                "content_block": start}))
        blk = self.blocks[-1]
        blk[kind] += ev.text
        if kind == "thinking":
            blk["signature"] = SIGNATURE
        delta = {"type": "thinking_delta", "thinking": ev.text} if kind == "thinking" else {
            "type": "text_delta", "text": ev.text}
        return evs + [("content_block_delta", {"type": "content_block_delta", "index": len(self.blocks) - 1,
                                               "delta": delta})]

    def finish(self) -> list[tuple[str, dict]]:
        return self._close()


def _usage(call: Call, output_tokens: int) -> dict:
    return {"input_tokens": len(call.prompt.ids), "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


async def respond(call: Call, request: web.Request) -> web.StreamResponse:
    mid, blocks = f"msg_{new_id(24)}", _Blocks()
    message = {"id": mid, "type": "message", "role": "assistant", "model": call.req.model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": _usage(call, 0)}
    if not call.req.stream:
        async for ev in call.events():
            blocks.add(ev)
        blocks.finish()
        message.update(content=blocks.blocks, stop_reason=STOP_REASONS[call.finish_reason],
                       usage=_usage(call, len(call.completion_ids)))
        return await finish_json(call, message)
    sse = call.sse = await SSE.open(request)
    await sse.send({"type": "message_start", "message": message}, event="message_start")
    await sse.send({"type": "ping"}, event="ping")
    async for ev in call.events():
        for name, data in blocks.add(ev):
            await sse.send(data, event=name)
    for name, data in blocks.finish():
        await sse.send(data, event=name)
    await call.finish()
    await sse.send({"type": "message_delta", "delta": {"stop_reason": STOP_REASONS[call.finish_reason],
                                                       "stop_sequence": None},
                    "usage": {"output_tokens": len(call.completion_ids)}}, event="message_delta")
    await sse.send({"type": "message_stop"}, event="message_stop")
    await sse.close()
    return sse.resp


async def stream_error(call: Call, message: str, kind: str) -> None:
    etype = "overloaded_error" if kind == "overloaded" else "api_error"
    await call.sse.send({"type": "error", "error": {"type": etype, "message": message}}, event="error")
    await call.sse.close()
