"""Capture log -> sealed ArrayRecord shards -> grain -> group trees -> one packed batch per step.

Why through shards and grain even in a single process: the shards are the durable, replayable record
of what the trainer saw (a resumed or a later offline run reads the same groups), and the grain source
is the same one a multi-host trainer uses. Staleness is enforced here, per group: a group whose
oldest call was generated more than `max_off_policy_steps` weight versions ago is dropped and counted,
never trained on.
"""

from __future__ import annotations

import dataclasses
import pathlib

import grain
import numpy as np

from research.capture import CallRecord
from research.data.pipeline import PipelineConfig, TreeItem, clean_group, pack_items
from research.data.shards import GroupRecord, ShardSource, seal_log, shard_paths
from research.rl.objective import loss_slots
from research.trees.builder import GroupTree, build_tree
from research.trees.packing import pack_routed_experts

HOST_ONLY = ("tree_id", "node_id", "own", "rejections", "num_rejected", "num_groups")


@dataclasses.dataclass
class StepBatch:
    """Everything one train step needs, plus the host-side facts the metrics report."""

    device: dict[str, np.ndarray]  # what the jitted step consumes
    packed: dict[str, np.ndarray]  # full packed view (tree_id/node_id/own) for PPO GAE and inspection
    trees: list[GroupTree]
    rollout_ids: set[str]  # every rollout whose group was consumed (trained or dropped)
    trained_ids: set[str]
    stale_groups: int
    stale_rollouts: int
    rejections: list[str]
    flat_tokens: int  # sum over calls of prompt + completion (what per-call training would process)
    tree_tokens: int
    min_version: int


def seal(capture_path: pathlib.Path, shards_dir: pathlib.Path) -> list[str]:
    if not capture_path.exists():
        return []
    return seal_log(capture_path, shards_dir)


def load_groups(shards_dir: pathlib.Path, want: set[str]) -> list[GroupRecord]:
    """The sealed groups (grain source over every shard) that belong to rollouts in `want`."""
    paths = shard_paths(shards_dir)
    if not paths:
        return []
    ds = grain.MapDataset.source(ShardSource(paths))
    out = []
    for i in range(len(ds)):
        rec = ds[i]
        rids = {r.rollout_id for r in rec.results} | {c.rollout_id for c in rec.calls}
        if rids & want:
            out.append(rec)
    return out


def _version(rec: GroupRecord) -> int | None:
    vs = [c.weight_version for c in rec.calls]
    return min(vs) if vs else None


def build_batch(groups: list[GroupRecord], pcfg: PipelineConfig, *, current_version: int, max_off_policy: int,
                loss_slots_k: int) -> StepBatch | None:
    """Trees of the fresh groups packed into at least `pcfg.num_rows` rows (more, in multiples, if needed)."""
    fresh, stale, stale_r, rids = [], 0, 0, set()
    for rec in groups:
        ids = {r.rollout_id for r in rec.results}
        rids |= ids
        v = _version(rec)
        if v is not None and current_version - v > max_off_policy:
            stale, stale_r = stale + 1, stale_r + len(ids)
            continue
        fresh.append(rec)
    items = []
    for rec in fresh:
        calls, results, rejections = clean_group(rec, pcfg.vocab_size)
        tree = build_tree(calls, results, merge_generations=pcfg.merge_generations) if calls else None
        items.append((TreeItem(tree, rejections), calls))
    trees = [it.tree for it, _ in items if it.tree is not None]
    rejections = [m for it, _ in items for m in it.rejections]
    base = dict(rollout_ids=rids, stale_groups=stale, stale_rollouts=stale_r, rejections=rejections)
    if not trees:
        return StepBatch(device={}, packed={}, trees=[], trained_ids=set(), flat_tokens=0, tree_tokens=0,
                         min_version=current_version, **base)
    need = sum(-(-t.num_nodes // pcfg.row_len) for t in trees)
    rows = pcfg.num_rows * max(1, -(-need // pcfg.num_rows))
    while True:
        try:
            packed = pack_items([it for it, _ in items], dataclasses.replace(pcfg, num_rows=rows))
            break
        except ValueError:
            if rows > 16 * need + pcfg.num_rows:
                raise
            rows += pcfg.num_rows
    idx, valid = loss_slots(packed["count"], loss_slots_k)
    device = {k: v for k, v in packed.items()
              if k not in HOST_ONLY and isinstance(v, np.ndarray) and v.dtype != object}
    device.update(loss_idx=idx, loss_valid=valid)
    routed = pack_routed_experts(trees, packed)
    if routed is not None:
        device["expert_ids"] = routed
    calls: list[CallRecord] = [c for _, cs in items for c in cs]
    trained = {ci.rollout_id for t in trees for ci in t.calls}
    return StepBatch(device=device, packed=packed, trees=trees, trained_ids=trained,
                     flat_tokens=sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls),
                     tree_tokens=sum(t.num_nodes for t in trees),
                     min_version=min(c.weight_version for c in calls), **base)
