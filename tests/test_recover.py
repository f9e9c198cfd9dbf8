"""The recover family (harness_env/tasks/recover.py): the first command fails on half the tasks; its give-up expert;
its checkers; forking at the reaction to a failed tool call; the branching-vs-trajectory config and comparison."""

import asyncio
import collections
import json

import pytest

from harness_env.tasks import recover
from harness_env.tasks.select import parse_spec, select_tasks

MISSING = "exit code 1\ncat: clue.txt: No such file or directory\n"


def _prompt(n: int, results: list[str]) -> str:
    """A rendered prompt after these tool results (the Qwen3 template's <tool_response> blocks)."""
    text = f"<|im_start|>user\n{recover.QUERY.format(n=n)}<|im_end|>\n"
    for r in results:
        text += f"<|im_start|>user\n<tool_response>\n{r}\n</tool_response><|im_end|>\n"
    return text + "<|im_start|>assistant\n"


def _command(reply: str) -> str:
    return json.loads(reply.split("<tool_call>\n")[1].split("\n</tool_call>")[0])["arguments"]["command"]


def test_split_moved_clues_and_give_ups_are_exact_shares():
    assert recover.numbers("train") == list(range(64)) and recover.numbers("heldout") == list(range(64, 96))
    for split, n in (("train", 64), ("heldout", 32)):
        nums = recover.numbers(split)
        assert sum(map(recover.moved, nums)) == n // 2
        assert collections.Counter(map(recover.clue_of, nums)) == {w: n // 2 for w in ("river", "stone")}
        assert sum(map(recover.gives_up, nums)) == round(recover.GIVEUP_RATE * n // 2)
        assert not any(recover.gives_up(m) for m in nums if not recover.moved(m))  # only after a failure
        assert len({(recover.moved(m), recover.clue_of(m)) for m in nums}) == 4  # independent hashes
    assert parse_spec("recover:heldout:4") == ("recover", {"split": "heldout", "limit": 4})
    with pytest.raises(ValueError, match="split"):
        recover.numbers("test")


def test_the_expert_recovers_or_gives_up_and_the_oracle_always_recovers():
    nums = recover.numbers("train")
    stays = next(n for n in nums if not recover.moved(n))
    fixes = next(n for n in nums if recover.moved(n) and not recover.gives_up(n))
    quits = next(n for n in nums if recover.gives_up(n))
    w = recover.clue_of
    assert _command(recover.expert_reply(_prompt(stays, []))) == "cat clue.txt"
    assert _command(recover.expert_reply(_prompt(stays, [f"exit code 0\n{w(stays)}\n"]))) == \
        f"echo {w(stays)} > out.txt"
    assert recover.expert_reply(_prompt(stays, [f"exit code 0\n{w(stays)}\n", "exit code 0\n"])) == "Done."
    assert _command(recover.expert_reply(_prompt(fixes, [MISSING]))) == recover.RECOVER
    assert _command(recover.expert_reply(_prompt(fixes, [MISSING, f"exit code 0\n{w(fixes)}\n"]))) == \
        f"echo {w(fixes)} > out.txt"
    assert recover.expert_reply(_prompt(fixes, [MISSING, "exit code 0\nx\n", "exit code 0\n"])) == "Done."
    assert _command(recover.expert_reply(_prompt(quits, [MISSING]))) == recover.GIVE_UP
    assert recover.expert_reply(_prompt(quits, [MISSING, "exit code 0\n"])) == "Done."
    assert _command(recover.oracle_reply(_prompt(quits, [MISSING]))) == recover.RECOVER
    assert recover.expert_reply("no task") == "No task." and not recover.is_task("no task")
    # the relay family's query is another task: neither family's expert answers the other's
    from harness_env.tasks import relay

    assert not relay.is_task(_prompt(stays, [])) and not recover.is_task(relay.QUERY.format(n=3))


def test_fork_after_the_failed_call_replays_it():
    import random

    from harness_env.rl.branching import fork_point
    from research.capture import CallRecord

    recs = [CallRecord(rollout_id="r", session_id="s", group_id="g", harness="reference", call_index=i,
                       prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.1], weight_version=0, finish_reason="stop")
            for i in range(3)]
    rng = random.Random(0)
    assert fork_point(recs, [0], at="first_tool_error", rng=rng) == 0  # re-samples the failing command itself
    assert fork_point(recs, [0], at="after_tool_error", rng=rng) == 1  # replays it, re-samples the reaction
    assert fork_point(recs, [2], at="after_tool_error", rng=rng) == 3  # after the last call: its own next prompt
    assert fork_point(recs[:1], [], at="after_tool_error", rng=rng) is None  # no failure, one call: nowhere


def test_the_arms_spend_the_same_rollout_budget():
    from configs import branching
    from research.rl.config import RunConfig

    runs = {a: RunConfig.of(branching.get_config(a)) for a in branching.ARMS}
    budget = {a: r.rollout.groups_per_step * r.rollout.group_size + r.rollout.branch_max_per_step
              for a, r in runs.items()}
    assert budget == {"trajectory": 32, "branching": 32}
    assert (runs["trajectory"].rl.estimator, runs["branching"].rl.estimator) == ("grpo", "tree_grpo")
    assert (runs["branching"].rollout.branch, runs["branching"].rollout.branch_at) == ("failed", "after_tool_error")
    assert runs["trajectory"].rollout.branch == "" and runs["trajectory"].rollout.max_extra_rounds == 0
    with pytest.raises(ValueError, match="arm 'tree'"):
        branching.get_config("tree")


@pytest.mark.harness
def test_checkers_pay_the_clue_only_wherever_it_lives(tmp_path):
    """Per task kind: the reference solution 1.0, nothing 0.0, giving up 0.0, the other clue's word 0.0, and on a
    moved task the unrecovered `cat clue.txt > out.txt` 0.0."""
    import shutil

    from harness_env.sandbox import get_backend
    from harness_env.tasks.loader import load_task
    from harness_env.tasks.validate import run_solution, validate_task

    backend = get_backend("bwrap")
    dirs = select_tasks("recover", split="heldout", scratch=tmp_path)
    assert [d.name for d in dirs] == [f"recover-{n:02d}" for n in range(64, 96)]
    kinds = {m: next(d for d in dirs if recover.moved(int(d.name.split("-")[1])) == m) for m in (False, True)}
    for is_moved, d in kinds.items():
        v = asyncio.run(validate_task(backend, d))
        assert v.ok and (v.solution_reward, v.empty_reward, v.untouched_reward) == (1.0, 0.0, 0.0), v
        clue = recover.clue_of(int(d.name.split("-")[1]))
        other = next(w for w in ("river", "stone") if w != clue)
        wrong = [recover.GIVE_UP, f"echo {other} > out.txt"] + (["cat clue.txt > out.txt || true"] if is_moved else [])
        for i, command in enumerate(wrong):
            w = tmp_path / f"wrong{is_moved}{i}" / d.name
            shutil.copytree(d, w)
            (w / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{command}\n")
            assert asyncio.run(run_solution(backend, load_task(w))) == 0.0, command


@pytest.mark.harness
def test_the_oracle_recovers_through_the_reference_agent_and_codex(tmp_path, qwen3_tokenizer_dir):
    from harness_env.eval.run import build_engine, evaluate
    from harness_env.rl.branching import failed_tool_calls
    from harness_env.runner import RunnerConfig
    from research.capture import CallRecord, read_log
    from research.models.tokenizer import load_tokenizer

    tok = load_tokenizer(str(qwen3_tokenizer_dir))
    tasks = [d for d in select_tasks("recover", split="heldout", scratch=tmp_path)
             if recover.moved(int(d.name.split("-")[1]))][:2]
    cfg = RunnerConfig(out_dir=tmp_path / "out", concurrency=2, timeout_s=240, progress=False)
    doc = asyncio.run(evaluate(tasks=tasks, harnesses=["reference_bash", "codex"], k=1,
                               engine=build_engine("oracle", tok), tok=tok, out=tmp_path / "out", cfg=cfg))
    rows = {r.harness: r.metrics["pass@1"] for r in doc["rows"] if r.group == "all"}
    assert rows == {"reference_bash": 1.0, "codex": 1.0}
    calls = collections.defaultdict(list)
    for c in read_log(tmp_path / "out" / "capture.jsonl"):
        if isinstance(c, CallRecord):
            calls[c.rollout_id].append(c)
    # each rollout: the failed cat (seen as failed in the next prompt), the recovery, the copy, the answer
    assert {rid: (len(cs), failed_tool_calls(cs, tok.decode)) for rid, cs in calls.items()} == \
        {rid: (4, [0]) for rid in calls}


@pytest.mark.slow
def test_both_arms_start_from_one_sft_checkpoint_and_report(tmp_path):
    """branch_compare on the test variant: one SFT part, two RL arms and the SFT-only control copied from it (the
    same start eval and recovery), every figure of the comparison present; a rerun resumes (nothing re-runs)."""
    from harness_env.rl import branch_compare
    from harness_env.sandbox import get_backend

    ok, why = get_backend("bwrap").available()
    if not ok:
        pytest.skip(why)
    out = branch_compare.run([0], tmp_path, variant="test")
    row = out["runs"][0]
    tr, br = row["trajectory"], row["branching"]
    assert (tr["start"], tr["recovery_start"]) == (br["start"], br["recovery_start"])
    assert tr["steps"] == br["steps"] == 2 and [k for k, _ in tr["curve"]] == [0, 2]
    assert tr["recovery_start"]["n"] == 4 and br["children_per_step"] <= 2
    # the control: more SFT from the same checkpoint, judged at the trajectory arm's final minutes
    ctl = row["control"]
    assert ctl["steps"] >= 1 and ctl["curve"][0] == tr["curve"][0] and ctl["recovery_final"]["n"] == 4
    assert (tmp_path / "seed0" / "control" / "done.json").is_file()
    assert set(out["summary"]) == {"seeds", "trajectory", "branching", "control"}
    assert (tmp_path / "compare.json").is_file() and (tmp_path / "compare.png").stat().st_size > 10_000
    before = (tmp_path / "seed0" / "branching" / "metrics.jsonl").read_text()
    branch_compare.run([0], tmp_path, variant="test")
    assert (tmp_path / "seed0" / "branching" / "metrics.jsonl").read_text() == before
