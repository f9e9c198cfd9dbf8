"""Per-node credit on prefix trees (research/trees/credit.py, the `tree_grpo` estimator): exact numbers on a
hand-built forked tree, GRPO where nothing is shared after the prompt, node values against their definition."""

import math

import numpy as np
import pytest

from research import advantages as A
from research.capture import CallRecord, RolloutResult
from research.trees import credit, synthetic
from research.trees.builder import build_tree
from research.trees.targets import rollout_advantages


def _call(rid, k, prompt, comp, lps=None):
    return CallRecord(rollout_id=rid, session_id=rid, group_id="g", harness="h", call_index=k, prompt_ids=prompt,
                      completion_ids=comp, logprobs=lps or [-0.5] * len(comp), weight_version=1,
                      finish_reason="stop", call_id=f"{rid}/{k}")


def _res(rid, reward):
    return RolloutResult(rollout_id=rid, group_id="g", harness="h", status="ok", reward=reward)


def _forked_tree():
    """a: call 0 = [3, 4] after the prompt [1, 2], call 1 = [5] after tool output [9]; a.f1c0 replays a's call 0
    and samples [6] at call 1; b and c answer [7] and [8]. Rewards a 0, a.f1c0 0.5, b 1, c 0.5."""
    calls = [_call("a", 0, [1, 2], [3, 4], [-0.25, -0.5]), _call("a", 1, [1, 2, 3, 4, 9], [5]),
             _call("a.f1c0", 0, [1, 2], [3, 4], [-0.25, -0.5]), _call("a.f1c0", 1, [1, 2, 3, 4, 9], [6]),
             _call("b", 0, [1, 2], [7]), _call("c", 0, [1, 2], [8])]
    return build_tree(calls, [_res("a", 0.0), _res("a.f1c0", 0.5), _res("b", 1.0), _res("c", 0.5)])


def test_forked_tree_by_hand():
    t = _forked_tree()
    assert t.tokens.tolist() == [1, 2, 3, 4, 9, 5, 6, 7, 8]  # the replayed call 0 merged with its parent's
    values, counts = credit.node_values(t)
    assert counts.tolist() == [4, 4, 2, 2, 2, 1, 1, 1, 1]
    np.testing.assert_allclose(values, [0.5, 0.5, 0.25, 0.25, 0.25, 0.0, 0.5, 1.0, 0.5])
    # the shared call 0 hangs from the prompt (the group's mean); the two call-1 answers from the fork's state
    base = credit.segment_baselines(t, values, counts, root_value=0.5)
    np.testing.assert_allclose(base, [0.5, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.5, 0.5])
    adv = credit.occurrence_advantages(t, estimator="tree_grpo", eps=0.0)
    s = 1 / math.sqrt(2)  # (V - base) / std, std of (0, 0.5, 1, 0.5) = 1 / (2 sqrt 2)
    by_occ = {(t.calls[c].rollout_id, int(t.tokens[n])): float(a) for c, n, a in zip(t.occ_call, t.occ_node, adv)}
    assert by_occ == pytest.approx({("a", 3): -s, ("a", 4): -s, ("a", 5): -s, ("a.f1c0", 3): -s, ("a.f1c0", 4): -s,
                                    ("a.f1c0", 6): s, ("b", 7): 2 * s, ("c", 8): 0.0})
    # GRPO gives a's call 1 its rollout's -sqrt 2 and the child's 0: the fork's sibling gets no credit
    grpo = rollout_advantages([t], estimator="grpo")[0]
    assert {(t.calls[c].rollout_id, int(t.tokens[n])): round(float(a), 4) for c, n, a in
            zip(t.occ_call, t.occ_node, grpo) if t.tokens[n] in (5, 6)} == {("a", 5): -1.4142, ("a.f1c0", 6): 0.0}
    # on the nodes of a segment leaving the root (the shared call 0) both estimators put the same sum
    on3 = t.occ_node == 2
    assert adv[on3].sum() == pytest.approx(grpo[on3].sum(), abs=1e-5)


def test_tree_grpo_is_grpo_when_nothing_is_shared_after_the_prompt():
    rng = np.random.default_rng(3)
    trees = [build_tree(*synthetic.make_group(rng, group_id=f"g{i}", sessions=5, turns=3, p_duplicate=0.0,
                                              vocab=1000)) for i in range(3)]
    for t in trees:  # a node is on every rollout's path (the task prefix) or on one rollout's only
        assert {len(rs) for rs in t.node_rollouts()} == {1, 5}
    for tree_adv, grpo_adv in zip(rollout_advantages(trees, estimator="tree_grpo"),
                                  rollout_advantages(trees, estimator="grpo")):
        np.testing.assert_allclose(tree_adv, grpo_adv, rtol=1e-5, atol=1e-6)


def test_node_values_and_baselines_match_their_definitions():
    rng = np.random.default_rng(7)
    calls, results = synthetic.fork_group(rng, *synthetic.make_group(rng, sessions=4, turns=4), forks=3, children=2)
    t = build_tree(calls, results)
    values, counts = credit.node_values(t)
    rewards = t.node_rewards()
    np.testing.assert_allclose(values, [np.mean(r) for r in rewards])
    assert counts.tolist() == [len(r) for r in rewards]
    mean = np.mean([r.reward for r in results])
    base = credit.segment_baselines(t, values, counts, root_value=mean)
    for n in range(t.num_nodes):  # walk up to the first ancestor fewer rollouts pass through... or the root
        p = int(t.parent[n])
        while p >= 0 and counts[p] == counts[n]:
            p = int(t.parent[p])
        assert base[n] == pytest.approx(values[p] if p >= 0 else mean)
    assert (counts[t.occ_node] < len(results)).all() and (values != values[0]).any()


def test_tree_estimator_needs_each_group_in_one_tree():
    calls = [_call("a", 0, [1, 2], [3]), _call("b", 0, [1, 2], [4])]
    res = [_res("a", 1.0), _res("b", 0.0)]
    flat = [build_tree([c], res) for c in calls]
    with pytest.raises(ValueError, match="needs each group in one tree; group 'g' harness 'h' is split"):
        rollout_advantages(flat, estimator="tree_grpo")
    with pytest.raises(ValueError, match="unknown tree estimator 'nope'"):
        A.tree_advantages("nope", node_value_N=np.zeros(1), base_value_N=np.zeros(1), group_std=1.0)


def test_tree_grpo_by_hand_on_arrays():
    adv = A.tree_advantages("tree_grpo", node_value_N=np.array([0.5, 0.25, 1.0]), base_value_N=np.array(
        [0.5, 0.5, 0.25]), group_std=0.25, eps=0.0)
    np.testing.assert_allclose(np.asarray(adv), [0.0, -1.0, 3.0])
    assert "tree_grpo" in A.ESTIMATORS and set(A.GROUP_ESTIMATORS) < set(A.ESTIMATORS)


def test_the_viewer_shows_tree_grpo_credit():
    from harness_env.inspect import tree_view

    calls = [_call("a", 0, [1, 2], [3, 4], [-0.25, -0.5]), _call("a", 1, [1, 2, 3, 4, 9], [5]),
             _call("a.f1c0", 0, [1, 2], [3, 4], [-0.25, -0.5]), _call("a.f1c0", 1, [1, 2, 3, 4, 9], [6]),
             _call("b", 0, [1, 2], [7]), _call("c", 0, [1, 2], [8])]
    view = tree_view.build_view(calls, [_res("a", 0.0), _res("a.f1c0", 0.5), _res("b", 1.0), _res("c", 0.5)],
                                estimator="tree_grpo")
    assert view.estimator == "tree_grpo"
    s = 1 / math.sqrt(2)
    np.testing.assert_allclose(view.node_adv, [np.nan, np.nan, -s, -s, np.nan, -s, s, 2 * s, 0.0], atol=1e-5)
