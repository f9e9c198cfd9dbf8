"""Forking a black-box harness by replay: a child session answers its first k calls from its parent's records.

Why: a harness CLI cannot be forked mid-run, but the shim sees every call. The runner re-runs the harness from
scratch in a fresh sandbox, and this session answers its first k calls with the parent's recorded completions (the
same tokens, the same behaviour log-probs and weight version) without calling the engine. A deterministic
environment then reaches the parent's state at call k by itself, and the child samples fresh from call k on: its
calls share the parent's first k turns token for token, so the group's prefix tree branches there and trains the
shared turns once.

Every replayed request is verified: its rendered prompt must equal the record's prompt ids, because a recorded
completion and its log-probs belong to exactly that context. A difference (a clock or a random id in a tool output,
a harness that numbers its sessions) is a `ReplayMismatch`: the call gets an error, every later call of the session
too, and the runner ends the rollout as `replay_mismatch` with the first differing tokens — never a silent
divergence. Calls are matched to records by prompt, not arrival order, so a harness that sends two calls at once
still replays. The fork call (the first call sampled fresh) is compared with the parent's call k as well; a
difference there is no error (the sample is the policy's own, from the prompt it saw) but is reported: the child
then shares less than k turns with its parent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from typing import NoReturn

import numpy as np

from research.capture import CallRecord
from research.serving.api import GenerateResult, TokenChunk

WINDOW = 16  # differing tokens shown in a mismatch report, from the first difference on


class ReplayMismatch(Exception):
    """A replayed request differs from its record (or the session failed replay before)."""


@dataclasses.dataclass(frozen=True)
class ReplayPlan:
    """What a child session replays: the parent's calls 0..k-1 and the prompt of its call k (None: it had none)."""

    parent_rollout_id: str
    records: tuple[CallRecord, ...]
    fork_prompt: tuple[int, ...] | None = None

    @property
    def k(self) -> int:
        return len(self.records)

    @classmethod
    def of(cls, records: Sequence[CallRecord], k: int) -> ReplayPlan:
        """The plan forking a rollout whose calls are `records` at call k: its calls 0..k-1 must all be `ok`
        (an aborted call has no completion to answer with) and numbered 0..k-1 in one session."""
        recs = sorted(records, key=lambda c: c.call_index)
        if not 0 <= k <= len(recs):
            raise ValueError(f"fork at call {k}: the rollout has {len(recs)} calls")
        head = recs[:k]
        for i, c in enumerate(head):
            if c.call_index != i or c.status != "ok" or c.session_id != recs[0].session_id:
                raise ValueError(f"fork at call {k}: cannot replay {c.where()}: calls 0..{k - 1} must be the ok "
                                 f"calls of one session (this one: index {c.call_index}, status {c.status!r})")
        fork = tuple(recs[k].prompt_ids) if k < len(recs) else None
        return cls(recs[0].rollout_id, tuple(head), fork)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first position where the two id sequences differ (the shorter length if one is a prefix of the other)."""
    n = min(len(a), len(b))
    ne = np.flatnonzero(np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64))
    return int(ne[0]) if ne.size else n


def same_ids(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and first_difference(a, b) == len(a)


def difference(expected: Sequence[int], got: Sequence[int], decode: Callable[[list[int]], str]) -> dict:
    """Where `got` leaves `expected`: position, lengths, the next WINDOW ids of both and their text."""
    at = first_difference(expected, got)
    exp, new = list(expected[at:at + WINDOW]), list(got[at:at + WINDOW])
    return {"at": at, "expected_len": len(expected), "got_len": len(got), "expected": exp, "got": new,
            "before_text": decode(list(expected[max(0, at - WINDOW):at])), "expected_text": decode(exp),
            "got_text": decode(new)}


class ReplayState:
    """One child session's progress through its plan (the shim's Session holds it)."""

    def __init__(self, plan: ReplayPlan, decode: Callable[[list[int]], str]):
        self.plan, self._decode = plan, decode
        self.pending: list[CallRecord] = list(plan.records)
        self.replayed, self.replayed_tokens = 0, 0
        self.mismatch: dict | None = None
        self.fork: dict | None = None  # the first fresh call: its index and whether its prompt is the parent's

    def take(self, prompt_ids: Sequence[int], index: int, max_new_tokens: int) -> CallRecord | None:
        """The record answering this call, or None: sample it. Raises ReplayMismatch (and keeps failing)."""
        if self.mismatch is not None:
            raise ReplayMismatch(f"replay failed earlier in this session: {self.mismatch['why']}")
        if self.pending:
            rec = next((r for r in self.pending if same_ids(r.prompt_ids, prompt_ids)), None)
            if rec is None:
                want = self.pending[0]
                self._fail(index, f"call {index}'s prompt differs from the parent's call {want.call_index}",
                           difference(want.prompt_ids, prompt_ids, self._decode))
            if len(rec.completion_ids) > max_new_tokens:
                self._fail(index, f"call {index} may generate {max_new_tokens} tokens, the parent's call "
                           f"{rec.call_index} generated {len(rec.completion_ids)}", None)
            self.pending.remove(rec)
            self.replayed += 1
            self.replayed_tokens += len(rec.completion_ids)
            return rec
        if self.fork is None:
            fp = self.plan.fork_prompt
            same = fp is not None and same_ids(fp, prompt_ids)
            self.fork = {"call": index, "prompt_match": same}
            if fp is not None and not same:
                self.fork["difference"] = difference(fp, prompt_ids, self._decode)
        return None

    def _fail(self, index: int, why: str, diff: dict | None) -> NoReturn:
        if diff is not None:
            why += (f": at token {diff['at']} of {diff['expected_len']} (got {diff['got_len']}), after "
                    f"{diff['before_text'][-80:]!r} expected {diff['expected_text']!r}, got {diff['got_text']!r}")
        self.mismatch = {"call": index, "why": why, **({"difference": diff} if diff else {})}
        raise ReplayMismatch(why)

    def close(self) -> None:
        """At the session's end: a harness that stopped before its fork call diverged from the parent too."""
        if self.mismatch is None and (self.pending or (self.fork is None and self.plan.fork_prompt is not None)):
            self.mismatch = {"call": None, "why": f"the harness ended after {self.replayed} of {self.plan.k} "
                             "replayed calls" + ("" if self.pending else ", before its fork call")}

    def report(self) -> dict:
        """What the runner keeps in the child's result (`meta["replay"]`) and the metrics count."""
        return {"parent": self.plan.parent_rollout_id, "k": self.plan.k, "replayed": self.replayed,
                "replayed_tokens": self.replayed_tokens, "mismatch": self.mismatch, "fork": self.fork}


async def recorded_stream(rec: CallRecord) -> AsyncIterator[TokenChunk | GenerateResult]:
    """The record's completion through the engine interface: one chunk, then the result with its log-probs,
    weight version and routed experts, as the engine gave them to the parent."""
    ids, lps = list(rec.completion_ids), list(rec.logprobs)
    yield TokenChunk(ids, lps)
    routed = None
    if rec.routed_experts is not None and rec.routed_experts_shape is not None:
        routed = np.asarray(rec.routed_experts, np.int32).reshape(rec.routed_experts_shape)
    yield GenerateResult(ids, lps, "length" if rec.finish_reason == "length" else "stop", rec.weight_version,
                         routed_experts=routed, prompt_tokens=len(rec.prompt_ids))
