"""Incremental index of a run's workdir: runs -> sources -> steps -> groups -> rollouts, and the calls of each.

Why incremental: a long run's logs grow to gigabytes while it runs and the viewer must stay live. Each refresh
reads only the bytes appended to every jsonl file since the previous one (a byte offset per file; a torn final
line waits for its newline; a file that shrank or was replaced is read again from the start). The index keeps
what lists and filters need plus each record's byte range; a page's details (a transcript, a group's token ids)
are read back by offset when asked for.

What it understands (harness_env/rl/loop.py, harness_env/runner.py, launch.eval):
  RUN/metrics.jsonl                                     the curves
  RUN/rollouts/results.jsonl  + RUN/capture.jsonl       train rollouts (ids train{step:05d}[r{round}].…)
  RUN/eval/results.jsonl      + RUN/eval_capture.jsonl  held-out evals (ids eval{version:05d}.…)
  RUN/demos/rollouts/results.jsonl + RUN/demos/capture.jsonl
  RUN/dlogp/step{V:05d}.npz                             Δlogprob of the tokens update V trained (the group page)
  OUT/results.jsonl           + OUT/capture.jsonl       a `launch.eval --out=OUT` dir (ids without a step)
  <results dir>/rollouts/<rollout id>/logs/…            a rollout's harness logs and screenshots
A root given to the viewer is a run or a folder whose runs lie up to three levels below it (a launch.sweep dir).

Threading: `scan` (file reads and JSON parsing, run in a worker thread) touches only the scanner's state and
returns updates; `apply` (on the event loop, where pages are built) is the only writer of what pages read.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import re
import time
from collections.abc import Iterator, Mapping

import orjson

log = logging.getLogger(__name__)
ID_RE = re.compile(r"^([a-z]+)(\d{5})(?:r(\d+))?\.")
NOT_RUN_DIRS = {"checkpoints", "shards", "tasks", "tb", "web_tasks", "rollouts", "logs"}
CHUNK = 32 << 20  # bytes read per go: a first index of a huge log never holds it whole in memory
DISCOVER_EVERY_S = 2.0
ANSWER_CHARS = 4000


@dataclasses.dataclass(slots=True)
class Row:
    """One rollout, as lists, filters and the held-out table need it; `offset`/`length`: its results line."""

    rid: str
    gid: str
    harness: str
    status: str
    reward: float | None
    task: str
    tag: str  # train | eval | demo | "" (launch.eval ids carry no step)
    step: int  # -1: none
    source: str
    offset: int
    length: int
    cause: str
    total_s: float | None
    answer: str  # the final answer, else the last command (held-out comparison)


@dataclasses.dataclass(slots=True)
class CallRef:
    """Where one model call's record lies in its capture log (`ref`: the call its prompt continues)."""

    offset: int
    length: int
    rid: str
    gid: str
    call_id: str
    call_index: int
    prompt_len: int
    completion_len: int
    version: int
    status: str
    finish: str
    latency_s: float
    ref: str | None


@dataclasses.dataclass
class Source:
    """One results log (and its capture log) of a run: train rollouts, held-out evals, demonstrations."""

    key: str  # the results dir relative to the run: "rollouts", "eval", "demos/rollouts", "."
    dir: pathlib.Path
    capture: pathlib.Path | None
    rows: dict[str, Row] = dataclasses.field(default_factory=dict)
    calls_by_group: dict[str, list[CallRef]] = dataclasses.field(default_factory=dict)
    calls_by_rollout: dict[str, list[CallRef]] = dataclasses.field(default_factory=dict)
    call_by_id: dict[str, CallRef] = dataclasses.field(default_factory=dict)
    bad_lines: int = 0

    @property
    def label(self) -> str:
        first = self.key.split("/")[0]
        return {"rollouts": "train", ".": "results"}.get(first, first)

    def rollout_dir(self, rid: str) -> pathlib.Path:
        return self.dir / "rollouts" / rid


@dataclasses.dataclass
class Run:
    name: str  # relative to the viewer's root ("." for the root itself)
    dir: pathlib.Path
    sources: dict[str, Source] = dataclasses.field(default_factory=dict)
    metrics: list[dict] = dataclasses.field(default_factory=list)
    config: dict = dataclasses.field(default_factory=dict)
    summary: dict = dataclasses.field(default_factory=dict)
    ledger: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)  # rollout id -> (update step, fate)
    generation: int = 0  # bumped on every change: caches of derived tables key on it
    cache: dict = dataclasses.field(default_factory=dict, repr=False)  # queries.py: name -> (generation, value)


@dataclasses.dataclass
class Update:
    """What one scan found for one file of one run (applied on the event loop)."""

    run: str
    run_dir: pathlib.Path
    what: str  # results | capture | metrics | ledger | json
    source: str = ""
    source_dir: pathlib.Path | None = None
    capture: pathlib.Path | None = None
    reset: bool = False
    items: list = dataclasses.field(default_factory=list)
    bad: int = 0


class Tail:
    """The complete lines appended to one file since the previous call, each with its byte offset."""

    def __init__(self, path: pathlib.Path):
        self.path, self.offset, self.ident = path, 0, None

    def read(self) -> tuple[bool, Iterator[tuple[int, bytes]]]:
        """(reset, lines): reset when the file shrank or was replaced (everything is read again)."""
        try:
            st = os.stat(self.path)
        except OSError:  # not there (yet), or unreadable
            return False, iter(())
        ident = (st.st_dev, st.st_ino)
        reset = self.ident is not None and (ident != self.ident or st.st_size < self.offset)
        if reset:
            self.offset = 0
        self.ident = ident
        return reset, self._lines(st.st_size)

    def _lines(self, size: int) -> Iterator[tuple[int, bytes]]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            pending, pos, left = b"", self.offset, size - self.offset
            while left > 0:
                data = f.read(min(CHUNK, left))
                if not data:
                    return
                left -= len(data)
                buf = pending + data
                end = buf.rfind(b"\n")
                if end < 0:  # a line longer than a chunk, or a torn final line (read again next time)
                    pending = buf
                    continue
                for line in buf[:end].split(b"\n"):
                    if line.strip():
                        yield pos, line
                    pos += len(line) + 1
                pending, self.offset = buf[end + 1:], pos


def answer_of(meta: Mapping) -> str:
    """The rollout's final answer, else its last shell command (what a held-out comparison shows)."""
    final = meta.get("final_message")
    if isinstance(final, str) and final.strip():
        return final[:ANSWER_CHARS]
    hm = meta.get("harness_meta") or {}
    transcript = hm.get("transcript") if isinstance(hm, dict) else None
    for msg in reversed(transcript if isinstance(transcript, list) else []):
        for call in reversed((msg.get("tool_calls") or []) if isinstance(msg, dict) else []):
            fn = call.get("function", call) if isinstance(call, dict) else {}
            args = fn.get("arguments", "") if isinstance(fn, dict) else ""
            try:
                args = orjson.loads(args) if isinstance(args, str) else args
            except orjson.JSONDecodeError:
                return str(args)[:ANSWER_CHARS]
            if isinstance(args, dict) and "command" in args:
                return str(args["command"])[:ANSWER_CHARS]
            return orjson.dumps(args).decode()[:ANSWER_CHARS]
    return ""


def parse_result(line: bytes, offset: int, source: str) -> Row:
    d = orjson.loads(line)
    if d.get("kind") != "result":
        raise ValueError("not a result record")
    meta = d.get("meta") or {}
    m = ID_RE.match(d["rollout_id"])
    task = meta.get("task_id") or d["group_id"].rsplit("/", 2)[-2 if d["group_id"].count("/") else -1]
    reward = d.get("reward")
    return Row(rid=d["rollout_id"], gid=d["group_id"], harness=d.get("harness", ""), status=d.get("status", ""),
               reward=None if reward is None else float(reward), task=str(task),
               tag=m.group(1) if m else "", step=int(m.group(2)) if m else -1, source=source, offset=offset,
               length=len(line), cause=str(meta.get("cause") or ""),
               total_s=(d.get("timings") or {}).get("total_s"), answer=answer_of(meta))


def parse_call(line: bytes, offset: int) -> CallRef | None:
    d = orjson.loads(line)
    if d.get("kind") != "call":
        return None  # the runner also logs results here; results.jsonl is their index
    ref = d.get("prompt_ref")
    return CallRef(offset=offset, length=len(line), rid=d["rollout_id"], gid=d["group_id"],
                   call_id=d.get("call_id") or "", call_index=int(d.get("call_index", 0)),
                   prompt_len=len(d.get("prompt_ids") or []) + (int(ref[1]) if ref else 0),
                   completion_len=len(d.get("completion_ids") or []), version=int(d.get("weight_version", -1)),
                   status=d.get("status", "ok"), finish=d.get("finish_reason", ""),
                   latency_s=float(d.get("t_end", 0.0)) - float(d.get("t_start", 0.0)), ref=ref[0] if ref else None)


def _parse_all(lines: Iterator[tuple[int, bytes]], parse) -> tuple[list, int]:  # noqa: ANN001
    """Parsed lines and the count of corrupt ones. A read that fails midway (the file vanished) keeps what was
    read: the tail's offset stops at the last line handed out, so nothing is lost or read twice."""
    items, bad = [], 0
    try:
        for off, line in lines:
            try:
                item = parse(line, off)
            except (ValueError, KeyError, TypeError):  # a corrupt line is counted and shown, never fatal
                bad += 1
                continue
            if item is not None:
                items.append(item)
    except OSError as e:
        log.warning("inspect: reading stopped: %s", e)
    return items, bad


def find_runs(root: pathlib.Path, depth: int = 3, budget: int = 500) -> list[pathlib.Path]:
    """The run dirs at or below `root`: a dir with metrics.jsonl or results.jsonl (or rollouts/results.jsonl)."""
    out, frontier = [], [(root, 0)]
    while frontier and budget > 0:
        d, k = frontier.pop(0)
        budget -= 1
        if any((d / f).is_file() for f in ("metrics.jsonl", "results.jsonl", "rollouts/results.jsonl")):
            out.append(d)
            continue
        if k < depth:
            try:
                kids = sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")
                              and p.name not in NOT_RUN_DIRS)
            except OSError:
                continue
            frontier += [(p, k + 1) for p in kids]
    return out


def _subdirs(d: pathlib.Path) -> list[pathlib.Path]:
    try:
        return sorted(p for p in d.iterdir() if p.is_dir() and p.name not in NOT_RUN_DIRS - {"rollouts"})
    except OSError:  # gone or unreadable: nothing there this time
        return []


def find_sources(run: pathlib.Path) -> list[tuple[str, pathlib.Path, pathlib.Path | None]]:
    """(key, results dir, capture log or None) of every results.jsonl at most two levels below the run (never
    inside a `rollouts/` dir of per-rollout folders)."""
    cands = [run]
    for c in _subdirs(run):
        cands.append(c)
        if not (c / "results.jsonl").is_file() and c.name != "rollouts":
            cands += _subdirs(c)
    out = []
    for d in cands:
        if (d / "results.jsonl").is_file():
            out.append((d.relative_to(run).as_posix(), d, capture_of(d)))
    return out


def capture_of(d: pathlib.Path) -> pathlib.Path | None:
    """A results dir's capture log: its own, the run's (train: rollouts/ -> capture.jsonl) or NAME_capture.jsonl."""
    for p in (d / "capture.jsonl", d.parent / "capture.jsonl" if d.name == "rollouts" else None,
              d.parent / f"{d.name}_capture.jsonl"):
        if p is not None and p.is_file():
            return p
    return None


def _read_json(path: pathlib.Path) -> dict:
    try:
        d = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return d if isinstance(d, dict) else {}


class Scanner:
    """The file side of the index (runs in a worker thread): finds runs and sources, reads what was appended."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self._tails: dict[pathlib.Path, Tail] = {}
        self._mtimes: dict[pathlib.Path, float] = {}
        self._runs: list[pathlib.Path] = []
        self._sources: dict[pathlib.Path, list] = {}
        self._found_at = -float("inf")

    def _tail(self, path: pathlib.Path) -> Tail:
        return self._tails.setdefault(path, Tail(path))

    def _discover(self) -> None:
        if time.monotonic() - self._found_at < DISCOVER_EVERY_S:
            return
        self._runs = find_runs(self.root)
        self._sources = {d: find_sources(d) for d in self._runs}
        self._found_at = time.monotonic()

    def scan(self) -> list[Update]:
        self._discover()
        out = []
        for d in self._runs:
            name = d.relative_to(self.root).as_posix()
            base = dict(run=name, run_dir=d)
            for fname in ("config.json", "summary.json"):
                p = d / fname
                try:
                    mtime = p.stat().st_mtime
                except OSError:
                    continue
                if self._mtimes.get(p) != mtime:
                    self._mtimes[p] = mtime
                    out.append(Update(**base, what="json", items=[(fname, _read_json(p))]))
            for what, parse in (("metrics", _parse_metric), ("ledger", _parse_ledger)):
                reset, lines = self._tail(d / f"{what}.jsonl").read()
                items, bad = _parse_all(lines, parse)
                out.append(Update(**base, what=what, reset=reset, items=items, bad=bad))
            for key, sdir, capture in self._sources.get(d, []):
                src = dict(base, source=key, source_dir=sdir, capture=capture)
                reset, lines = self._tail(sdir / "results.jsonl").read()
                items, bad = _parse_all(lines, lambda line, off, key=key: parse_result(line, off, key))
                out.append(Update(**src, what="results", reset=reset, items=items, bad=bad))
                if capture is not None:
                    reset, lines = self._tail(capture).read()
                    items, bad = _parse_all(lines, parse_call)
                    out.append(Update(**src, what="capture", reset=reset, items=items, bad=bad))
        return out


def _parse_metric(line: bytes, offset: int) -> dict | None:
    d = orjson.loads(line)
    return d if isinstance(d, dict) and "step" in d else None


def _parse_ledger(line: bytes, offset: int) -> list[tuple[str, int, str]] | None:
    """ledger.jsonl (research/rl/run_state.py): which rollouts each update step trained on or dropped."""
    d = orjson.loads(line)
    if not isinstance(d, dict) or "step" not in d:
        return None
    return [(rid, int(d["step"]), fate) for fate in ("trained", "dropped") for rid in d.get(fate) or []]


class WorkdirIndex:
    """The viewer's model of a root dir: `runs` by name. Refresh with `refresh` (async) or `refresh_sync`."""

    def __init__(self, root: str | os.PathLike):
        self.root = pathlib.Path(root).absolute()
        if not self.root.exists():
            raise FileNotFoundError(f"workdir {self.root} does not exist")
        if not self.root.is_dir():
            raise NotADirectoryError(f"workdir {self.root} is a file, not a run directory")
        self.scanner = Scanner(self.root)
        self.runs: dict[str, Run] = {}
        self._lock = None

    def refresh_sync(self) -> None:
        self.apply(self.scanner.scan())

    async def refresh(self) -> None:
        """Reads what was appended (worker thread), then applies it here, on the loop where pages are built."""
        import asyncio

        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            self.apply(await asyncio.to_thread(self.scanner.scan))

    def apply(self, updates: list[Update]) -> None:
        for u in updates:
            run = self.runs.get(u.run)
            if run is None:
                run = self.runs[u.run] = Run(u.run, u.run_dir)
            if u.what == "json":
                for fname, d in u.items:
                    setattr(run, fname.removesuffix(".json"), d)
                run.generation += 1
            elif u.what == "metrics":
                if u.reset:
                    run.metrics = []
                run.metrics += u.items
                run.generation += bool(u.items or u.reset)
            elif u.what == "ledger":
                if u.reset:
                    run.ledger = {}
                run.ledger.update((rid, (step, fate)) for entries in u.items for rid, step, fate in entries)
                run.generation += bool(u.items or u.reset)
            else:
                self._apply_source(run, u)

    @staticmethod
    def _apply_source(run: Run, u: Update) -> None:
        src = run.sources.get(u.source)
        if src is None:
            src = run.sources[u.source] = Source(u.source, u.source_dir, u.capture)
        src.capture = u.capture
        if u.what == "results":
            if u.reset:
                src.rows, src.bad_lines = {}, 0
            for row in u.items:
                src.rows.pop(row.rid, None)  # a re-recorded rollout (a resumed run's retry): the latest wins
                src.rows[row.rid] = row
        else:
            if u.reset:
                src.calls_by_group, src.calls_by_rollout, src.call_by_id = {}, {}, {}
            for c in u.items:
                src.calls_by_group.setdefault(c.gid, []).append(c)
                src.calls_by_rollout.setdefault(c.rid, []).append(c)
                if c.call_id:
                    src.call_by_id[c.call_id] = c
        src.bad_lines += u.bad
        run.generation += bool(u.items or u.reset or u.bad)

    def run(self, name: str | None) -> Run:
        """The named run (None: the only / first one); KeyError with the known names."""
        if name is None and self.runs:
            return self.runs[sorted(self.runs)[0]]
        if name not in self.runs:
            raise KeyError(f"no run {name!r} under {self.root}; runs: {sorted(self.runs) or 'none yet'}")
        return self.runs[name]

