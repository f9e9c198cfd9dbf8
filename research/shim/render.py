"""Qwen3 chat rendering for the shim: incremental, and token-in/token-out for generated turns.

Every API (OpenAI chat, Responses, Anthropic) is first mapped to `Message`s; this module turns them
into prompt token ids exactly as the Qwen3 chat template would (tested byte-for-byte against the
jinja template), with two differences that matter for RL:

* Assistant turns the shim generated earlier in the session are put back as the *exact sampled ids*
  (`generation prompt + completion + <|im_end|>\n`), never re-tokenized from their text. (The Qwen3
  template would also drop earlier turns' reasoning once a new user query arrives; exact ids keep
  what the policy really saw, so call k+1 extends call k token for token.)
* The prompt is rendered as segments that each start with `<|im_start|>` and end with
  `<|im_end|>\\n`. Special tokens are split off before BPE, so tokenizing segments separately is
  identical to tokenizing the whole string; a per-session cache keyed by segment text makes the
  cost of a call proportional to its new messages, not the history.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

from research.models.tokenizer import Tokenizer
from research.shim import images
from research.shim.common import loads_checked
from research.shim.images import Vision

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
EMPTY_THINK = "<think>\n\n</think>\n\n"
NL = "\n"
# one tool result as _segments renders it (the newlines are optional so text another renderer wrote parses too)
TOOL_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.S)


def tool_results(text: str) -> list[str]:
    """The contents of every tool result rendered in `text`, in order."""
    return TOOL_RESPONSE.findall(text)


@dataclasses.dataclass
class ToolCall:
    id: str
    name: str
    arguments: str | dict  # a JSON string (OpenAI) or an object (Anthropic input)


@dataclasses.dataclass
class Message:
    role: str  # system | user | assistant | tool
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
    tool_call_id: str | None = None


def canonical_args(arguments: str | dict) -> str:
    """Tool arguments compared by value, so `{"a": 1}` sent back as `{"a":1}` still matches.

    A string that is not strict JSON (or is nested too deep to re-serialise) is compared verbatim."""
    if isinstance(arguments, str):
        try:
            arguments = loads_checked(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def turn_keys(content: str, reasoning: str | None, calls: list[tuple[str, Any]], *,
              canonical: Callable[[str | dict], str] = canonical_args) -> tuple[tuple, tuple]:
    """(exact key, reasoning-agnostic key) identifying an assistant turn by what the harness sees."""
    c = tuple((name, canonical(args)) for name, args in calls)
    return (content.strip(), (reasoning or "").strip(), c), (content.strip(), None, c)


def message_keys(m: Message, *, canonical: Callable[[str | dict], str] = canonical_args) -> tuple[tuple, tuple]:
    return turn_keys(m.content, m.reasoning, [(t.name, t.arguments) for t in m.tool_calls], canonical=canonical)


def tool_json(tool: dict) -> str:
    return json.dumps(tool, ensure_ascii=False)


def render_header(system: str | None, tools: list[dict]) -> str:
    if tools:
        out = f"{IM_START}system\n" + (system + "\n\n" if system is not None else "")
        out += ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
        out += "".join("\n" + tool_json(t) for t in tools)
        out += ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                "\"arguments\": <args-json-object>}\n</tool_call>" + IM_END + "\n")
        return out
    return f"{IM_START}system\n{system}{IM_END}\n" if system is not None else ""


def render_assistant(m: Message, *, after_query: bool, is_last: bool) -> str:
    content, reasoning = m.content, ""
    if m.reasoning is not None:
        reasoning = m.reasoning
    elif "</think>" in content:
        content = m.content.split("</think>")[-1].lstrip("\n")
        reasoning = m.content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    if after_query and (is_last or reasoning):
        out = f"{IM_START}assistant\n<think>\n{reasoning.strip(NL)}\n</think>\n\n{content.lstrip(NL)}"
    else:
        out = f"{IM_START}assistant\n{content}"
    for j, tc in enumerate(m.tool_calls):
        if j > 0 or content:
            out += "\n"
        args = tc.arguments if isinstance(tc.arguments, str) else json.dumps(tc.arguments, ensure_ascii=False)
        out += f'<tool_call>\n{{"name": "{tc.name}", "arguments": {args}}}\n</tool_call>'
    return out + IM_END + "\n"


def _last_query_index(messages: list[Message]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        wrapped = m.content.startswith("<tool_response>") and m.content.endswith("</tool_response>")
        if m.role == "user" and not wrapped:
            return i
    return len(messages) - 1


def _segments(messages: list[Message], tools: list[dict], start: int, last_query: int, *,
              header: bool = True) -> list[tuple[str, Message | None, int]]:
    """(text, assistant message or None, index of the last message it renders) from message `start`
    on (a segment boundary; the header too when `header`); -1 marks a tools-only header."""
    segs: list[tuple[str, Message | None, int]] = []
    i = start
    if header:
        if messages and messages[0].role == "system":
            segs.append((render_header(messages[0].content, tools), None, 0))
            i = 1
        elif tools:
            segs.append((render_header(None, tools), None, -1))
    n = len(messages)
    while i < n:
        m = messages[i]
        if m.role in ("user", "system"):
            segs.append((f"{IM_START}{m.role}\n{m.content}{IM_END}\n", None, i))
        elif m.role == "assistant":
            segs.append((render_assistant(m, after_query=i > last_query, is_last=i == n - 1), m, i))
        elif m.role == "tool":
            j = i
            while j < n and messages[j].role == "tool":
                j += 1
            body = "".join(f"\n<tool_response>\n{t.content}\n</tool_response>" for t in messages[i:j])
            segs.append((f"{IM_START}user{body}{IM_END}\n", None, j - 1))
            i = j
            continue
        else:
            raise ValueError(f"messages[{i}].role: unknown role {m.role!r}")
        i += 1
    return segs


def render_segments(messages: list[Message], tools: list[dict]) -> list[tuple[str, Message | None]]:
    """The template's output split at message boundaries: [(text, assistant message or None)].

    Assistant segments carry their message so the caller can swap in exact generated ids.
    """
    return [(text, asst) for text, asst, _ in _segments(messages, tools, 0, _last_query_index(messages))]


def generation_prompt(enable_thinking: bool) -> str:
    return f"{IM_START}assistant\n" + ("" if enable_thinking else EMPTY_THINK)


@dataclasses.dataclass
class GeneratedTurn:
    call_id: str
    head_ids: list[int]  # the generation prompt ids the call ended with
    completion_ids: list[int]
    exact_ids: list[int] | None = None  # the turn as put back into later prompts (built once)


@dataclasses.dataclass
class _Seg:
    end: int  # index of the last message the segment renders (-1: a tools-only header)
    part: str | GeneratedTurn  # text, or a turn generated here (put back as its exact ids)
    retokenized: bool = False  # an assistant turn not recognised as generated here


@dataclasses.dataclass
class _Memo:
    """The previous prompt of the session, segment by segment: the next request of an agent loop
    resends it unchanged (same Message objects, see `ItemCache`) and adds a few messages."""

    messages: list[Message]
    tools: list[dict]
    last_query: int
    segs: list[_Seg]
    seg_ends: list[int]  # _Seg.end of each segment (bisected)
    tok_ends: list[int]  # prompt length after each segment
    ids: list[int]  # the prompt (its generation prompt after tok_ends[-1]): the previous Prompt.ids


@dataclasses.dataclass
class Plan:
    parts: list[str | GeneratedTurn]  # the parts after the reused prefix; the last is the generation prompt
    retokenized_turns: int
    missing: list[str]  # segment texts not in the cache yet
    messages: list[Message] = dataclasses.field(default_factory=list)
    tools: list[dict] = dataclasses.field(default_factory=list)
    last_query: int = -1
    segs: list[_Seg] = dataclasses.field(default_factory=list)  # every segment (reused ones first)
    base: _Memo | None = None  # whose first `reused` segments (and their ids) this prompt starts with
    reused: int = 0


@dataclasses.dataclass
class Prompt:
    ids: list[int]
    head_ids: list[int]  # generation-prompt suffix of `ids`
    tokenized_tokens: int  # tokens produced by tokenizing new segments this call (the incremental cost)
    exact_turns: int  # assistant turns put back as sampled ids
    retokenized_turns: int  # assistant turns in the history not recognised as generated here
    exact_call_ids: list[str]
    images: list[str] = dataclasses.field(default_factory=list)  # "SHA:TxHxW" of each image, in prompt order


class SessionRenderer:
    """Per-session segment cache + the map of assistant turns this session generated.

    Cached segment ids are tuples: a tuple of ints leaves Python's cyclic GC after one collection, a
    list would be walked token by token by every full collection for as long as the session lives."""

    def __init__(self, tokenizer: Tokenizer, max_cached_segments: int = 4096, vision: Vision | None = None):
        self.tok = tokenizer
        self.vision = vision  # a vision policy's image handling: segments with image markers expand them
        self.im_end_id = tokenizer.token_to_id(IM_END)
        self.nl_ids = tokenizer.encode("\n")
        self.stop_ids = set(tokenizer.stop_token_ids)
        self._cache: collections.OrderedDict[str, tuple[int, ...]] = collections.OrderedDict()
        self._max = max_cached_segments
        self._generated: dict[tuple, GeneratedTurn] = {}
        self._canon: collections.OrderedDict[str, str] = collections.OrderedDict()  # arguments string -> canonical
        self._memo: _Memo | None = None

    def canonical(self, arguments: str | dict) -> str:
        """canonical_args, cached for strings: a session resends every earlier tool call on every call."""
        if not isinstance(arguments, str):
            return canonical_args(arguments)
        hit = self._canon.get(arguments)
        if hit is None:
            hit = self._canon[arguments] = canonical_args(arguments)
            if len(self._canon) > self._max:
                self._canon.popitem(last=False)
        return hit

    def _ids(self, text: str) -> tuple[tuple[int, ...], int]:
        hit = self._cache.get(text)
        if hit is not None:
            self._cache.move_to_end(text)
            return hit, 0
        ids = self._cache[text] = tuple(self.encode(text))
        if len(self._cache) > self._max:
            self._cache.popitem(last=False)
        return ids, len(ids)

    def encode(self, text: str) -> list[int]:
        """One segment's ids (image markers expanded into placeholder tokens under a vision policy)."""
        return self.tok.encode(text) if self.vision is None else self.vision.encode(self.tok, text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self.vision is None or not any(images.VISION_START in t for t in texts):
            return self.tok.encode_batch(texts)
        return [self.encode(t) for t in texts]

    def exact_turn_ids(self, turn: GeneratedTurn) -> list[int]:
        if turn.exact_ids is None:
            ids = turn.head_ids + turn.completion_ids
            if not turn.completion_ids or turn.completion_ids[-1] not in self.stop_ids:
                ids.append(self.im_end_id)
            turn.exact_ids = ids + self.nl_ids
        return turn.exact_ids

    def _reusable(self, messages: list[Message], tools: list[dict], last_query: int) -> tuple[int, _Memo | None]:
        """How many segments of the previous prompt this one starts with: those rendering only
        messages that are the very same objects, whose rendering cannot have changed (same tools,
        same last-query position for the assistant turns, not the group the new messages extend)."""
        m = self._memo
        if m is None or m.tools != tools:
            return 0, None
        p, n = 0, min(len(messages), len(m.messages))
        while p < n and messages[p] is m.messages[p]:
            p += 1
        b = p if last_query == m.last_query else min(p, min(last_query, m.last_query) + 1)
        k = bisect.bisect_left(m.seg_ends, b - 1)  # segments with end + 1 < b
        return k, m

    def plan(self, messages: list[Message], tools: list[dict], *, enable_thinking: bool) -> Plan:
        """Segments of the prompt (text, or a generated turn to put back as ids) + texts not yet tokenized.

        Segments already in the previous prompt are reused as they were resolved then (a turn keeps
        the exact ids it was first put back with), so a call costs its new messages."""
        last_query = _last_query_index(messages)
        reused, base = self._reusable(messages, tools, last_query)
        start = base.segs[reused - 1].end + 1 if reused else 0
        segs = base.segs[:reused] if reused else []
        n_old = len(segs)
        for text, asst, end in _segments(messages, tools, start, last_query, header=not reused):
            if asst is not None:
                k_exact, k_loose = message_keys(asst, canonical=self.canonical)
                turn = self._generated.get(k_exact) or self._generated.get(k_loose)
                if turn is not None:
                    segs.append(_Seg(end, turn))
                    continue
                segs.append(_Seg(end, text, retokenized=True))
            else:
                segs.append(_Seg(end, text))
        parts = [sg.part for sg in segs[n_old:]] + [generation_prompt(enable_thinking)]
        missing = list(dict.fromkeys(p for p in parts if isinstance(p, str) and p not in self._cache))
        return Plan(parts, sum(sg.retokenized for sg in segs), missing, messages, tools, last_query, segs, base,
                    reused)

    def add_tokenized(self, texts: list[str], ids: list[list[int]]) -> int:
        for t, i in zip(texts, ids, strict=True):
            self._cache[t] = tuple(i)
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)
        return sum(map(len, ids))

    def assemble(self, plan: Plan, tokenized_tokens: int, *, keep: bool = True) -> Prompt:
        """The prompt's ids; `keep`: remember it as the base for the next call's `plan`."""
        if plan.reused:
            ids = plan.base.ids[:plan.base.tok_ends[plan.reused - 1]]
            tok_ends = plan.base.tok_ends[:plan.reused]
        else:
            ids, tok_ends = [], []
        for part in plan.parts[:-1]:
            if isinstance(part, GeneratedTurn):
                ids += self.exact_turn_ids(part)
            else:
                seg, n = self._ids(part)
                ids += seg
                tokenized_tokens += n
            tok_ends.append(len(ids))
        head, n = self._ids(plan.parts[-1])
        ids += head
        exact_calls = [sg.part.call_id for sg in plan.segs if isinstance(sg.part, GeneratedTurn)]
        if keep:
            self._memo = _Memo(plan.messages, plan.tools, plan.last_query, plan.segs, [sg.end for sg in plan.segs],
                               tok_ends, ids)
        pics = [] if self.vision is None else [x for sg in plan.segs if isinstance(sg.part, str)
                                               for x in self.vision.images_of(sg.part)]
        return Prompt(ids, list(head), tokenized_tokens + n, len(exact_calls), plan.retokenized_turns, exact_calls,
                      pics)

    def build(self, messages: list[Message], tools: list[dict], *, enable_thinking: bool, keep: bool = True) -> Prompt:
        """Synchronous plan + tokenize + assemble (the shim tokenizes large new text off the event loop)."""
        plan = self.plan(messages, tools, enable_thinking=enable_thinking)
        n = self.add_tokenized(plan.missing, [self.encode(t) for t in plan.missing])
        return self.assemble(plan, n, keep=keep)

    def remember(self, keys: tuple[tuple, tuple], turn: GeneratedTurn) -> None:
        for k in keys:
            self._generated[k] = turn
