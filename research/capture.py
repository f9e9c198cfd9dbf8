"""The capture record: one model call made by a harness, exactly as the policy saw and produced it.

This is the contract between the interception shim (which writes records) and the tree builder /
trainer (which reads them). Token ids are the ground truth: nothing downstream re-tokenizes text the
policy generated. The log is append-only JSON lines, fsync'd per record, so a crash loses nothing
that was acknowledged; a torn final line (crash mid-write) is detected and ignored on read.

A call that continues an earlier call of its session (an agent's next turn: the previous prompt +
completion + new messages) is written as a reference: `"prompt_ref": [call_id, n]` and `prompt_ids`
holding only the tokens after the first n of that call's prompt + completion, which is earlier in the
same log. A record then costs its new tokens, not its whole prompt (a 20k-token prompt is ~120 KB of
JSON: writing and fsyncing it per call was most of the shim's overhead). Readers resolve it
(`read_log`, `PromptResolver`); in memory a CallRecord always holds its whole prompt.

Schema history:
  1: initial version (log lines may carry `prompt_ref`, see above; the record itself is unchanged).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import orjson

SCHEMA_VERSION = 1

# Rollout statuses. Only "ok" rollouts carry a reward that may be trained on. "replay_mismatch": a forked child whose
# environment did not reproduce its parent's state (research/shim/fork.py).
ROLLOUT_STATUSES = ("ok", "timeout", "task_error", "reward_error", "harness_error", "infra_error", "disk_limit",
                    "replay_mismatch")
FINISH_REASONS = ("stop", "length", "tool_calls", "abort")


class CaptureError(ValueError):
    """A record breaks the schema; the message names the rollout and call."""


@dataclasses.dataclass
class CallRecord:
    """One model call. `prompt_ids + completion_ids` is the exact token sequence of the call."""

    rollout_id: str
    session_id: str
    group_id: str  # the task (and sample group) this rollout belongs to
    harness: str
    call_index: int  # 0-based order of the call within its session
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # behaviour log-prob of each completion token under `weight_version`
    weight_version: int
    finish_reason: str
    call_id: str = ""
    parent_call_id: str | None = None  # the call whose prompt+completion this prompt extends/branches
    # Length of the longest common token prefix with the parent's prompt+completion (shim-computed).
    prefix_match_len: int | None = None
    # Routed experts per completion token: flat int list with shape [len(completion), layers, top_k].
    routed_experts: list[int] | None = None
    routed_experts_shape: tuple[int, int, int] | None = None
    api: str = ""  # openai_chat | openai_responses | anthropic_messages | native
    status: str = "ok"  # ok | aborted (client went away mid-generation)
    t_start: float = 0.0
    t_end: float = 0.0
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def where(self) -> str:
        return f"rollout {self.rollout_id!r} call {self.call_index} ({self.call_id or 'no id'})"

    def validate(self, vocab_size: int | None = None) -> None:
        """Raises CaptureError naming the rollout and call when the record cannot be trained on."""
        if self.schema_version != SCHEMA_VERSION:
            raise CaptureError(f"{self.where()}: schema_version {self.schema_version} != {SCHEMA_VERSION}")
        if len(self.logprobs) != len(self.completion_ids):
            raise CaptureError(
                f"{self.where()}: {len(self.logprobs)} logprobs for "
                f"{len(self.completion_ids)} completion tokens"
            )
        if not self.completion_ids and self.status == "ok":
            raise CaptureError(f"{self.where()}: empty completion")
        if not self.prompt_ids:
            raise CaptureError(f"{self.where()}: empty prompt")
        if self.finish_reason not in FINISH_REASONS:
            raise CaptureError(f"{self.where()}: finish_reason {self.finish_reason!r} not in {FINISH_REASONS}")
        if vocab_size is not None:
            for name, ids in (("prompt_ids", self.prompt_ids), ("completion_ids", self.completion_ids)):
                bad = [t for t in ids if not 0 <= t < vocab_size]
                if bad:
                    raise CaptureError(f"{self.where()}: {name} has token id {bad[0]} outside vocab {vocab_size}")
        if self.routed_experts is not None:
            shape = self.routed_experts_shape
            if shape is None or shape[0] != len(self.completion_ids):
                raise CaptureError(f"{self.where()}: routed_experts_shape {shape} does not match completion")
            if shape[0] * shape[1] * shape[2] != len(self.routed_experts):
                n = len(self.routed_experts)
                raise CaptureError(f"{self.where()}: routed_experts has {n} ids for shape {shape}")


@dataclasses.dataclass
class RolloutResult:
    """How one rollout ended. `reward` is None unless status == 'ok'."""

    rollout_id: str
    group_id: str
    harness: str
    status: str
    reward: float | None = None
    sub_scores: dict[str, float] = dataclasses.field(default_factory=dict)
    session_ids: list[str] = dataclasses.field(default_factory=list)
    message: str = ""
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def success(self, threshold: float = 1.0) -> bool:
        """THE definition of a solved rollout (pass rates, pass@k, demonstration filters all use it)."""
        return self.status == "ok" and self.reward is not None and self.reward >= threshold

    def validate(self) -> None:
        if self.status not in ROLLOUT_STATUSES:
            raise CaptureError(f"rollout {self.rollout_id!r}: status {self.status!r} not in {ROLLOUT_STATUSES}")
        if self.status == "ok" and self.reward is None:
            raise CaptureError(f"rollout {self.rollout_id!r}: status ok but no reward")


def _fields(rec: CallRecord | RolloutResult) -> dict:
    # Shallow field read, not dataclasses.asdict: asdict deep-copies every token id (~35 ms for a
    # 22k-token call), which dominated the shim's per-call overhead.
    kind = "call" if isinstance(rec, CallRecord) else "result"
    return {"kind": kind, **{f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)}}


def _finite(rec: CallRecord | RolloutResult) -> bool:
    """orjson writes NaN/inf as null; such records (a -inf logprob) keep the stdlib's -Infinity."""
    if isinstance(rec, CallRecord):
        return all(map(math.isfinite, rec.logprobs))
    return (rec.reward is None or math.isfinite(rec.reward)) and all(
        isinstance(v, int | float) and math.isfinite(v) for v in rec.sub_scores.values())


def to_json_bytes(rec: CallRecord | RolloutResult, *, prompt_ref: tuple[str, int] | None = None) -> bytes:
    """One record as a compact JSON line (no newline). orjson: ~6x faster than the stdlib on a
    20k-token call (the shim serialises every record before the call's final event); the stdlib
    writes what orjson cannot (non-finite floats, values orjson does not know), same schema.

    `prompt_ref` (call id, n): the record's prompt starts with the first n tokens of that call's
    prompt + completion, written earlier to the same log; only the rest is written (see above)."""
    d = _fields(rec)
    if prompt_ref is not None:
        d["prompt_ids"], d["prompt_ref"] = rec.prompt_ids[prompt_ref[1]:], [prompt_ref[0], prompt_ref[1]]
    if _finite(rec):
        try:
            return orjson.dumps(d, option=orjson.OPT_SERIALIZE_NUMPY)
        except (TypeError, orjson.JSONEncodeError):
            pass
    return json.dumps(d, separators=(",", ":"), default=_plain).encode()


def _plain(obj: Any) -> Any:
    """What the stdlib fallback cannot write natively (numpy ints/arrays from an engine)."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def to_json(rec: CallRecord | RolloutResult) -> str:
    return to_json_bytes(rec).decode()


def from_json(line: str | bytes) -> CallRecord | RolloutResult:
    """One self-contained line; a line whose prompt is a reference needs the lines before it
    (`PromptResolver`, `read_log`)."""
    return PromptResolver(keep=False).decode(line)


class PromptResolver:
    """Decodes a log's lines in order, resolving `prompt_ref`s against the call records seen before.

    Keeps the ok call records it decoded (references to them, by call id), as a log's reader
    materialises them anyway; `keep=False` keeps none (self-contained lines only)."""

    def __init__(self, keep: bool = True):
        self.keep = keep
        self._calls: dict[str, CallRecord] = {}

    def decode(self, line: str | bytes) -> CallRecord | RolloutResult:
        try:
            d = orjson.loads(line)
        except orjson.JSONDecodeError:
            d = json.loads(line)  # NaN / Infinity literals written by the stdlib path
        if not isinstance(d, dict):
            raise CaptureError(f"capture record is a {type(d).__name__}, not an object")
        kind = d.pop("kind", None)
        if kind == "result":
            return RolloutResult(**d)
        if kind != "call":
            raise CaptureError(f"unknown record kind {kind!r}")
        if d.get("routed_experts_shape") is not None:
            d["routed_experts_shape"] = tuple(d["routed_experts_shape"])
        ref = d.pop("prompt_ref", None)
        if ref is not None:
            d["prompt_ids"] = self._resolve(ref, d) + d["prompt_ids"]
        rec = CallRecord(**d)
        if self.keep and rec.status == "ok" and rec.call_id:
            self._calls[rec.call_id] = rec
        return rec

    def _resolve(self, ref: Any, d: dict) -> list[int]:
        where = f"call {d.get('call_id')!r}"
        if not (isinstance(ref, list) and len(ref) == 2 and isinstance(ref[1], int)):
            raise CaptureError(f"{where}: prompt_ref {ref!r} is not [call_id, length]")
        parent = self._calls.get(ref[0])
        if parent is None:
            raise CaptureError(f"{where}: its prompt continues call {ref[0]!r}, which is not earlier in this log "
                               "(read the whole log in order: read_log / PromptResolver)")
        n, p = ref[1], len(parent.prompt_ids)
        if not 0 <= n <= p + len(parent.completion_ids):
            raise CaptureError(f"{where}: prompt_ref length {n} outside call {ref[0]!r}'s {p} + "
                               f"{len(parent.completion_ids)} tokens")
        return parent.prompt_ids[:n] if n <= p else parent.prompt_ids + parent.completion_ids[: n - p]


class CaptureLog:
    """Append-only, fsync-per-record JSONL log. Safe to share between threads of one process.

    `append` returns only once the record is on disk: the shim calls it before finishing a
    response, so an acknowledged call survives a crash of the shim. Concurrent appends are group
    committed: one writer thread takes every line queued so far, writes them in one go and fsyncs
    once, and all their callers return together (an fsync costs milliseconds whatever its size, so
    64 sessions would otherwise queue behind each other's fsyncs).
    """

    def __init__(self, path: str | os.PathLike, fsync: bool = True):
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        self._cv = threading.Condition()
        self._pending: list[bytes] = []
        self._queued = self._durable = 0  # tickets: lines queued / lines on disk
        self._broken: BaseException | None = None  # a failed write: the log stops (fail-stop, no torn middle)
        self._writing = False
        self._repair_torn_tail()
        self._f = open(self.path, "ab")

    def _repair_torn_tail(self) -> None:
        """A crash mid-write leaves a final line without newline; cut it so appends stay parseable."""
        if not self.path.exists():
            return
        with open(self.path, "rb+") as f:
            end = f.seek(0, os.SEEK_END)
            pos = end
            while pos > 0:  # scan back from the end: the file may be gigabytes, the torn line is short
                step = min(pos, 1 << 16)
                f.seek(pos - step)
                block = f.read(step)
                if pos == end and block.endswith(b"\n"):
                    return
                nl = block.rfind(b"\n")
                if nl >= 0:
                    f.truncate(pos - step + nl + 1)
                    return
                pos -= step
            f.truncate(0)

    @property
    def idle(self) -> bool:
        """Nothing queued or being written right now (a hint: another thread may append at any time)."""
        return not self._writing and not self._pending

    def append(self, rec: CallRecord | RolloutResult, *, prompt_ref: tuple[str, int] | None = None) -> None:
        """Durable on return; `prompt_ref` as in `to_json_bytes`."""
        self._commit(to_json_bytes(rec, prompt_ref=prompt_ref) + b"\n")

    def append_line(self, line: bytes) -> None:
        """A record already serialised by `to_json_bytes` (no newline); durable on return."""
        self._commit(line + b"\n")

    def append_many(self, recs: list[CallRecord | RolloutResult]) -> None:
        """Writes the records as one block (durable on return), group committed with other threads."""
        self._commit(b"".join(to_json_bytes(r) + b"\n" for r in recs))

    def _commit(self, data: bytes) -> None:
        with self._cv:
            self._check()
            self._pending.append(data)
            self._queued += 1
            ticket = self._queued
            while self._durable < ticket and self._broken is None:
                if self._writing:
                    self._cv.wait()
                else:
                    self._write_batch()
            if self._durable < ticket:
                self._check()

    def _check(self) -> None:
        if self._broken is not None:
            raise OSError(f"capture log {self.path} stopped after a failed write: {self._broken}") from self._broken

    def _write_batch(self) -> None:
        """Called with the lock held; releases it for the I/O so other threads can queue meanwhile."""
        batch, last = self._pending, self._queued
        self._pending, self._writing = [], True
        self._cv.release()
        err = None
        try:
            self._f.write(b"".join(batch))
            self._f.flush()
            if self._fsync:
                os.fsync(self._f.fileno())
        except BaseException as e:  # noqa: BLE001 - handed to every caller of the batch below
            err = e
        finally:
            self._cv.acquire()
            self._writing = False
            if err is None:
                self._durable = last
            else:
                self._broken = err
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            while self._writing:
                self._cv.wait()
            self._f.close()

    def __enter__(self) -> CaptureLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_log(path: str | os.PathLike) -> Iterator[CallRecord | RolloutResult]:
    """Yields every complete record; a torn final line is skipped, a corrupt middle line raises."""
    path = pathlib.Path(path)
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    last = len(lines) - 1  # after the final "\n" split gives b"" (or a torn line)
    resolver = PromptResolver()
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            yield resolver.decode(raw)
        except (ValueError, TypeError) as e:  # JSONDecodeError, CaptureError, bad fields
            if i == last:
                return  # torn tail: the writer died mid-record, nothing acknowledged is lost
            raise CaptureError(f"{path}:{i + 1}: corrupt capture record: {e}") from e
