"""The built-in JAX engine: continuous batching over fixed KV-cache slots, behind the async Engine API.

One background thread owns the device state (params, cache, slot table) and runs the loop
  admit waiting requests into slots -> prefill ONE chunk of one request -> ONE decode step of all slots
so a request joins the running batch as soon as a slot is free and leaves it the step it finishes;
nobody waits for a batch. Decode is overlapped: step n+1 is dispatched from the sampled tokens still on
device before the host fetches and hands out step n, so Python bookkeeping hides behind device work;
decode runs on the smallest bucket of leading slots that covers every decoding slot. Long prompts are
prefilled in fixed chunks interleaved with decode steps, so they do not stall streaming requests. Every
jitted function has a fixed shape: compiled once per (bucket, max_len, chunk). asyncio callers get
tokens through `loop.call_soon_threadsafe`.

Semantics worth knowing (the shim and the trainer rely on them):
- logprobs: see sampling.py (after temperature, before top-k/top-p truncation; greedy = T 1).
- stop tokens are included in `token_ids` (the next turn's prompt must contain them token for token).
- routed_experts[i] = experts chosen at the forward step that *produced* token i (the last prompt
  position for i == 0), int32 [n, layers, top_k]: what routing replay needs for the training forward.
- prompt longer than max_len - 1 -> ContextLengthExceeded; max_new_tokens is clamped to the room
  left, finishing with "length" (as SGLang does).
- weight update: `on_update="drain"` (default) stops admitting, lets in-flight requests finish on the
  old weights, swaps, then runs the queue on the new ones; `"abort"` ends in-flight decodes at once
  with finish_reason "abort" (tokens so far are old-version tokens) and re-queues requests that had
  not produced a token yet. Either way each result carries the one version that produced all of it,
  and cached prefixes of older versions are dropped.
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
import jax.numpy as jnp
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
from research.serving.runner import ModelRunner, StepFunctions
from research.serving.sampling import request_key
from research.serving.scheduler import EngineConfig, Request, SlotTable, common_prefix_len, worth_waiting

log = logging.getLogger(__name__)


def _committed(params):
    """Params explicitly placed (committed) where they are: jit caches key on commitment, and updates
    are placed the same way, so a weight swap never triggers a recompile."""
    dev = jax.devices()[0]
    return jax.tree.map(lambda a: jax.device_put(a, a.sharding if isinstance(a, jax.Array) else dev), params)


class JaxEngine(Engine):
    def __init__(self, runner: ModelRunner, params, *, config: EngineConfig = EngineConfig(), weight_version: int = 0):
        if config.on_update not in ("drain", "abort"):
            raise ValueError(f"on_update must be 'drain' or 'abort', got {config.on_update!r}")
        self.runner, self.cfg = runner, config
        self._params, self._version = _committed(params), weight_version
        self._fns = StepFunctions.of(runner)
        self._cache = _committed(runner.init_cache(config.num_slots, config.max_len + config.prefill_chunk))
        self._slots = SlotTable(config.num_slots, min_reuse=config.min_reuse)
        self._tok_buf = _committed(jnp.zeros(config.num_slots, jnp.int32))  # last sampled token per slot
        self._inflight: tuple | None = None  # a dispatched decode step whose results are not processed yet
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
        r.emit = lambda item: loop.call_soon_threadsafe(q.put_nowait, item)
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
        params = self._like_current(params)
        if mode == "drain":
            await self._call(lambda: self._set_admitting(False))
            await self._until_idle()
        await self._call(lambda: self._swap(params, version))

    def _like_current(self, params):
        """New params placed and typed exactly like the served ones: a different sharding, commitment or
        dtype would silently recompile every step function (seconds to minutes) on the next call."""
        old = self._params
        if jax.tree.structure(params) != jax.tree.structure(old):
            raise ValueError("new params have a different tree structure than the served model")
        cast = jax.tree.map(lambda n, o: np.asarray(n, o.dtype) if n.dtype != o.dtype else n, params, old)
        return jax.device_put(cast, jax.tree.map(lambda o: o.sharding, old))

    async def flush_cache(self) -> None:
        await self._call(self._slots.flush)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._post(("stop", None))
        await asyncio.to_thread(self._thread.join)

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
        return Request(
            req=req, emit=lambda _: None, max_new=min(sp.max_new_tokens, self.cfg.max_len - n),
            key=np.asarray(request_key(seed)),
        )

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
        """Runs each step function once on slot 0 (free: nothing cached there yet) to compile it."""
        zero_key = np.zeros(2, np.uint32)
        C = self.cfg.prefill_chunk
        self._cache, *_ = self._fns.prefill(
            self._params, self._cache, jnp.int32(0), np.zeros(C, np.int32), jnp.int32(0), jnp.int32(1),
            jnp.float32(1.0), jnp.float32(1.0), jnp.int32(-1), zero_key, jnp.int32(0),
        )
        S = self.cfg.num_slots
        for B in self.cfg.buckets():
            self._cache, self._tok_buf, *_ = self._fns.decode(
                self._params, self._cache, self._tok_buf, np.zeros(S, np.int32), np.ones(S, bool),
                np.full(B, self.cfg.max_len, np.int32), np.ones(B, np.float32), np.ones(B, np.float32),
                np.full(B, -1, np.int32), np.zeros((B, 2), np.uint32), np.zeros(B, np.int32),
            )
        jax.block_until_ready(self._cache)

    def _run(self) -> None:
        if self.cfg.warmup:
            try:
                self._warmup()
            except Exception:
                log.exception("engine warmup failed (compilation will happen on the first request)")
        while True:
            if not self._handle_commands():
                break
            try:
                self._admit()
                worked = self._prefill_step()
                worked = self._decode_step() or worked
            except Exception as e:  # a device error must not leave callers hanging forever
                log.exception("engine step failed")
                self._inflight = None
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
                    self._process_inflight()  # control calls see every dispatched token accounted for
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
                r.filled, r.slot = 0, -1
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
        for r in list(self._active.values()) + list(self._waiting):
            r.send(exc)
            if r.slot >= 0:
                self._release(r, keep=False)
        self._waiting.clear()

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
                self._cache = self._fns.copy_slot(self._cache, jnp.int32(p.copy_from), jnp.int32(p.slot))
                self.stats["slot_copies"] += 1
            self._slots.acquire(p, r.prompt, r.req.session_id, self._version)
            r.slot, r.filled, r.version = p.slot, p.reuse, self._version
            self._active[p.slot] = r
            self.stats["reused_tokens"] += p.reuse
            self.stats["admitted"] += 1
            if r.filled < len(r.prompt) and len(r.prompt) > C:
                prefilling.setdefault(r.head(C), []).append(r)
        self._waiting.extendleft(reversed(deferred))
        self.stats["deferred_for_prefix"] += len(deferred)

    def _prefill_step(self) -> bool:
        """Prefills one chunk of the oldest request still prefilling; samples its first token at the end."""
        pending = [r for r in self._active.values() if r.filled < len(r.prompt)]
        if not pending:
            return False
        r = min(pending, key=lambda x: self._slots.slots[x.slot].last_used)
        C = self.cfg.prefill_chunk
        chunk = r.prompt[r.filled : r.filled + C]
        tokens = np.zeros(C, np.int32)
        tokens[: len(chunk)] = chunk
        sp = r.req.sampling
        self._cache, tok, lp, experts = self._fns.prefill(
            self._params, self._cache, jnp.int32(r.slot), tokens, jnp.int32(r.filled), jnp.int32(len(chunk)),
            jnp.float32(sp.temperature), jnp.float32(sp.top_p), jnp.int32(sp.top_k), r.key, jnp.int32(0),
        )
        self._slots.extend(r.slot, chunk)
        r.filled += len(chunk)
        self.stats["prefill_tokens"] += len(chunk)
        if r.filled == len(r.prompt):
            tok, lp, experts = jax.device_get((tok, lp, experts))
            self._accept(r, int(tok), float(lp), experts)
        return True

    def _decode_step(self) -> bool:
        """Dispatches decode step n+1, then processes step n (host work overlaps device work).

        A request whose step-n token turns out to be a stop token got one extra step computed for it:
        that token is dropped (its K/V lands past the slot's valid prefix, rewritten before any read)."""
        pending = set(self._inflight[0]) if self._inflight else set()
        decoding = []
        for r in self._active.values():
            n = len(r.out) + (r in pending)
            if r.filled == len(r.prompt) and n and n < r.max_new and not r.cancelled:
                decoding.append((r, n))
        if not decoding:
            return self._process_inflight()
        top = max(r.slot for r, _ in decoding) + 1
        B, S = next(b for b in self.cfg.buckets() if b >= top), self.cfg.num_slots
        host_tok, use_host = np.zeros(S, np.int32), np.zeros(S, bool)
        positions = np.full(B, self.cfg.max_len, np.int32)
        temp, top_p = np.ones(B, np.float32), np.ones(B, np.float32)
        top_k, steps = np.full(B, -1, np.int32), np.zeros(B, np.int32)
        keys = np.zeros((B, 2), np.uint32)
        for r, n in decoding:
            s, sp = r.slot, r.req.sampling
            if r not in pending:
                host_tok[s], use_host[s] = r.out[-1], True
            positions[s] = len(r.prompt) + n - 1
            temp[s], top_p[s], top_k[s], keys[s], steps[s] = sp.temperature, sp.top_p, sp.top_k, r.key, n
        self._cache, self._tok_buf, tok_B, lp_B, experts_B = self._fns.decode(
            self._params, self._cache, self._tok_buf, host_tok, use_host, positions, temp, top_p, top_k, keys, steps
        )
        self.stats["decode_steps"] += 1
        self._process_inflight()
        self._inflight = ([r for r, _ in decoding], tok_B, lp_B, experts_B)
        return True

    def _process_inflight(self) -> bool:
        """Fetches the dispatched step's tokens and hands them out (skipping requests that ended since)."""
        if self._inflight is None:
            return False
        reqs, tok_B, lp_B, experts_B = self._inflight
        self._inflight = None
        tok_B, lp_B, experts_B = jax.device_get((tok_B, lp_B, experts_B))
        for r in reqs:
            if self._active.get(r.slot) is not r or r.cancelled:
                continue
            self._slots.extend(r.slot, [r.out[-1]])
            self._accept(r, int(tok_B[r.slot]), float(lp_B[r.slot]), experts_B[r.slot])
        return True

    def _accept(self, r: Request, tok: int, lp: float, experts: np.ndarray) -> None:
        r.out.append(tok)
        r.logprobs.append(lp)
        if r.req.return_routed_experts:
            r.experts.append(np.asarray(experts, np.int32))
        self.stats["generated_tokens"] += 1
        r.send(TokenChunk(token_ids=[tok], logprobs=[lp]))
        if r.cancelled:
            self._release(r, keep=True)
        elif tok in r.req.sampling.stop_token_ids:
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
