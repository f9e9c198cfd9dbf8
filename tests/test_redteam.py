"""The red-team suite (harness_env/redteam.py) in CI: every adversarial policy, on bwrap and on docker, ends with
the failure reward IN the training batch (the attacks that fail the rollout are attributed to the policy and
scored; none is dropped), and each defence, switched off alone, lets its attack through."""

import asyncio
import pathlib

import pytest

from harness_env import redteam
from harness_env.runner import Runner
from harness_env.sandbox import get_backend
from harness_env.tasks import loader, sanitize


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer_dir):
    from research.models.tokenizer import load_tokenizer

    return load_tokenizer(qwen3_tokenizer_dir)


REWARD_TIMEOUT_S = 20.0  # the checker's timeout in these runs (unless a test passes its own)


def _suite(root: pathlib.Path, tok, backend_name: str, names=None, **kw):
    backend = get_backend(backend_name)
    ok, why = backend.available()
    assert ok, why
    kw.setdefault("reward_timeout_s", REWARD_TIMEOUT_S)
    return asyncio.run(redteam.run_attacks(root, tok, backend, names, **kw))


@pytest.fixture(scope="module")
def bwrap_root(tmp_path_factory):
    return tmp_path_factory.mktemp("redteam")


@pytest.fixture(scope="module")
def bwrap_run(bwrap_root, tok):
    names = [a.name for a in redteam.ATTACKS] + [redteam.LEGIT_LINK.name]
    results, calls = _suite(bwrap_root, tok, "bwrap", names)
    legit = results.pop(redteam.LEGIT_LINK.name)
    assert legit.status == "ok" and legit.reward == 1.0 and "links" not in legit.meta["sanitized"], legit.meta
    return results, calls


def _check_all_defended(results, calls):
    report = redteam.assess(results, calls)
    assert len(report) == len(redteam.ATTACKS) >= 12
    for a in redteam.ATTACKS:
        r = report[a.name]
        assert r["status"] == a.status, (a.name, r)
        assert r["in_batch"] and r["reward"] == redteam.FAILURE_REWARD and not r["sheltered"], (a.name, r)
        if a.status != "ok":
            assert r["cause"] == "policy", (a.name, r)
        # nothing holds the checker until its timeout: one that did would take REWARD_TIMEOUT_S or more
        assert r["reward_s"] < REWARD_TIMEOUT_S / 2, (a.name, r)
    return report


def test_every_attack_is_in_the_batch_with_the_failure_reward_bwrap(bwrap_run, bwrap_root):
    from harness_env.sandbox.base import OUTPUT_CAP

    report = _check_all_defended(*bwrap_run)
    assert report["empty_inputs"]["grade"] == 1.0  # the checker was fooled; the tamper rule scored it 0
    # the harness wrote 1 GB to its stdout (the pipe to the host): the host kept and saved its last MiB only
    log = bwrap_root / "run" / "rollouts" / bwrap_run[0]["stdout_flood"].rollout_id / "logs" / "stdout.txt"
    assert 0 < log.stat().st_size <= OUTPUT_CAP, log.stat().st_size


@pytest.mark.docker
def test_every_attack_is_in_the_batch_with_the_failure_reward_docker(tmp_path, tok):
    _check_all_defended(*_suite(tmp_path, tok, "docker"))


REMOVED = {"rel_link": ("links", ["largest.txt"]), "abs_link": ("links", ["largest.txt"]),
           "dir_link": ("links", ["largest.txt", "r"]),  # both resolve into reward/
           "outside_link": ("links", ["largest.txt"]), "fifo": ("special", ["largest.txt"]),
           "sparse_tb": ("oversize", ["largest.txt"])}


def test_what_the_sanitizer_removed_is_on_record(bwrap_run):
    results, _ = bwrap_run
    for name, (kind, paths) in REMOVED.items():
        assert results[name].meta["sanitized"][kind] == paths, (name, results[name].meta["sanitized"])
    assert results["chmod"].meta["sanitized"]["modes"] >= 2  # the workspace and largest.txt readable again


def test_without_attribution_the_policys_failures_are_sheltered(bwrap_run):
    report = redteam.assess(*bwrap_run, scored_causes=())
    sheltered = sorted(n for n, r in report.items() if r["sheltered"])
    assert sheltered == ["break_checker", "kill_harness"], sheltered  # dropped: no negative advantage


def test_without_the_tamper_rule_emptied_inputs_pay(bwrap_run):
    report = redteam.assess(*bwrap_run, tamper_reward=None)
    assert report["empty_inputs"]["reward"] == 1.0
    assert bwrap_run[0]["empty_inputs"].meta["tampered"] == ["sales.csv"]


@pytest.mark.parametrize("rule,attack,broken", [
    ("links", "rel_link", "pays"), ("special", "fifo", "reward_error"), ("oversize", "sparse_tb", "reward_error"),
    ("modes", "chmod", "reward_error")])
def test_each_sanitizer_rule_alone_stops_its_attack(tmp_path, tok, monkeypatch, rule, attack, broken):
    """With one rule switched off (the others on), its attack pays or breaks grading (a FIFO holds the checker
    until the reward timeout, a sparse terabyte kills it, a chmod makes it fail)."""
    monkeypatch.setattr(sanitize, "RULES", tuple(r for r in sanitize.RULES if r != rule))
    results, _ = _suite(tmp_path, tok, "bwrap", [attack], reward_timeout_s=5.0)
    r = results[attack]
    if broken == "pays":
        assert r.status == "ok" and r.reward == 1.0, (r.status, r.reward, r.message)
    else:
        assert r.status == "reward_error", (r.status, r.reward, r.message)


@pytest.mark.parametrize("fresh_home,nousersite,pays", [(False, False, True), (True, False, False),
                                                        (False, True, False)])
def test_fresh_home_and_nousersite_each_stop_usercustomize_alone(tmp_path, tok, monkeypatch, fresh_home,
                                                                 nousersite, pays):
    """The two defences are redundant on purpose; each is tested alone, so removing one fails CI."""
    if not fresh_home:  # the verifier gets the agent's HOME
        import dataclasses

        orig = Runner.verifier_spec
        monkeypatch.setattr(Runner, "verifier_spec", lambda self, spec, task, ws: dataclasses.replace(
            orig(self, spec, task, ws), home=ws.parent / "home"))
    if not nousersite:
        monkeypatch.delitem(loader.VERIFIER_ENV, "PYTHONNOUSERSITE")
    results, _ = _suite(tmp_path, tok, "bwrap", ["usercustomize"])
    r = results["usercustomize"]
    assert r.status == "ok" and r.reward == (1.0 if pays else 0.0), (r.status, r.reward, r.message)


OLD_HIDDEN = """import sys
sys.path.insert(0, ".")
import mathlib
assert [n for n in range(-3, 60) if mathlib.is_prime(n)][:3] == [2, 3, 5]
assert [mathlib.factorial(n) for n in range(4)] == [1, 1, 2, 6]
"""
OLD_CHECK = """import os, subprocess, sys
hidden = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hidden_test.py")
print(float(subprocess.run([sys.executable, hidden], capture_output=True).returncode == 0))
"""


def test_a_checker_that_trusts_an_exit_status_is_fooled_and_validation_says_so(tmp_path, tok):
    """The guard of fix_module_tests (compare returned values, never an exit status), switched off: the same
    exit stub scores 1.0 through the rollout path, and `validate` flags the task `exit_fooled`."""
    from harness_env.tasks.validate import validate_task

    tasks = redteam.build_tasks(tmp_path / "tasks")
    (tasks["fix_module_tests"] / "reward" / "hidden_test.py").write_text(OLD_HIDDEN)
    (tasks["fix_module_tests"] / "reward" / "check.py").write_text(OLD_CHECK)
    results, _ = _suite(tmp_path, tok, "bwrap", ["exit_stub"])
    assert results["exit_stub"].reward == 1.0, results["exit_stub"].message
    v = asyncio.run(validate_task(get_backend("bwrap"), tasks["fix_module_tests"]))
    assert v.exit_fooled is True and "exit_fooled" in v.flags and not v.ok, v
    from harness_env.tasks import LIBRARY

    v = asyncio.run(validate_task(get_backend("bwrap"), LIBRARY / "fix_module_tests"))
    assert v.exit_fooled is False and v.ok and v.flags == {}, v


def test_without_the_output_cap_the_host_holds_the_whole_flood(tmp_path, tok, monkeypatch):
    """The stdout flood, 50 MB here: with TailBuffer's cap switched off the host keeps (and saves) all of it;
    with the cap (the suite above, 1 GB) it keeps the last MiB."""
    from harness_env.sandbox import base

    monkeypatch.setitem(redteam.BY_NAME, "flood_50m", redteam.Attack(
        "flood_50m", "hello", ("yes | head -c 50000000 > /proc/$PPID/fd/1; echo flooded",), "ok", "output caps"))
    monkeypatch.setattr(base.TailBuffer.__init__, "__defaults__", (1 << 40,))
    monkeypatch.setattr(base.decode, "__defaults__", (1 << 40,))
    results, _ = _suite(tmp_path, tok, "bwrap", ["flood_50m"])
    log = tmp_path / "run" / "rollouts" / results["flood_50m"].rollout_id / "logs" / "stdout.txt"
    assert log.stat().st_size >= 50_000_000, log.stat().st_size


def test_without_the_disk_cap_the_workspace_takes_what_the_policy_writes(tmp_path, tok):
    results, _ = _suite(tmp_path, tok, "bwrap", ["fill_disk"], workspace_mb=None, keep_workspaces=True)
    r = results["fill_disk"]
    big = tmp_path / "run" / "rollouts" / r.rollout_id / "workspace" / "big"
    assert r.status == "ok" and big.stat().st_size == 200 << 20, (r.status, r.message)  # on the host's disk


@pytest.mark.parametrize("clearenv,fixed_launch_env,pays", [(False, False, True), (True, False, False),
                                                            (False, True, False)])
def test_clearenv_and_the_fixed_launch_env_each_keep_the_orchestrators_env_out_alone(tmp_path, tok, monkeypatch,
                                                                                    clearenv, fixed_launch_env, pays):
    """An orchestrator whose environment carries PYTHONPATH into the workspace (where the policy plants a
    sitecustomize): bwrap is started with a fixed environment AND runs the command with --clearenv; each alone
    keeps that PYTHONPATH from the checker, with both off the planted module prints the score."""
    from harness_env.sandbox import bwrap

    monkeypatch.setattr(bwrap, "CLEAR_ENV", clearenv)
    if not fixed_launch_env:
        monkeypatch.setattr(bwrap, "LAUNCH_ENV", {**bwrap.LAUNCH_ENV, "PYTHONPATH": redteam.HOSTILE_PYTHONPATH})
    results, _ = _suite(tmp_path, tok, "bwrap", ["pythonpath_hook"])
    r = results["pythonpath_hook"]
    assert r.status == "ok" and r.reward == (1.0 if pays else 0.0), (r.status, r.reward, r.message)
