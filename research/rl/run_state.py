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
        self.meta: dict = {"rl_step": 0, "sft_step": 0, "started_at": time.time(), "rl_started": False,
                           "work_s": 0.0}
        self._since = time.monotonic()  # work_s counts from here on (this process's start or its restore)
        self.consumed: set[str] = set()
        self.data_state: dict = {}
        self._ledger = open(workdir / "ledger.jsonl", "a")

    @property
    def version(self) -> int:
        """Loop steps done (SFT + RL): the policy version, checkpoint step and metrics step."""
        return int(self.meta["sft_step"]) + int(self.meta["rl_step"])

    @property
    def work_s(self) -> float:
        """Seconds this run has worked: summed over its processes up to its last checkpoint, plus this process's
        time since its restore. Why not wall time since `started_at`: a resumed run, or a run continued in a copy
        of another's workdir (launch.sweep's RL and control runs branch from one SFT checkpoint), must not count
        the hours it sat idle or another branch ran; compared runs are compared at equal work minutes."""
        return float(self.meta.get("work_s", 0.0)) + time.monotonic() - self._since

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
        self._since = time.monotonic()
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
        meta = {**self.meta, "work_s": self.work_s, "consumed": sorted(self.consumed)}
        self.ckpt.save(self.version, state, data_state=self.data_state, meta=meta, force=force)

    def finish(self, state) -> None:
        if self.ckpt.latest_step() != self.version:
            self.save(state, force=True)
        self.ckpt.wait()

    def close(self) -> None:
        self.ckpt.close()
        self._ledger.close()
