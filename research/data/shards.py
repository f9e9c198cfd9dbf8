"""Seal capture logs into ArrayRecord shards: one record per finished (group, harness).

Why a second format: the JSONL capture log is the crash-safe write path (an ArrayRecord file whose
writer was not closed holds 0 readable records), while grain wants random access. Sealing reads the
log, keeps groups whose every rollout has a RolloutResult, and writes each as one record (JSON of its
calls and results). Durable: a shard is written to a temp name, fsync'd, renamed, and only then
listed in `manifest.json` (itself replaced atomically). Idempotent: groups already in the manifest
are skipped, so sealing the same (growing) log again only adds newly finished groups.

Sealed batches: a seal with a `key` (the RL loop passes the step's tag) also records, in the manifest's
`batches` list, which shards that seal wrote (possibly none). The loop's grain iterator reads the
batches in that order, one per training step, so each step reads only its new shards; sealing a key
again (a resumed step) adds nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

from research.capture import CallRecord, RolloutResult, from_json, read_log, to_json

MANIFEST = "manifest.json"


class ShardError(RuntimeError):
    """A shard (or one of its records) cannot be read; the message names the file and record."""


@dataclasses.dataclass
class GroupRecord:
    """All calls and results of one (group_id, harness): the unit a tree is built from."""

    group_id: str
    harness: str
    calls: list[CallRecord]
    results: list[RolloutResult]

    @property
    def key(self) -> str:
        return f"{self.group_id}\x1f{self.harness}"

    def encode(self) -> bytes:
        return json.dumps({"group_id": self.group_id, "harness": self.harness,
                           "calls": [to_json(c) for c in self.calls],
                           "results": [to_json(r) for r in self.results]}).encode()

    @staticmethod
    def decode(data: bytes) -> GroupRecord:
        d = json.loads(data)
        return GroupRecord(d["group_id"], d["harness"], [from_json(c) for c in d["calls"]],
                           [from_json(r) for r in d["results"]])


def finished_groups(log_path: str | os.PathLike) -> list[GroupRecord]:
    """Groups of the log whose every rollout (seen in a call or a result) has a result."""
    calls: dict[tuple[str, str], list[CallRecord]] = {}
    results: dict[str, RolloutResult] = {}
    for rec in read_log(log_path):
        if isinstance(rec, CallRecord):
            calls.setdefault((rec.group_id, rec.harness), []).append(rec)
        else:
            results[rec.rollout_id] = rec
    out = []
    for (g, h), cs in calls.items():
        rids = {c.rollout_id for c in cs}
        rids |= {r.rollout_id for r in results.values() if (r.group_id, r.harness) == (g, h)}
        if all(r in results for r in rids):
            out.append(GroupRecord(g, h, cs, [results[r] for r in sorted(rids)]))
    return out


def _read_manifest(out_dir: pathlib.Path) -> dict:
    path = out_dir / MANIFEST
    m = json.loads(path.read_text()) if path.exists() else {}
    return {"shards": m.get("shards", []), "groups": m.get("groups", []), "batches": m.get("batches", [])}


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seal_log(log_path: str | os.PathLike, out_dir: str | os.PathLike, *, groups_per_shard: int = 64,
             key: str | None = None, rollout_ids: set[str] | None = None) -> list[str]:
    """Writes the log's newly finished groups (only those with a rollout in `rollout_ids`, if given) into new
    shards; returns the new shard paths. With `key`, records them as one sealed batch (once per key)."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = _read_manifest(out_dir)
    if key is not None and any(b["key"] == key for b in manifest["batches"]):
        return []
    done = set(manifest["groups"])
    todo = sorted((g for g in finished_groups(log_path) if g.key not in done and _wanted(g, rollout_ids)),
                  key=lambda g: g.key)
    new = []
    for i in range(0, len(todo), groups_per_shard):
        chunk = todo[i:i + groups_per_shard]
        name = f"groups-{len(manifest['shards']):05d}.array_record"
        tmp = out_dir / (name + ".tmp")
        writer = ArrayRecordWriter(str(tmp), "group_size:1")
        for g in chunk:
            writer.write(g.encode())
        writer.close()
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out_dir / name)
        _fsync_dir(out_dir)
        manifest["shards"].append(name)
        manifest["groups"].extend(g.key for g in chunk)
        _write_atomic(out_dir / MANIFEST, json.dumps(manifest).encode())
        new.append(str(out_dir / name))
    if key is not None:
        manifest["batches"].append({"key": key, "shards": [pathlib.Path(p).name for p in new]})
        _write_atomic(out_dir / MANIFEST, json.dumps(manifest).encode())
    return new


def _wanted(g: GroupRecord, rollout_ids: set[str] | None) -> bool:
    if rollout_ids is None:
        return True
    return any(r.rollout_id in rollout_ids for r in g.results) or any(c.rollout_id in rollout_ids for c in g.calls)


def sealed_batches(out_dir: str | os.PathLike) -> list[tuple[str, list[str]]]:
    """[(key, shard paths)] of the keyed seals, in the order they were sealed."""
    out_dir = pathlib.Path(out_dir)
    return [(b["key"], [str(out_dir / s) for s in b["shards"]]) for b in _read_manifest(out_dir)["batches"]]


def shard_paths(out_dir: str | os.PathLike) -> list[str]:
    """The sealed shards listed in the manifest (never half-written ones)."""
    out_dir = pathlib.Path(out_dir)
    return [str(out_dir / s) for s in _read_manifest(out_dir)["shards"]]


class ShardSource:
    """grain RandomAccessDataSource over sealed shards; records decode to GroupRecord.

    Readers are opened lazily per shard; any failure names the shard (and record).
    """

    def __init__(self, paths: list[str]):
        self.paths = list(paths)
        self._readers: dict[int, ArrayRecordReader] = {}
        self._offsets = [0]
        for i in range(len(self.paths)):
            self._offsets.append(self._offsets[-1] + self._reader(i).num_records())

    def _reader(self, i: int) -> ArrayRecordReader:
        if i not in self._readers:
            try:
                reader = ArrayRecordReader(self.paths[i])
                n = reader.num_records()
            except Exception as e:
                raise ShardError(f"corrupt shard {self.paths[i]}: {e}") from e
            if n == 0:  # sealing never writes an empty shard: garbage, truncation or an unclosed writer
                raise ShardError(f"corrupt shard {self.paths[i]}: no readable records "
                                 "(truncated, never closed, or not an ArrayRecord file)")
            self._readers[i] = reader
        return self._readers[i]

    def __len__(self) -> int:
        return self._offsets[-1]

    def __getitem__(self, idx: int) -> GroupRecord:
        idx = int(idx)
        shard = next(i for i in range(len(self.paths)) if idx < self._offsets[i + 1])
        local = idx - self._offsets[shard]
        try:
            data = self._reader(shard).read([local])[0]
            return GroupRecord.decode(data)
        except Exception as e:
            raise ShardError(f"corrupt shard {self.paths[shard]}: record {local}: {type(e).__name__}: {e}") from e

    def __getstate__(self):
        return {"paths": self.paths, "_offsets": self._offsets, "_readers": {}}

    def __repr__(self) -> str:
        return f"ShardSource({len(self.paths)} shards, {len(self)} groups)"
