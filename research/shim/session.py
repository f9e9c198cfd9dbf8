"""Sessions and the life of one model call: render -> generate -> parse -> capture.

The API adapters (OpenAI chat / Responses, Anthropic) only translate formats; everything that must be
identical across APIs lives here: the token-in/token-out prompt, the branch detection against earlier
calls of the session, the engine stream (cancelled when the client goes away), and the CallRecord,
fsync'd to the capture log before the adapter sends the final event.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from research.capture import CallRecord, CaptureLog
from research.models.tokenizer import Tokenizer
from research.serving.api import (
    ContextLengthExceeded,
    Engine,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    TokenChunk,
)
from research.shim.parse import Delta, OutputParser, ParsedOutput, ParsedToolCall, collect
from research.shim.render import GeneratedTurn, Message, SessionRenderer, turn_keys

# The shim's own threads for fsync and tokenization: asyncio's default pool is shared with sandbox
# backends whose blocking calls can hold every thread for a whole rollout, which would starve capture.
_IO_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="shim-io")

OFFLOAD_CHARS = 16384  # new text above this is tokenized in a thread (encode_batch releases the GIL)


@dataclasses.dataclass
class ChatRequest:
    """An API request mapped onto the chat template's vocabulary."""

    messages: list[Message]
    tools: list[dict]  # [{"type": "function", "function": {name, description, parameters}}]
    model: str = "policy"
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    enable_thinking: bool | None = None
    parse_tools: bool = True  # False for tool_choice "none": tags stay text
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ShimOptions:
    model_name: str = "policy"
    enable_thinking: bool = True  # Qwen3 default; a request may switch it (chat_template_kwargs, thinking)
    default_max_tokens: int = 8192
    # Sampling forced for every call (RL needs the behaviour policy fixed, not what a harness asks).
    sampling_override: dict[str, Any] = dataclasses.field(default_factory=dict)
    return_routed_experts: bool = True


class Session:
    """One rollout's view of the shim: key, call counter, render cache, generated turns, calls."""

    def __init__(self, session_id: str, api_key: str, rollout_id: str, group_id: str, harness: str,
                 tokenizer: Tokenizer, meta: dict | None = None):
        self.session_id, self.api_key = session_id, api_key
        self.rollout_id, self.group_id, self.harness = rollout_id, group_id, harness
        self.meta = dict(meta or {})
        self.renderer = SessionRenderer(tokenizer)
        self.records: list[CallRecord] = []
        self._seqs: list[tuple[str, list[int]]] = []  # (call_id, prompt+completion) of finished calls
        self._next_index = 0
        self.inflight: set[asyncio.Task] = set()

    def next_index(self) -> int:
        self._next_index += 1
        return self._next_index - 1

    def find_parent(self, prompt_ids: list[int]) -> tuple[str | None, int | None]:
        """Earlier call sharing the longest token prefix with this prompt (latest on ties).

        Append-only harnesses hit the fast path: the last call's full sequence is a prefix.
        """
        if not self._seqs:
            return None, None
        cid, seq = self._seqs[-1]
        if len(seq) <= len(prompt_ids) and prompt_ids[:len(seq)] == seq:
            return cid, len(seq)
        p = np.asarray(prompt_ids, dtype=np.int64)
        best_id, best = None, -1
        for cid, seq in reversed(self._seqs):
            n = min(len(seq), len(p))
            neq = np.flatnonzero(p[:n] != np.asarray(seq[:n], dtype=np.int64))
            lcp = int(neq[0]) if len(neq) else n
            if lcp > best:
                best_id, best = cid, lcp
        return (best_id, best) if best > 0 else (None, None)

    def add_finished(self, rec: CallRecord) -> None:
        self.records.append(rec)
        if rec.status == "ok":
            self._seqs.append((rec.call_id, rec.prompt_ids + rec.completion_ids))


class Call:
    """One model call. Adapters: `await start()`, iterate `events()`, then `await finish()`; on a
    client disconnect or an error after headers went out, `await abort()`."""

    def __init__(self, *, session: Session, req: ChatRequest, api: str, engine: Engine, tokenizer: Tokenizer,
                 capture: CaptureLog, options: ShimOptions):
        self.session, self.req, self.api = session, req, api
        self.engine, self.tok, self.capture, self.opt = engine, tokenizer, capture, options
        self.call_id = f"{session.session_id}-{uuid.uuid4().hex[:12]}"
        self.t_start = time.time()
        self.thinking = options.enable_thinking if req.enable_thinking is None else req.enable_thinking
        self.parser = OutputParser(tokenizer, parse_tools=req.parse_tools)
        self.completion_ids: list[int] = []
        self.logprobs: list[float] = []
        self.events_seen: list[Delta | ParsedToolCall] = []
        self.result: GenerateResult | None = None
        self.record: CallRecord | None = None
        self._stream: AsyncIterator | None = None
        self._first: TokenChunk | GenerateResult | None = None
        self.sse = None  # set by the adapter once response headers are out (errors then go in-stream)

    # ---- before headers: everything that can still become a clean HTTP error ------------------

    async def build_prompt(self) -> None:
        r = self.session.renderer
        plan = r.plan(self.req.messages, self.req.tools, enable_thinking=self.thinking)
        if sum(map(len, plan.missing)) > OFFLOAD_CHARS:  # e.g. a 76 KB first request: keep the loop serving
            ids = await asyncio.get_running_loop().run_in_executor(_IO_POOL, self.tok.encode_batch, plan.missing)
        else:
            ids = [self.tok.encode(t) for t in plan.missing]
        p = self.prompt = r.assemble(plan, r.add_tokenized(plan.missing, ids))
        self.parent_call_id, self.prefix_match_len = self.session.find_parent(p.ids)
        max_ctx = self.engine.max_context
        if len(p.ids) >= max_ctx:
            raise ContextLengthExceeded(f"prompt is too long: {len(p.ids)} tokens > {max_ctx - 1} maximum")
        want = self.req.max_tokens or self.opt.default_max_tokens
        self.max_new_tokens = max(1, min(want, max_ctx - len(p.ids)))

    def sampling(self) -> SamplingParams:
        r, o = self.req, self.opt.sampling_override
        kw: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "stop_token_ids": tuple(self.tok.stop_token_ids)}
        for name in ("temperature", "top_p", "top_k", "seed"):
            v = o.get(name, getattr(r, name))
            if v is not None:
                kw[name] = v
        return SamplingParams(**kw)

    async def start(self) -> None:
        """Builds the prompt and waits for the engine's first item, so engine errors are still HTTP errors."""
        await self.build_prompt()
        greq = GenerateRequest(list(self.prompt.ids), self.sampling(), session_id=self.session.session_id,
                               return_routed_experts=self.opt.return_routed_experts, request_id=self.call_id)
        self._stream = self.engine.stream(greq)
        try:
            self._first = await self._stream.__anext__()
        except StopAsyncIteration:
            self._first = None
        except BaseException:
            await self._close_stream()
            raise

    async def _close_stream(self) -> None:
        if self._stream is not None:
            s, self._stream = self._stream, None
            await s.aclose()

    # ---- generation -----------------------------------------------------------------------------

    def _take(self, item: TokenChunk | GenerateResult) -> list[Delta | ParsedToolCall]:
        if isinstance(item, GenerateResult):
            self.result = item
            new = item.token_ids[len(self.completion_ids):]
            self.completion_ids = list(item.token_ids)
            self.logprobs = list(item.logprobs)
        else:
            new = item.token_ids
            self.completion_ids += item.token_ids
            self.logprobs += item.logprobs
        evs = self.parser.feed(list(new)) if new else []
        if isinstance(item, GenerateResult):
            evs += self.parser.finish()
        self.events_seen += evs
        return evs

    async def events(self) -> AsyncIterator[Delta | ParsedToolCall]:
        item = self._first
        while item is not None:
            for ev in self._take(item):
                yield ev
            if isinstance(item, GenerateResult):
                break
            try:
                item = await self._stream.__anext__()
            except StopAsyncIteration:
                item = None
        self._stream = None
        if self.result is None:
            raise RuntimeError(f"engine stream of call {self.call_id} ended without a GenerateResult")

    @property
    def output(self) -> ParsedOutput:
        return collect(self.events_seen)

    @property
    def finish_reason(self) -> str:
        if self.result is None:
            return "abort"
        if self.result.finish_reason == "stop" and self.output.tool_calls:
            return "tool_calls"
        return self.result.finish_reason if self.result.finish_reason in ("stop", "length") else "abort"

    async def generate_all(self) -> ParsedOutput:
        async for _ in self.events():
            pass
        return self.output

    # ---- capture --------------------------------------------------------------------------------

    def _record(self, status: str) -> CallRecord:
        res = self.result
        routed, shape = None, None
        if res is not None and res.routed_experts is not None and status == "ok":
            arr = np.asarray(res.routed_experts, dtype=np.int32)
            routed, shape = arr.reshape(-1).tolist(), tuple(int(d) for d in arr.shape)
        p = self.prompt
        meta = {"model": self.req.model, "stream": self.req.stream, "enable_thinking": self.thinking,
                "exact_turns": p.exact_turns, "retokenized_turns": p.retokenized_turns,
                "tokenized_tokens": p.tokenized_tokens, "max_new_tokens": self.max_new_tokens, **self.req.meta}
        return CallRecord(
            rollout_id=self.session.rollout_id, session_id=self.session.session_id, group_id=self.session.group_id,
            harness=self.session.harness, call_index=self.session.next_index(), prompt_ids=list(p.ids),
            completion_ids=list(self.completion_ids), logprobs=list(self.logprobs),
            weight_version=res.weight_version if res is not None else self.engine.weight_version,
            finish_reason=self.finish_reason if status == "ok" else "abort", call_id=self.call_id,
            parent_call_id=self.parent_call_id, prefix_match_len=self.prefix_match_len, routed_experts=routed,
            routed_experts_shape=shape, api=self.api, status=status, t_start=self.t_start, t_end=time.time(),
            meta=meta)

    async def _append(self, rec: CallRecord) -> CallRecord:
        await asyncio.get_running_loop().run_in_executor(_IO_POOL, self.capture.append, rec)
        self.session.add_finished(rec)
        self.record = rec
        return rec

    async def finish(self) -> CallRecord:
        """Captures the call (fsync'd) and remembers the turn for token-in/token-out; call before the final event."""
        rec = await self._append(self._record("ok"))
        out = self.output
        keys = turn_keys(out.content, out.reasoning, [(c.name, c.arguments) for c in out.tool_calls])
        self.session.renderer.remember(keys, GeneratedTurn(self.call_id, self.prompt.head_ids, rec.completion_ids))
        return rec

    async def abort(self) -> CallRecord | None:
        """Client went away or the engine failed mid-call: stop generating, record what was sampled."""
        if self.record is not None:
            return self.record
        try:
            await asyncio.shield(self._close_stream())
        except Exception:  # noqa: BLE001 - the engine's own cleanup error must not hide the abort record
            pass
        if not hasattr(self, "prompt"):
            return None
        return await asyncio.shield(self._append(self._record("aborted")))
