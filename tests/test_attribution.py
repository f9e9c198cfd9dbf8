"""Every failed rollout is attributed (harness_env/attribution.py) and the batch trains on exactly the policy's
failures: a policy that kills its own harness or makes the checker fail gets the failure reward, an engine that
fails or a checker broken on the untouched workspace is never held against the policy."""

import json
import pathlib

import pytest
from rollout_kit import per_task_policy, run_rollouts, writable_copy

from harness_env import attribution as A
from harness_env.runner import RolloutSpec
from harness_env.sandbox import Limits, get_backend
from harness_env.tasks import LIBRARY
from research.capture import CallRecord, RolloutResult
from research.data.pipeline import clean_group
from research.data.shards import GroupRecord


def test_the_rule_table():
    assert A.cause_of("ok") == (None, "")
    assert A.cause_of("timeout")[0] == A.cause_of("disk_limit")[0] == A.POLICY
    assert A.cause_of("harness_error", calls=2)[0] == A.POLICY
    assert A.cause_of("harness_error", calls=2, faults=["context_length@3:5000:continued"])[0] == A.POLICY  # its turns
    assert A.cause_of("harness_error", calls=1, faults=["context_length@1:12248:fresh"])[0] == A.INFRA  # mismatch
    assert A.cause_of("harness_error", calls=3, faults=["engine_error@2"])[0] == A.INFRA
    assert A.cause_of("harness_error", calls=0)[0] == A.INFRA  # died before the policy said anything
    assert A.cause_of("harness_error", ran=False, calls=0)[0] == A.INFRA
    assert A.cause_of("reward_error", clean_grade=True)[0] == A.POLICY
    assert A.cause_of("reward_error", clean_grade=False)[0] == A.TASK
    assert A.cause_of("reward_error", clean_grade=None)[0] == A.TASK
    assert A.cause_of("task_error")[0] == A.TASK and A.cause_of("infra_error")[0] == A.INFRA


def _call(rid: str, gid: str) -> CallRecord:
    return CallRecord(rollout_id=rid, session_id="s" + rid, group_id=gid, harness="h", call_index=0,
                      prompt_ids=[1, 2, 3], completion_ids=[4, 5], logprobs=[-0.1, -0.2], weight_version=0,
                      finish_reason="stop")


def test_the_batch_scores_policy_failures_and_drops_the_others():
    results = [RolloutResult("r0", "g", "h", "ok", reward=1.0),
               RolloutResult("r1", "g", "h", "harness_error", meta={"cause": "policy"}),
               RolloutResult("r2", "g", "h", "harness_error", meta={"cause": "infra"}),
               RolloutResult("r3", "g", "h", "reward_error", meta={"cause": "task"}),
               RolloutResult("r4", "g", "h", "timeout", meta={})]  # scored by status (older results: no cause)
    rec = GroupRecord(group_id="g", harness="h", calls=[_call(f"r{i}", "g") for i in range(5)], results=results)
    calls, kept, rejections = clean_group(rec, 100, scored_failures=("timeout",), failure_reward=-0.5,
                                          scored_causes=("policy",))
    assert {r.rollout_id: r.reward for r in kept} == {"r0": 1.0, "r1": -0.5, "r4": -0.5}
    assert sorted(c.rollout_id for c in calls) == ["r0", "r1", "r4"] and len(rejections) == 2
    _, kept, _ = clean_group(rec, 100, scored_failures=("timeout",), scored_causes=())
    assert {r.rollout_id for r in kept} == {"r0", "r4"}  # the old behaviour, on request


CRASHY = """#!/bin/bash
cd "$(dirname "$0")/.." || exit 1
[ -f out.json ] || { echo 0.0; exit 0; }
exec python3 -c 'import json; d = json.load(open("out.json")); print(1.0 if d.get("ok") else 0.0)'
"""


def _task(root: pathlib.Path, name: str, reward_sh: str) -> pathlib.Path:
    d = root / name
    (d / "reward").mkdir(parents=True)
    (d / "data_entry.json").write_text(json.dumps({"task_id": name, "user_query": f"Write out.json ({name}).",
                                                   "metadata": {"category": "test"}}))
    (d / "reward" / "reward.sh").write_text(reward_sh)
    return d


@pytest.fixture(scope="module")
def attributed(tmp_path_factory, qwen3_tokenizer_dir):
    from research.models.tokenizer import load_tokenizer
    from research.serving.replay import ReplayEngine

    ok, why = get_backend("bwrap").available()
    assert ok, why
    tmp = tmp_path_factory.mktemp("attribution")
    tasks = {"killer": writable_copy(LIBRARY / "file_hello", tmp / "tasks" / "killer"),
             "bad_output": _task(tmp / "tasks", "bad_output", CRASHY),
             "broken_checker": _task(tmp / "tasks", "broken_checker", "#!/bin/bash\nexit 3\n"),
             "engine_down": _task(tmp / "tasks", "engine_down", CRASHY)}
    entry = json.loads((tasks["killer"] / "data_entry.json").read_text())
    entry["user_query"] += " (killer)"
    (tasks["killer"] / "data_entry.json").write_text(json.dumps(entry))
    plans = {"(killer)": (["kill -9 $PPID"], "Done."), "(bad_output)": (["echo '{not json' > out.json"], "Done."),
             "(broken_checker)": (["echo '{}' > out.json"], "Done.")}
    tok = load_tokenizer(qwen3_tokenizer_dir)
    scripted = per_task_policy("reference", plans, tok.decode)

    def script(req):  # noqa: ANN001, ANN202
        if "(engine_down)" in tok.decode(list(req.prompt_ids)):
            raise RuntimeError("the engine fell over")
        return scripted(req)

    specs = [RolloutSpec(d, "reference", 0) for d in tasks.values()]
    results, _ = run_rollouts(tmp, ReplayEngine(script, tok), tok, specs, backend=get_backend("bwrap"), concurrency=4,
                              timeout_s=60,
                              limits=Limits(cpus=1.0, memory_mb=1024, wall_s=120))
    return {r.rollout_id.split(".")[0]: r for r in results}


def test_a_harness_the_policy_killed_is_the_policys(attributed):
    r = attributed["killer"]
    assert r.status == "harness_error" and r.meta["cause"] == "policy", (r.status, r.message, r.meta)
    assert r.meta["calls"] >= 1 and "serving_faults" not in r.meta


def test_a_checker_the_policys_output_broke_is_the_policys(attributed):
    r = attributed["bad_output"]
    assert r.status == "reward_error" and r.meta["cause"] == "policy", (r.status, r.message, r.meta)


def test_a_checker_broken_on_the_untouched_workspace_is_the_tasks(attributed):
    r = attributed["broken_checker"]
    assert r.status == "reward_error" and r.meta["cause"] == "task", (r.status, r.message, r.meta)


def test_an_engine_failure_is_the_infrastructures(attributed):
    r = attributed["engine_down"]
    assert r.status == "harness_error" and r.meta["cause"] == "infra", (r.status, r.message, r.meta)
    assert r.meta["serving_faults"], r.meta
