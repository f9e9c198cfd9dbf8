"""grain pipeline: sealed ArrayRecord shards -> group -> validated calls -> tree -> packed batch.

Deterministic given the seed (grain's index shuffle), checkpointable: `iterator.get_state()` is a
JSON-able dict (saved by research/train/checkpoint.py as JSON next to the train state) and
`iterator.set_state(state)` resumes at exactly the next batch. Each batch packs `groups_per_batch`
groups into a fixed [num_rows, row_len] shape, so the jitted train step never recompiles; a batch
whose trees do not fit raises an error naming the groups (raise num_rows or lower groups_per_batch).

Bad input never stops training and never takes good data with it: a call that fails validation
(logprob count != completion length, token id outside the vocab, empty completion, ...) is dropped
with a message naming its rollout and call; a rollout without a reward drops its calls, each named;
the messages and counts travel with the batch (`rejections`, `num_rejected`) for the metrics.
GRPO-family advantages are computed here (rewards are known); for PPO with a critic the trainer
recomputes the node statistics from GAE after a value forward pass on the batch's `trees`
(research.trees.objective.ppo_stats_from_values).
"""

from __future__ import annotations

import dataclasses

import grain
import numpy as np

from research.capture import CaptureError
from research.data.shards import GroupRecord, ShardSource
from research.trees.builder import GroupTree, build_tree
from research.trees.packing import pack_trees
from research.trees.targets import node_stats, normalizer, rollout_advantages


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    row_len: int
    num_rows: int
    groups_per_batch: int
    vocab_size: int
    estimator: str = "grpo"
    aggregation: str = "token_mean"
    merge_generations: bool = True
    seed: int = 0
    num_epochs: int | None = 1  # None: repeat forever


@dataclasses.dataclass
class TreeItem:
    tree: GroupTree | None
    rejections: list[str]


def clean_group(rec: GroupRecord, vocab_size: int):
    """(calls, results, rejections): drops exactly the bad calls/rollouts, naming each."""
    rejections, results = [], []
    for r in rec.results:
        try:
            r.validate()
        except CaptureError as e:
            rejections.append(str(e))
            continue
        if r.status == "ok":
            results.append(r)
    rewarded = {r.rollout_id for r in results}
    calls = []
    for c in rec.calls:
        if c.rollout_id not in rewarded:
            rejections.append(f"{c.where()}: rollout has no reward")
            continue
        try:
            c.validate(vocab_size)
        except CaptureError as e:
            rejections.append(str(e))
            continue
        calls.append(c)
    if not calls:
        rejections.append(f"group {rec.group_id!r} harness {rec.harness!r}: no trainable calls left")
    return calls, results, rejections


def to_tree(rec: GroupRecord, *, vocab_size: int, merge_generations: bool) -> TreeItem:
    calls, results, rejections = clean_group(rec, vocab_size)
    tree = build_tree(calls, results, merge_generations=merge_generations) if calls else None
    return TreeItem(tree, rejections)


def pack_items(items: list[TreeItem], cfg: PipelineConfig) -> dict[str, np.ndarray]:
    """Advantages within (group, harness), per-node stats, best-fit packing into the fixed shape."""
    trees = [it.tree for it in items if it.tree is not None]
    rejections = [m for it in items for m in it.rejections]
    if trees:
        advs = rollout_advantages(trees, estimator=cfg.estimator)
        stats = [node_stats(t, occ_adv=a, agg_name=cfg.aggregation) for t, a in zip(trees, advs)]
        norms = [normalizer(t, cfg.aggregation) for t in trees]
    else:
        stats, norms = [], []
    try:
        out = pack_trees(trees, stats, norms, row_len=cfg.row_len, num_rows=cfg.num_rows)
    except ValueError as e:
        names = [f"{t.group_id}/{t.harness}" for t in trees]
        raise ValueError(f"cannot pack groups {names}: {e}") from e
    out["num_rejected"] = np.asarray(len(rejections), np.int32)
    out["rejections"] = np.asarray(rejections, dtype=object)
    out["num_groups"] = np.asarray(len(trees), np.int32)
    out["trees"] = np.empty(len(trees), dtype=object)  # host-only: PPO recomputes stats with GAE on them
    out["trees"][:] = trees
    return out


def make_dataset(paths: list[str], cfg: PipelineConfig) -> grain.IterDataset:
    """Shards -> shuffled groups -> trees -> packed batches (an IterDataset; `iter()` it)."""
    ds = grain.MapDataset.source(ShardSource(paths)).shuffle(seed=cfg.seed)
    ds = ds.repeat(cfg.num_epochs)
    ds = ds.map(lambda rec: to_tree(rec, vocab_size=cfg.vocab_size, merge_generations=cfg.merge_generations))
    return ds.to_iter_dataset().batch(cfg.groups_per_batch, batch_fn=lambda items: pack_items(list(items), cfg))


def device_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The array part a train step consumes (drops host-only bookkeeping like rejection messages)."""
    return {k: v for k, v in batch.items() if v.dtype != object}
