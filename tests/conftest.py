"""Test-wide environment: 8 fake CPU devices for sharding tests, fp32 matmuls for parity."""
import collections
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import pathlib

# No persistent XLA compilation cache by default. XLA:CPU's `deserialize_executable` segfaulted in a cache read
# once, in the JAX engine's thread 97% into a CI run (stop 35; deserializing on CPU is known to crash:
# jax-ml/jax#28908). The crash took its xdist worker down, and --dist=loadfile then hung the run at its end
# (pytest-xdist#784, #1378) until CI's 90 minutes ran out. The suite compiles more without it (README's test line
# has its time). HRL_TEST_COMPILE_CACHE=1 turns the shared cache back on for local reruns: the key is the
# program's HLO, flags and jax version, so a hit is the same executable.
if os.environ.get("HRL_TEST_COMPILE_CACHE") == "1":
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(os.environ.get("XDG_CACHE_HOME", "~/.cache"))
                                                           .expanduser() / "harness-rl" / "jax-tests"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest

# CI (.ci/run) sets HARNESS_RL_STRICT=1: there every dependency is installed and started, so a test that
# skips (no bwrap, no dockerd, no strace, no harness CLI) is a broken environment, reported as a failure.
STRICT = os.environ.get("HARNESS_RL_STRICT") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if STRICT and rep.skipped and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"skipped under HARNESS_RL_STRICT=1 (a missing dependency is a failure here): {reason}"

# Files whose one test runs longer than a quarter of the suite: handed out first, so the suite's wall time is not
# that test's time added after everything else (xdist's own order, largest file first, put it last: 43 min vs ~27).
LONGEST_FIRST = ("test_learning_through_cli.py",)


def pytest_collection_modifyitems(config, items):
    """Files in LONGEST_FIRST, then the others largest-first by test count (the order xdist's loadfile would pick;
    setup.cfg passes `--no-loadscope-reorder`, so this order is the one it hands out); within a file, slow tests
    first (stable otherwise)."""
    files = [pathlib.Path(str(item.fspath)).name for item in items]
    count = collections.Counter(files)
    key = {id(item): (name not in LONGEST_FIRST, -count[name], name, item.get_closest_marker("slow") is None)
           for item, name in zip(items, files)}
    items.sort(key=lambda item: key[id(item)])


REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir() -> pathlib.Path:
    """The real Qwen3 tokenizer files, packaged with research/models (works offline, never skips)."""
    from research.models.tokenizer import PACKAGED_QWEN3

    return PACKAGED_QWEN3


@pytest.fixture
def step_batch():
    """make(cfg, seed=0) -> a packed RL StepBatch of two synthetic groups (the loop's real builder/packer path,
    no harness): for Learner-level tests of the RL loop."""
    import dataclasses

    import numpy as np

    from research.data.pipeline import to_tree
    from research.data.shards import GroupRecord
    from research.rl import batches as B
    from research.rl.config import RunConfig
    from research.trees import synthetic

    def make(cfg, seed: int = 0, *, flat_groups: tuple[int, ...] = (), filter_groups: bool | None = None
             ) -> B.StepBatch:
        """`flat_groups`: these groups get equal rewards (no signal); `filter_groups` overrides the config's."""
        rng = np.random.default_rng(seed)
        run = RunConfig.of(cfg)
        pcfg, bcfg = run.pipeline(), run.batching()
        items = []
        for g in range(2):
            calls, results = synthetic.make_group(rng, group_id=f"t{g}", harness="reference", sessions=3, turns=2,
                                                  vocab=cfg.model.vocab_size, prefix_len=24, p_trunc=0.0)
            if g in flat_groups:
                results = [dataclasses.replace(r, reward=1.0) for r in results]
            rec = GroupRecord(group_id=f"t{g}", harness="reference", calls=calls, results=results)
            items.append(to_tree(rec, pcfg))
        batch = B.build_batch(items, bcfg, current_version=0, max_off_policy=1 << 30,
                              loss_slots_k=cfg.train.loss_slots, filter_groups=filter_groups)
        assert batch.trees and not batch.rejections
        return batch

    return make


PARITY_CHECK = """import json, os
p = json.loads(os.environ["OPENCLAW_REWARD_PAYLOAD"])
m = p["final_message"]
print(1.0 if m and len(m) % 2 == 0 else 0.0)  # saying nothing pays nothing (task validation checks that)
"""


@pytest.fixture
def parity_tasks():
    """make(root, n) -> a ClawGym task dir of n chat-graded tasks rewarding an even-length final message: a
    random tiny policy gets rewards that vary within a group, so RL-loop tests have a GRPO signal."""
    import json

    def make(root: pathlib.Path, n: int = 4) -> pathlib.Path:
        for i in range(n):
            d = root / f"parity{i}"
            (d / "reward").mkdir(parents=True, exist_ok=True)
            (d / "data_entry.json").write_text(json.dumps({
                "task_id": f"parity{i}", "user_query": f"Say something {i}.",
                "metadata": {"category": "chat", "chat_graded": True}}))
            (d / "reward" / "check.py").write_text(PARITY_CHECK)
            (d / "reward" / "reward.sh").write_text('#!/bin/bash\nexec python3 "$(dirname "$0")/check.py"\n')
        return root

    return make
