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
import gc
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from research.capture import CallRecord, CaptureLog, PromptResolver, to_json_bytes
from research.models.image_processor import ImageProcessorConfig
from research.models.tokenizer import Tokenizer
from research.serving.api import (
    ContextLengthExceeded,
    Engine,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    TokenChunk,
)
from research.shim.common import RequestCache, new_id, sampling_problem
from research.shim.fork import ReplayState, recorded_stream
from research.shim.images import Vision
from research.shim.parse import Delta, OutputParser, ParsedOutput, ParsedToolCall, collect, special_ids
from research.shim.prefix import PrefixIndex
from research.shim.render import GeneratedTurn, Message, Plan, Prompt, SessionRenderer, turn_keys

# The shim's own threads for fsync and tokenization: asyncio's default pool is shared with sandbox
# backends whose blocking calls can hold every thread for a whole rollout, which would starve capture.
_IO_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="shim-io")

log = logging.getLogger(__name__)

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
    # Python's young-generation GC threshold while a shim serves (raised, never lowered; 0: leave it).
    # At the interpreter's 700 a collection runs every few calls and walks every in-flight call's
    # token lists: 64 sessions of 20k-token prompts spent ~1.5 ms of each call's ~4.5 ms in it.
    gc_young_threshold: int = 10_000
    # A vision-language policy's image processor settings: image parts become its placeholder tokens and are
    # stored beside the capture log (research/shim/images.py). None: a text policy, images are omitted.
    vision: ImageProcessorConfig | None = None

    def __post_init__(self):
        for name, v in self.sampling_override.items():
            if name not in ("temperature", "top_p", "top_k", "seed"):
                raise ValueError(f"sampling_override: unknown field {name!r}")
            why = sampling_problem(name, v)
            if why:
                raise ValueError(f"sampling_override.{name}: {why}")


def raise_gc_threshold(young: int) -> None:
    """Raises the interpreter's young-generation GC threshold to `young` (process-wide; never lowers
    it, so a process serving several shims keeps the highest; 0 leaves it)."""
    t0, t1, t2 = gc.get_threshold()
    if young > t0:
        gc.set_threshold(young, t1, t2)
        log.info("shim: young-generation GC threshold %d -> %d", t0, young)


class Session:
    """One rollout's view of the shim: key, call counter, render cache, generated turns, calls.

    Finished calls are kept as their capture-log lines (bytes: compact, and invisible to Python's
    cyclic GC, which otherwise walks every token id of every kept prompt again and again);
    `records` decodes them. `keep_records=False` (open mode) keeps only the count: the capture log
    is the record there.
    """

    def __init__(self, session_id: str, api_key: str, rollout_id: str, group_id: str, harness: str,
                 tokenizer: Tokenizer, meta: dict | None = None, *, keep_records: bool = True, first_index: int = 0,
                 vision: Vision | None = None):
        self.session_id, self.api_key = session_id, api_key
        self.rollout_id, self.group_id, self.harness = rollout_id, group_id, harness
        self.meta = dict(meta or {})
        self.renderer = SessionRenderer(tokenizer, vision=vision)
        self.keep_records = keep_records
        self._lines: list[bytes] = []  # capture-log lines of the finished calls (keep_records)
        self.prefixes = PrefixIndex()  # prompt+completion of finished calls, for parent lookup
        self.last_ok: tuple[str, int] | None = None  # (call id, len(prompt + completion)) of the last ok record
        self._request_caches: dict[str, RequestCache] = {}
        self._next_index = first_index
        self.inflight: set[asyncio.Task] = set()
        self.last_used = time.monotonic()
        # what the shim or the engine got wrong in this session ("engine_error@3": call 3): the runner reads
        # them to tell a harness the policy broke from one the serving side failed (harness_env/runner.py)
        self.faults: list[str] = []
        self.replay: ReplayState | None = None  # a forked child's plan: its first calls answered from records

    def request_cache(self, api: str) -> RequestCache:
        """The parsed previous request of this session on `api` (see common.RequestCache)."""
        c = self._request_caches.get(api)
        if c is None:
            c = self._request_caches[api] = RequestCache()
        return c

    @property
    def n_calls(self) -> int:
        """Calls recorded so far (every started call, ok or aborted)."""
        return self._next_index

    def next_index(self) -> int:
        self._next_index += 1
        return self._next_index - 1

    def find_parent(self, prompt_ids: list[int]) -> tuple[str | None, int | None]:
        """Earlier call sharing the longest token prefix with this prompt (latest on ties); O(prompt)."""
        return self.prefixes.lookup(prompt_ids)

    def _decoded(self) -> list[CallRecord]:
        """The finished calls in the order they were recorded (a line may refer to earlier ones)."""
        return list(map(PromptResolver().decode, self._lines))

    @property
    def records(self) -> list[CallRecord]:
        """The finished calls, in call order (decoded from their capture-log lines)."""
        return sorted(self._decoded(), key=lambda r: r.call_index)

    def last_record(self) -> CallRecord | None:
        recs = self._decoded()
        return recs[-1] if recs else None

    def add_finished(self, rec: CallRecord, line: bytes) -> None:
        if self.keep_records:
            self._lines.append(line)
        if rec.status == "ok" and not self.prefixes.extend_last(
                rec.call_id, rec.parent_call_id, rec.prefix_match_len, rec.prompt_ids, rec.completion_ids):
            self.prefixes.insert(rec.prompt_ids + rec.completion_ids, rec.call_id)


class Call:
    """One model call. Adapters: `await start()`, iterate `events()`, then `await finish()`; on a
    client disconnect or an error after headers went out, `await abort()`."""

    def __init__(self, *, session: Session, req: ChatRequest, api: str, engine: Engine, tokenizer: Tokenizer,
                 capture: CaptureLog, options: ShimOptions, server_calls: set | None = None):
        self.session, self.req, self.api = session, req, api
        self.server_calls = server_calls  # every call in flight on the server (this one included)
        self.engine, self.tok, self.capture, self.opt = engine, tokenizer, capture, options
        self.call_id = f"{session.session_id}-{new_id(12)}"
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
        self.prompt: Prompt | None = None
        self.overflow: tuple[int, bool] | None = None  # (prompt tokens, continues an earlier call) past the context
        self._prompt_job: asyncio.Future | None = None
        self._commit_job: asyncio.Future | None = None  # the one capture record of this call
        self._abort_job: asyncio.Future | None = None
        self.sse = None  # set by the adapter once response headers are out (errors then go in-stream)
        self.replay_meta: dict[str, Any] = {}  # {"replayed": True, "replay_of": id} when answered from a record

    # ---- before headers: everything that can still become a clean HTTP error ------------------

    async def build_prompt(self) -> None:
        plan = self.session.renderer.plan(self.req.messages, self.req.tools, enable_thinking=self.thinking)
        if self._offload(plan):
            await self._tokenize_offloaded(plan)
        else:
            self._finish_prompt(plan, None)

    @staticmethod
    def _offload(plan: Plan) -> bool:
        return sum(map(len, plan.missing)) > OFFLOAD_CHARS  # e.g. a 76 KB first request: keep the loop serving

    async def _tokenize_offloaded(self, plan: Plan) -> None:
        ids = await asyncio.get_running_loop().run_in_executor(_IO_POOL, self.session.renderer.encode_batch,
                                                               plan.missing)
        self._finish_prompt(plan, ids)

    def _finish_prompt(self, plan: Plan, ids: list[list[int]] | None) -> None:
        r = self.session.renderer
        if ids is None:
            ids = [r.encode(t) for t in plan.missing]
        p = r.assemble(plan, r.add_tokenized(plan.missing, ids))
        max_ctx = self.engine.max_context
        if len(p.ids) >= max_ctx:
            # whether the prompt continues an earlier call of the session: then the policy's own turns filled the
            # context; a fresh prompt that does not fit is a configuration mismatch (harness_env/attribution.py)
            self.overflow = (len(p.ids), self.session.find_parent(p.ids)[0] is not None)
            raise ContextLengthExceeded(f"prompt is too long: {len(p.ids)} tokens > {max_ctx - 1} maximum")
        want = self.req.max_tokens or self.opt.default_max_tokens
        self.max_new_tokens = max(1, min(want, max_ctx - len(p.ids)))
        self.parent_call_id, self.prefix_match_len = self.session.find_parent(p.ids)
        self.prompt = p  # last: a call with a prompt is one that can be recorded

    def sampling(self) -> SamplingParams:
        """The request's sampling values under the forced ones (both checked by `check_sampling`)."""
        r, o = self.req, self.opt.sampling_override
        kw: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "stop_token_ids": special_ids(self.tok)[4]}
        for name in ("temperature", "top_p", "top_k", "seed"):
            v = o.get(name, getattr(r, name))
            if v is not None:
                kw[name] = v
        if kw.get("top_k", -1) <= 0:
            kw["top_k"] = -1  # 0 and -1 both mean "no top-k"; -1 is what every engine takes
        return SamplingParams(**kw)

    async def start(self) -> None:
        """Builds the prompt and waits for the engine's first item, so engine errors are still HTTP errors.

        From here on the call ends as exactly one capture record unless it ends as an HTTP error
        before anything was sampled; a prompt tokenized off the loop is finished in its own task,
        so a client that leaves meanwhile still gets its (aborted) record."""
        plan = self.session.renderer.plan(self.req.messages, self.req.tools, enable_thinking=self.thinking)
        if self._offload(plan):
            self._prompt_job = asyncio.ensure_future(self._tokenize_offloaded(plan))
            await asyncio.shield(self._prompt_job)
        else:
            self._finish_prompt(plan, None)
        rec = self._replayed()
        if rec is not None:  # a forked child's prefix: the parent's completion, no engine time
            self._stream = recorded_stream(rec)
        else:
            vision = self.session.renderer.vision
            pics = await asyncio.to_thread(vision.inputs, self.prompt.images) if self.prompt.images else ()
            greq = GenerateRequest(list(self.prompt.ids), self.sampling(), session_id=self.session.session_id,
                                   return_routed_experts=self.opt.return_routed_experts, request_id=self.call_id,
                                   images=pics)
            self._stream = self.engine.stream(greq)
        try:
            self._first = await self._stream.__anext__()
        except StopAsyncIteration:
            self._first = None
        except asyncio.CancelledError:
            raise  # abort() closes the stream
        except BaseException:
            await asyncio.shield(self._close_stream())
            raise

    def _replayed(self) -> CallRecord | None:
        """The parent's record answering this call of a forked child (research/shim/fork.py); ReplayMismatch."""
        rep = self.session.replay
        rec = None if rep is None else rep.take(self.prompt.ids, self.session.n_calls, self.max_new_tokens)
        if rec is not None:
            self.replay_meta = {"replayed": True, "replay_of": rec.call_id}
        return rec

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
        """Parser events as the engine produces tokens; an SSE response is flushed at each wait."""
        item = self._first
        while item is not None:
            for ev in self._take(item):
                yield ev
            if isinstance(item, GenerateResult):
                break
            if self.sse is not None:
                self.sse.flush_soon()  # goes out as soon as the next item has to be waited for
            try:
                item = await self._stream.__anext__()
            except StopAsyncIteration:
                item = None
        self._stream = None
        if self.sse is not None:
            self.sse.flush_soon()
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
                "tokenized_tokens": p.tokenized_tokens, "max_new_tokens": self.max_new_tokens, **self.req.meta,
                **self.replay_meta, **({"images": p.images} if p.images else {})}
        return CallRecord(
            rollout_id=self.session.rollout_id, session_id=self.session.session_id, group_id=self.session.group_id,
            harness=self.session.harness, call_index=self.session.next_index(), prompt_ids=p.ids,
            completion_ids=list(self.completion_ids), logprobs=list(self.logprobs),
            weight_version=res.weight_version if res is not None else self.engine.weight_version,
            finish_reason=self.finish_reason if status == "ok" else "abort", call_id=self.call_id,
            parent_call_id=self.parent_call_id, prefix_match_len=self.prefix_match_len, routed_experts=routed,
            routed_experts_shape=shape, api=self.api, status=status, t_start=self.t_start, t_end=time.time(),
            meta=meta)

    def _prompt_ref(self) -> tuple[str, int] | None:
        """(parent call id, n) when this prompt continues the session's last recorded call (an
        append-only session): the record is then written as a reference plus the new tokens."""
        last = self.session.last_ok
        return last if last == (self.parent_call_id, self.prefix_match_len) else None

    def _write(self, rec: CallRecord) -> bytes:
        line = to_json_bytes(rec)
        self.capture.append_line(line)
        return line

    def _alone(self) -> bool:
        """No other call in flight and no write under way: blocking the loop for this call's small
        write + fsync (~0.5 ms) then delays no one, while handing it to a thread costs ~0.5 ms more in
        wake-ups on a VM. Under load the thread pool path keeps the loop serving and group-commits."""
        return self.server_calls is not None and len(self.server_calls) <= 1 and self.capture.idle

    async def _append(self, rec: CallRecord) -> CallRecord:
        """Writes the record (fsync'd) and only then makes it part of the session. A call continuing the
        previous one serialises its new tokens only, on the loop; a whole prompt is serialised off it."""
        loop, ref = asyncio.get_running_loop(), self._prompt_ref()
        if ref is None:
            line = await loop.run_in_executor(_IO_POOL, self._write, rec)
        else:
            line = to_json_bytes(rec, prompt_ref=ref)
            if self._alone():
                self.capture.append_line(line)
            else:
                await loop.run_in_executor(_IO_POOL, self.capture.append_line, line)
        if rec.status == "ok":
            self.session.last_ok = (rec.call_id, len(rec.prompt_ids) + len(rec.completion_ids))
        self.session.add_finished(rec, line)
        self.record = rec
        return rec

    async def _commit_ok(self) -> CallRecord:
        rec = await self._append(self._record("ok"))
        out = self.output
        keys = turn_keys(out.content, out.reasoning, [(c.name, c.arguments) for c in out.tool_calls])
        self.session.renderer.remember(keys, GeneratedTurn(self.call_id, self.prompt.head_ids, rec.completion_ids))
        return rec

    async def finish(self) -> CallRecord:
        """Captures the call (fsync'd) and remembers the turn for token-in/token-out; call before the final event.

        The commit is its own task: a client leaving meanwhile cannot half-record the call."""
        if self._commit_job is None:
            self._commit_job = asyncio.ensure_future(self._commit_ok())
        return await asyncio.shield(self._commit_job)

    async def abort(self) -> CallRecord | None:
        """Client went away or the engine failed mid-call: stop generating, record what was sampled.

        Idempotent, and immune to further cancellation of the caller (aiohttp may cancel a handler
        again while it cleans up): the work runs in its own task, awaited until done, so the call
        still ends as exactly one record; the caller's cancellation is re-raised afterwards."""
        if self._abort_job is None:
            self._abort_job = asyncio.ensure_future(self._abort())
        return await wait_through_cancel(self._abort_job)

    async def _abort(self) -> CallRecord | None:
        if self._commit_job is None:
            try:
                await self._close_stream()
            except Exception:  # noqa: BLE001 - the engine's own cleanup error must not hide the abort record
                log.exception("call %s: closing the engine stream failed", self.call_id)
            if self.prompt is None and self._prompt_job is not None:
                try:
                    await self._prompt_job
                except (Exception, asyncio.CancelledError):  # it would have been an HTTP error: nothing sampled
                    return None
            if self.prompt is None:
                return None
            if self._commit_job is None:
                self._commit_job = asyncio.ensure_future(self._append(self._record("aborted")))
        try:
            return await self._commit_job
        except Exception:  # noqa: BLE001 - the capture log failed; the client gets an error either way
            log.exception("call %s: capture failed", self.call_id)
            return None


async def finish_json(call: Call, body: dict) -> web.Response:
    """A non-streaming answer: serialised first, then the call is captured, then sent, so a body
    that cannot be sent becomes an aborted record and an error, never an "ok" record and a 500."""
    payload = orjson.dumps(body)
    await call.finish()
    return web.Response(body=payload, content_type="application/json")


async def wait_through_cancel(fut: asyncio.Future):
    """`await fut` to its end even if the awaiting task is cancelled meanwhile (then re-raised after)."""
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(fut)
            break
        except asyncio.CancelledError:
            if fut.done():  # fut itself was cancelled (loop shutdown)
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result
