"""Sealing capture logs into ArrayRecord shards and the grain streams (determinism, resume, bad input)."""

import dataclasses
import json

import numpy as np
import pytest

from research.capture import CaptureLog, RolloutResult
from research.data.pipeline import PipelineConfig, demo_stream, step_stream
from research.data.shards import ShardError, ShardSource, seal_log, shard_paths
from research.rl.batches import BatchConfig, build_batch
from research.trees import synthetic

CFG = PipelineConfig(vocab_size=64, seed=7)
BCFG = BatchConfig(row_len=160, num_rows=4)


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


def _ids(items):
    return [it.group.group_id for it in items]


def test_demo_stream_is_deterministic_reshuffles_per_epoch_and_filters(shards):
    def take(seed, n=7):
        it, kept, total = demo_stream(shards, dataclasses.replace(CFG, seed=seed), groups_per_step=2,
                                      keep=lambda rec: rec.group_id != "t5")
        assert (kept, total) == (6, 7)
        return [_ids(next(it)) for _ in range(n)]

    a, b, c = take(7), take(7), take(8)
    assert a == b and a != c
    flat = [g for batch in a for g in batch]
    assert "t5" not in flat and sorted(flat[:6]) == sorted({f"t{i}" for i in range(7)} - {"t5"})  # one epoch
    assert flat[:6] != flat[6:12]  # the next epoch has another order


def test_demo_stream_resumes_from_its_checkpointed_state(shards, tmp_path):
    import orbax.checkpoint as ocp

    it, _, _ = demo_stream(shards, CFG, groups_per_step=2)
    next(it)
    next(it)
    with ocp.CheckpointManager(tmp_path / "ck", item_names=("data",)) as mgr:  # as research/train/checkpoint
        mgr.save(2, args=ocp.args.Composite(data=ocp.args.JsonSave(it.get_state())))
        mgr.wait_until_finished()
        state = mgr.restore(2, args=ocp.args.Composite(data=ocp.args.JsonRestore()))["data"]
    expected = [_ids(next(it)) for _ in range(4)]
    it2, _, _ = demo_stream(shards, CFG, groups_per_step=2)
    it2.set_state(state)
    assert [_ids(next(it2)) for _ in range(4)] == expected


def test_step_stream_reads_each_keyed_seal_once_in_order_and_resumes(tmp_path):
    rng = np.random.default_rng(3)
    log = tmp_path / "log.jsonl"
    it = step_stream(tmp_path / "sh", CFG)
    with pytest.raises(StopIteration):
        next(it)  # nothing sealed yet
    for step, n in enumerate((2, 0, 3)):  # step 1 finished no group: an empty sealed batch, still one element
        with CaptureLog(log, fsync=False) as w:
            for g in range(n):
                calls, results = synthetic.make_group(rng, group_id=f"s{step}g{g}", sessions=2, turns=1)
                for rec in [*calls, *results]:
                    w.append(rec)
        seal_log(log, tmp_path / "sh", key=f"train{step:05d}")
        assert seal_log(log, tmp_path / "sh", key=f"train{step:05d}") == []  # a resumed step seals nothing twice
        sealed = next(it)
        assert sealed.key == f"train{step:05d}" and sorted(_ids(sealed.items)) == [f"s{step}g{g}" for g in range(n)]
        if step == 0:
            state = it.get_state()
    with pytest.raises(StopIteration):
        next(it)
    again = step_stream(tmp_path / "sh", CFG)
    again.set_state(state)
    assert [next(again).key for _ in range(2)] == ["train00001", "train00002"]


def test_seal_with_rollout_ids_takes_only_those_groups(tmp_path):
    _write_log(tmp_path / "log.jsonl", 4)
    from research.data.shards import finished_groups

    want = {r.rollout_id for g in finished_groups(tmp_path / "log.jsonl") if g.group_id in ("t1", "t3")
            for r in g.results}
    seal_log(tmp_path / "log.jsonl", tmp_path / "sh", key="k", rollout_ids=want)
    (sealed,) = list(step_stream(tmp_path / "sh", CFG))
    assert sorted(_ids(sealed.items)) == ["t1", "t3"]


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
                               status="infra_error", reward=None)  # a rollout without reward
    with CaptureLog(tmp_path / "log.jsonl", fsync=False) as log:
        for rec in [*calls, *results]:
            log.append(rec)
    seal_log(tmp_path / "log.jsonl", tmp_path / "sh", key="k")
    (sealed,) = list(step_stream(tmp_path / "sh", CFG))
    batch = build_batch(sealed.items, BCFG, current_version=0, max_off_policy=1, loss_slots_k=16)
    msgs = batch.rejections
    assert len(msgs) == 5  # 3 bad calls + the 2 calls of the unrewarded rollout
    assert any("call 0" in m and "logprobs for" in m and calls[0].rollout_id in m for m in msgs)
    assert any("outside vocab 64" in m and calls[2].rollout_id in m for m in msgs)
    assert any("empty completion" in m and calls[4].rollout_id in m for m in msgs)
    assert sum("rollout has no reward" in m and results[3].rollout_id in m for m in msgs) == 2
    good = [c for i, c in enumerate(calls) if i not in (0, 2, 4) and c.rollout_id != results[3].rollout_id]
    assert batch.packed["count"].sum() == sum(len(c.completion_ids) for c in good)  # nothing else dropped
    assert {"tokens", "weight", "norm", "loss_idx"} <= set(batch.device) and "own" not in batch.device


def test_batch_carries_trees_for_ppo_gae(shards):
    from research.trees.targets import ppo_stats_from_values

    it, _, _ = demo_stream(shards, CFG, groups_per_step=2)
    step = build_batch(next(it), BCFG, current_version=0, max_off_policy=1, loss_slots_k=16)
    trees, batch = step.trees, step.packed
    assert len(trees) == 2
    # zero values, gamma = lam = 1: every action's advantage (and return) is its rollout's reward
    out = ppo_stats_from_values(trees, batch, np.zeros(batch["tokens"].shape), gamma=1.0, lam=1.0,
                                aggregation="token_mean")
    total = sum(t.calls[c].reward for t in trees for c in t.occ_call)
    assert out["adv_pos"].sum() + out["adv_neg"].sum() == pytest.approx(total, rel=1e-5)
    assert out["ret_sum"].sum() == pytest.approx(total, rel=1e-5)
    np.testing.assert_array_equal(out["weight"], batch["weight"])


def test_policy_failures_are_trained_with_the_failure_reward_infra_errors_dropped(tmp_path):
    rng = np.random.default_rng(4)
    calls, results = synthetic.make_group(rng, group_id="g", sessions=3, turns=1)
    results[0] = dataclasses.replace(results[0], status="timeout", reward=None)
    results[1] = dataclasses.replace(results[1], status="infra_error", reward=None)
    with CaptureLog(tmp_path / "log.jsonl", fsync=False) as log:
        for rec in [*calls, *results]:
            log.append(rec)
    seal_log(tmp_path / "log.jsonl", tmp_path / "sh", key="k")
    (sealed,) = list(step_stream(tmp_path / "sh", dataclasses.replace(CFG, failure_reward=-0.5)))
    (tree,) = [it.tree for it in sealed.items]
    rewards = {c.rollout_id: c.reward for c in tree.calls}
    assert rewards[results[0].rollout_id] == -0.5  # the timed-out rollout is trained on, with the failure reward
    assert results[1].rollout_id not in rewards  # an infrastructure error says nothing about the policy
    assert any(results[1].rollout_id in m and "no reward" in m for m in sealed.items[0].rejections)
