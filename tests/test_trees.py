"""Tree builder and packing: structure, mask contract, splitting, best fit."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from research.capture import CallRecord, RolloutResult
from research.trees import synthetic
from research.trees.builder import build_tree
from research.trees.packing import best_fit, pack_routed_experts, pack_trees
from research.trees.targets import node_stats, normalizer, rollout_advantages


def _call(rid, k, prompt, comp, lps=None, sess=None):
    return CallRecord(rollout_id=rid, session_id=sess or rid, group_id="g", harness="h", call_index=k,
                      prompt_ids=prompt, completion_ids=comp, logprobs=lps or [-0.5] * len(comp),
                      weight_version=3, finish_reason="stop", call_id=f"{rid}{k}")


def _res(rid, reward):
    return RolloutResult(rollout_id=rid, group_id="g", harness="h", status="ok", reward=reward)


def test_append_only_session_is_one_path_and_sessions_share_prefix():
    calls = [_call("a", 0, [1, 2], [3, 4]), _call("a", 1, [1, 2, 3, 4, 9], [5]),
             _call("b", 0, [1, 2], [7])]
    t = build_tree(calls, [_res("a", 1.0), _res("b", 0.0)])
    assert t.tokens.tolist() == [1, 2, 3, 4, 9, 5, 7]  # DFS: a's path, then b's branch after the prefix
    assert t.parent.tolist() == [-1, 0, 1, 2, 3, 4, 1]
    assert t.depth.tolist() == [0, 1, 2, 3, 4, 5, 2]
    assert t.subtree_end.tolist() == [6, 6, 5, 5, 5, 5, 6]
    assert t.is_generated().tolist() == [False, False, True, True, False, True, True]
    assert t.weight_version.tolist() == [-1, -1, 3, 3, -1, 3, 3]
    assert t.node_rollouts()[1] == {"a", "b"} and t.node_rollouts()[5] == {"a"}
    assert t.node_rewards()[0] == [0.0, 1.0]


def test_identical_generation_merges_only_with_same_behaviour_logprob():
    calls = [_call("a", 0, [1], [3, 4], [-0.5, -0.25]), _call("b", 0, [1], [3, 4], [-0.5, -0.25]),
             _call("c", 0, [1], [3, 4], [-0.5, -0.75])]
    t = build_tree(calls, [_res("a", 1.0), _res("b", 0.0), _res("c", 0.5)])
    # a and b share nodes 3, 4; c shares token 3 (same logprob) then needs its own copy of token 4
    assert t.tokens.tolist() == [1, 3, 4, 4]
    counts = np.bincount(t.occ_node, minlength=t.num_nodes).tolist()
    assert counts == [0, 3, 2, 1]
    t2 = build_tree(calls, [_res("a", 1.0), _res("b", 0.0), _res("c", 0.5)], merge_generations=False)
    assert np.bincount(t2.occ_node, minlength=t2.num_nodes).max() == 1


def test_missing_reward_names_call():
    with pytest.raises(ValueError, match="rollout 'a' call 0"):
        build_tree([_call("a", 0, [1], [2])], [])


def _visible_tokens(row, i):
    seg, end = row["segment_ids"], row["subtree_end"]
    js = [j for j in range(i + 1) if seg[i] == seg[j] != 0 and i <= end[j]]
    return row["tokens"][js].tolist(), row["positions"][js].tolist()


@pytest.mark.parametrize("row_len", [60, 90, 400])
def test_packing_respects_mask_contract_and_splits(row_len):
    rng = np.random.default_rng(row_len)
    trees = [build_tree(*synthetic.make_group(rng, group_id=f"g{i}", sessions=3, turns=3)) for i in range(3)]
    advs = rollout_advantages(trees, estimator="grpo")
    stats = [node_stats(t, occ_adv=a, agg_name="token_mean") for t, a in zip(trees, advs)]
    norms = [normalizer(t, "token_mean") for t in trees]
    packed = pack_trees(trees, stats, norms, row_len=row_len)
    B, T = packed["tokens"].shape
    seen = [np.zeros(t.num_nodes, int) for t in trees]
    for b in range(B):
        row = {k: v[b] for k, v in packed.items()}
        for i in np.nonzero(row["segment_ids"])[0]:
            t, n = trees[row["tree_id"][i]], row["node_id"][i]
            path = t.path(n)
            assert _visible_tokens(row, i) == (t.tokens[path].tolist(), t.depth[path].tolist())
            p = row["parent_index"][i]
            assert (p < 0) == (t.parent[n] < 0)
            if p >= 0:
                assert row["node_id"][p] == t.parent[n] and p < i
            seen[row["tree_id"][i]][n] += row["own"][i]
    assert all((s == 1).all() for s in seen)  # every node owned exactly once
    assert packed["norm"].sum() == pytest.approx(sum(norms))
    assert packed["weight"].sum() == pytest.approx(sum(s["weight"].sum() for s in stats))
    if row_len == 400:
        assert B == 1 or packed["segment_ids"].max() > 1  # several trees share a row


def test_best_fit():
    assert best_fit([5, 3, 4, 2, 6], 10) == [[4, 2], [0, 1, 3]]  # 6+4 and 5+3+2: both rows full
    assert best_fit([10, 1], 10) == [[0], [1]]


def test_root_path_longer_than_row_is_a_clear_error():
    t = build_tree([_call("a", 0, list(range(1, 30)), [3])], [_res("a", 1.0)])
    s = node_stats(t, occ_adv=np.ones(1), agg_name="token_mean")
    with pytest.raises(ValueError, match="root path of 17 tokens in one row, longer than row length 16"):
        pack_trees([t], [s], [1.0], row_len=16)


def test_routed_experts_follow_their_nodes():
    rng = np.random.default_rng(5)
    trees = [build_tree(*synthetic.make_group(rng, group_id=f"g{i}", sessions=2, turns=2, routed_shape=(3, 2)))
             for i in range(2)]
    stats = [node_stats(t, occ_adv=np.zeros(len(t.occ_node)), agg_name="token_mean") for t in trees]
    packed = pack_trees(trees, stats, [1.0, 1.0], row_len=90)
    routed = pack_routed_experts(trees, packed)
    assert routed.shape == packed["tokens"].shape + (3, 2)
    gen = np.zeros(packed["tokens"].shape, bool)
    for t, tree in enumerate(trees):
        sel = packed["tree_id"] == t
        gen[sel] = tree.is_generated()[packed["node_id"][sel]]
    assert (routed[gen] >= 0).all() and (routed[~gen] == -1).all()


_seq = st.lists(st.integers(1, 3), min_size=1, max_size=5)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), _seq, _seq, st.booleans()), min_size=1, max_size=6),
       st.integers(12, 40))
def test_property_calls_are_root_paths_and_packing_is_exact(spec, row_len):
    calls = [_call(f"r{r}", k, [9, *p], c, [-0.5 if same else -0.25 * (k + 1)] * len(c))
             for k, (r, p, c, same) in enumerate(spec)]
    rids = sorted({c.rollout_id for c in calls})
    t = build_tree(calls, [_res(r, float(i)) for i, r in enumerate(rids)])
    for info, c in zip(t.calls, sorted(calls, key=lambda c: (c.rollout_id, c.session_id, c.call_index))):
        assert t.tokens[t.path(info.end_node)].tolist() == [*c.prompt_ids, *c.completion_ids]
    ordered = sorted(calls, key=lambda c: (c.rollout_id, c.session_id, c.call_index))
    for n, ci, k in zip(t.occ_node, t.occ_call, t.occ_pos):
        call = ordered[ci]
        assert t.tokens[n] == call.completion_ids[k] and t.depth[n] == len(call.prompt_ids) + k
    s = node_stats(t, occ_adv=np.ones(len(t.occ_node)), agg_name="token_mean")
    packed = pack_trees([t], [s], [1.0], row_len=row_len)
    owned = np.zeros(t.num_nodes, int)
    for b in range(packed["tokens"].shape[0]):
        row = {k: v[b] for k, v in packed.items()}
        for i in np.nonzero(row["segment_ids"])[0]:
            path = t.path(row["node_id"][i])
            assert _visible_tokens(row, i) == (t.tokens[path].tolist(), t.depth[path].tolist())
            owned[row["node_id"][i]] += row["own"][i]
    assert (owned == 1).all() and packed["count"].sum() == len(t.occ_node)
