"""One training step's batch: sealed groups (from the grain streams) -> advantages -> packed rows.

The grain iterators of research/data/pipeline.py yield validated group trees; what depends on the
learner's current weight version happens here, per step:
- staleness, per group: a group whose oldest call was generated more than `max_off_policy_steps`
  versions ago is dropped and counted, never trained on;
- group filtering (`BatchConfig.filter_groups`, DAPO's dynamic-sampling filter): a group whose
  rollouts all got the same reward has zero GRPO advantage everywhere, yet its tokens would still
  dilute a token-mean normaliser (a smaller effective step for the groups that carry signal) and feed
  the KL/entropy terms; it is dropped and counted;
- GRPO-family advantages per (group, harness), per-node loss statistics, best-fit packing into at
  least `num_rows` rows (more, in multiples, if needed), the LM-head loss slots and routed experts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from research.data.pipeline import TreeItem
from research.models import image_processor as ip
from research.rl.objective import loss_slots
from research.trees.batch import HOST_ONLY
from research.trees.builder import GroupTree
from research.trees.packing import image_fields, pack_images, pack_routed_experts, pack_trees
from research.trees.targets import node_stats, normalizer, rollout_advantages


@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """How a step's trees become packed rows (what this module reads; the pipeline has its own config)."""

    row_len: int
    num_rows: int
    estimator: str = "grpo"
    aggregation: str = "token_mean"
    filter_groups: bool = False  # drop groups whose rollouts all got the same reward (no GRPO signal)


@dataclasses.dataclass(frozen=True)
class StepImages:
    """Where a vision policy's steps find their images: `load(sha)` gives the bytes the harness sent (the shim's
    content-addressed store beside the capture log), preprocessed here with the policy's processor, the function
    that made the prompt's placeholder count, so the tower trains on the pixels the engine saw."""

    load: Callable[[str], bytes]
    processor: ip.ImageProcessorConfig
    side: int  # sqrt of the tower's learned position table (VisionConfig.side)

    def pixels(self, name: str) -> np.ndarray:
        """Patch rows of the image "SHA:TxHxW"; a grid other than the name's (another processor) is an error."""
        sha, _, grid = name.partition(":")
        return ip.patch_rows(self.load(sha), self.processor, grid, f"image {sha}")

    def fields(self, trees: list[GroupTree], packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The VISUAL row fields and the IMAGES fields of the step (each distinct image once); {} if none."""
        out = pack_images(trees, packed, merge=self.processor.merge_size)
        if out is None:
            return {}
        visual, names = out
        grids = [tuple(int(v) for v in n.rsplit(":", 1)[1].split("x")) for n in names]
        return visual | image_fields([self.pixels(n) for n in names], grids, merge=self.processor.merge_size,
                                     side=self.side)


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
    filtered_groups: int  # dropped by the group filter (all rewards equal)
    rejections: list[str]
    flat_tokens: int  # sum over calls of prompt + completion (what per-call training would process)
    tree_tokens: int
    min_version: int

    @property
    def empty(self) -> bool:
        return not self.trees


def _fresh(items: list[TreeItem], current_version: int, max_off_policy: int):
    fresh, stale, stale_r = [], 0, 0
    for it in items:
        v = it.min_version
        if v is not None and current_version - v > max_off_policy:
            stale, stale_r = stale + 1, stale_r + len({r.rollout_id for r in it.group.results})
            continue
        fresh.append(it)
    return fresh, stale, stale_r


def has_signal(tree: GroupTree) -> bool:
    """Whether the group's rollouts got different rewards (else every group advantage is zero)."""
    rewards = {c.reward for c in tree.calls}
    return len(rewards) > 1


def pack(trees: list[GroupTree], bcfg: BatchConfig) -> dict[str, np.ndarray]:
    """Advantages within (group, harness), per-node stats, best-fit packing into >= num_rows rows."""
    advs = rollout_advantages(trees, estimator=bcfg.estimator)
    stats = [node_stats(t, occ_adv=a, agg_name=bcfg.aggregation) for t, a in zip(trees, advs)]
    norms = [normalizer(t, bcfg.aggregation) for t in trees]
    # Start from the fewest rows the tokens could fill (small trees share rows: 16 SFT demonstrations of
    # ~250 tokens fit 8 rows of 512, where one row per tree padded 8 empty rows and doubled the step)
    # and grow by num_rows while best-fit packing does not fit them.
    need = sum(-(-t.num_nodes // bcfg.row_len) for t in trees)
    least = -(-sum(t.num_nodes for t in trees) // bcfg.row_len)
    rows = bcfg.num_rows * max(1, -(-least // bcfg.num_rows))
    while True:
        try:
            return pack_trees(trees, stats, norms, row_len=bcfg.row_len, num_rows=rows)
        except ValueError as e:
            if rows > 16 * need + bcfg.num_rows:
                names = [f"{t.group_id}/{t.harness}" for t in trees]
                raise ValueError(f"cannot pack groups {names}: {e}") from e
            rows += bcfg.num_rows


def build_batch(items: list[TreeItem], bcfg: BatchConfig, *, current_version: int, max_off_policy: int,
                loss_slots_k: int, filter_groups: bool | None = None, max_groups: int | None = None,
                images: StepImages | None = None) -> StepBatch:
    """The step's batch from its sealed groups (see the module docstring); `empty` if nothing is trainable.

    `filter_groups` overrides `bcfg.filter_groups` (SFT never filters); `max_groups` keeps only the first
    groups (dynamic sampling may finish with more informative groups than a step trains on: fixed shapes);
    `images`: a vision policy's image source (trees with images and none to read them from are an error)."""
    rids = set().union(*(it.rollout_ids for it in items)) if items else set()
    fresh, stale, stale_r = _fresh(items, current_version, max_off_policy)
    trees = [it.tree for it in fresh if it.tree is not None]
    filtered = 0
    if bcfg.filter_groups if filter_groups is None else filter_groups:
        kept = [t for t in trees if has_signal(t)]
        filtered, trees = len(trees) - len(kept), kept
    if max_groups is not None:
        trees = trees[:max_groups]
    base = dict(rollout_ids=rids, stale_groups=stale, stale_rollouts=stale_r, filtered_groups=filtered,
                rejections=[m for it in fresh for m in it.rejections])
    if not trees:
        return StepBatch(device={}, packed={}, trees=[], trained_ids=set(), flat_tokens=0, tree_tokens=0,
                         min_version=current_version, **base)
    packed = pack(trees, bcfg)
    idx, valid = loss_slots(packed["count"], loss_slots_k)
    device = {k: v for k, v in packed.items() if k not in HOST_ONLY}
    device.update(loss_idx=idx, loss_valid=valid)
    routed = pack_routed_experts(trees, packed)
    if routed is not None:
        device["expert_ids"] = routed
    if any(t.images for t in trees):
        if images is None:
            raise ValueError("the step's trees hold images but the learner reads none (a text policy's batches: "
                             "build trees without image_pad_id, or give build_batch the policy's StepImages)")
        device.update(images.fields(trees, packed))
    calls = [c for t in trees for c in t.calls]
    versions = [int(t.weight_version[t.weight_version >= 0].min()) for t in trees if (t.weight_version >= 0).any()]
    return StepBatch(device=device, packed=packed, trees=trees, trained_ids={c.rollout_id for c in calls},
                     flat_tokens=sum(c.prompt_len + c.completion_len for c in calls),
                     tree_tokens=sum(t.num_nodes for t in trees),
                     min_version=min(versions, default=current_version), **base)
