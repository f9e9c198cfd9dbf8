"""Forking by replay through real, unmodified CLIs (Claude Code, Codex) in bwrap, through the shim, with a scripted
engine: what replays and what cannot.

- Claude Code renders the same prompt for the same state: a child replays two calls and samples its own third;
  a clock in a replayed tool result ends a child as `replay_mismatch`.
- Codex's exec_command result starts with a random `Chunk ID: 3f2a1b` per call, so no call after its first tool
  call can be replayed: forked at call 1 a child replays call 0 and its fork call's prompt differs from the parent's
  by those six hex digits (reported, the child runs on); forked at call 2 the replayed call 1 mismatches.
"""

import pytest
from branch_kit import run_with_children, stepwise

from research.trees.builder import build_tree

pytestmark = [pytest.mark.harness]

FAIL_AT_1 = {0: ["ls"], 1: ["cat missing.txt", "echo apple > notes.txt"], 2: ["echo wrong > notes.txt", "Done."]}
FAIL_AT_2 = {0: ["ls"], 1: ["ls -a"], 2: ["cat missing.txt", "echo apple > notes.txt"],
             3: ["echo wrong > notes.txt", "Done."]}
CLOCK = {0: ["date +%s%N"], 1: ["ls"], 2: ["cat missing.txt", "Done."]}


def _run(tmp_path, qwen3_tokenizer_dir, harness, plan):
    from research.models.tokenizer import load_tokenizer
    from research.serving.replay import ReplayEngine

    tok = load_tokenizer(qwen3_tokenizer_dir)
    engine = ReplayEngine(stepwise(tok, plan, harness), tok)
    _, parent, kids, results, calls = run_with_children(tmp_path, tok, engine, harness, timeout_s=240,
                                                        sandbox_cpus=2.0, sandbox_memory_mb=4096)
    assert len(kids) == 1, [(r.status, r.message) for r in results.values()]
    return tok, engine, parent, kids[0], results, calls


def _shared_prefix(calls, parent, kid, res):
    tree = build_tree(calls[parent.rollout_id] + calls[kid.rollout_id], [res[parent.rollout_id], res[kid.rollout_id]])
    flat = sum(len(c.prompt_ids) + len(c.completion_ids) for cs in (calls[parent.rollout_id], calls[kid.rollout_id])
               for c in cs)
    return tree.num_nodes, flat


@pytest.mark.timeout(600)
def test_claude_code_child_replays_two_calls_then_samples(tmp_path, qwen3_tokenizer_dir):
    tok, engine, parent, kid, res, calls = _run(tmp_path, qwen3_tokenizer_dir, "claude_code", FAIL_AT_2)
    pid = parent.rollout_id
    assert (res[pid].status, res[pid].reward) == ("ok", 0.3) and kid.fork_at == 2
    r = res[kid.rollout_id]
    assert (r.status, r.reward) == ("ok", 1.0), r.message
    rep = r.meta["replay"]
    assert (rep["replayed"], rep["mismatch"], rep["fork"]) == (2, None, {"call": 2, "prompt_match": True})
    for p, c in zip(calls[pid][:2], calls[kid.rollout_id][:2]):
        assert (c.prompt_ids, c.completion_ids, c.logprobs, c.weight_version, c.meta["replayed"]) == \
            (p.prompt_ids, p.completion_ids, p.logprobs, p.weight_version, True)
    assert len(engine.requests) == len(calls[pid]) + len(calls[kid.rollout_id]) - 2
    tree_tokens, flat_tokens = _shared_prefix(calls, parent, kid, res)
    print(f"claude_code: tree {tree_tokens} vs flat {flat_tokens} tokens, parent alone "
          f"{build_tree(calls[pid], [res[pid]]).num_nodes}")
    assert tree_tokens < build_tree(calls[pid], [res[pid]]).num_nodes + 200  # the child adds ~its last turns only


@pytest.mark.timeout(600)
@pytest.mark.parametrize("harness", ["claude_code", "codex"])
def test_a_nondeterministic_replayed_prompt_is_a_replay_mismatch(harness, tmp_path, qwen3_tokenizer_dir):
    """Claude Code: the parent's clock in call 1's prompt; Codex: the random Chunk ID of its first tool result."""
    _, _, parent, kid, res, calls = _run(tmp_path, qwen3_tokenizer_dir, harness, CLOCK if harness == "claude_code"
                                         else FAIL_AT_2)
    assert kid.fork_at == 2
    r = res[kid.rollout_id]
    assert r.status == "replay_mismatch" and r.meta["cause"] == "infra", (r.status, r.message)
    mm = r.meta["replay"]["mismatch"]
    diff = mm["difference"]
    print(f"{harness}: {r.message}")
    assert mm["call"] == 1 and diff["expected"] != diff["got"]
    if harness == "codex":
        assert "Chunk ID:" in diff["before_text"][-16:] and diff["expected_text"] != diff["got_text"]
    else:
        assert diff["expected_text"][:1].isdigit() and diff["got_text"][:1].isdigit()
    assert [c.meta.get("replayed") for c in calls[kid.rollout_id]] == [True]


@pytest.mark.timeout(600)
def test_codex_child_forked_at_call_1_replays_call_0_its_fork_prompt_differs_by_the_chunk_id(tmp_path,
                                                                                          qwen3_tokenizer_dir):
    _, engine, parent, kid, res, calls = _run(tmp_path, qwen3_tokenizer_dir, "codex", FAIL_AT_1)
    pid = parent.rollout_id
    assert (res[pid].status, res[pid].reward) == ("ok", 0.3) and kid.fork_at == 1
    r = res[kid.rollout_id]
    assert (r.status, r.reward) == ("ok", 1.0), r.message
    rep = r.meta["replay"]
    assert rep["replayed"] == 1 and rep["mismatch"] is None and rep["fork"]["prompt_match"] is False
    diff = rep["fork"]["difference"]
    assert "Chunk ID:" in diff["before_text"][-16:]  # tokens of two random hex ids may share a first one
    p0, c0 = calls[pid][0], calls[kid.rollout_id][0]
    assert (c0.prompt_ids, c0.completion_ids, c0.logprobs) == (p0.prompt_ids, p0.completion_ids, p0.logprobs)
    assert len(engine.requests) == len(calls[pid]) + len(calls[kid.rollout_id]) - 1
    tree_tokens, flat_tokens = _shared_prefix(calls, parent, kid, res)
    print(f"codex: tree {tree_tokens} vs flat {flat_tokens} tokens; fork prompt differs at {diff['at']}: "
          f"{diff['expected_text'][:12]!r} vs {diff['got_text'][:12]!r}")
    # the tree branches inside call 0's tool result (at the chunk id): the ~9k-token prompt is shared
    assert tree_tokens < build_tree(calls[pid], [res[pid]]).num_nodes + 1000
