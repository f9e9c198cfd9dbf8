"""The Inspect AI export (harness_env/eval/inspect_log.py), read back with inspect_ai's own reader: a real
launch.eval run (oracle engine, reference harness, bwrap, shim) exported through `evaluate(inspect_log=...)`,
and a launch.train workdir's eval layout (no harness transcript, a timed-out rollout) through the CLI.

The oracle solves the make_file family and answers "I cannot tell which file to create." on the library tasks,
so the run has both outcomes: accuracy 1/3 cannot come out right by accident."""

import asyncio
import dataclasses
import json
import pathlib
import shutil

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai.log import list_eval_logs, read_eval_log

from harness_env.eval import inspect_log
from research.capture import CallRecord, RolloutResult, read_log, to_json

LIBRARY = pathlib.Path(__file__).resolve().parents[1] / "harness_env" / "tasks" / "library"


@pytest.fixture(scope="module")
def run(tmp_path_factory, qwen3_tokenizer_dir):
    """One eval: 2 library tasks + 1 make_file task, k=2 (6 rollouts), exported to run.eval by evaluate()."""
    from harness_env.eval.run import build_engine, evaluate, task_dirs
    from harness_env.runner import RunnerConfig
    from research.models.tokenizer import load_tokenizer

    root = tmp_path_factory.mktemp("inspect")
    tok = load_tokenizer(qwen3_tokenizer_dir)
    tasks = [LIBRARY / "file_rename", LIBRARY / "text_wordcount", *task_dirs("family:heldout:1", root)]
    out = root / "out"
    cfg = RunnerConfig(out_dir=out, concurrency=6, timeout_s=60, progress=False)
    doc = asyncio.run(evaluate(tasks=tasks, harnesses=["reference"], k=2, engine=build_engine("oracle", tok),
                               tok=tok, out=out, cfg=cfg, inspect_log=root / "run.eval"))
    results = [r for r in read_log(out / "results.jsonl") if isinstance(r, RolloutResult)]
    return {"root": root, "out": out, "doc": doc, "results": results, "tok": tok}


def _metric(log, key):
    (score,) = log.results.scores
    return score.metrics[key].value


def test_evaluate_writes_an_inspect_log_that_inspect_reads_back(run):
    path, results = run["doc"]["paths"]["inspect"], run["results"]
    assert path == run["root"] / "run.eval" and len(results) == 6
    log = read_eval_log(str(path))
    assert log.status == "success" and len(log.samples) == len(results)
    by_id = {s.id: s for s in log.samples}
    assert set(by_id) == {r.rollout_id for r in results}
    for r in results:
        s = by_id[r.rollout_id]
        assert s.scores["verifier"].value == r.reward and s.epoch == r.meta["sample"] + 1
        query = json.loads((pathlib.Path(r.meta["task_dir"]) / "data_entry.json").read_text())["user_query"]
        assert s.input == query and s.messages and s.messages[0].role == "user" and s.messages[0].text == query
        assert s.output.completion == r.meta["final_message"] and s.metadata["status"] == "ok"
        assert s.metadata["messages_from"] == "harness" and s.model_usage  # usage from the capture log
    (row,) = [x for x in run["doc"]["rows"] if x.group == "all"]
    assert _metric(log, "accuracy") == pytest.approx(row.metrics["pass@1"]) == pytest.approx(1 / 3)
    assert _metric(log, "mean") == pytest.approx(row.mean_reward)
    assert _metric(log, "accuracy_reference") == pytest.approx(1 / 3)
    assert _metric(log, "pass@2_reference") == pytest.approx(row.metrics["pass@2"])


def test_the_transcripts_tool_calls_become_inspect_tool_calls(run):
    """The make_file expert's bash call and its tool result keep their shape (the viewer renders them)."""
    log = read_eval_log(str(run["doc"]["paths"]["inspect"]))
    solved = [s for s in log.samples if s.scores["verifier"].value == 1.0]
    assert len(solved) == 2
    for s in solved:
        calls = [m for m in s.messages if m.role == "assistant" and m.tool_calls]
        assert calls and calls[0].tool_calls[0].function == "bash"
        assert "command" in calls[0].tool_calls[0].arguments
        tools = [m for m in s.messages if m.role == "tool"]
        assert tools and tools[0].tool_call_id == calls[0].tool_calls[0].id


def test_the_header_alone_carries_task_model_and_results(run):
    head = read_eval_log(str(run["doc"]["paths"]["inspect"]), header_only=True)
    assert head.samples is None and head.eval.model == "harness-rl/policy@v0"
    assert head.eval.task == "harness_rl/heldout+library" and head.eval.config.epochs == 2
    assert head.results.total_samples == 6 and _metric(head, "accuracy") == pytest.approx(1 / 3)
    assert head.stats.model_usage["harness-rl/policy@v0"].output_tokens > 0


def _as_train_workdir(run, wd: pathlib.Path) -> list[RolloutResult]:
    """The eval results the way a launch.train workdir keeps them (eval/results.jsonl, eval_capture.jsonl),
    without the harness transcript (as a CLI harness that reports none), plus a timed-out rollout."""
    (wd / "eval").mkdir(parents=True)
    (wd / "config.json").write_text("{}")
    shutil.copy(run["out"] / "capture.jsonl", wd / "eval_capture.jsonl")
    results = [dataclasses.replace(r, meta={k: v for k, v in r.meta.items() if k != "harness_meta"})
               for r in run["results"]]
    results.append(RolloutResult(rollout_id="eval00003.late.reference.0", group_id="eval00003/late/reference",
                                 harness="reference", status="timeout", message="harness timed out after 60s",
                                 meta={"task_id": "late", "sample": 0, "category": "text"}))
    (wd / "eval" / "results.jsonl").write_text("".join(to_json(r) + "\n" for r in results))
    return results


def test_a_train_workdirs_evals_through_the_cli_decode_the_captured_calls(run, tmp_path):
    results = _as_train_workdir(run, tmp_path / "wd")
    assert inspect_log.main(["--results", str(tmp_path / "wd"), "--out", str(tmp_path / "logs")]) == 0
    (info,) = list_eval_logs(str(tmp_path / "logs"))  # what `inspect view --log-dir` lists
    log = read_eval_log(info)
    assert len(log.samples) == 7 and _metric(log, "accuracy") == pytest.approx(2 / 7)
    calls = {}
    for c in read_log(run["out"] / "capture.jsonl"):
        if isinstance(c, CallRecord):
            calls.setdefault(c.rollout_id, []).append(c)
    by_id = {s.id: s for s in log.samples}
    for r in results[:-1]:
        s = by_id[r.rollout_id]
        said = [m.text for m in s.messages if m.role == "assistant"]
        ours = sorted(calls[r.rollout_id], key=lambda c: (c.t_start, c.call_index))
        assert s.metadata["messages_from"] == "capture" and len(ours) >= 1
        assert said == [run["tok"].decode(c.completion_ids, skip_special_tokens=True) for c in ours]
    late = by_id["eval00003.late.reference.0"]
    assert late.scores["verifier"].value == 0.0 and late.scores["verifier"].explanation.startswith("timeout")
    assert late.input == "late" and late.metadata["success"] is False


def test_a_dir_without_results_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="results.jsonl"):
        inspect_log.export(tmp_path, tmp_path / "x.eval")
