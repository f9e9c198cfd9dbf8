"""Orbax checkpointing of the whole training state plus the host-side state that must resume with it.

One checkpoint step directory holds three items (one `ocp.args.Composite`):
  state  the TrainState pytree (params, optimizer state, step, rng, critic + its optimizer state),
         saved with `StandardSave` (tensorstore/OCDBT, each host writes its own shards);
  data   the data-iterator position (grain iterator state) as JSON; on a multi-process run each process
         has its own iterator, so the positions of all processes are gathered and stored together
         (orbax writes JSON items from the primary process only) and each process gets its own back;
  meta   any other JSON the loop needs to resume exactly (e.g. the ids of consumed rollouts).

Why restore takes an *abstract* state: the target shardings come from the caller's mesh, so a
checkpoint written on (data=2, fsdp=2, tensor=2) restores onto (fsdp=4, tensor=2) or one device
unchanged — orbax reads each target shard's slice directly, nothing is gathered on one host.

Saving is asynchronous: `save` returns once device arrays are copied to host memory (so donating the
state to the next train step is safe) and the files are written in the background; orbax finalises a
step by an atomic rename, so a `kill -9` leaves either the complete step or none. Call `wait()` before
relying on a step being on disk, and `close()` at the end.
"""

from __future__ import annotations

import base64
import json
import logging
import pathlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from research.train.state import TrainState

_log = logging.getLogger(__name__)
_BYTES_KEY = "__bytes_b64__"
PER_PROCESS_KEY = "__per_process__"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be restored; the message names the directory and step."""


def _to_json(obj: Any) -> Any:
    """JSON items must be dicts; grain's iterator state may be bytes, so wrap what is not a dict."""
    if isinstance(obj, bytes | bytearray):
        return {_BYTES_KEY: base64.b64encode(bytes(obj)).decode("ascii")}
    if isinstance(obj, dict):
        return obj
    return {"__value__": obj}


def _from_json(obj: Any) -> Any:
    if isinstance(obj, dict) and set(obj) == {_BYTES_KEY}:
        return base64.b64decode(obj[_BYTES_KEY])
    if isinstance(obj, dict) and set(obj) == {"__value__"}:
        return obj["__value__"]
    return obj


def _gather_per_process(obj: Any) -> Any:
    """Every process's JSON item -> one item: the common value when all are equal, else
    `{PER_PROCESS_KEY: [item of process 0, item of process 1, ...]}` (a collective: all processes call it)."""
    if jax.process_count() == 1:
        return obj
    raw = np.frombuffer(json.dumps(obj, sort_keys=True).encode(), np.uint8)
    lengths = multihost_utils.process_allgather(np.asarray([raw.size], np.int64)).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[: raw.size] = raw
    every = multihost_utils.process_allgather(padded).reshape(len(lengths), -1)
    items = [json.loads(bytes(row[:n]).decode()) for row, n in zip(every, lengths)]
    return items[0] if all(x == items[0] for x in items) else {PER_PROCESS_KEY: items}


def _own_item(obj: Any) -> Any:
    """This process's entry of a gathered item; with another process count than at save time the whole
    `{PER_PROCESS_KEY: [...]}` is returned: how N iterator positions map onto M is the data pipeline's call."""
    if isinstance(obj, dict) and set(obj) == {PER_PROCESS_KEY}:
        items = obj[PER_PROCESS_KEY]
        if len(items) == jax.process_count():
            return items[jax.process_index()]
        _log.warning("data state was saved by %d processes, restoring on %d: returning all of them",
                     len(items), jax.process_count())
    return obj


class Checkpointer:
    """Save every `save_every` steps, keep the newest `keep`, restore the latest (or a given) step."""

    def __init__(self, directory: str | pathlib.Path, *, save_every: int = 1, keep: int | None = 3,
                 async_save: bool = True):
        if save_every < 1:
            raise ValueError(f"save_every={save_every} must be >= 1")
        self.directory = pathlib.Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=save_every,
            max_to_keep=keep,
            create=True,
            cleanup_tmp_directories=True,  # a save killed mid-write leaves a tmp dir: removed on restart
            enable_async_checkpointing=async_save,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data", "meta"))

    def save(self, step: int, state: TrainState, *, data_state: Any = None, meta: dict | None = None,
             force: bool = False) -> bool:
        """Saves if `step` is on the save interval (or `force`); returns whether a save started. On a
        multi-process run every process calls it (a collective), each with its own `data_state`."""
        if not force and not self._manager.should_save(int(step)):
            return False  # (before the gather below: no collective on steps that are not saved)
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(_gather_per_process(_to_json(data_state))),
            meta=ocp.args.JsonSave(_to_json(meta or {})),
        )
        saved = self._manager.save(int(step), args=args, force=force)
        if saved:
            _log.debug("checkpoint step %d -> %s", step, self.directory)
        return saved

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def restore(self, abstract_state: TrainState, step: int | None = None) -> tuple[TrainState, Any, dict]:
        """Returns (state, data_state, meta) of `step` (default: latest) placed on `abstract_state`'s
        shardings. `abstract_state` is e.g. `state.abstract_train_state(...)` built on the new mesh."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        if step not in self._manager.all_steps():
            raise CheckpointError(f"no checkpoint step {step} in {self.directory}; have {self.all_steps()}")
        _check_abstract(abstract_state)
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore(),
            meta=ocp.args.JsonRestore(),
        )
        try:
            out = self._manager.restore(step, args=args)
        except (ValueError, KeyError, FileNotFoundError) as e:
            raise CheckpointError(f"restoring step {step} from {self.directory}: {e}") from e
        return out["state"], _from_json(_own_item(out["data"])), _from_json(out["meta"]) or {}

    def wait(self) -> None:
        """Blocks until background writes are finished (then the step is durable)."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_abstract(abstract_state: TrainState) -> None:
    """Every leaf of the restore target needs a sharding, else orbax would guess a placement."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_state):
        if getattr(leaf, "sharding", None) is None:
            raise CheckpointError(
                f"restore target leaf {jax.tree_util.keystr(path)} has no sharding; build it with "
                "state.abstract_train_state(...) on the target mesh"
            )
