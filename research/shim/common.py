"""Pieces every API adapter shares: request-field validation with precise errors, SSE writing,
and the provider-specific error bodies (OpenAI vs Anthropic shapes)."""

from __future__ import annotations

import asyncio
import bisect
import math
import os
import random
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from research.shim import images


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
    v = obj.get(key)
    if type(v) is typ:  # the common case, checked first (this runs for every field of every message)
        return v
    path = f"{where}.{key}" if where else key
    if v is None:
        if required:
            raise BadRequest(path, "required field missing")
        return default
    types = typ if isinstance(typ, tuple) else (typ,)
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
    if float in types and isinstance(v, int) and not isinstance(v, bool):
        ok = True
    if not ok:
        names = " or ".join(_TYPES.get(t, t.__name__) for t in types)
        raise BadRequest(path, f"must be {names}, got {type(v).__name__}")
    return v


_IDS = random.Random(int.from_bytes(os.urandom(16), "big"))  # seeded once from the OS, then no syscalls


def new_id(n: int = 24) -> str:
    """`n` random hex digits for response / item / call ids (uuid4 reads /dev/urandom every time)."""
    return f"{_IDS.getrandbits(4 * n):0{n}x}"


class RequestCache:
    """A session's previous request, parsed (one per API). Agent loops resend their whole history
    on every call: the leading items equal to last time's (one C-level compare each) are not parsed
    again and keep their Message objects, which lets the renderer reuse their segments too.

    `parse(raw, step, where)`: `step(item, index, out, open_turn) -> open_turn` appends the item's
    messages to `out`; parsing resumes only after an item that left no turn open (Responses folds
    several items into one assistant turn). New items are checked for nesting depth here (the body
    check skips the history, see `parse_json_body`), so a long history is walked once, not per call."""

    def __init__(self):
        self.raw: list = []
        self.out: list = []
        self.marks: list[tuple[int, int]] = [(0, 0)]  # (items parsed, messages out) with no open turn
        self.singles: dict[str, tuple[Any, Any]] = {}

    def parse(self, raw: list, step: Callable[[Any, int, list, Any], Any], where: str) -> list:
        k, n = 0, min(len(raw), len(self.raw))
        while k < n and raw[k] == self.raw[k]:  # cached items are shallow: the compare recursion is bounded
            k += 1
        for i in range(k, len(raw)):
            if json_depth(raw[i], MAX_JSON_DEPTH) > MAX_JSON_DEPTH - 2:  # the item sits 2 levels down
                raise BadRequest(f"{where}[{i}]", f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        j = bisect.bisect_right(self.marks, (k, 1 << 62)) - 1
        start, n_out = self.marks[j]
        marks, out, cur = self.marks[:j + 1], self.out[:n_out], None
        for i in range(start, len(raw)):
            cur = step(raw[i], i, out, cur)
            if cur is None:
                marks.append((i + 1, len(out)))
        self.raw, self.out, self.marks = raw, out, marks
        return list(out)

    def single(self, name: str, raw: Any, make: Callable[[], Any]) -> Any:
        """`make()`, or what it returned last time for an equal `raw` (e.g. the system prompt)."""
        hit = self.singles.get(name)
        if hit is not None and hit[0] == raw:
            return hit[1]
        value = make()
        self.singles[name] = (raw, value)
        return value


def cached_tools(body: dict, cache: RequestCache | None, parse: Callable[[dict], Any]) -> Any:
    """`parse(body)` for the body's tools, reused while the client resends the same tools (an agent
    sends all of them, schemas included, on every call); depth-checked when new (the body check
    skips them, see `parse_json_body`)."""
    raw = body.get("tools")

    def make():
        if type(raw) is list and json_depth(raw, MAX_JSON_DEPTH) > MAX_JSON_DEPTH - 1:
            raise BadRequest("tools", f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        return parse(body)

    return (cache or RequestCache()).single("tools", raw, make)


SEED_RANGE = (-(1 << 63), (1 << 63) - 1)  # OpenAI's int64 seed
TOP_K_MAX = (1 << 31) - 1  # engines hold top_k in int32


def sampling_problem(name: str, value: Any, *, max_temperature: float = 2.0) -> str | None:
    """Why `value` is not a sampling value every engine can take, or None.

    Checked once at the shim for every engine: the replay engine takes anything, the JAX engine
    raised a 500 on top_p 0 and sampled garbage at NaN temperature, SGLang rejects top_k < -1."""
    if value is None:
        return None
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if name in ("temperature", "top_p"):
        if not (is_int or isinstance(value, float)) or not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
        if name == "temperature" and not 0 <= value <= max_temperature:
            return f"must be between 0 and {max_temperature:g}, got {value!r}"
        if name == "top_p" and not 0 < value <= 1:
            return f"must be greater than 0 and at most 1, got {value!r}"
    elif name == "top_k":
        if not is_int or not -1 <= value <= TOP_K_MAX:
            return f"must be an integer from -1 (or 0: no top-k) to {TOP_K_MAX}, got {value!r}"
    elif name == "seed":
        if not is_int or not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
            return f"must be a 64-bit signed integer, got {value!r}"
    return None


def check_sampling(req: Any, *, max_temperature: float = 2.0) -> None:
    """Raises BadRequest naming the first sampling field of the request no engine should get."""
    for name in ("temperature", "top_p", "top_k", "seed"):
        why = sampling_problem(name, getattr(req, name), max_temperature=max_temperature)
        if why:
            raise BadRequest(name, why)


MAX_JSON_DEPTH = 128  # nesting of a request body (real harness requests stay under ~20; JSON Schema included)


class BodyTooLarge(BadRequest):
    """413: the body is over the shim's limit (read up to the limit, never buffered whole)."""

    def __init__(self, message: str):
        super().__init__("body", message)


def json_dumps(obj: Any) -> str:
    """Compact UTF-8 JSON of a response object (orjson; every value came from orjson or the parser)."""
    return orjson.dumps(obj).decode()


def json_depth(obj: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value (0 for a scalar), level by level without recursion;
    stops early once over `limit`. ~0.1 ms for a 40-turn agent request."""
    if type(obj) is not dict and type(obj) is not list:
        return 0
    level, depth = [obj], 0
    while level:
        depth += 1
        if depth > limit:
            return depth
        nxt = []
        for v in level:
            for c in (v.values() if type(v) is dict else v):
                t = type(c)
                if t is dict or t is list:
                    nxt.append(c)
        level = nxt
    return depth


def loads_checked(raw: bytes | bytearray | str, *, max_depth: int | None = MAX_JSON_DEPTH) -> Any:
    """Strict JSON: valid UTF-8, no lone surrogates (not even as \\u escapes), no NaN/Infinity, and
    at most `max_depth` levels (the stdlib parser and every later `json.dumps` would otherwise hit
    Python's recursion limit on deep input). Raises ValueError with the reason."""
    try:
        v = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        if "UTF-8" in str(e) and not isinstance(raw, str):
            try:
                bytes(raw).decode("utf-8")
            except UnicodeDecodeError as u:
                raise ValueError(f"not valid UTF-8: byte {u.start} ({bytes(raw[u.start:u.start + 1])!r})") from None
        raise ValueError(f"not valid JSON: {e}") from None
    if max_depth is not None and json_depth(v, max_depth) > max_depth:
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    return v


async def read_body(request: web.Request, max_bytes: int) -> bytearray:
    """The whole request body, up to `max_bytes` (Content-Length checked first; chunked bodies are
    counted as they arrive, after any Content-Encoding is undone)."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise BodyTooLarge(f"request body of {request.content_length} bytes exceeds the limit of {max_bytes} bytes")
    buf = bytearray()
    while chunk := await request.content.readany():
        buf += chunk
        if len(buf) > max_bytes:
            raise BodyTooLarge(f"request body exceeds the limit of {max_bytes} bytes")
    return buf


async def parse_json_body(request: web.Request, max_bytes: int, *, history: str | None = None) -> dict:
    """The body as a JSON object, strict and depth-checked (see `loads_checked`) except for the lists
    under `history` ("messages" / "input") and "tools": an agent resends them on every call, so they
    are depth-checked when first seen (`RequestCache.parse`, `cached_tools`)."""
    raw = await read_body(request, max_bytes)
    try:
        body = loads_checked(raw, max_depth=None)
    except ValueError as e:
        raise BadRequest("body", str(e)) from None
    if not isinstance(body, dict):
        raise BadRequest("body", f"must be a JSON object, got {type(body).__name__}")
    for key, value in body.items():
        if type(value) is dict or (type(value) is list and key != history and key != "tools"):
            if json_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH - 1:
                raise BadRequest("body", f"JSON nested deeper than {MAX_JSON_DEPTH} levels (in {key!r})")
    return body


def json_response(obj: Any, *, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, headers=headers, content_type="application/json")


def safe_text(text: str) -> str:
    """Error messages quote client input; a lone surrogate there must not break the error itself."""
    return text.encode("utf-8", "replace").decode() if text else text


def openai_error(status: int, message: str, etype: str, *, code: str | None = None, param: str | None = None,
                 headers: dict | None = None) -> web.Response:
    body = {"error": {"message": safe_text(message), "type": etype, "param": param and safe_text(param), "code": code}}
    return json_response(body, status=status, headers=headers)


def anthropic_error(status: int, message: str, etype: str, *, headers: dict | None = None) -> web.Response:
    body = {"type": "error", "error": {"type": etype, "message": safe_text(message)}}
    return json_response(body, status=status, headers=headers)


_LINE_BREAKS = ((b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"), (b"\xc2\x85", b"\\u0085"))


def _line_safe(payload: bytes) -> bytes:
    """JSON with U+2028, U+2029 and U+0085 escaped: SSE lines end only at CR/LF, but clients that split lines
    with a Unicode-aware splitlines (Python's str.splitlines) would cut an event there. They only occur inside
    JSON strings, where the escape means the same character."""
    for raw, esc in _LINE_BREAKS:
        if raw in payload:
            payload = payload.replace(raw, esc)
    return payload


class _EventStream(web.StreamResponse):
    """A StreamResponse whose headers go out with its first event instead of in a write of their own
    (aiohttp's buffered-headers mode, which its plain Response uses): every write to a local client
    is a syscall and a wake-up of the harness, a measurable share of a short call's cost."""

    _send_headers_immediately = False


class SSE:
    """A started text/event-stream response. `send` queues an event; `flush_soon` writes what is queued
    once the calling task next waits (a task of its own, run when the loop gets control), so the
    chunks an engine produced together go out in one write and a client still sees tokens as soon as
    the call waits for more. A write that failed (the client left) raises ConnectionResetError from
    the next `flush_soon` / `close`. The headers travel with the
    first write, the last events with the end of the chunked body: a short call is two or three writes
    (every write to a local client is a syscall and a wake-up of the harness)."""

    def __init__(self, resp: web.StreamResponse):
        self.resp = resp
        self._queued: list[bytes] = []
        self._writer: asyncio.Task | None = None
        self._error: BaseException | None = None

    @classmethod
    async def open(cls, request: web.Request) -> SSE:
        resp = _EventStream(status=200, headers={"Content-Type": "text/event-stream",
                                                 "Cache-Control": "no-cache", "Connection": "keep-alive"})
        await resp.prepare(request)
        return cls(resp)

    async def send(self, data: Any, event: str | None = None) -> None:
        payload = data.encode() if isinstance(data, str) else _line_safe(orjson.dumps(data))
        head = f"event: {event}\ndata: ".encode() if event else b"data: "
        self._queued.append(head + payload + b"\n\n")

    def _raise_failed(self) -> None:
        if self._error is not None:
            raise ConnectionResetError(f"event stream write failed: {self._error}") from self._error

    def flush_soon(self) -> None:
        self._raise_failed()
        if self._queued and self._writer is None:
            self._writer = asyncio.ensure_future(self._write_queued())

    async def _write_queued(self) -> None:
        try:
            while self._queued and self._error is None:
                data = b"".join(self._queued)
                self._queued.clear()
                await self.resp.write(data)
        except (Exception, asyncio.CancelledError) as e:  # noqa: BLE001 - re-raised in the call's own task
            self._error = e
        finally:
            self._writer = None

    async def close(self) -> None:
        if self._writer is not None:
            await asyncio.shield(self._writer)
        self._raise_failed()
        data = b"".join(self._queued)
        self._queued.clear()
        await self.resp.write_eof(data)


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
        elif kind in IMAGE_KINDS:
            parts.append(image_text(part, kind, f"{where}[{i}]"))
        elif kind in ("document", "input_file"):
            parts.append(f"[{kind} omitted]")
        # other part kinds (cache markers, etc.) carry no text for the policy
    return join_parts(parts)


IMAGE_KINDS = ("image", "image_url", "input_image")  # Anthropic, OpenAI Chat, OpenAI Responses


def image_text(part: dict, kind: str, where: str) -> str:
    """An image part as the policy sees it: the active vision policy's marker (research/shim/images.py), else
    "[KIND omitted]"; an image the vision policy refuses is a BadRequest naming the part."""
    try:
        text = images.image_part_text(part, kind, where)
    except images.BadImage as e:
        raise BadRequest(e.where, e.message) from None
    return f"[{kind} omitted]" if text is None else text


def join_parts(parts: list[str]) -> str:
    """Content parts as one text: blank lines between text parts; an image sits flush against its neighbours,
    as Qwen3-VL's chat template puts it."""
    if images.active() is None:
        return "\n\n".join(parts)
    out = ""
    for i, p in enumerate(parts):
        glued = i == 0 or p.startswith(images.VISION_START) or parts[i - 1].endswith(images.VISION_END)
        out += p if glued else "\n\n" + p
    return out
