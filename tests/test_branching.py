"""Forking by replay through the real rollout path (RolloutService: shim + runner + bwrap, the reference agent, a
scripted engine on a make_file task): a failed parent's child replays its prefix token for token without the engine,
then samples its own call; a nondeterministic tool output ends a child as `replay_mismatch`. Plus the pieces:
replay plans, the failed-tool-call reader on each CLI's format, the children's plan, metrics, config checks."""

import collections
import dataclasses
import pathlib
import random

import numpy as np
import pytest
from branch_kit import run_with_children, stepwise

from harness_env.rl import branching
from harness_env.rl.rollouts import StepSpec
from harness_env.tasks import family
from research.capture import CallRecord, RolloutResult, to_json_bytes
from research.data.pipeline import clean_group
from research.data.shards import GroupRecord
from research.rl.config import RunConfig, RunConfigError
from research.shim.fork import ReplayPlan, first_difference
from research.trees.builder import build_tree
from research.trees.targets import rollout_advantages


def _rec(k, prompt, comp, *, status="ok", rid="p", parent=None, match=None):
    return CallRecord(rollout_id=rid, session_id=rid, group_id="g", harness="reference", call_index=k,
                      prompt_ids=prompt, completion_ids=comp, logprobs=[-0.5] * len(comp), weight_version=2,
                      finish_reason="stop", call_id=f"{rid}{k}", parent_call_id=parent, prefix_match_len=match,
                      status=status)


def test_replay_plan_takes_the_ok_prefix_of_one_session():
    recs = [_rec(1, [1, 2, 3], [4]), _rec(0, [1], [2]), _rec(2, [1, 2, 3, 4, 5], [6])]
    plan = ReplayPlan.of(recs, 2)
    assert [r.call_index for r in plan.records] == [0, 1] and plan.fork_prompt == (1, 2, 3, 4, 5)
    assert ReplayPlan.of(recs, 3).fork_prompt is None and ReplayPlan.of(recs, 0).records == ()
    with pytest.raises(ValueError, match=r"cannot replay rollout 'p' call 1 .*status 'aborted'"):
        ReplayPlan.of([recs[1], dataclasses.replace(recs[0], status="aborted"), recs[2]], 2)
    with pytest.raises(ValueError, match="fork at call 4: the rollout has 3 calls"):
        ReplayPlan.of(recs, 4)


def test_replay_state_matches_by_prompt_and_fails_for_good():
    from research.shim.fork import ReplayMismatch, ReplayState

    a, b = _rec(0, [1, 2], [3]), _rec(1, [1, 2, 3, 4], [5, 6])
    decode = lambda ids: " ".join(map(str, ids))  # noqa: E731
    st = ReplayState(ReplayPlan("p", (a, b), fork_prompt=(1, 2, 3, 4, 5, 6, 7)), decode)
    assert st.take([1, 2, 3, 4], 0, 16) is b and st.take((1, 2), 1, 16) is a  # concurrent calls: either order
    assert st.take([1, 2, 3, 4, 5, 6, 8], 2, 16) is None  # the fork call is sampled; its prompt is compared
    assert st.fork["prompt_match"] is False and st.fork["difference"]["at"] == 6
    assert st.take([9], 3, 16) is None and st.report()["replayed"] == 2 and st.report()["replayed_tokens"] == 3
    st = ReplayState(ReplayPlan("p", (a, b)), decode)
    with pytest.raises(ReplayMismatch, match=r"call 0's prompt differs from the parent's call 0: at token 1 of 2 "
                                             r"\(got 3\), after '1' expected '2', got '7 8'"):
        st.take([1, 7, 8], 0, 16)
    with pytest.raises(ReplayMismatch, match="replay failed earlier in this session"):
        st.take([1, 2], 1, 16)
    short = ReplayState(ReplayPlan("p", (b,)), decode)
    with pytest.raises(ReplayMismatch, match="call 0 may generate 1 tokens, the parent's call 1 generated 2"):
        short.take([1, 2, 3, 4], 0, 1)
    ended = ReplayState(ReplayPlan("p", (a, b), fork_prompt=(9,)), decode)
    ended.take([1, 2], 0, 16)
    ended.close()
    assert ended.report()["mismatch"]["why"] == "the harness ended after 1 of 2 replayed calls"


@pytest.mark.parametrize(("result", "failed"), [
    ("exit code 2\nls: cannot access 'x': No such file or directory", True),  # reference
    ("exit code 0\nnotes.txt", False),
    ("Exit code 1\ncat: nothere.txt: No such file or directory", True),  # Claude Code's Bash
    ("(Bash completed with no output)", False),
    ("Chunk ID: 34b928\nWall time: 0.0000 seconds\nProcess exited with code 1\nOriginal token count: 11\nOutput:\n"
     "cat: nothere.txt: No such file or directory\n", True),  # Codex's exec_command
    ("Chunk ID: 044c18\nWall time: 0.0000 seconds\nProcess exited with code 0\nOriginal token count: 0\nOutput:\n",
     False),
    ("exit code 0\n" + "\n" * 5 + "exit code 1", False),  # a command's own output further down is not its status
])
def test_failed_tool_calls_reads_each_clis_tool_result(result, failed, qwen3_tokenizer_dir):
    from research.models.tokenizer import load_tokenizer

    tok = load_tokenizer(qwen3_tokenizer_dir)
    head = tok.encode("<|im_start|>user\nDo it.<|im_end|>\n<|im_start|>assistant\n")
    comp = tok.encode('<tool_call>\n{"name": "bash", "arguments": {"command": "x"}}\n</tool_call><|im_end|>')
    tail = tok.encode(f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n"
                      "<|im_start|>assistant\n")
    recs = [_rec(0, head, comp), _rec(1, head + comp + tail, tok.encode("Done."), parent="p0",
                                      match=len(head) + len(comp))]
    assert branching.failed_tool_calls(recs, tok.decode) == ([0] if failed else [])


def _spec(i):
    return StepSpec(pathlib.Path(f"/t/task{i}"), "reference", i, step=5)


def test_plan_children_which_at_children_and_cap():
    decode = lambda ids: "".join(chr(96 + i) for i in ids)  # noqa: E731 - ids 1.. as letters
    parents = [_spec(i) for i in range(4)]
    calls = {s.rollout_id: [_rec(k, list(range(1, 3 + 2 * k)), [20 + k], rid=s.rollout_id) for k in range(3)]
             for s in parents}
    results = {s.rollout_id: RolloutResult(s.rollout_id, s.group_id, "reference", "ok", reward=r)
               for s, r in zip(parents, (1.0, 0.3, 0.0, 0.3))}
    plan = lambda **kw: branching.plan_children(parents, results, calls, seed=0, decode=decode,  # noqa: E731
                                                trainable=lambda r: r.status == "ok", **kw)
    kids = plan(which="failed", at="uniform", children=2, cap=0)
    assert [(c.parent_id, c.child) for c in kids] == [(p.rollout_id, j) for p in parents[1:] for j in (0, 1)]
    assert all(1 <= c.fork_at <= 2 and c.replay.k == c.fork_at and c.group_id == parents[c.sample].group_id
               and c.rollout_id == f"{c.parent_id}.f{c.fork_at}c{c.child}" for c in kids)
    assert plan(which="failed", at="uniform", children=2, cap=0) == kids  # a pure function of its inputs
    assert len(plan(which="all", at="uniform", children=2, cap=3)) == 3
    assert plan(which="tool_error", at="uniform", children=1, cap=0) == []  # no failed tool call in these
    with pytest.raises(ValueError, match="branch='sometimes'"):
        plan(which="sometimes", at="uniform", children=1, cap=0)
    one_call = {rid: cs[:1] for rid, cs in calls.items()}
    assert branching.plan_children(parents, results, one_call, which="all", at="uniform", children=1, cap=0,
                                   seed=0, decode=decode, trainable=lambda r: True) == []  # nothing to fork at
    assert branching.fork_point(calls[parents[0].rollout_id], [1], at="first_tool_error", rng=random.Random(0)) == 1


def test_call_lines_are_found_without_decoding(tmp_path):
    rec = _rec(0, [1, 2], [3], rid="train00001.t.reference.0")
    assert branching.call_rollout(to_json_bytes(rec)) == "train00001.t.reference.0"
    assert branching.call_rollout(to_json_bytes(RolloutResult("x", "g", "h", "ok", reward=1.0))) is None


def test_branch_config_is_checked():
    from configs import demo_cpu

    cfg = demo_cpu.get_config("test")
    cfg.rollout.update(branch="failed", branch_at="uniform", branch_children=3, branch_max_per_step=4)
    ro = RunConfig.of(cfg).rollout
    assert (ro.branch, ro.branch_at, ro.branch_children, ro.branch_max_per_step) == ("failed", "uniform", 3, 4)
    for field, value, msg in [("branch", "some", "config.rollout.branch='some'"),
                              ("branch_at", "last", "config.rollout.branch_at='last'"),
                              ("branch_children", 0, "branch_children=0 must be >= 1")]:
        bad = demo_cpu.get_config("test")
        bad.rollout[field] = value
        with pytest.raises(RunConfigError, match=msg):
            RunConfig.of(bad)
    est = demo_cpu.get_config("test")
    est.rl.estimator = "tree_grpo"
    assert RunConfig.of(est).rl.estimator == "tree_grpo"


def test_branch_metrics_per_harness():
    def kid(h, status, rep):
        return RolloutResult(f"{h}{status}", "g", h, status, reward=1.0 if status == "ok" else None,
                             meta={"replay": rep})

    ok = {"replayed": 2, "replayed_tokens": 30, "mismatch": None, "fork": {"call": 2, "prompt_match": False}}
    miss = {"replayed": 1, "replayed_tokens": 10, "mismatch": {"call": 1, "why": "x"}, "fork": None}
    m = branching.branch_metrics([kid("codex", "ok", ok), kid("codex", "replay_mismatch", miss),
                                  kid("reference", "ok", ok), RolloutResult("p", "g", "codex", "ok", reward=0.0)])
    assert m["branch/all/children"] == 3 and m["branch/codex/children"] == 2
    assert (m["branch/codex/replay_match"], m["branch/codex/replay_mismatch"]) == (1, 1)
    assert m["branch/codex/replay_match_rate"] == 0.5 and m["branch/reference/replay_match_rate"] == 1.0
    assert m["branch/all/replayed_calls"] == 5 and m["branch/all/replayed_tokens"] == 70
    assert m["branch/all/fork_prompt_diff"] == 2 and m["branch/codex/reward"] == 1.0


# ------------------------------------------------------------------------------------- the real rollout path


@pytest.mark.timeout(300)
def test_failed_parent_child_replays_its_prefix_then_samples(tmp_path, qwen3_tokenizer_dir):
    from research.models.tokenizer import load_tokenizer
    from research.serving.replay import ReplayEngine

    tok = load_tokenizer(qwen3_tokenizer_dir)
    engine = ReplayEngine(stepwise(tok, {0: ["ls"], 1: ["cat missing.txt", "echo apple > notes.txt"],
                                         2: ["echo wrong > notes.txt", "Done."]}), tok, weight_version=4)
    _, parent, kids, results, calls = run_with_children(tmp_path, tok, engine, "reference")
    pid = parent.rollout_id
    assert (results[pid].status, results[pid].reward) == ("ok", 0.3)  # wrong content after a failed `cat`
    (kid,) = kids
    assert (kid.fork_at, kid.rollout_id, kid.group_id) == (1, f"{pid}.f1c0", parent.group_id)  # the failed call
    res = results[kid.rollout_id]
    assert (res.status, res.reward) == ("ok", 1.0), res.message
    assert res.meta["replay"] == {"parent": pid, "k": 1, "replayed": 1, "replayed_tokens": len(
        calls[pid][0].completion_ids), "mismatch": None, "fork": {"call": 1, "prompt_match": True}}
    p0, c0 = calls[pid][0], calls[kid.rollout_id][0]
    assert (c0.prompt_ids, c0.completion_ids, c0.logprobs, c0.weight_version) == \
        (p0.prompt_ids, p0.completion_ids, p0.logprobs, 4)
    assert c0.meta["replayed"] is True and c0.meta["replay_of"] == p0.call_id and c0.call_id != p0.call_id
    # the engine never saw the replayed call: the parent's 4 calls and the child's 2 fresh ones
    assert len(engine.requests) == 4 + 2 and c0.call_id not in {r.request_id for r in engine.requests}
    c1 = calls[kid.rollout_id][1]
    assert c1.prompt_ids == calls[pid][1].prompt_ids and "replayed" not in c1.meta
    assert "echo apple" in tok.decode(c1.completion_ids) and c1.parent_call_id == c0.call_id
    # one tree: the child adds only what follows the shared call-1 prompt and the first tokens both call-1
    # answers share (`<tool_call>...{"command": "`: same tokens, same scripted logprobs, so merged)
    group = calls[pid] + calls[kid.rollout_id]
    tree = build_tree(group, [results[pid], res])
    last = calls[kid.rollout_id][-1]
    same = first_difference(calls[pid][1].completion_ids, c1.completion_ids)
    assert tok.decode(c1.completion_ids[:same]).endswith('"command": "')
    new = len(last.prompt_ids) + len(last.completion_ids) - len(calls[pid][1].prompt_ids) - same
    assert tree.num_nodes == build_tree(calls[pid], [results[pid]]).num_nodes + new
    assert tree.num_nodes < sum(len(c.prompt_ids) + len(c.completion_ids) for c in group)
    assert np.bincount(tree.occ_node)[tree.occ_node[tree.occ_call == 0]].tolist() == [2] * len(p0.completion_ids)
    # tree_grpo: what both share gets no credit, the two answers from where they part +-1 (rewards 0.3 / 1.0)
    adv = rollout_advantages([tree], estimator="tree_grpo")[0]
    by_call = collections.defaultdict(list)
    for ci, pos, a in zip(tree.occ_call, tree.occ_pos, adv):
        by_call[(tree.calls[ci].rollout_id, tree.calls[ci].call_index, bool(pos >= same))].append(round(float(a), 4))
    assert set(by_call[(pid, 0, False)] + by_call[(pid, 0, True)] + by_call[(pid, 1, False)]) == {0.0}
    assert set(by_call[(pid, 1, True)]) == {-1.0} and set(by_call[(kid.rollout_id, 1, True)]) == {1.0}


@pytest.mark.timeout(300)
def test_a_clock_in_a_replayed_prompt_ends_the_child_as_replay_mismatch(tmp_path, qwen3_tokenizer_dir):
    from research.models.tokenizer import load_tokenizer
    from research.serving.replay import ReplayEngine

    tok = load_tokenizer(qwen3_tokenizer_dir)
    engine = ReplayEngine(stepwise(tok, {0: ["date +%s%N"], 1: ["ls"], 2: ["cat missing.txt", "Done."]}), tok)
    run, parent, kids, results, calls = run_with_children(tmp_path, tok, engine, "reference", branch="tool_error")
    (kid,) = kids
    assert kid.fork_at == 2  # calls 0 (date) and 1 (ls) replayed; call 1's prompt holds the parent's clock
    res = results[kid.rollout_id]
    assert res.status == "replay_mismatch" and res.meta["cause"] == "infra", res.message
    mm = res.meta["replay"]["mismatch"]
    assert mm["call"] == 1 and "call 1's prompt differs from the parent's call 1" in res.message
    diff = mm["difference"]
    assert diff["expected_text"] != diff["got_text"] and diff["expected_text"][:1].isdigit()
    assert diff["expected"] != diff["got"] and diff["expected_len"] == len(calls[parent.rollout_id][1].prompt_ids)
    assert [c.meta.get("replayed") for c in calls[kid.rollout_id]] == [True]  # the mismatched call left no record
    assert res.meta["replay"]["replayed"] == 1 and "replay_mismatch@1" in res.meta["serving_faults"]
    group = GroupRecord(parent.group_id, "reference", calls[parent.rollout_id] + calls[kid.rollout_id],
                        [results[parent.rollout_id], res])
    kept, _, why = clean_group(group, 151936, scored_causes=run.rl.scored_causes)
    assert {c.rollout_id for c in kept} == {parent.rollout_id}  # never trained on as the policy's failure
    assert any(kid.rollout_id in w and "no reward" in w for w in why)
    m = branching.branch_metrics(list(results.values()))
    assert (m["branch/reference/replay_mismatch"], m["branch/reference/replay_match"]) == (1.0, 0.0)


def _fail_then_fix(tok):
    """The loop test's policy, per task: `ls`, then at the first visits (the group's two parents) a failing `cat`,
    a wrong file and "Done."; their children, forked at the failed call, write the right file."""
    import re

    from harness_env.harnesses.scripted import tool_call_text
    from research.serving.replay import ReplayEngine

    seen = collections.Counter()

    def reply(req):
        text = tok.decode(list(req.prompt_ids))
        name, word = re.findall(r"Create a file named (\S+) containing the word (\w+)\.", text)[-1]
        step = text.count("<tool_response>")
        seen[(name, word, step)] += 1
        bash = lambda cmd: tool_call_text({"name": "bash", "arguments": {"command": cmd}})  # noqa: E731
        if step == 0:
            return bash("ls")
        if step == 1:
            return bash("cat missing.txt" if seen[(name, word, 1)] <= 2 else f"echo {word} > {name}")
        return bash(f"echo wrong > {name}") if step == 2 and "cat missing.txt" in text else "Done."

    class Scripted(ReplayEngine):
        async def update_weights(self, params, version: int) -> None:  # noqa: ANN001
            self._version = version

    return Scripted(reply, tok)


@pytest.mark.timeout(600)
def test_rl_step_with_branching_trains_children_in_their_groups(tmp_path, monkeypatch):
    import json

    from configs import demo_cpu
    from harness_env.rl.loop import train
    from harness_env.sandbox import get_backend
    from research.models.tokenizer import load_tokenizer
    from research.serving import factory

    ok, why = get_backend("bwrap").available()
    if not ok:
        pytest.skip(why)
    src = tmp_path / "tasks"
    for name, word in (("notes.txt", "apple"), ("out.txt", "river")):
        family.write_task(src, name, word)
    cfg = demo_cpu.get_config("test")
    cfg.tasks.update(source="dir", train_dir=str(src), eval_dir=str(src), validate=False)
    cfg.rollout.update(harnesses="reference_bash", max_turns=6, max_new_tokens=64, branch="failed",
                       branch_at="first_tool_error", branch_children=1, progress=False)
    cfg.rl.update(estimator="tree_grpo")
    cfg.train.update(steps=1)
    cfg.eval.update(every=0, at_start=False)
    tok = load_tokenizer(cfg.tokenizer_dir or None)
    monkeypatch.setattr(factory, "policy_engine", lambda run, params, weight_version: _fail_then_fix(tok))
    wd = tmp_path / "run"
    assert train(cfg, wd)["rl_step"] == 1
    (m,) = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines() if json.loads(x)["kind"] == "train"]
    print({k: v for k, v in m.items() if k.startswith(("branch/", "tree_", "flat_", "rollout_s", "rollout/"))})
    assert m["rollout/all/count"] == 4 and m["rollout/all/reward"] == pytest.approx(0.3)  # the sampled parents
    assert m["branch/all/children"] == 4 and m["branch/reference_bash/replay_match_rate"] == 1.0
    assert m["branch/all/replayed_calls"] == 4 and m["branch/all/reward"] == 1.0
    assert 0 < m["branch/rollout_s"] < m["rollout_s"] and not m["skipped"] and m["grad_norm"] > 0
    assert m["tree_tokens"] < m["flat_tokens"] and m["tree_compression"] == pytest.approx(
        m["flat_tokens"] / m["tree_tokens"])
    ledger = [json.loads(x) for x in (wd / "ledger.jsonl").read_text().splitlines()]
    trained = {rid for e in ledger for rid in e["trained"]}
    assert len(trained) == 8 and sum(".f1c0" in rid for rid in trained) == 4
