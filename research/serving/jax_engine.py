"""The built-in JAX engine: continuous batching over fixed KV-cache slots, behind the async Engine API.

One background thread owns the device state (params, cache, per-slot decode state, slot table) and runs
  admit waiting requests into slots -> prefill up to `prefill_budget` prompt tokens -> ONE decode block
so a request joins the running batch as soon as a slot is free and leaves it when it finishes; nobody
waits for a batch. A decode block is up to `decode_steps` tokens per slot in one jitted on-device loop
(sampling, per-slot stop-token and length checks, early exit), so the host syncs once per block, not per
token; while a prompt is being prefilled blocks are `prefill_decode_steps` long, so its chunks interleave
with decoding and do not stall streaming requests. Dispatch is overlapped: block n+1 starts from the decode
state still on device before the host fetches and hands out block n, so Python bookkeeping hides behind
device work. A block runs on the smallest bucket of leading slots covering every decoding slot and attends
over the smallest length bucket covering their sequences; every jitted function has a fixed shape per
(batch bucket, length bucket): compiled once, never per request. asyncio callers get tokens through
`loop.call_soon_threadsafe` (one hand-over per request per block, one TokenChunk per token, in order).

Semantics worth knowing (the shim and the trainer rely on them):
- logprobs: see sampling.py (after temperature, before top-k/top-p truncation; greedy = T 1).
- stop tokens are included in `token_ids` (the next turn's prompt must contain them token for token);
  stop tokens, max_new_tokens and cancellation act per token: nothing after a stop token or past the
  limit is ever emitted, and a cancelled request gets no further item.
- routed_experts[i] = experts chosen at the forward step that *produced* token i (the last prompt
  position for i == 0), int32 [n, layers, top_k]: what routing replay needs for the training forward.
- prompt longer than max_len - 1 -> ContextLengthExceeded; max_new_tokens is clamped to the room
  left, finishing with "length" (as SGLang does).
- weight update: `on_update="drain"` (default) stops admitting, lets in-flight requests finish on the
  old weights, swaps, then runs the queue on the new ones; `"abort"` ends in-flight decodes at once
  with finish_reason "abort" (tokens so far are old-version tokens) and re-queues requests that had
  not produced a token yet. Either way each result carries the one version that produced all of it,
  and cached prefixes of older versions are dropped. Swaps never recompile.
- pause(): stop admitting, wait for in-flight; while paused new calls raise EngineUnavailable
  (unless queue_while_paused), already-queued ones wait for resume().
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable

import jax
import numpy as np

from research.serving.api import (
    ContextLengthExceeded,
    Engine,
    EngineError,
    EngineUnavailable,
    GenerateRequest,
    GenerateResult,
    TokenChunk,
)
from research.serving.runner import DecodeState, ModelRunner, SlotSampling, StepFunctions
from research.serving.sampling import request_key
from research.serving.scheduler import EngineConfig, Request, SlotTable, common_prefix_len, worth_waiting

log = logging.getLogger(__name__)


def _committed(tree):
    """Arrays explicitly placed (committed) where they are: jit caches key on commitment, and updates are
    placed the same way, so a weight swap never triggers a recompile."""
    dev = jax.devices()[0]
    return jax.tree.map(lambda a: jax.device_put(a, a.sharding if isinstance(a, jax.Array) else dev), tree)


class JaxEngine(Engine):
    def __init__(self, runner: ModelRunner, params, *, config: EngineConfig = EngineConfig(), weight_version: int = 0):
        if config.on_update not in ("drain", "abort"):
            raise ValueError(f"on_update must be 'drain' or 'abort', got {config.on_update!r}")
        self.runner, self.cfg = runner, config
        self._fns = StepFunctions.of(runner)
        params = _committed(params)
        # update_weights takes params in this (training) layout and placement; the runner's layout is served.
        self._raw_like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), params)
        self._params, self._version = self._fns.prepare(params), weight_version
        S = config.num_slots
        self._sampling = SlotSampling(
            temperature=np.ones(S, np.float32), top_p=np.ones(S, np.float32), top_k=np.full(S, -1, np.int32),
            key=np.zeros((S, 2), np.uint32), stops=np.full((S, config.max_stop_tokens), -1, np.int32),
        )
        self._reset_device()
        self._slots = SlotTable(S, min_reuse=config.min_reuse)
        self._override: dict[int, Request | None] = {}  # slots whose device decode state the next block resets
        self._pending: list[tuple] = []  # dispatched work whose outputs are not handed out yet, in dispatch order
        self._active: dict[int, Request] = {}  # slot -> request
        self._waiting: collections.deque[Request] = collections.deque()
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._admitting = True  # False while paused or draining for a weight update
        self._paused = False
        self._idle_waiters: list[Callable[[], None]] = []
        self._seeds = itertools.count(0x5EED)
        self._closed = False
        self.stats = collections.Counter()
        self._thread = threading.Thread(target=self._run, name="jax-engine", daemon=True)
        self._thread.start()

    def _reset_device(self) -> None:
        """A fresh cache (max_len + one chunk: a padded last chunk never clamps) and an all-idle decode state."""
        self._cache = _committed(self.runner.init_cache(self.cfg.num_slots, self.cfg.max_len + self.cfg.prefill_chunk))
        self._state = _committed(DecodeState.zeros(self.cfg.num_slots))

    # ---------------------------------------------------------------- Engine API (asyncio side)
    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        return self.cfg.max_len

    async def stream(self, req: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        r = self._make_request(req)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        def put_all(items: list) -> None:
            for item in items:
                q.put_nowait(item)

        r.emit = lambda items: loop.call_soon_threadsafe(put_all, items)
        self._post(("submit", r))
        done = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                if isinstance(item, GenerateResult):
                    done = True
                yield item
                if done:
                    return
        finally:
            if not done:
                self._post(("cancel", r))

    async def pause(self) -> None:
        self._paused = True
        await self._call(lambda: self._set_admitting(False))
        await self._until_idle()

    async def resume(self) -> None:
        self._paused = False
        await self._call(lambda: self._set_admitting(True))

    async def update_weights(self, params, version: int, *, on_update: str | None = None) -> None:  # noqa: ANN001
        """Swaps params (same shapes/dtypes/shardings: no recompile) and tags results with `version`.

        `on_update` overrides the engine's policy for this update ("drain" | "abort")."""
        mode = on_update or self.cfg.on_update
        if mode not in ("drain", "abort"):
            raise ValueError(f"on_update must be 'drain' or 'abort', got {mode!r}")
        prepared = self._fns.prepare(self._like_current(params))
        if mode == "drain":
            await self._call(lambda: self._set_admitting(False))
            await self._until_idle()
        await self._call(lambda: self._swap(prepared, version))

    def _like_current(self, params):
        """New params placed and typed exactly like the served ones: a different sharding, commitment or
        dtype would silently recompile every step function (seconds to minutes) on the next call."""
        like = self._raw_like
        if jax.tree.structure(params) != jax.tree.structure(like):
            raise ValueError("new params have a different tree structure than the served model")
        cast = jax.tree.map(lambda o, n: np.asarray(n, o.dtype) if n.dtype != o.dtype else n, like, params)
        return jax.device_put(cast, jax.tree.map(lambda o: o.sharding, like))

    async def flush_cache(self) -> None:
        await self._call(self._slots.flush)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._post(("stop", None))
        await asyncio.to_thread(self._thread.join)

    @property
    def image_processor(self):  # noqa: ANN201
        return getattr(self.runner, "image_processor", None)

    # ---------------------------------------------------------------- helpers (asyncio side)
    def _make_request(self, req: GenerateRequest) -> Request:
        if self._closed:
            raise EngineUnavailable("engine is closed", retry_after_s=self.cfg.retry_after_s)
        if self._paused and not self.cfg.queue_while_paused:
            raise EngineUnavailable("engine is paused for a weight update", retry_after_s=self.cfg.retry_after_s)
        n = len(req.prompt_ids)
        if n == 0:
            raise ValueError("prompt_ids is empty")
        if n >= self.cfg.max_len:
            raise ContextLengthExceeded(f"prompt has {n} tokens; this engine's context is {self.cfg.max_len}")
        bad = [t for t in req.prompt_ids if not 0 <= t < self.runner.vocab_size]
        if bad:
            raise ValueError(f"prompt_ids contains {bad[0]}, outside vocab {self.runner.vocab_size}")
        sp = req.sampling
        if sp.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {sp.max_new_tokens}")
        if not 0.0 < sp.top_p <= 1.0 or sp.temperature < 0.0:
            raise ValueError(f"need 0 < top_p <= 1 and temperature >= 0, got top_p={sp.top_p}, "
                             f"temperature={sp.temperature}")
        seed = sp.seed if sp.seed is not None else next(self._seeds)
        r = Request(req=req, emit=lambda _: None, max_new=min(sp.max_new_tokens, self.cfg.max_len - n),
                    key=np.asarray(request_key(seed)))
        if req.images:
            if not getattr(self.runner, "serves_images", False):
                raise ValueError(f"the request has {len(req.images)} images; this engine serves a text-only model")
            self.runner.check_images(req)
            r.match = self.runner.match_key(req)
        return r

    def _post(self, cmd) -> None:
        self._cmds.put(cmd)
        self._wake.set()

    async def _call(self, fn: Callable[[], object]):
        """Runs `fn` on the engine thread between steps and returns its result."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def done(res, exc):
            if not fut.done():
                fut.set_exception(exc) if exc else fut.set_result(res)

        self._post(("call", (fn, lambda res, exc: loop.call_soon_threadsafe(done, res, exc))))
        return await fut

    async def _until_idle(self) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        cb = lambda: loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))
        await self._call(lambda: self._idle_waiters.append(cb))
        self._wake.set()
        await fut

    # ---------------------------------------------------------------- engine thread
    def _warmup(self) -> None:
        """Compiles the step functions (on slot 0, free at start; zero decode steps, so nothing changes):
        every batch bucket at the shortest length bucket, or every (batch, length) pair with warmup_all."""
        lengths = self.cfg.len_buckets() if self.cfg.warmup_all else self.cfg.len_buckets()[:1]
        self._cache = self._fns.copy_slot(self._cache, np.int32(0), np.int32(0))
        for L in lengths:
            self._dispatch_prefill(0, np.zeros(self.cfg.prefill_chunk, np.int32), 0, 1, 0, ctx_len=L)
            for B in self.cfg.buckets():
                self._dispatch_block(B, L, 0)
        jax.block_until_ready(self._cache)

    def _run(self) -> None:
        if self.cfg.warmup:
            try:
                self._warmup()
            except Exception:
                log.exception("engine warmup failed (compilation will happen on the first request)")
                self._reset_device()
        while True:
            if not self._handle_commands():
                break
            try:
                self._admit()
                worked = self._prefill_step()
                worked = self._decode_step() or worked
            except Exception as e:  # a device error must not leave callers hanging forever
                log.exception("engine step failed")
                self._fail_all(EngineError(f"engine step failed: {e!r}"))
                worked = False
            self._notify_idle()
            if not worked:
                self._wake.wait(timeout=0.5)
                self._wake.clear()
        self._fail_all(EngineUnavailable("engine closed", retry_after_s=self.cfg.retry_after_s))

    def _handle_commands(self) -> bool:
        while True:
            try:
                kind, arg = self._cmds.get_nowait()
            except queue.Empty:
                return True
            if kind == "submit":
                self._waiting.append(arg)
            elif kind == "cancel":
                self._cancel(arg)
            elif kind == "call":
                fn, reply = arg
                try:
                    self._hand_out_pending()  # control calls see every dispatched token accounted for
                    reply(fn(), None)
                except Exception as e:
                    reply(None, e)
            elif kind == "stop":
                return False

    def _set_admitting(self, on: bool) -> None:
        self._admitting = on and not self._paused

    def _notify_idle(self) -> None:
        if self._idle_waiters and not self._active:
            waiters, self._idle_waiters = self._idle_waiters, []
            for cb in waiters:
                cb()

    def _swap(self, params, version: int) -> None:
        for r in list(self._active.values()):
            if r.out:
                self._finish(r, "abort")
            else:  # nothing emitted yet: run it again from scratch on the new weights
                self._release(r, keep=False)
                r.filled, r.slot, r.dispatched, r.images = 0, -1, 0, None
                self._waiting.appendleft(r)
        self._params, self._version = params, version
        self._slots.flush()
        self._set_admitting(True)
        self.stats["weight_updates"] += 1

    def _cancel(self, r: Request) -> None:
        r.cancelled = True
        if r in self._waiting:
            self._waiting.remove(r)
        elif r.slot >= 0 and self._active.get(r.slot) is r:
            self._release(r, keep=True)

    def _fail_all(self, exc: BaseException) -> None:
        """Fails every request; the device state may be gone (donated buffers of a failed call): start afresh."""
        for r in list(self._active.values()) + list(self._waiting):
            r.outbox = None
            r.send(exc)
            if r.slot >= 0:
                self._release(r, keep=False)
        self._waiting.clear()
        self._pending.clear()
        self._override.clear()
        self._slots = SlotTable(self.cfg.num_slots, min_reuse=self.cfg.min_reuse)
        try:
            self._reset_device()
        except Exception:
            log.exception("could not re-allocate the engine's device state")

    def _admit(self) -> None:
        """Moves waiting requests into slots, FIFO, except one that shares at least a chunk of prompt
        prefix with a request still prefilling: it waits for that prefill and then copies the slot
        (the G samples of a GRPO group arrive together with one long prompt: prefill it once, not G times)."""
        C = self.cfg.prefill_chunk
        prefilling: dict[int, list[Request]] = {}
        for a in self._active.values():
            if a.filled < len(a.prompt) and len(a.prompt) > C:
                prefilling.setdefault(a.head(C), []).append(a)
        deferred: list[Request] = []
        while self._admitting and self._waiting and self._slots.has_room():
            r = self._waiting.popleft()
            if len(r.prompt) > C and any(worth_waiting(common_prefix_len(a.prompt, r.prompt), a.filled, C)
                                         for a in prefilling.get(r.head(C), ())):
                deferred.append(r)
                continue
            p = self._slots.place(r.prompt, r.req.session_id, self._version)
            if p is None:
                self._waiting.appendleft(r)
                break
            if p.copy_from is not None:
                self._cache = self._fns.copy_slot(self._cache, np.int32(p.copy_from), np.int32(p.slot))
                self.stats["slot_copies"] += 1
            self._slots.acquire(p, r.prompt, r.req.session_id, self._version)
            r.slot, r.filled, r.version = p.slot, p.reuse, self._version
            self._active[p.slot] = r
            self._set_sampling(r)
            self.stats["reused_tokens"] += p.reuse
            self.stats["admitted"] += 1
            if r.filled < len(r.prompt) and len(r.prompt) > C:
                prefilling.setdefault(r.head(C), []).append(r)
        self._waiting.extendleft(reversed(deferred))
        self.stats["deferred_for_prefix"] += len(deferred)

    def _set_sampling(self, r: Request) -> None:
        s, sp, smp = r.slot, r.req.sampling, self._sampling
        smp.temperature[s], smp.top_p[s], smp.top_k[s], smp.key[s] = sp.temperature, sp.top_p, sp.top_k, r.key
        stops = list(sp.stop_token_ids)[: self.cfg.max_stop_tokens]
        smp.stops[s] = -1
        smp.stops[s, : len(stops)] = stops

    def _prefill_step(self) -> bool:
        """Prefills chunks of the requests still prefilling, oldest first, up to `prefill_budget` tokens (at
        least one chunk). A prompt's last chunk samples its first token on device and starts the slot
        decoding there; the token is handed out with the next block's."""
        pending = sorted((r for r in self._active.values() if r.filled < len(r.prompt)),
                         key=lambda x: self._slots.slots[x.slot].last_used)
        budget = max(self.cfg.prefill_budget, 1)
        for r in pending:
            while r.filled < len(r.prompt) and budget > 0:
                budget -= self._prefill_chunk(r)
        return bool(pending)

    def _prefill_chunk(self, r: Request) -> int:
        C = self.cfg.prefill_chunk
        chunk = r.req.prompt_ids[r.filled : r.filled + C]
        tokens = np.zeros(C, np.int32)
        tokens[: len(chunk)] = chunk
        last = r.filled + len(chunk) == len(r.prompt)
        images = None
        if r.req.images:  # encoded once per request and weight version, on the first chunk that needs them
            r.images = r.images or self.runner.encode_images(self._params, r.req)
            images = self.runner.chunk_images(r.images, r.filled, C)
        out = self._dispatch_prefill(r.slot, tokens, r.filled, len(chunk), r.max_new if last else 0,
                                     ctx_len=self.cfg.len_bucket(r.filled), images=images)
        self._slots.extend(r.slot, r.prompt[r.filled : r.filled + C])
        r.filled += len(chunk)
        self.stats["prefill_tokens"] += len(chunk)
        if last:
            self._override.pop(r.slot, None)  # the prefill set this slot's decode state itself
            r.dispatched = 1
            self._pending.append(("first", r, out))
        return C

    def _dispatch_prefill(self, slot: int, tokens: np.ndarray, start: int, n_valid: int, max_new: int, *,
                          ctx_len: int, images=None):
        smp = SlotSampling(*(a[slot].copy() for a in self._sampling))  # copies: jit may read host memory late
        self._cache, self._state, *out = self._fns.prefill(
            self._params, self._cache, self._state, np.int32(slot), tokens, np.int32(start), np.int32(n_valid),
            *smp, np.int32(max_new), images, ctx_len=ctx_len,
        )
        return out

    def _decode_step(self) -> bool:
        """Dispatches decode block n+1, then hands out block n (host work overlaps device work)."""
        decoding = [r for r in self._active.values()
                    if r.filled == len(r.prompt) and 0 < r.dispatched < r.max_new and not r.cancelled]
        if not decoding:
            return self._hand_out_pending()
        top = max(r.slot for r in decoding) + 1
        B = next(b for b in self.cfg.buckets() if b >= top)
        # Every decoding slot's cached length when the block starts is at most prompt + dispatched - 1.
        L = self.cfg.len_bucket(max(len(r.prompt) + r.dispatched - 1 for r in decoding))
        prefilling = any(r.filled < len(r.prompt) for r in self._active.values())
        n = self.cfg.prefill_decode_steps if prefilling else self.cfg.decode_steps
        out = self._dispatch_block(B, L, n)
        for r in decoding:
            r.dispatched += n
        prev, self._pending = self._pending, []
        self._hand_out(prev)
        self._pending.append(("block", decoding, out))
        return True

    def _dispatch_block(self, batch: int, ctx_len: int, n_steps: int):
        S = self.cfg.num_slots
        mask = np.zeros(S, bool)
        host = DecodeState(*(np.zeros(S, np.int32) for _ in range(4)))  # overridden slots: off (left = 0)
        for s in self._override:
            mask[s] = True
        self._override.clear()
        sampling = SlotSampling(*(a.copy() for a in self._sampling))
        self._cache, self._state, out = self._fns.decode(
            self._params, self._cache, self._state, mask, host, sampling, np.int32(n_steps),
            batch=batch, ctx_len=ctx_len, steps=self.cfg.decode_steps,
        )
        self.stats["decode_blocks"] += n_steps > 0
        return out

    def _hand_out_pending(self) -> bool:
        prev, self._pending = self._pending, []
        self._hand_out(prev)
        return bool(prev)

    def _hand_out(self, records: list[tuple]) -> None:
        """Fetches dispatched outputs (one sync) and hands their tokens out in order, token by token, skipping
        requests that ended since; each request's items reach its caller in one hand-over."""
        if not records:
            return
        fetched = jax.device_get([rec[2] for rec in records])
        touched = []
        for (kind, reqs, _), out in zip(records, fetched):
            if kind == "first":
                reqs = [reqs]
            for r in reqs:
                if r.outbox is None:
                    r.outbox = []
                    touched.append(r)
            if kind == "first":
                if self._live(reqs[0]):
                    tok, lp, experts = out
                    self._accept(reqs[0], int(tok), float(lp), experts)
                continue
            if out.overflow:
                raise EngineError("a decode block read past its length bucket (engine bug)")
            self.stats["decode_steps"] += int(out.count.max(initial=0))
            for r in reqs:
                s = r.slot
                for i in range(int(out.count[s])):
                    if not self._live(r):
                        break
                    self._slots.extend(s, [r.out[-1]])  # the block fed it: its K/V are in the cache now
                    self._accept(r, int(out.tokens[i, s]), float(out.logprobs[i, s]), out.experts[i, s])
        for r in touched:
            r.flush()
            if r.cancelled:  # its caller's event loop is gone
                self._release(r, keep=True)

    def _live(self, r: Request) -> bool:
        return self._active.get(r.slot) is r and not r.cancelled

    def _accept(self, r: Request, tok: int, lp: float, experts: np.ndarray) -> None:
        r.out.append(tok)
        r.logprobs.append(lp)
        if r.req.return_routed_experts:
            r.experts.append(np.asarray(experts, np.int32))
        self.stats["generated_tokens"] += 1
        r.send(TokenChunk(token_ids=[tok], logprobs=[lp]))
        if tok in r.req.sampling.stop_token_ids:
            self._finish(r, "stop")
        elif len(r.out) >= r.max_new:
            self._finish(r, "length")

    def _finish(self, r: Request, reason: str) -> None:
        experts = None
        if r.req.return_routed_experts and self.runner.routing_shape is not None:
            L, K = self.runner.routing_shape
            experts = np.stack(r.experts) if r.experts else np.zeros((0, L, K), np.int32)
        r.send(
            GenerateResult(
                token_ids=list(r.out), logprobs=list(r.logprobs), finish_reason=reason,
                weight_version=r.version, routed_experts=experts, prompt_tokens=len(r.prompt),
            )
        )
        self._release(r, keep=True)

    def _release(self, r: Request, *, keep: bool) -> None:
        if self._active.get(r.slot) is r:
            del self._active[r.slot]
            self._slots.release(r.slot, keep=keep and self.cfg.keep_cache)
            self._override[r.slot] = None  # switch the slot's decode state off on device
