"""Queries over a WorkdirIndex's runs: the rollout list's filters, step and group summaries, held-out answers.

Derived tables are cached per run and rebuilt when the run's `generation` moved (something was appended), so a
page over a 10,000-rollout run costs a pass over its rows only after new rows arrived.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import orjson

from harness_env.inspect.index import Row, Run, Source
from research.capture import RolloutResult


def source_of(run: Run, key: str | None) -> Source:
    if key not in run.sources:
        raise KeyError(f"run {run.name!r} has no rollout log {key!r}; it has {sorted(run.sources)}")
    return run.sources[key]


def read_result(src: Source, row: Row) -> RolloutResult:
    """The full record of a rollout (transcript and all), read back from its results line."""
    with open(src.dir / "results.jsonl", "rb") as f:
        f.seek(row.offset)
        d = orjson.loads(f.read(row.length))
    d.pop("kind", None)
    return RolloutResult(**d)


@dataclasses.dataclass
class Filter:
    """The rollout list's filters, from a page's query string (empty fields: no filter)."""

    source: str | None = None
    step: int | None = None
    group: str | None = None
    harness: str | None = None
    status: str | None = None
    task: str | None = None  # substring of the task id
    rmin: float | None = None
    rmax: float | None = None

    @classmethod
    def from_query(cls, q: Mapping[str, str]) -> Filter:
        """ValueError naming the field when a number does not parse."""
        kw: dict = {}
        for f in dataclasses.fields(cls):
            v = (q.get(f.name) or "").strip()
            if not v:
                continue
            conv = {"step": int, "rmin": float, "rmax": float}.get(f.name, str)
            try:
                kw[f.name] = conv(v)
            except ValueError:
                raise ValueError(f"filter {f.name}={v!r} is not a number") from None
        return cls(**kw)

    def query(self) -> dict[str, str]:
        return {k: str(v) for k, v in dataclasses.asdict(self).items() if v is not None}

    def match(self, r: Row) -> bool:
        if (self.source is not None and r.source != self.source) or (self.step is not None and r.step != self.step):
            return False
        if (self.group is not None and r.gid != self.group) or (self.harness is not None and r.harness != self.harness):
            return False
        if (self.status is not None and r.status != self.status) or (self.task and self.task not in r.task):
            return False
        if self.rmin is not None or self.rmax is not None:
            if r.reward is None:
                return False
            if (self.rmin is not None and r.reward < self.rmin) or (self.rmax is not None and r.reward > self.rmax):
                return False
        return True


def passed(r: Row) -> bool:
    """RolloutResult.success: status ok and reward >= 1."""
    return r.status == "ok" and r.reward is not None and r.reward >= 1.0


@dataclasses.dataclass
class Summary:
    """Counts of a set of rollouts (a step, a group)."""

    key: tuple
    rollouts: int = 0
    groups: set = dataclasses.field(default_factory=set)
    rewards: list = dataclasses.field(default_factory=list)
    passed: int = 0
    statuses: dict = dataclasses.field(default_factory=dict)
    harnesses: set = dataclasses.field(default_factory=set)
    updates: dict = dataclasses.field(default_factory=dict)  # (update step, trained|dropped) -> rollouts

    def add(self, r: Row, ledger: Mapping[str, tuple[int, str]]) -> None:
        self.rollouts += 1
        fate = ledger.get(r.rid)
        if fate is not None:
            self.updates[fate] = self.updates.get(fate, 0) + 1
        self.groups.add(r.gid)
        self.harnesses.add(r.harness)
        self.passed += passed(r)
        self.statuses[r.status] = self.statuses.get(r.status, 0) + 1
        if r.status == "ok" and r.reward is not None:
            self.rewards.append(r.reward)

    @property
    def mean_reward(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None


def _cached(run: Run, key: str, build):  # noqa: ANN001, ANN202
    hit = run.cache.get(key)
    if hit is None or hit[0] != run.generation:
        hit = run.cache[key] = (run.generation, build())
    return hit[1]


def all_rows(run: Run) -> list[Row]:
    return _cached(run, "rows", lambda: [r for s in run.sources.values() for r in s.rows.values()])


def filter_rows(run: Run, flt: Filter) -> list[Row]:
    return [r for r in all_rows(run) if flt.match(r)]


def steps(run: Run) -> list[Summary]:
    """One summary per (source, step), in (source, step) order."""
    def build() -> list[Summary]:
        out: dict[tuple, Summary] = {}
        for r in all_rows(run):
            key = (r.source, r.step)
            (out.get(key) or out.setdefault(key, Summary(key))).add(r, run.ledger)
        order = {"rollouts": 0, "eval": 1}
        return [out[k] for k in sorted(out, key=lambda k: (order.get(k[0], 2), k))]
    return _cached(run, "steps", build)


def groups(run: Run, source: str, step: int | None) -> list[Summary]:
    """One summary per group of a step (all steps: None), keyed (group id, task, harness)."""
    out: dict[str, Summary] = {}
    for r in source_of(run, source).rows.values():
        if step is None or r.step == step:
            (out.get(r.gid) or out.setdefault(r.gid, Summary((r.gid, r.task, r.harness)))).add(r, run.ledger)
    return [out[k] for k in sorted(out)]


def options(run: Run) -> dict[str, list[str]]:
    """The values the filter form offers."""
    def build() -> dict[str, list[str]]:
        rows = all_rows(run)
        return {"source": sorted(run.sources), "harness": sorted({r.harness for r in rows}),
                "status": sorted({r.status for r in rows})}
    return _cached(run, "options", build)


@dataclasses.dataclass
class Heldout:
    """Held-out answers: (task, harness) x version -> the rollouts there (launch.eval dirs: one column, -1)."""

    versions: list[int]
    keys: list[tuple[str, str]]
    cells: dict[tuple[str, str, int], list[Row]]


def heldout(run: Run) -> Heldout:
    rows = [r for r in all_rows(run) if r.tag == "eval"]
    if not rows and "." in run.sources:  # a launch.eval dir: its rollouts, one column
        rows = list(run.sources["."].rows.values())
    cells: dict[tuple[str, str, int], list[Row]] = {}
    for r in rows:
        cells.setdefault((r.task, r.harness, r.step), []).append(r)
    return Heldout(versions=sorted({k[2] for k in cells}), keys=sorted({k[:2] for k in cells}), cells=cells)
