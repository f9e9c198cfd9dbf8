"""Model output (token ids) -> text / reasoning / tool-call events, incrementally.

Qwen3's tags `<think>`, `</think>`, `<tool_call>`, `</tool_call>` are single added tokens, so the
parser switches state on token ids and only decodes the text between tags. Streaming and
non-streaming responses use this one parser (non-streaming = feed everything, then finish), so the
text a harness receives is identical either way — which is what lets the shim recognise its own
turns when the harness sends them back.

Malformed tool-call JSON is returned as plain text (`<tool_call>...</tool_call>` verbatim), never an
error: a bad tool call is the policy's mistake and must reach the harness and the reward.
"""

from __future__ import annotations

import dataclasses
import functools

from research.models.tokenizer import Tokenizer
from research.shim.common import loads_checked


@dataclasses.dataclass
class Delta:
    kind: str  # "text" | "reasoning"
    text: str


@dataclasses.dataclass
class ParsedToolCall:
    name: str
    arguments: dict
    raw: str  # the text between the tags, for the fallback


class _RegionDecoder:
    """Decodes one region's ids incrementally; holds back incomplete UTF-8 and edge newlines.

    Leading newlines are dropped and trailing ones held until more text follows, because the
    template wraps every region in newlines (`<think>\\n...\\n</think>\\n\\n...`).
    """

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.ids: list[int] = []
        self.text = ""  # decoded so far (complete characters)
        self.sent = 0  # chars of the stripped text already emitted
        self._prefix = self._read = 0

    def add(self, ids: list[int]) -> None:
        self.ids += ids
        prev = self.tok.decode(self.ids[self._prefix:self._read])
        new = self.tok.decode(self.ids[self._prefix:])
        if len(new) > len(prev) and not new.endswith("\ufffd"):
            self.text += new[len(prev):]
            self._prefix, self._read = self._read, len(self.ids)

    def take(self, final: bool = False) -> str:
        if final and self._read < len(self.ids):  # flush a dangling partial character as U+FFFD
            done = len(self.tok.decode(self.ids[self._prefix:self._read]))
            self.text += self.tok.decode(self.ids[self._prefix:])[done:]
            self._prefix = self._read = len(self.ids)
        body = self.text.lstrip("\n").rstrip("\n")
        out = body[self.sent:]
        self.sent = len(body)
        return out


@functools.lru_cache(maxsize=16)
def special_ids(tok: Tokenizer) -> tuple[int, int, int, int, tuple[int, ...]]:
    """(<think>, </think>, <tool_call>, </tool_call>, stop ids), looked up once per tokenizer."""
    return (tok.token_to_id("<think>"), tok.token_to_id("</think>"), tok.token_to_id("<tool_call>"),
            tok.token_to_id("</tool_call>"), tuple(tok.stop_token_ids))


class OutputParser:
    """Feed completion ids as they arrive; get Delta / ParsedToolCall events."""

    def __init__(self, tok: Tokenizer, *, parse_tools: bool = True):
        self.tok = tok
        self.parse_tools = parse_tools
        self.think_open, self.think_close, self.tool_open, self.tool_close, stops = special_ids(tok)
        self.stop_ids = frozenset(stops)
        self.mode = "text"
        self.region = _RegionDecoder(tok)
        self.tool_ids: list[int] = []
        self.n_tool_calls = 0

    def _flush(self, final: bool) -> list[Delta]:
        kind = "reasoning" if self.mode == "think" else "text"
        s = self.region.take(final)
        return [Delta(kind, s)] if s else []

    def _switch(self, mode: str) -> list:
        out = self._flush(final=True)
        self.mode, self.region = mode, _RegionDecoder(self.tok)
        return out

    def _close_tool(self) -> list:
        raw = self.tok.decode(self.tool_ids)
        self.tool_ids = []
        self.mode = "text"
        call = parse_tool_json(raw)
        if call is None:
            return [Delta("text", f"<tool_call>{raw}</tool_call>")]
        self.n_tool_calls += 1
        return [call]

    def feed(self, ids: list[int]) -> list[Delta | ParsedToolCall]:
        out: list[Delta | ParsedToolCall] = []
        pending: list[int] = []
        for t in ids:
            if t in self.stop_ids:
                continue
            if self.mode == "tool":
                if t == self.tool_close:
                    out += self._close_tool()
                else:
                    self.tool_ids.append(t)
                continue
            special = ((t == self.think_open and self.mode == "text")
                       or (t == self.think_close and self.mode == "think")
                       or (t == self.tool_open and self.parse_tools and self.mode == "text"))
            if not special:
                pending.append(t)
                continue
            if pending:
                self.region.add(pending)
                pending = []
            out += self._switch({self.think_open: "think", self.think_close: "text", self.tool_open: "tool"}[t])
        if pending:
            self.region.add(pending)
            out += self._flush(final=False)
        return out

    def finish(self) -> list[Delta | ParsedToolCall]:
        if self.mode == "tool":  # cut off inside a tool call: give the harness the raw text
            raw = self.tok.decode(self.tool_ids)
            self.mode = "text"
            return [Delta("text", "<tool_call>" + raw)]
        return self._flush(final=True)


def parse_tool_json(raw: str) -> ParsedToolCall | None:
    """A tool call the harness can take, or None (then it stays text). Strict JSON: arguments the
    shim could not send back (lone surrogates, NaN, nesting beyond MAX_JSON_DEPTH) are not a call."""
    try:
        obj = loads_checked(raw)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return None
        args = obj.get("arguments", {})
        if isinstance(args, str):
            args = loads_checked(args)
    except ValueError:
        return None
    if not isinstance(args, dict):
        return None
    return ParsedToolCall(obj["name"], args, raw)


@dataclasses.dataclass
class ParsedOutput:
    content: str
    reasoning: str | None
    tool_calls: list[ParsedToolCall]


def collect(events: list[Delta | ParsedToolCall]) -> ParsedOutput:
    text = "".join(e.text for e in events if isinstance(e, Delta) and e.kind == "text")
    reasoning = [e.text for e in events if isinstance(e, Delta) and e.kind == "reasoning"]
    calls = [e for e in events if isinstance(e, ParsedToolCall)]
    return ParsedOutput(text, "".join(reasoning) if reasoning else None, calls)
