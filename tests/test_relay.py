"""The relay family (harness_env/tasks/relay.py): two tool calls, the second conditioned on the first's output;
its sloppy expert; its split; sampled held-out evals; and the oracle solving it through real CLIs' own tools."""

import asyncio
import collections
import json

import pytest

from harness_env.tasks import relay
from harness_env.tasks.select import select_tasks


def _prompt(n: int, results: int) -> str:
    """A rendered prompt after `results` tool results (the Qwen3 template's <tool_response> blocks)."""
    text = f"<|im_start|>user\n{relay.QUERY.format(n=n)}<|im_end|>\n"
    for _ in range(results):
        text += "<|im_start|>user\n<tool_response>\nriver\n</tool_response><|im_end|>\n"
    return text + "<|im_start|>assistant\n"


def _command(reply: str) -> str:
    return json.loads(reply.split("<tool_call>\n")[1].split("\n</tool_call>")[0])["arguments"]["command"]


def test_split_clues_and_the_experts_mistakes():
    assert relay.numbers("train") == list(range(64)) and relay.numbers("heldout") == list(range(64, 80))
    for split in ("train", "heldout"):  # half the tasks of each split per clue word
        clues = collections.Counter(relay.clue_of(n) for n in relay.numbers(split))
        assert set(clues.values()) == {len(relay.numbers(split)) // 2}, clues
        parity = {(n % 2, relay.clue_of(n)) for n in relay.numbers(split)}
        assert len(parity) == 4  # neither parity tells the clue: only reading clue.txt does
    assert sum(relay.literal_mistake(n) for n in relay.numbers("train")) == 40  # MISTAKE_RATE of 64
    with pytest.raises(ValueError, match="split"):
        relay.numbers("test")


def test_the_expert_reads_then_copies_then_answers():
    right = next(n for n in relay.numbers("train") if not relay.literal_mistake(n))
    wrong = next(n for n in relay.numbers("train") if relay.literal_mistake(n))
    assert _command(relay.expert_reply(_prompt(right, 0))) == "cat clue.txt"
    assert _command(relay.expert_reply(_prompt(right, 1))) == f"echo {relay.clue_of(right)} > out.txt"
    assert _command(relay.expert_reply(_prompt(wrong, 1))) == f"echo the word {relay.clue_of(wrong)} > out.txt"
    assert _command(relay.oracle_reply(_prompt(wrong, 1))) == f"echo {relay.clue_of(wrong)} > out.txt"
    assert relay.expert_reply(_prompt(right, 2)) == "Done."
    assert relay.expert_reply("no task here") == "No task." and not relay.is_task("no task here")
    # the form and word a completion writes, from any CLI's call format (JSON-escaped in an arguments string)
    assert relay.written('{"cmd": "echo stone > out.txt"}') == ("exact", "stone")
    assert relay.written('"arguments": "{\\"command\\":\\"echo the word river >out.txt\\"}"') == ("literal", "river")
    assert relay.written("cat clue.txt") is None


@pytest.mark.harness
def test_tasks_grade_the_copy_and_nothing_else(tmp_path):
    """The reference solution 1.0, nothing done 0.0, a guess of the other clue's word 0.0, the literal form 0.0."""
    import shutil

    from harness_env.sandbox import get_backend
    from harness_env.tasks.loader import load_task
    from harness_env.tasks.validate import run_solution, validate_task

    backend = get_backend("bwrap")
    dirs = select_tasks("relay", split="heldout", scratch=tmp_path)
    assert [d.name for d in dirs] == [f"relay-{n:02d}" for n in range(64, 80)]
    v = asyncio.run(validate_task(backend, dirs[0]))
    assert v.ok and (v.solution_reward, v.empty_reward, v.untouched_reward) == (1.0, 0.0, 0.0), v
    clue = (dirs[0] / "input_files" / "clue.txt").read_text().strip()
    other = next(w for w in relay.CLUES if w != clue)
    for i, (command, reward) in enumerate(((f"echo {other} > out.txt", 0.0),  # the other clue's word: a guess
                                           (f"echo the word {clue} > out.txt", 0.0))):  # the expert's mistake
        wrong = tmp_path / f"wrong{i}" / dirs[0].name
        shutil.copytree(dirs[0], wrong)
        (wrong / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{command}\n")
        assert asyncio.run(run_solution(backend, load_task(wrong))) == reward, command


def test_sampled_evals_plan_k_rollouts_per_task_and_greedy_copies_are_refused(tmp_path):
    from configs import harness_matrix
    from harness_env.rl.rollouts import plan_eval
    from research.rl.config import RunConfig

    cfg = harness_matrix.get_config("codex")
    run = RunConfig.of(cfg)
    assert (run.eval.samples, run.eval.temperature) == (2, 1.0)
    tasks = select_tasks("relay", split="heldout", scratch=tmp_path)
    specs = plan_eval(run, tasks, step=100)
    assert len(specs) == 2 * len(tasks) and len({s.rollout_id for s in specs}) == len(specs)
    assert all(s.rollout_id.startswith("eval00100.") for s in specs)
    cfg.eval.temperature = 0.0
    with pytest.raises(ValueError, match="greedy"):
        RunConfig.of(cfg)


@pytest.mark.harness
def test_the_oracle_solves_relay_through_codex_and_claude_code_with_their_own_tools(tmp_path, qwen3_tokenizer_dir):
    from harness_env.eval.run import build_engine, evaluate
    from harness_env.runner import RunnerConfig
    from research.capture import CallRecord, read_log
    from research.models.tokenizer import load_tokenizer

    tok = load_tokenizer(str(qwen3_tokenizer_dir))
    tasks = select_tasks("relay", split="heldout", scratch=tmp_path, limit=2)
    cfg = RunnerConfig(out_dir=tmp_path / "out", concurrency=2, timeout_s=240, progress=False)
    doc = asyncio.run(evaluate(tasks=tasks, harnesses=["codex", "claude_code"], k=1, engine=build_engine("oracle", tok),
                               tok=tok, out=tmp_path / "out", cfg=cfg))
    rows = {r.harness: r for r in doc["rows"] if r.group == "all"}
    assert {h: rows[h].metrics["pass@1"] for h in ("codex", "claude_code")} == {"codex": 1.0, "claude_code": 1.0}
    calls = [c for c in read_log(tmp_path / "out" / "capture.jsonl") if isinstance(c, CallRecord)]
    for h, tool in (("codex", "exec_command"), ("claude_code", "Bash")):  # 2 tool calls + the answer per rollout
        mine = [c for c in calls if c.harness == h]
        assert len(mine) == 3 * len(tasks), (h, len(mine))
        assert sum(tool in tok.decode(c.completion_ids) for c in mine) == 2 * len(tasks)
