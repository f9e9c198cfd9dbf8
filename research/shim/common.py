"""Pieces every API adapter shares: request-field validation with precise errors, SSE writing,
and the provider-specific error bodies (OpenAI vs Anthropic shapes)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web


class BadRequest(ValueError):
    """Malformed request: 400 naming the offending field (`param`)."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


_TYPES = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
          bool: "a boolean"}


def field(obj: dict, key: str, typ: type | tuple[type, ...], where: str, *, required: bool = False,
          default: Any = None) -> Any:
    """obj[key] checked against typ; `where` is the path of obj for the error message."""
    path = f"{where}.{key}" if where else key
    if key not in obj or obj[key] is None:
        if required:
            raise BadRequest(path, "required field missing")
        return default
    v = obj[key]
    types = typ if isinstance(typ, tuple) else (typ,)
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
    if float in types and isinstance(v, int) and not isinstance(v, bool):
        ok = True
    if not ok:
        names = " or ".join(_TYPES.get(t, t.__name__) for t in types)
        raise BadRequest(path, f"must be {names}, got {type(v).__name__}")
    return v


def json_dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


async def parse_json_body(request: web.Request, max_bytes: int) -> dict:
    if request.content_length is not None and request.content_length > max_bytes:
        raise BadRequest("body", f"request body of {request.content_length} bytes exceeds {max_bytes}")
    raw = await request.content.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise BadRequest("body", f"request body exceeds {max_bytes} bytes")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest("body", f"not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise BadRequest("body", f"must be a JSON object, got {type(body).__name__}")
    return body


def openai_error(status: int, message: str, etype: str, *, code: str | None = None, param: str | None = None,
                 headers: dict | None = None) -> web.Response:
    body = {"error": {"message": message, "type": etype, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers, dumps=json_dumps)


def anthropic_error(status: int, message: str, etype: str, *, headers: dict | None = None) -> web.Response:
    body = {"type": "error", "error": {"type": etype, "message": message}}
    return web.json_response(body, status=status, headers=headers, dumps=json_dumps)


class SSE:
    """A started text/event-stream response; `send` raises ConnectionResetError when the client left."""

    def __init__(self, resp: web.StreamResponse):
        self.resp = resp

    @classmethod
    async def open(cls, request: web.Request) -> SSE:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                       "Cache-Control": "no-cache", "Connection": "keep-alive"})
        await resp.prepare(request)
        return cls(resp)

    async def send(self, data: Any, event: str | None = None) -> None:
        payload = data if isinstance(data, str) else json_dumps(data)
        msg = (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
        await self.resp.write(msg.encode())

    async def close(self) -> None:
        await self.resp.write_eof()


def text_of(content: Any, where: str, *, kinds: tuple[str, ...] = ("text", "input_text", "output_text")) -> str:
    """Content that may be a string or a list of text parts -> one string (parts joined by blank lines)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(where, f"must be a string or an array of content parts, got {type(content).__name__}")
    parts = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            parts.append(part)
            continue
        if not isinstance(part, dict):
            raise BadRequest(f"{where}[{i}]", "must be an object")
        kind = part.get("type")
        if kind in kinds or (kind is None and "text" in part):
            parts.append(field(part, "text", str, f"{where}[{i}]", required=True))
        elif kind in ("image", "image_url", "input_image", "document", "input_file"):
            parts.append(f"[{kind} omitted]")
        # other part kinds (cache markers, etc.) carry no text for the policy
    return "\n\n".join(parts)
