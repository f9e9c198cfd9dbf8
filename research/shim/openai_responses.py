"""OpenAI Responses (`/v1/responses`), the API Codex speaks: function + custom tools, streamed events.

Namespace tools (`{"type": "namespace", "name": "mcp__playwright", "tools": [functions]}`: how Codex
sends an MCP server's tools) are flattened into functions named `{namespace}__{name}` (the name the
policy sees and calls, as Claude Code names MCP tools); a call of such a name goes back as a
function_call item with `name` and `namespace` split again, and history items carrying a namespace fold
back into the flat name.

Input items are folded back into chat turns: consecutive reasoning / assistant message /
function_call items are one assistant turn (that is how the shim produced them), outputs of tool
calls become tool turns. The streamed event sequence follows the OpenAI SDK's event types:
response.created, response.in_progress, then per output item output_item.added, (content_part.added,
output_text.delta..., output_text.done, content_part.done | reasoning_text.delta..., reasoning_text.done
| function_call_arguments.delta, function_call_arguments.done), output_item.done, and finally
response.completed (after the call is captured).
"""

from __future__ import annotations

import time

from aiohttp import web

from research.shim.common import SSE, BadRequest, RequestCache, cached_tools, field, json_dumps, new_id, text_of
from research.shim.parse import Delta, ParsedToolCall
from research.shim.render import Message, ToolCall
from research.shim.session import Call, ChatRequest, finish_json

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
CUSTOM_PARAMS = {"type": "object", "properties": {"input": {"type": "string", "description": "the raw tool input"}},
                 "required": ["input"]}
TEXT_KINDS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def _fold_item(it, i: int, out: list[Message], cur: Message | None) -> Message | None:
    """One input item into `out`; returns the assistant turn still open (later reasoning / message /
    call items of the same turn extend it) or None."""
    w = f"input[{i}]"
    if not isinstance(it, dict):
        raise BadRequest(w, "must be an object")
    kind = it.get("type", "message" if "role" in it else None)
    if kind == "message":
        role = ROLES.get(field(it, "role", str, w, required=True))
        if role is None:
            raise BadRequest(f"{w}.role", f"unknown role {it['role']!r}")
        text = text_of(it.get("content"), f"{w}.content", kinds=TEXT_KINDS)
        if role == "assistant":
            if cur is None or cur.tool_calls:
                cur = Message("assistant")
                out.append(cur)
            cur.content += text
            return cur
        out.append(Message(role, text))
    elif kind == "reasoning":
        parts = it.get("content") or it.get("summary") or []
        if not isinstance(parts, list):
            raise BadRequest(f"{w}.content", "must be an array of reasoning parts")
        text = "".join(p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
        if cur is None or cur.content or cur.tool_calls:
            cur = Message("assistant")
            out.append(cur)
        cur.reasoning = (cur.reasoning or "") + text
        return cur
    elif kind in ("function_call", "custom_tool_call"):
        if cur is None:
            cur = Message("assistant")
            out.append(cur)
        args = field(it, "arguments", str, w, default="{}") if kind == "function_call" else {
            "input": field(it, "input", str, w, default="")}
        name, ns = field(it, "name", str, w, required=True), field(it, "namespace", str, w)
        cur.tool_calls.append(ToolCall(field(it, "call_id", str, w, default=""),
                                       f"{ns}__{name}" if ns else name, args))
        return cur
    elif kind in ("function_call_output", "custom_tool_call_output"):
        output = it.get("output", "")
        out.append(Message("tool", output if isinstance(output, str) else text_of(output, f"{w}.output",
                                                                                  kinds=TEXT_KINDS),
                           tool_call_id=it.get("call_id")))
    # other item kinds (web_search_call, item_reference, ...) carry nothing the policy generated
    return None


def _fold_items(items: list, cache: RequestCache | None = None) -> list[Message]:
    """Input items -> chat turns (consecutive reasoning / message / call items are one assistant turn)."""
    return (cache or RequestCache()).parse(items, _fold_item, "input")


def parse_tools(body: dict) -> tuple[list[dict], set[str], dict[str, list[str]]]:
    """(chat tools, names of custom tools, flat name -> [namespace, name] of namespaced functions)."""
    out, custom, spaced = [], set(), {}
    for i, t in enumerate(field(body, "tools", list, "", default=[])):
        if not isinstance(t, dict):
            raise BadRequest(f"tools[{i}]", "must be an object")
        if t.get("type") == "namespace":
            ns = field(t, "name", str, f"tools[{i}]", required=True)
            for j, inner in enumerate(field(t, "tools", list, f"tools[{i}]", default=[])):
                tool = _tool(inner, f"tools[{i}].tools[{j}]", custom, prefix=f"{ns}__")
                if tool is not None:
                    out.append(tool)
                    spaced[tool["function"]["name"]] = [ns, tool["function"]["name"][len(ns) + 2:]]
            continue
        tool = _tool(t, f"tools[{i}]", custom)
        if tool is not None:
            out.append(tool)
    return out, custom, spaced


def _tool(t, w: str, custom: set[str], prefix: str = "") -> dict | None:
    if not isinstance(t, dict):
        raise BadRequest(w, "must be an object")
    kind = t.get("type")
    if kind not in ("function", "custom"):
        return None
    fn = {"name": prefix + field(t, "name", str, w, required=True)}
    if t.get("description") is not None:
        fn["description"] = field(t, "description", str, w)
    if kind == "custom":
        custom.add(fn["name"])
        fn["parameters"] = CUSTOM_PARAMS
    else:
        fn["parameters"] = field(t, "parameters", dict, w, default={})
    return {"type": "function", "function": fn}


def parse_request(body: dict, cache: RequestCache | None = None) -> ChatRequest:
    """`cache`: the session's RequestCache for this API (history already parsed last call)."""
    raw = body.get("input")
    cache = cache or RequestCache()
    if raw is None:
        raise BadRequest("input", "required field missing")
    if isinstance(raw, str):
        messages = [cache.single("input", raw, lambda: Message("user", raw))]
    elif isinstance(raw, list):
        messages = _fold_items(raw, cache)
    else:
        raise BadRequest("input", f"must be a string or an array of items, got {type(raw).__name__}")
    instructions = field(body, "instructions", str, "")
    if instructions:
        messages.insert(0, cache.single("instructions", instructions, lambda: Message("system", instructions)))
    if not messages:
        raise BadRequest("input", "must not be empty")
    tools, custom, spaced = cached_tools(body, cache, parse_tools)
    reasoning = field(body, "reasoning", dict, "", default={})
    tool_choice = body.get("tool_choice", "auto")
    max_tokens = field(body, "max_output_tokens", int, "")
    if max_tokens is not None and max_tokens < 1:
        raise BadRequest("max_output_tokens", "must be >= 1")
    return ChatRequest(
        messages=messages, tools=tools, model=field(body, "model", str, "", default="policy"),
        stream=bool(field(body, "stream", bool, "", default=False)), max_tokens=max_tokens,
        temperature=field(body, "temperature", float, ""), top_p=field(body, "top_p", float, ""),
        enable_thinking=False if reasoning.get("effort") == "none" else None, parse_tools=tool_choice != "none",
        meta={"tool_choice": tool_choice if isinstance(tool_choice, str) else json_dumps(tool_choice),
              "custom_tools": sorted(custom), **({"namespaced_tools": spaced} if spaced else {})})


class _Items:
    """Parser events -> Responses output items, plus the SSE events that build them."""

    def __init__(self, custom: set[str], spaced: dict | None = None):
        self.items: list[dict] = []
        self.open: dict | None = None
        self.custom = custom
        self.spaced = spaced or {}  # flat name -> [namespace, name]

    def _close(self) -> list[dict]:
        it, self.open = self.open, None
        if it is None:
            return []
        idx = len(self.items) - 1
        it["status"] = "completed"
        if it["type"] == "reasoning":
            text = it["content"][0]["text"]
            evs = [{"type": "response.reasoning_text.done", "item_id": it["id"], "output_index": idx,
                    "content_index": 0, "text": text}]
        else:
            part = it["content"][0]
            evs = [{"type": "response.output_text.done", "item_id": it["id"], "output_index": idx,
                    "content_index": 0, "text": part["text"], "logprobs": []},
                   {"type": "response.content_part.done", "item_id": it["id"], "output_index": idx,
                    "content_index": 0, "part": part}]
        return evs + [{"type": "response.output_item.done", "output_index": idx, "item": it}]

    def _tool(self, ev: ParsedToolCall) -> list[dict]:
        evs, idx, cid = self._close(), len(self.items), f"call_{new_id(24)}"
        if ev.name in self.custom:
            inp = ev.arguments.get("input")
            inp = inp if isinstance(inp, str) else json_dumps(ev.arguments)
            item = {"type": "custom_tool_call", "id": f"ctc_{new_id(24)}", "call_id": cid,
                    "name": ev.name, "input": inp, "status": "completed"}
            self.items.append(item)
            return evs + [
                {"type": "response.output_item.added", "output_index": idx, "item": {**item, "input": ""}},
                {"type": "response.custom_tool_call_input.delta", "item_id": item["id"], "output_index": idx,
                 "delta": inp},
                {"type": "response.custom_tool_call_input.done", "item_id": item["id"], "output_index": idx,
                 "input": inp},
                {"type": "response.output_item.done", "output_index": idx, "item": item}]
        args = json_dumps(ev.arguments)
        ns, name = self.spaced.get(ev.name, (None, ev.name))
        item = {"type": "function_call", "id": f"fc_{new_id(24)}", "call_id": cid, "name": name,
                "arguments": args, "status": "completed", **({"namespace": ns} if ns else {})}
        self.items.append(item)
        return evs + [
            {"type": "response.output_item.added", "output_index": idx,
             "item": {**item, "arguments": "", "status": "in_progress"}},
            {"type": "response.function_call_arguments.delta", "item_id": item["id"], "output_index": idx,
             "delta": args},
            {"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": idx,
             "name": name, "arguments": args},
            {"type": "response.output_item.done", "output_index": idx, "item": item}]

    def add(self, ev: Delta | ParsedToolCall) -> list[dict]:
        if isinstance(ev, ParsedToolCall):
            return self._tool(ev)
        kind = "reasoning" if ev.kind == "reasoning" else "message"
        evs = []
        if self.open is None or self.open["type"] != kind:
            evs = self._close()
            idx = len(self.items)
            if kind == "reasoning":
                item = {"type": "reasoning", "id": f"rs_{new_id(24)}", "summary": [],
                        "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}
                evs.append({"type": "response.output_item.added", "output_index": idx,
                            "item": {**item, "content": []}})
            else:
                item = {"type": "message", "id": f"msg_{new_id(24)}", "status": "in_progress",
                        "role": "assistant", "content": [{"type": "output_text", "text": "", "annotations": []}]}
                evs += [{"type": "response.output_item.added", "output_index": idx, "item": {**item, "content": []}},
                        {"type": "response.content_part.added", "item_id": item["id"], "output_index": idx,
                         "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}]
            self.items.append(item)
            self.open = item
        idx, item = len(self.items) - 1, self.open
        item["content"][0]["text"] += ev.text
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        d = {"type": name, "item_id": item["id"], "output_index": idx, "content_index": 0, "delta": ev.text}
        if kind == "message":
            d["logprobs"] = []
        return evs + [d]

    def finish(self) -> list[dict]:
        return self._close()


def _response(call: Call, rid: str, created: int, status: str, output: list[dict]) -> dict:
    r = {"id": rid, "object": "response", "created_at": created, "status": status, "model": call.req.model,
         "output": output, "parallel_tool_calls": True, "tool_choice": call.req.meta.get("tool_choice", "auto"),
         "tools": [], "error": None, "incomplete_details": None, "metadata": {}, "instructions": None,
         "temperature": call.req.temperature, "top_p": call.req.top_p}
    if status == "incomplete":
        r["incomplete_details"] = {"reason": "max_output_tokens"}
    if status in ("completed", "incomplete"):
        n_in, n_out = len(call.prompt.ids), len(call.completion_ids)
        r["usage"] = {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": n_out,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": n_in + n_out}
    return r


async def respond(call: Call, request: web.Request) -> web.StreamResponse:
    rid, created = f"resp_{new_id(32)}", int(time.time())
    items = _Items(set(call.req.meta.get("custom_tools", ())), call.req.meta.get("namespaced_tools"))
    if not call.req.stream:
        async for ev in call.events():
            items.add(ev)
        items.finish()
        status = "incomplete" if call.finish_reason in ("length", "abort") else "completed"
        return await finish_json(call, _response(call, rid, created, status, items.items))
    sse = call.sse = await SSE.open(request)
    seq = 0

    async def send(ev: dict) -> None:
        nonlocal seq
        await sse.send({**ev, "sequence_number": seq}, event=ev["type"])
        seq += 1

    call.responses_send = send
    await send({"type": "response.created", "response": _response(call, rid, created, "in_progress", [])})
    await send({"type": "response.in_progress", "response": _response(call, rid, created, "in_progress", [])})
    async for ev in call.events():
        for e in items.add(ev):
            await send(e)
    for e in items.finish():
        await send(e)
    await call.finish()
    status = "incomplete" if call.finish_reason in ("length", "abort") else "completed"
    await send({"type": "response.completed", "response": _response(call, rid, created, status, items.items)})
    await sse.close()
    return sse.resp


async def stream_error(call: Call, message: str, kind: str) -> None:
    send = call.responses_send
    await send({"type": "response.failed", "response": {
        "id": "resp_failed", "object": "response", "status": "failed", "output": [], "model": call.req.model,
        "error": {"code": "server_error" if kind == "server" else "rate_limit_exceeded", "message": message}}})
    await call.sse.close()
