"""Per-process data on a multi-host run: each process reads its own share, the step sees one global batch.

Why: on a pod every process feeds only the devices it owns. Reading every group on every host and
discarding most of it would make data loading scale with the pod instead of the host, so each process
takes a disjoint, deterministic share of a step's groups (`process_share`) or of the grain source
(`shard_dataset`), packs its own rows, and `global_batch` stitches the per-process rows into one
`jax.Array` per key (`jax.make_array_from_process_local_data`) sharded over the batch mesh axes.

Processes pack different groups, so their row counts and loss-slot widths can differ; `global_batch`
agrees on the largest (one tiny all-gather of two integers) and pads with rows that carry no loss
(segment 0, count 0, norm 0, invalid loss slots), which leaves the tree objective unchanged: its
normaliser is the global `norm.sum()`. With one process everything here is the identity (plus that
padding), so the same code path runs on a laptop and on a pod.

Wiring into the RL loop (research/rl/): give `build_batch` `process_share(groups)` and `num_rows =
batch_rows // jax.process_count()`, then replace `batch.device` by `global_batch(batch.device,
learner.mesh, batch_axes(config))` before `Learner.train`; with grain, apply `shard_dataset` right after
the shuffle of a grain MapDataset (e.g. `pipeline.demo_stream`'s source).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from research.trees import batch as fields

T = TypeVar("T")


def _padding(key: str, rows: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """`rows` padding rows of `key`, filled as the batch field table says (research/trees/batch.py), so a
    padded row is indistinguishable from the packer's empty rows and a new field pads itself correctly."""
    pad = fields.BY_NAME[key].pad
    if pad == "arange":  # subtree_end: padding tokens see only themselves (segment 0 masks them anyway)
        return np.broadcast_to(np.arange(shape[0], dtype=dtype), (rows, *shape)).copy()
    return np.full((rows, *shape), pad, dtype)


def _index_count(index: int | None, count: int | None) -> tuple[int, int]:
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    if not 0 <= index < count:
        raise ValueError(f"process index {index} is not in [0, {count})")
    return index, count


def process_share(items: Sequence[T], *, index: int | None = None, count: int | None = None) -> list[T]:
    """This process's round-robin share of one step's items (e.g. rollout groups): disjoint across
    processes, together exactly `items`, sizes differing by at most one. Every process must pass the
    same `items` in the same order (the loop's step plan is deterministic)."""
    index, count = _index_count(index, count)
    return list(items[index::count])


def shard_dataset(ds, *, index: int | None = None, count: int | None = None):
    """This process's share of a grain `MapDataset` (apply after the shuffle, before repeat/batch).

    The tail that does not divide evenly is dropped so every process yields the same number of
    batches: a process that ran out one step early would leave the others waiting in a collective.
    """
    index, count = _index_count(index, count)
    usable = len(ds) // count * count
    if usable == 0:
        raise ValueError(f"dataset of {len(ds)} records cannot give each of {count} processes one")
    return ds[:usable][index::count]


def pad_batch(device: dict[str, np.ndarray], *, rows: int, slots: int | None = None) -> dict[str, np.ndarray]:
    """Pads a packed step batch to `rows` rows (and `slots` loss slots) with rows that carry no loss."""
    B = device["tokens"].shape[0]
    if rows < B:
        raise ValueError(f"cannot pad a batch of {B} rows down to {rows}")
    if unknown := sorted(set(device) - set(fields.BY_NAME)):  # no known padding: name them rather than guess
        raise KeyError(f"batch keys {unknown} are not fields of research/trees/batch.py")
    out = {}
    for key, x in device.items():
        if fields.BY_NAME[key].shape == "BK" and slots is not None and slots > x.shape[1]:
            # loss slots [B, K]: widened with the table's padding (invalid slots, index 0)
            x = np.concatenate([x, _padding(key, B, (slots - x.shape[1],), x.dtype)], axis=1)
        if rows > B:
            x = np.concatenate([x, _padding(key, rows - B, x.shape[1:], x.dtype)], axis=0)
        out[key] = x
    return out


def _row_blocks(sharding: NamedSharding, n_blocks: int) -> int:
    """How many of the `n_blocks` distinct row blocks this process's devices hold."""
    starts = {idx[0].start or 0 for idx in sharding.addressable_devices_indices_map((n_blocks, 1)).values()}
    return len(starts)


def global_batch(device: dict[str, np.ndarray], mesh: Mesh, batch_axes: Sequence[str]) -> dict[str, jax.Array]:
    """This process's packed rows -> one global array per key, rows sharded over `batch_axes`.

    Agrees with the other processes on rows per process and loss-slot width (maximum over processes,
    rows rounded up to split evenly over this process's row shards), pads, and assembles. The global row
    order is process 0's rows, then process 1's, ... (the mesh lists each process's devices together).
    """
    if not device:
        raise ValueError(f"process {jax.process_index()} has no packed rows this step; every process needs at "
                         "least one group (skip the step on all processes instead)")
    sharding = NamedSharding(mesh, PartitionSpec(tuple(batch_axes)))
    rows, slots = device["tokens"].shape[0], device["loss_idx"].shape[1] if "loss_idx" in device else 0
    if jax.process_count() > 1:
        agreed = multihost_utils.process_allgather(np.asarray([rows, slots], np.int64))
        rows, slots = (int(v) for v in np.max(agreed.reshape(-1, 2), axis=0))
    n_blocks = math.prod(mesh.shape[a] for a in batch_axes)
    local_blocks = _row_blocks(sharding, n_blocks)
    per_block = math.ceil(rows / local_blocks)
    padded = pad_batch(device, rows=per_block * local_blocks, slots=slots or None)
    total = per_block * n_blocks
    return {k: jax.make_array_from_process_local_data(sharding, v, (total, *v.shape[1:])) for k, v in padded.items()}


def local_rows(x: jax.Array) -> np.ndarray:
    """This process's rows of a row-sharded global array, in the order `global_batch` took them (host-side
    follow-ups such as PPO's GAE on the process's own trees). A fully addressable array is returned whole."""
    if x.is_fully_addressable:
        return np.asarray(x)
    shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
    seen, parts = set(), []
    for s in shards:
        start = s.index[0].start or 0
        if start not in seen:
            seen.add(start)
            parts.append(np.asarray(s.data))
    return np.concatenate(parts, axis=0)
