"""grain pipelines: sealed ArrayRecord shards -> groups -> validated calls -> prefix trees.

Two checkpointable iterators feed the RL loop; their states go into the orbax checkpoint (as JSON, by
research/train/checkpoint.py) and are restored on resume, so a resumed run reads exactly what it would
have read:

- `step_stream(shards_dir)`: the RL stream. Each training step seals its finished groups as one keyed
  batch (research/data/shards.py); the iterator yields them in sealing order, one element per step,
  reading only that step's new shards (never re-reading old ones). Its state is the next batch index.
- `demo_stream(paths, ...)`: the SFT stream over the demonstration shards: shuffled per epoch
  (grain's index shuffle, seeded), repeated forever, `groups_per_step` groups per element.

Both map every group through `to_tree` (bad calls dropped and named; one prefix tree per group). What
is left — staleness, group filtering, advantages, per-node statistics and packing into the step's
fixed row shape — depends on the learner's current version, so `research/rl/batches.py` does it.

Bad input never stops training and never takes good data with it: a call that fails validation
(logprob count != completion length, token id outside the vocab, empty completion, ...) is dropped
with a message naming its rollout and call; a rollout without a reward drops its calls, each named.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any

import grain

from research.capture import CaptureError
from research.data.shards import GroupRecord, ShardSource, sealed_batches
from research.trees.builder import GroupTree, build_tree


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """What the grain pipeline reads: call validation, which failures are scored, tree building, shuffling.
    (How trees become packed rows is research/rl/batches.BatchConfig.)"""

    vocab_size: int
    merge_generations: bool = True
    seed: int = 0
    # Rollouts that ended by the policy's own doing are trained on with `failure_reward` instead of being
    # dropped: dropping them would hide the failure from the advantages (RL could never learn to avoid it).
    scored_failures: tuple[str, ...] = ("timeout", "disk_limit")
    failure_reward: float = 0.0
    # ... and so are failed rollouts whose `meta["cause"]` is one of these (harness_env/attribution.py: a harness
    # the policy broke, a checker it made fail); failures of the infrastructure or the task are never trained on
    scored_causes: tuple[str, ...] = ("policy",)
    # an `ok` rollout that tampered with its inputs (meta["tampered"]) is rewarded with this, not its grade
    tamper_reward: float | None = 0.0
    # a vision policy's image placeholder token and spatial merge: calls merge through an image only if it is the
    # same one (research/trees/builder.py); None for a text policy (placeholders are then plain tokens)
    image_pad_id: int | None = None
    merge_size: int = 2


@dataclasses.dataclass
class TreeItem:
    """One group after validation: its prefix tree (None if nothing trainable is left) and what was dropped."""

    tree: GroupTree | None
    rejections: list[str]
    group: GroupRecord

    @property
    def rollout_ids(self) -> set[str]:
        return {r.rollout_id for r in self.group.results} | {c.rollout_id for c in self.group.calls}

    @property
    def min_version(self) -> int | None:
        vs = [c.weight_version for c in self.group.calls]
        return min(vs) if vs else None


def clean_group(rec: GroupRecord, vocab_size: int, *, scored_failures: tuple[str, ...] = (),
                failure_reward: float = 0.0, scored_causes: tuple[str, ...] = (), tamper_reward: float | None = None):
    """(calls, results, rejections): drops exactly the bad calls/rollouts, naming each. Results whose status
    is in `scored_failures`, or whose attributed cause is in `scored_causes`, count as rewarded with
    `failure_reward` (their calls are trained on); an `ok` result that tampered with its inputs
    (`meta["tampered"]`) is rewarded with `tamper_reward` (None: its grade stands)."""
    rejections, results = [], []
    for r in rec.results:
        try:
            r.validate()
        except CaptureError as e:
            rejections.append(str(e))
            continue
        if r.status == "ok":
            tampered = tamper_reward is not None and (r.meta or {}).get("tampered")
            results.append(dataclasses.replace(r, reward=tamper_reward) if tampered else r)
        elif r.status in scored_failures or (r.meta or {}).get("cause") in scored_causes:
            results.append(dataclasses.replace(r, reward=failure_reward))
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


def to_tree(rec: GroupRecord, cfg: PipelineConfig) -> TreeItem:
    calls, results, rejections = clean_group(rec, cfg.vocab_size, scored_failures=cfg.scored_failures,
                                             failure_reward=cfg.failure_reward, scored_causes=cfg.scored_causes,
                                             tamper_reward=cfg.tamper_reward)
    tree = build_tree(calls, results, merge_generations=cfg.merge_generations, image_pad_id=cfg.image_pad_id,
                      merge_size=cfg.merge_size) if calls else None
    return TreeItem(tree, rejections, rec)


def merge_items(items: list[TreeItem], cfg: PipelineConfig) -> list[TreeItem]:
    """The items' groups rebuilt as one tree per harness (each rollout once). Why: demonstrations through a real
    CLI share its ~9k-token prompt up to the task's line; as separate trees each one trains that prompt again
    (16 demonstrations: 16 rows of ~10k tokens), merged they train it once. Only for losses that need no group
    advantages (SFT): a merged tree's rollouts come from different tasks."""
    by_harness: dict[str, dict[str, GroupRecord]] = {}
    for it in items:
        by_harness.setdefault(it.group.harness, {}).setdefault(it.group.key, it.group)
    out = []
    for harness, groups in by_harness.items():
        recs = list(groups.values())
        merged = GroupRecord(f"merged:{recs[0].group_id}+{len(recs) - 1}", harness,
                             [c for r in recs for c in r.calls], [x for r in recs for x in r.results])
        out.append(to_tree(merged, cfg))
    return out


@dataclasses.dataclass
class SealedBatch:
    """The groups one training step sealed (`key` = the step's tag)."""

    key: str
    items: list[TreeItem]


class _SealedBatchIterator(grain.DatasetIterator):
    def __init__(self, shards_dir: pathlib.Path, cfg: PipelineConfig):
        super().__init__()
        self._dir, self._cfg, self._next = shards_dir, cfg, 0

    def __next__(self) -> SealedBatch:
        batches = sealed_batches(self._dir)
        if self._next >= len(batches):
            raise StopIteration
        key, paths = batches[self._next]
        src = ShardSource(paths) if paths else []
        items = [to_tree(src[i], self._cfg) for i in range(len(src))]
        self._next += 1
        return SealedBatch(key, items)

    def get_state(self) -> dict[str, Any]:
        return {"next_batch": self._next}

    def set_state(self, state: dict[str, Any]) -> None:
        self._next = int(state["next_batch"])


class SealedBatches(grain.IterDataset):
    """An IterDataset over the keyed seals of `shards_dir`; it grows as the loop seals more steps.

    `next()` raises StopIteration when every sealed batch has been read; calling it again after the
    next seal returns that batch (the loop calls it exactly once per step, after sealing)."""

    def __init__(self, shards_dir: str | pathlib.Path, cfg: PipelineConfig):
        super().__init__()
        self._dir, self._cfg = pathlib.Path(shards_dir), cfg

    def __iter__(self) -> _SealedBatchIterator:
        return _SealedBatchIterator(self._dir, self._cfg)

    def __str__(self) -> str:
        return f"SealedBatches({self._dir})"


def step_stream(shards_dir: str | pathlib.Path, cfg: PipelineConfig) -> _SealedBatchIterator:
    return iter(SealedBatches(shards_dir, cfg))


class _Subset:
    """A random-access view of `src` at `indices` (the demonstrations that pass the filter)."""

    def __init__(self, src: ShardSource, indices: list[int]):
        self.src, self.indices = src, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> GroupRecord:
        return self.src[self.indices[int(i)]]


def demo_stream(paths: list[str], cfg: PipelineConfig, *, groups_per_step: int,
                keep: Callable[[GroupRecord], bool] = lambda rec: True) -> tuple[grain.DatasetIterator, int, int]:
    """(iterator, kept, total): the groups that `keep` accepts, shuffled per epoch (seeded), repeated forever,
    `groups_per_step` per element (a list of TreeItems)."""
    src = ShardSource(paths)
    good = [i for i in range(len(src)) if keep(src[i])]
    ds = grain.MapDataset.source(_Subset(src, good)).shuffle(seed=cfg.seed).repeat(None)  # reshuffled per epoch
    ds = ds.map(lambda rec: to_tree(rec, cfg))
    return iter(ds.to_iter_dataset().batch(groups_per_step, batch_fn=list)), len(good), len(src)
