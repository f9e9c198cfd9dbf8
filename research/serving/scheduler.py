"""Host-side bookkeeping of the engine's fixed KV-cache slots: who owns a slot, what its cache holds.

The device cache has a fixed shape [slots, max_len] for the engine's life (jit once). A slot is
`free` (holds nothing useful), `busy` (a running request) or `parked` (a finished request's KV is
kept so the next turn of the same session — or any prompt sharing its prefix — skips re-prefill).

Prefix reuse: for a new prompt we find the slot whose valid cache tokens share the longest common
prefix (LCP) with it. A parked match is taken over in place; a match in a busy slot (e.g. the 8
samples of a GRPO group, or another session on the same task) is *copied* into a free slot (one
device row copy, far cheaper than prefilling thousands of tokens). Caches are tagged with the
weight version that produced them and are never reused across versions.

Also here: `EngineConfig` (the engine's knobs) and `Request` (a request's host-side state while the
engine thread owns it), so jax_engine.py holds only the loop and the asyncio bridge.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import numpy as np

from research.serving.api import GenerateRequest

FREE, BUSY, PARKED = "free", "busy", "parked"


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    # Compare in blocks first: prompts are 10-100k tokens and usually share almost everything.
    step = 256
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclasses.dataclass
class Slot:
    index: int
    state: str = FREE
    cached: list[int] = dataclasses.field(default_factory=list)  # tokens whose K/V are valid, in order
    version: int = -1
    session_id: str | None = None
    last_used: int = 0


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a request goes: `slot`, reusing the first `reuse` tokens, copied from `copy_from` first."""

    slot: int
    reuse: int
    copy_from: int | None = None


class SlotTable:
    def __init__(self, num_slots: int, *, min_reuse: int = 1):
        self.slots = [Slot(i) for i in range(num_slots)]
        self.min_reuse = min_reuse
        self._clock = itertools.count(1)

    def has_room(self) -> bool:
        return any(s.state != BUSY for s in self.slots)

    def place(self, prompt: list[int], session_id: str | None, version: int) -> Placement | None:
        """Picks a slot for `prompt` (None when every slot is busy). Does not mark it busy."""
        best, best_len = None, 0
        for s in self.slots:
            if s.state == FREE or s.version != version or not s.cached:
                continue
            n = common_prefix_len(s.cached, prompt)
            # Same session wins ties: its cache is the natural continuation of this prompt.
            if n > best_len or (n == best_len and n > 0 and session_id and s.session_id == session_id):
                best, best_len = s, n
        # At least one prompt token must be prefilled: its logits produce the first sampled token.
        reuse = min(best_len, len(prompt) - 1)
        if best is not None and reuse < self.min_reuse:
            best, reuse = None, 0
        if best is not None and best.state == PARKED:
            return Placement(best.index, reuse)
        target = self._victim(protect=best.index if best is not None else None)
        if target is None:
            return None
        if best is not None:
            return Placement(target.index, reuse, copy_from=best.index)
        return Placement(target.index, 0)

    def _victim(self, protect: int | None) -> Slot | None:
        """A free slot, else the least recently used parked one (never `protect`, a copy source)."""
        free = [s for s in self.slots if s.state == FREE]
        if free:
            return free[0]
        parked = [s for s in self.slots if s.state == PARKED and s.index != protect]
        return min(parked, key=lambda s: s.last_used) if parked else None

    def acquire(self, p: Placement, prompt: list[int], session_id: str | None, version: int) -> None:
        s = self.slots[p.slot]
        if p.copy_from is not None:
            prefix = self.slots[p.copy_from].cached[: p.reuse]
        else:
            prefix = s.cached[: p.reuse]
        assert prefix == prompt[: p.reuse], "reused cache does not match the prompt prefix"
        s.state, s.cached, s.version, s.session_id = BUSY, list(prefix), version, session_id
        s.last_used = next(self._clock)

    def extend(self, slot: int, tokens: list[int]) -> None:
        """Records that K/V of `tokens` were written after the slot's current valid prefix."""
        self.slots[slot].cached.extend(tokens)

    def release(self, slot: int, *, keep: bool) -> None:
        s = self.slots[slot]
        s.last_used = next(self._clock)
        if keep and s.cached:
            s.state = PARKED
        else:
            s.state, s.cached, s.session_id = FREE, [], None

    def flush(self) -> None:
        """Forgets every parked cache (after a weight update or an explicit flush)."""
        for s in self.slots:
            if s.state == PARKED:
                s.state, s.cached, s.session_id = FREE, [], None

    def busy(self) -> list[int]:
        return [s.index for s in self.slots if s.state == BUSY]


def worth_waiting(shared: int, filled: int, chunk: int) -> bool:
    """Wait for another request's prefill when it shares >= a chunk of prompt and has not written it all."""
    return shared >= chunk and shared > filled


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    num_slots: int = 8
    max_len: int = 2048  # longest prompt + completion a slot holds
    prefill_chunk: int = 128
    on_update: str = "drain"  # drain | abort
    keep_cache: bool = True  # park finished requests' KV for prefix reuse
    min_reuse: int = 1  # shortest cached prefix worth reusing
    queue_while_paused: bool = False
    retry_after_s: float = 1.0
    warmup: bool = True  # compile the step functions when the engine starts, not on the first request
    warmup_all: bool = False  # ... for every (batch, length) bucket, not just the shortest length bucket
    # Decode runs on the first k slots, k the smallest bucket covering every decoding slot: one request
    # does not pay for 32 slots. () = 1, 4, 16, ... below num_slots, then num_slots (one compile each).
    decode_buckets: tuple[int, ...] = ()
    # Attention reads the first n cache positions, n the smallest bucket covering every decoding slot's
    # sequence. () = 256, 1024, 4096, ... below max_len, then max_len (compiled on first use).
    length_buckets: tuple[int, ...] = ()
    decode_steps: int = 8  # decode steps per dispatch (one host sync per block of this many tokens)
    prefill_budget: int = 512  # prompt tokens prefilled between two decode blocks (at least one chunk)
    prefill_decode_steps: int = 2  # ... while a prompt is being prefilled (its chunks interleave with decode)
    max_stop_tokens: int = 8  # stop ids checked on device per request (the host checks every one)

    def __post_init__(self):
        if self.on_update not in ("drain", "abort"):
            raise ValueError(f"on_update must be 'drain' or 'abort', got {self.on_update!r}")
        if not 1 <= self.prefill_decode_steps <= self.decode_steps:
            raise ValueError(f"need 1 <= prefill_decode_steps <= decode_steps, got {self.prefill_decode_steps}, "
                             f"{self.decode_steps}")
        self.buckets()
        self.len_buckets()

    def buckets(self) -> tuple[int, ...]:
        if self.decode_buckets:
            if max(self.decode_buckets) != self.num_slots:
                raise ValueError(f"decode_buckets {self.decode_buckets} must end at num_slots={self.num_slots}")
            return tuple(sorted(set(self.decode_buckets)))
        out = [b for b in (4**i for i in range(self.num_slots.bit_length())) if b < self.num_slots]
        return (*out, self.num_slots)

    def len_buckets(self) -> tuple[int, ...]:
        if self.length_buckets:
            if max(self.length_buckets) != self.max_len or min(self.length_buckets) < 1:
                raise ValueError(f"length_buckets {self.length_buckets} must be >= 1 and end at max_len={self.max_len}")
            return tuple(sorted(set(self.length_buckets)))
        out = [b for b in (256 * 4**i for i in range(self.max_len.bit_length())) if b < self.max_len]
        return (*out, self.max_len)

    def len_bucket(self, n: int) -> int:
        """The smallest length bucket holding n cached positions."""
        return next(b for b in self.len_buckets() if b >= n)


@dataclasses.dataclass(eq=False)
class Request:
    """Engine-internal state of one request; touched only by the engine thread after submission."""

    req: GenerateRequest
    emit: Callable[[list], None]  # hands a list of stream items to the caller's event loop, in order
    max_new: int
    key: np.ndarray
    slot: int = -1
    filled: int = 0  # prompt tokens whose K/V are in the slot
    version: int = -1
    out: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    experts: list[np.ndarray] = dataclasses.field(default_factory=list)
    cancelled: bool = False
    dispatched: int = 0  # upper bound on the tokens the device has been asked to produce so far
    outbox: list | None = None  # while not None, send() collects items here (one hand-over per block)
    match: list[int] | None = None  # what prefix reuse matches on, when not the prompt ids (images: their sha)
    images: object = None  # a vision-language request's encoded images (the runner's; None until prefilled)
    _head: tuple[int, int] | None = None

    @property
    def prompt(self) -> list[int]:
        """The prompt as prefix reuse sees it (the ids, or `match`): slots cache these."""
        return self.req.prompt_ids if self.match is None else self.match

    def head(self, n: int) -> int:
        """Hash of the first n prompt tokens: cheap grouping before comparing long prompts."""
        if self._head is None or self._head[0] != n:
            self._head = (n, hash(tuple(self.prompt[:n])))
        return self._head[1]

    def send(self, item: object) -> None:
        if self.outbox is not None:
            self.outbox.append(item)
        else:
            self._emit([item])

    def flush(self) -> None:
        items, self.outbox = self.outbox, None
        if items:
            self._emit(items)

    def _emit(self, items: list) -> None:
        """A caller whose event loop is gone counts as cancelled."""
        try:
            self.emit(items)
        except RuntimeError:  # "Event loop is closed"
            self.cancelled = True
