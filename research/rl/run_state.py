"""The loop's durable bookkeeping: versions, consumed rollouts, data-iterator states, ledger, checkpoints.

Why one object: everything a resumed run needs must move together with the TrainState in one orbax
checkpoint step — the phase counters (`sft_step`, `rl_step`; their sum is the policy *version*, the
number the engine tags its generations with), the ids of every consumed rollout, and the states of the
grain iterators (research/data/pipeline.py). After `kill -9`, the same command restores the latest step,
replans the same rollouts (the runner skips finished ones) and reads the next sealed batch: no rollout is
lost or trained twice. `ledger.jsonl` records which rollouts each step trained on or dropped.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import time

from research.train.checkpoint import Checkpointer

log = logging.getLogger(__name__)


class RunState:
    def __init__(self, workdir: pathlib.Path, *, save_every: int, keep: int):
        self.workdir = workdir
        self.ckpt = Checkpointer(workdir / "checkpoints", save_every=save_every, keep=keep)
        self.meta: dict = {"rl_step": 0, "sft_step": 0, "started_at": time.time(), "rl_started": False}
        self.consumed: set[str] = set()
        self.data_state: dict = {}
        self._ledger = open(workdir / "ledger.jsonl", "a")

    @property
    def version(self) -> int:
        """Loop steps done (SFT + RL): the policy version, checkpoint step and metrics step."""
        return int(self.meta["sft_step"]) + int(self.meta["rl_step"])

    @property
    def rl_step(self) -> int:
        return int(self.meta["rl_step"])

    @property
    def sft_step(self) -> int:
        return int(self.meta["sft_step"])

    def restore(self, abstract_state):
        """The latest checkpoint's TrainState (None on a fresh run); bookkeeping restored alongside."""
        if self.ckpt.latest_step() is None:
            return None
        state, data, meta = self.ckpt.restore(abstract_state)
        self.meta.update({k: v for k, v in meta.items() if k != "consumed"})
        self.consumed = set(meta.get("consumed", []))
        self.data_state = data if isinstance(data, dict) else {}
        log.info("resumed at version %d (rl %d, sft %d)", self.version, self.rl_step, self.sft_step)
        return state

    def commit(self, phase: str, state, *, trained: set[str] = frozenset(), dropped: set[str] = frozenset(),
               data_state: dict | None = None, force: bool = False) -> None:
        """Ledger line + checkpoint of the step just finished (the consumed set moves with the state)."""
        self.consumed |= set(trained) | set(dropped)
        if data_state is not None:
            self.data_state = data_state
        self._ledger.write(json.dumps({"step": self.version, "phase": phase, "trained": sorted(trained),
                                       "dropped": sorted(dropped)}) + "\n")
        self._ledger.flush()
        os.fsync(self._ledger.fileno())
        self.save(state, force=force)

    def save(self, state, *, force: bool = False) -> None:
        meta = {**self.meta, "consumed": sorted(self.consumed)}
        self.ckpt.save(self.version, state, data_state=self.data_state, meta=meta, force=force)

    def finish(self, state) -> None:
        if self.ckpt.latest_step() != self.version:
            self.save(state, force=True)
        self.ckpt.wait()

    def close(self) -> None:
        self.ckpt.close()
        self._ledger.close()
