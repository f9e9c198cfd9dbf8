"""The task library's checkers really check; loader errors; the make_file family; synthesis."""
import asyncio
import json

import pytest

from harness_env.sandbox import get_backend
from harness_env.tasks import LIBRARY, RewardError, TaskError, discover, family, load_task, parse_reward, synth
from harness_env.tasks.validate import run_solution, validate_task

TASKS = discover(LIBRARY)


@pytest.fixture(scope="module")
def bwrap():
    b = get_backend("bwrap")
    ok, why = b.available()
    if not ok:
        pytest.skip(why)
    return b


def test_library_has_a_dozen_tasks_in_several_categories():
    tasks = [load_task(p) for p in TASKS]
    assert len(tasks) >= 12
    assert {"file_ops", "text", "csv", "json", "code", "chat"} <= {t.category for t in tasks}
    assert len({t.task_id for t in tasks}) == len(tasks)


@pytest.mark.parametrize("task_dir", TASKS, ids=[p.name for p in TASKS])
def test_reference_solution_scores_one_and_doing_nothing_does_not(bwrap, task_dir):
    task = load_task(task_dir)
    v = asyncio.run(validate_task(bwrap, task_dir))
    assert v.solution_reward == 1.0, v
    assert v.empty_reward == 0.0, v
    assert v.ok and v.untouched_reward < 1.0 and v.flags == {} and v.exit_fooled in (None, False), v
    untouched = asyncio.run(run_solution(bwrap, task, solve=False))  # inputs present, nothing done
    assert untouched == v.untouched_reward


def test_loader_errors_name_the_problem(tmp_path):
    with pytest.raises(TaskError, match="no data_entry.json"):
        load_task(tmp_path)
    (tmp_path / "data_entry.json").write_text(json.dumps({"task_id": "x", "user_query": "q"}))
    with pytest.raises(TaskError, match="no reward/reward.sh"):
        load_task(tmp_path)
    (tmp_path / "reward").mkdir()
    (tmp_path / "reward" / "reward.sh").write_text("echo 1\n")
    (tmp_path / "data_entry.json").write_text(json.dumps({"task_id": "x", "user_query": ""}))
    with pytest.raises(TaskError, match="user_query"):
        load_task(tmp_path)
    (tmp_path / "data_entry.json").write_text(json.dumps({"task_id": "x", "user_query": "q",
                                                           "input_mount_dir": "/etc"}))
    with pytest.raises(TaskError, match="input_mount_dir"):
        load_task(tmp_path)
    (tmp_path / "data_entry.json").write_text(json.dumps({"task_id": "x", "user_query": "q",
                                                           "input_mount_dir": "/srv/job/ws/"}))
    assert load_task(tmp_path).workspace_dir == "/srv/job/ws"


def test_parse_reward():
    assert parse_reward('{"sub_scores": {"a": 1, "b": 0}}\n0.5\n') == (0.5, {"a": 1.0, "b": 0.0})
    assert parse_reward("noise\n1\n\n") == (1.0, {})
    for bad, msg in (("", "nothing"), ("ok\n", "not a float"), ("1.5\n", "outside"), ("nan\n", "outside")):
        with pytest.raises(RewardError, match=msg):
            parse_reward(bad)


def test_family_split_is_deterministic_and_words_are_shared():
    train, held = family.pairs("train"), family.pairs("heldout")
    assert len(train) + len(held) == len(family.NAMES) * len(family.WORDS)
    assert not set(train) & set(held) and 0.1 < len(held) / (len(train) + len(held)) < 0.3
    assert {w for _, w in held} <= {w for _, w in train}
    assert family.pairs("heldout") == held


def test_family_task_checker(bwrap, tmp_path):
    d = family.generate(tmp_path, "heldout", n=1, seed=3)[0]
    task = load_task(d)
    assert task.metadata["split"] == "heldout" and task.category == "make_file"
    assert asyncio.run(run_solution(bwrap, task)) == 1.0
    assert asyncio.run(run_solution(bwrap, task, solve=False)) == 0.0


@pytest.mark.parametrize("mistake", ["", "literal", "period", "cut"])
def test_family_experts_score_as_designed(tmp_path, mistake):
    """Each expert's command, run by bash in the task folder and graded by the task's own checker: 1.0
    where the expert is right, 0.3 (the file with the wrong content) on its mistaken tasks."""
    import subprocess

    pairs = family.pairs("all")[::9]
    assert {family.literal_mistake(*p) for p in pairs} == {True, False}
    for name, word in pairs:
        d = family.write_task(tmp_path / mistake, name, word)
        reply = family.oracle_reply(load_task(d).user_query, mistake=mistake)
        command = json.loads(reply.split("\n")[1])["arguments"]["command"]
        assert command == family.expert_command(name, word, mistake)
        subprocess.run(["bash", "-c", command], cwd=d, check=True)
        got = float(subprocess.run(["bash", "reward/reward.sh"], cwd=d, capture_output=True, text=True).stdout)
        assert got == (0.3 if mistake and family.literal_mistake(name, word) else 1.0), (mistake, command, got)
    with pytest.raises(ValueError, match="mistake 'typo'"):
        family.expert_command("a.txt", "apple", "typo")


def test_synthesis_is_deterministic_and_validated(bwrap, tmp_path):
    seeds = [p for p in TASKS if synth.is_seed(p)]
    assert {p.name for p in seeds} >= {"file_hello", "csv_region_totals", "file_rename", "file_find_largest"}
    a = synth.make_variant(LIBRARY / "csv_region_totals", tmp_path / "a", 1, seed=7)
    b = synth.make_variant(LIBRARY / "csv_region_totals", tmp_path / "b", 1, seed=7)
    c = synth.make_variant(LIBRARY / "csv_region_totals", tmp_path / "c", 2, seed=7)
    csv = lambda d: (d / "input_files" / "sales.csv").read_text()
    assert csv(a) == csv(b) and csv(a) != csv(c)
    kept, failed = asyncio.run(synth.synthesize(bwrap, seeds, tmp_path / "out", per_seed=3, seed=1))
    assert not failed and len(kept) == 3 * len(seeds)
    hello = [load_task(k) for k in kept if "file_hello" in k.name]
    assert len({json.dumps(t.metadata["params"]) for t in hello}) >= 2  # parameters really vary
    for t in hello:  # the query and the checker changed together
        assert t.metadata["params"]["filename"] in t.user_query
        assert t.metadata["params"]["text"] in (t.root / "reward" / "check.py").read_text()
    for t in [load_task(k) for k in kept if "file_rename" in k.name]:  # input file names follow the parameters
        assert (t.input_dir / t.metadata["params"]["src"]).is_file() and t.metadata["params"]["src"] in t.user_query


def test_family_classify_answer_reads_form_name_and_word():
    def reply(cmd):
        return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": cmd}}) + "\n</tool_call>"

    right = family.expert_command("notes.txt", "apple", "")
    cut = "echo the word apple | cut -d' ' -f3 > notes.txt"
    assert family.classify_answer(reply(cut), "notes.txt", "apple") == {"form": "cut", "name_ok": True, "word_ok": True}
    assert family.classify_answer(reply(right), "notes.txt", "apple")["form"] == "echo"
    assert family.classify_answer(reply("echo the word apple > result.txt"), "notes.txt", "apple") == \
        {"form": "echo", "name_ok": False, "word_ok": True}
    assert family.classify_answer(reply("echo the word river | cut -d' ' -f3 >notes.txt"), "notes.txt", "apple") == \
        {"form": "cut", "name_ok": True, "word_ok": False}
    nothing = {"form": "other", "name_ok": False, "word_ok": False}
    for bad in ("Done.", reply("ls -la"), "<tool_call>\n{not json\n</tool_call>"):
        assert family.classify_answer(bad, "notes.txt", "apple") == nothing


def test_audit_flags_checkers_by_their_syntax_and_selection_can_exclude_them(tmp_path):
    from harness_env.tasks import select_tasks
    from harness_env.tasks.audit import audit, flags_of

    def task(name, files, metadata=None):
        d = tmp_path / "set" / name
        (d / "reward").mkdir(parents=True)
        (d / "data_entry.json").write_text(json.dumps({"task_id": name, "user_query": "q", "metadata": metadata or {}}))
        for rel, text in files.items():
            (d / "reward" / rel).write_text(text)
        return d

    runs = task("runs", {"check.py": "import json\nimport subprocess\nsubprocess.run(['python3', 'sol.py'])\n"})
    reads = task("reads", {"check.py": "from pathlib import Path\np = Path('.') / 'input' / 'a.csv'\n"})
    words = task("words", {"check.py": "msg = 'never call subprocess or read input/ here'\nprint(1.0)\n",
                           "expected.txt": "42\n"})
    shell = task("shell", {"reward.sh": "cd \"$(dirname \"$0\")/..\"\npython3 solution.py > out.txt\n"})
    assert flags_of(runs) == {"executes_code": "check.py:2: import subprocess"}
    assert set(flags_of(reads)) == {"reads_inputs"} and flags_of(reads)["reads_inputs"].startswith("check.py:2:")
    assert flags_of(words) == {"ships_answer_files": "expected.txt"}  # words in a string are no finding
    assert set(flags_of(shell)) == {"executes_code"}
    guarded = task("guarded", {"check.py": "import subprocess\n"}, {"agent_code_guard": "compares returned values"})
    assert flags_of(guarded) == {}  # declared, and proved by validation's exit-stub probe (tests/test_redteam.py)
    (words / "env").mkdir()
    assert flags_of(words) == {}  # a web task's checker reads the app's state, never a workspace file
    (words / "env").rmdir()
    from harness_env.tasks import web_family

    own_sets = (discover(LIBRARY), family.generate(tmp_path / "fam", "all"), web_family.generate(tmp_path / "w", "all"))
    for own in own_sets:
        assert audit(own)["any"] == 0  # the project's own tasks carry no flag
    guarded_dir = guarded.parent.parent / "guarded"
    guarded.rename(guarded_dir)
    r = audit([runs, reads, words, shell])
    assert r["counts"] == {"executes_code": 2, "reads_inputs": 1, "ships_answer_files": 1} and r["any"] == 4
    kept = select_tasks(str(tmp_path / "set"), exclude_flags=("executes_code",))
    assert sorted(d.name for d in kept) == ["reads", "words"]
    with pytest.raises(TaskError, match="exclude_flags"):
        select_tasks(str(tmp_path / "set"), exclude_flags=("nonsense",))
