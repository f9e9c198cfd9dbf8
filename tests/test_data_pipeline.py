"""Sealing capture logs into ArrayRecord shards and the grain pipeline (determinism, resume, bad input)."""

import dataclasses
import json

import numpy as np
import pytest

from research.capture import CaptureLog, RolloutResult
from research.data.pipeline import PipelineConfig, device_batch, make_dataset
from research.data.shards import ShardError, ShardSource, seal_log, shard_paths
from research.trees import synthetic

CFG = PipelineConfig(row_len=160, num_rows=4, groups_per_batch=2, vocab_size=64, seed=7)


def _write_log(path, n_groups, seed=0, hold_back=()):
    rng = np.random.default_rng(seed)
    held = []
    with CaptureLog(path, fsync=False) as log:
        for g in range(n_groups):
            calls, results = synthetic.make_group(rng, group_id=f"t{g}", sessions=3, turns=2)
            for c in calls:
                log.append(c)
            for r in results:
                if f"t{g}" in hold_back:
                    held.append(r)
                else:
                    log.append(r)
    return held


def _batches(ds):
    return [{k: v for k, v in b.items() if v.dtype != object} for b in ds]


def test_seal_is_idempotent_and_only_finished_groups(tmp_path):
    held = _write_log(tmp_path / "log.jsonl", 5, hold_back=("t3",))
    first = seal_log(tmp_path / "log.jsonl", tmp_path / "sh", groups_per_shard=2)
    assert len(first) == 2 and len(ShardSource(first)) == 4  # t3 has no results yet
    assert seal_log(tmp_path / "log.jsonl", tmp_path / "sh") == []
    with CaptureLog(tmp_path / "log.jsonl", fsync=False) as log:
        for r in held:
            log.append(r)
    again = seal_log(tmp_path / "log.jsonl", tmp_path / "sh")
    assert len(again) == 1 and len(ShardSource(shard_paths(tmp_path / "sh"))) == 5
    keys = json.loads((tmp_path / "sh" / "manifest.json").read_text())["groups"]
    assert sorted(keys) == sorted(set(keys)) and len(keys) == 5
    assert not list((tmp_path / "sh").glob("*.tmp"))


@pytest.fixture
def shards(tmp_path):
    _write_log(tmp_path / "log.jsonl", 7)
    seal_log(tmp_path / "log.jsonl", tmp_path / "sh", groups_per_shard=3)
    return shard_paths(tmp_path / "sh")


def test_deterministic_given_seed(shards):
    a, b = _batches(make_dataset(shards, CFG)), _batches(make_dataset(shards, CFG))
    c = _batches(make_dataset(shards, dataclasses.replace(CFG, seed=8)))
    assert len(a) == 4 and int(sum(x["num_groups"] for x in a)) == 7
    for x, y in zip(a, b):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    assert any(not np.array_equal(x["tokens"], y["tokens"]) for x, y in zip(a, c))


def test_checkpoint_resume_gives_the_same_next_batches(shards, tmp_path):
    import orbax.checkpoint as ocp

    cfg = dataclasses.replace(CFG, num_epochs=None)
    it = iter(make_dataset(shards, cfg))
    next(it)
    next(it)
    with ocp.CheckpointManager(tmp_path / "ck", item_names=("data",)) as mgr:  # as research/train/checkpoint
        mgr.save(2, args=ocp.args.Composite(data=ocp.args.JsonSave(it.get_state())))
        mgr.wait_until_finished()
        state = mgr.restore(2, args=ocp.args.Composite(data=ocp.args.JsonRestore()))["data"]
    expected = [next(it) for _ in range(3)]
    it2 = iter(make_dataset(shards, cfg))
    it2.set_state(state)
    for e in expected:
        got = next(it2)
        for k in ("tokens", "subtree_end", "adv_pos", "adv_neg", "weight"):
            np.testing.assert_array_equal(got[k], e[k])


def test_corrupt_shard_is_named(shards, tmp_path):
    bad = tmp_path / "bad.array_record"
    bad.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(ShardError, match="corrupt shard .*bad.array_record"):
        ShardSource([*shards, str(bad)])
    data = open(shards[0], "rb").read()
    flipped = tmp_path / "flipped.array_record"
    flipped.write_bytes(data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:])
    with pytest.raises(ShardError, match="corrupt shard .*flipped.array_record"):
        list(ShardSource([str(flipped)])[i] for i in range(3))


def test_bad_records_are_dropped_named_and_counted(tmp_path):
    rng = np.random.default_rng(1)
    calls, results = synthetic.make_group(rng, group_id="g", sessions=4, turns=2)
    calls[0].logprobs = calls[0].logprobs[:-1]  # logprob count != completion length
    calls[2].completion_ids = [*calls[2].completion_ids[:-1], 999]  # token id >= vocab
    calls[4].completion_ids, calls[4].logprobs = [], []  # empty completion
    results[3] = RolloutResult(rollout_id=results[3].rollout_id, group_id="g", harness=results[3].harness,
                               status="timeout", reward=None)  # a rollout without reward
    with CaptureLog(tmp_path / "log.jsonl", fsync=False) as log:
        for rec in [*calls, *results]:
            log.append(rec)
    seal_log(tmp_path / "log.jsonl", tmp_path / "sh")
    (batch,) = list(make_dataset(shard_paths(tmp_path / "sh"), dataclasses.replace(CFG, groups_per_batch=4)))
    msgs = list(batch["rejections"])
    assert batch["num_rejected"] == len(msgs) == 5  # 3 bad calls + the 2 calls of the unrewarded rollout
    assert any("call 0" in m and "logprobs for" in m and calls[0].rollout_id in m for m in msgs)
    assert any("outside vocab 64" in m and calls[2].rollout_id in m for m in msgs)
    assert any("empty completion" in m and calls[4].rollout_id in m for m in msgs)
    assert sum("rollout has no reward" in m and results[3].rollout_id in m for m in msgs) == 2
    good = [c for i, c in enumerate(calls) if i not in (0, 2, 4) and c.rollout_id != results[3].rollout_id]
    assert batch["count"].sum() == sum(len(c.completion_ids) for c in good)  # nothing else dropped
    assert set(device_batch(batch)) >= {"tokens", "weight", "norm"} and "rejections" not in device_batch(batch)


def test_batch_carries_trees_for_ppo_gae(shards):
    from research.trees.objective import ppo_stats_from_values

    batch = next(iter(make_dataset(shards, CFG)))
    trees = list(batch["trees"])
    assert len(trees) == batch["num_groups"] == 2 and "trees" not in device_batch(batch)
    # zero values, gamma = lam = 1: every action's advantage (and return) is its rollout's reward
    out = ppo_stats_from_values(trees, batch, np.zeros(batch["tokens"].shape), gamma=1.0, lam=1.0,
                                aggregation="token_mean")
    total = sum(t.calls[c].reward for t in trees for c in t.occ_call)
    assert out["adv_pos"].sum() + out["adv_neg"].sum() == pytest.approx(total, rel=1e-5)
    assert out["ret_sum"].sum() == pytest.approx(total, rel=1e-5)
    np.testing.assert_array_equal(out["weight"], batch["weight"])
