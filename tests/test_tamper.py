"""Input tampering is scored, not paid (harness_env/tamper.py): the rule table, the changes a workspace records,
the batch's reward, and what validation reports of a task's untouched workspace."""

import asyncio
import json
import os

import pytest

from harness_env import tamper
from harness_env.sandbox import get_backend
from harness_env.tasks import load_task
from harness_env.tasks.validate import validate_task
from research.capture import CallRecord, RolloutResult
from research.data.pipeline import clean_group
from research.data.shards import GroupRecord


def _c(path, change, before=100, after=None):
    d = {"path": path, "change": change, "size_before": before}
    return d if after is None else {**d, "size_after": after}


def test_the_rule_table():
    changes = [_c("a.csv", "modified", 100, 95), _c("b.csv", "modified", 100, 10), _c("c.csv", "removed"),
               _c("d/e.json", "replaced"), _c("f.txt", "modified", 100, 0)]
    assert tamper.tampered(changes, None) == ["b.csv", "c.csv", "d/e.json", "f.txt"]  # destructive (default)
    assert tamper.tampered(changes, None, "frozen") == ["a.csv", "b.csv", "c.csv", "d/e.json", "f.txt"]
    assert tamper.tampered(changes, None, "editable") == []
    assert tamper.tampered(changes, ["*.csv"]) == ["d/e.json", "f.txt"]  # declared: everything else is frozen
    assert tamper.tampered(changes, []) == [c["path"] for c in changes]
    with pytest.raises(ValueError, match="undeclared_inputs"):
        tamper.tampered(changes, None, "lenient")


def test_queries_that_ask_for_edits_and_that_forbid_them():
    assert tamper.asks_for_edits("3) Update config/policy.yaml in place, keeping unrelated keys.")
    assert tamper.asks_for_edits("Rewrite input/rough_note.txt into a concise note.")
    assert not tamper.asks_for_edits("Constraints: do not modify files under input/. Write output/a.csv.")
    assert tamper.forbids_input_edits("Do not modify files under input/.")
    assert not tamper.forbids_input_edits("Summarise input/notes.md into output/summary.md.")


def test_a_workspace_records_each_kind_of_change(tmp_path):
    task = tmp_path / "task"
    (task / "input_files" / "d").mkdir(parents=True)
    (task / "reward").mkdir()
    (task / "data_entry.json").write_text(json.dumps({"task_id": "t", "user_query": "q"}))
    (task / "reward" / "reward.sh").write_text("echo 0\n")
    for name in ("kept.txt", "edited.txt", "emptied.txt", "gone.txt", "d/linked.txt"):
        (task / "input_files" / name).write_text("x" * 40 + "\n")
    t = load_task(task)
    ws = tmp_path / "ws"
    t.populate(ws)
    (ws / "edited.txt").write_text("y" * 40 + "\n")
    (ws / "emptied.txt").write_text("")
    (ws / "gone.txt").unlink()
    (ws / "d" / "linked.txt").unlink()
    os.symlink("/etc/hostname", ws / "d" / "linked.txt")
    by = {c["path"]: c for c in t.input_changes(ws)}
    assert set(by) == {"edited.txt", "emptied.txt", "gone.txt", "d/linked.txt"}
    assert (by["edited.txt"]["change"], by["edited.txt"]["size_after"]) == ("modified", 41)
    assert (by["emptied.txt"]["change"], by["emptied.txt"]["size_after"]) == ("modified", 0)
    assert by["gone.txt"]["change"] == "removed" and by["d/linked.txt"]["change"] == "replaced"
    assert sorted(tamper.tampered(list(by.values()), None)) == ["d/linked.txt", "emptied.txt", "gone.txt"]


def test_the_batch_pays_a_tampered_rollout_the_tamper_reward():
    results = [RolloutResult("r0", "g", "h", "ok", reward=1.0, meta={"tampered": ["sales.csv"]}),
               RolloutResult("r1", "g", "h", "ok", reward=1.0, meta={"inputs_changed": ["notes.md"]})]
    calls = [CallRecord(rollout_id=f"r{i}", session_id=f"s{i}", group_id="g", harness="h", call_index=0,
                        prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.1], weight_version=0,
                        finish_reason="stop") for i in range(2)]
    rec = GroupRecord(group_id="g", harness="h", calls=calls, results=results)
    _, kept, _ = clean_group(rec, 100, tamper_reward=-0.25)
    assert {r.rollout_id: r.reward for r in kept} == {"r0": -0.25, "r1": 1.0}
    _, kept, _ = clean_group(rec, 100, tamper_reward=None)
    assert {r.rollout_id: r.reward for r in kept} == {"r0": 1.0, "r1": 1.0}


def test_the_config_default_is_the_failure_reward():
    import configs.demo_cpu as demo
    from research.rl.config import RunConfig, RunConfigError

    cfg = demo.get_config("test")
    cfg.rl.failure_reward = -0.5
    assert RunConfig.of(cfg).pipeline().tamper_reward == -0.5
    cfg.rl.tamper_reward = 0.1
    assert RunConfig.of(cfg).pipeline().tamper_reward == 0.1
    cfg.tasks.undeclared_inputs = "lenient"
    with pytest.raises(RunConfigError, match="undeclared_inputs"):
        RunConfig.of(cfg)


def _task(root, name, check):
    d = root / name
    (d / "reward").mkdir(parents=True)
    (d / "input_files").mkdir()
    (d / "input_files" / "in.txt").write_text("3\n")
    (d / "data_entry.json").write_text(json.dumps({"task_id": name, "user_query": "Double in.txt into out.txt."}))
    (d / "reward" / "reward.sh").write_text(f'cd "$(dirname "$0")/.." || exit 1\n{check}\n')
    return d


@pytest.mark.parametrize("check,ok,untouched", [
    ('[ "$(cat out.txt 2>/dev/null)" = 6 ] && echo 1.0 || echo 0.0', True, 0.0),
    ("cat out.txt > /dev/null && echo 0.0", False, None),  # errs on the untouched workspace (no out.txt)
    ("echo 1.0", False, 1.0)])  # pays for doing nothing
def test_validation_needs_the_untouched_workspace_to_grade_cleanly_below_one(tmp_path, check, ok, untouched):
    v = asyncio.run(validate_task(get_backend("bwrap"), _task(tmp_path, "t", "set -e\n" + check)))
    assert v.ok is ok and v.untouched_reward == untouched and not v.has_solution, v


def test_a_task_source_is_validated_when_it_loads_and_cached(tmp_path):
    """keep_valid (config.tasks.validate, on in the demo and the Qwen3 configs) leaves out the tasks whose checker
    errs on, or pays for, the untouched workspace, and grades each task content once."""
    from harness_env.tasks.validate import keep_valid

    good = _task(tmp_path, "good", '[ "$(cat out.txt 2>/dev/null)" = 6 ] && echo 1.0 || echo 0.0')
    errs = _task(tmp_path, "errs", "set -e\ncat out.txt > /dev/null\necho 0.0")
    pays = _task(tmp_path, "pays", "echo 1.0")
    backend, cache = get_backend("bwrap"), tmp_path / "cache"
    kept, dropped = asyncio.run(keep_valid(backend, [good, errs, pays], cache=cache))
    assert kept == [good] and set(dropped) == {"errs", "pays"}, dropped
    assert "errs on the untouched workspace" in dropped["errs"] and "scores 1.0" in dropped["pays"]
    assert len(list(cache.iterdir())) == 3
    (pays / "reward" / "reward.sh").write_text("echo 0.0\n")  # a changed task is graded again
    kept, _ = asyncio.run(keep_valid(backend, [good, errs, pays], cache=cache))
    assert kept == [good, pays] and len(list(cache.iterdir())) == 4
