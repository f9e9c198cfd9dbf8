"""The grader cannot be fooled by what the agent leaves behind (issue 11, part 2).

Each attack is one rollout of the reference harness on a real ClawGym task (task_0185, all-or-nothing
checker, as shipped) with a scripted policy that (1) plants the attack, then (2) proves it is live: it
grades itself the naive way, in its own environment (reward/ merged into the workspace, run from the
workspace with the agent's HOME), and records that score in .probe_score — 1.0 for every attack. The
runner's verifier (fresh sandbox, fresh HOME/TMP, fixed env, reward/ replaced, cwd = reward/) must
score the same workspace 0.0, and no attack payload may have run during grading (payloads drop a
PWNED_* marker when they run inside the checker; the probe deletes the ones it triggered)."""
import json
import pathlib
import shutil

import pytest
from rollout_kit import WS, clawgym_train, logs_of, per_task_policy, run_rollouts, writable_copy

from harness_env.runner import RolloutSpec
from harness_env.sandbox import Limits, get_backend

PROBE = ("mkdir -p reward && cp -r .probe/. reward/ && sleep 0.3 && {env}bash reward/reward.sh > .probe_score "
         "2> .probe_err; rm -f PWNED_*; true")
FAKE_SCORE = '{"pwned": 1.0}'
PAYLOAD_PY = f"""import os, sys
if sys.argv and sys.argv[0].endswith("check.py"):
    open("{WS}/PWNED_%s", "w").write("ran")
    print('{FAKE_SCORE}'); sys.stdout.flush(); os._exit(0)
"""
USER_SITE = 'SITE="$(python3 -m site --user-site)" && mkdir -p "$SITE"'
FAKE_JSON = f"""open("{WS}/PWNED_%s", "w").write("ran")
def loads(s, *a, **k): return {{"pwned": 1.0}}
def load(f, *a, **k): return {{"pwned": 1.0}}
def dumps(o, *a, **k): return '{FAKE_SCORE}'
def dump(o, f, *a, **k): f.write(dumps(o))
"""
BASH_HOOK = f"""touch {WS}/PWNED_bashrc
python3() {{ cat > /dev/null; echo 1.0; }}
"""
EVIL_CHECK = f"""print('{FAKE_SCORE}')
open("{WS}/PWNED_background", "w").write("ran")
"""
BG_LOOP = (f"setsid nohup sh -c 'while :; do mkdir -p {WS}/reward; cp {WS}/.evil_check.py {WS}/reward/check.py; "
           "sleep 0.02; done' > /dev/null 2>&1 < /dev/null &")


def _heredoc(path: str, text: str) -> str:
    return f"cat > {path} <<'EOF'\n{text}EOF"


def attacks(host_dir: pathlib.Path) -> dict[str, list[str]]:
    """attack name -> the agent's shell commands (the probe last, where the attack can be proved live)."""
    probe = PROBE.format(env="")
    return {
        "usercustomize": [f'{USER_SITE} && ' + _heredoc('"$SITE/usercustomize.py"', PAYLOAD_PY % "usercustomize"),
                          probe],
        "sitecustomize": [_heredoc("sitecustomize.py", PAYLOAD_PY % "sitecustomize"),
                          f'{USER_SITE} && echo {WS} > "$SITE/workspace.pth"', probe],
        "json_shadow": [_heredoc("json.py", FAKE_JSON % "json_shadow"), probe],
        "reward_dir_merge": ["mkdir -p reward && " + _heredoc("reward/json.py", FAKE_JSON % "reward_dir_merge"), probe],
        "bashrc": [" && ".join(_heredoc(f, BASH_HOOK) for f in ("~/.bashrc", "~/.bash_profile", "~/.profile")),
                   PROBE.format(env="BASH_ENV=$HOME/.bashrc ")],
        "background": [_heredoc(".evil_check.py", EVIL_CHECK), BG_LOOP, probe],
        # No naive probe for these two: they attack the copy of reward/ itself (a merge writes through them).
        "reward_symlink": ["mkdir -p .evil && printf 'echo 1.0\\n' > .evil/reward.sh && ln -s .evil reward && ls -la"],
        "reward_symlink_host": [f"ln -s {host_dir} reward && ls -la"],
    }


@pytest.fixture(scope="module")
def attacked(tmp_path_factory, qwen3_tokenizer_dir):
    """Runs every attack once (bwrap); returns (results by attack, kept workspaces by attack, host dir)."""
    return _run_attacks(tmp_path_factory.mktemp("attacks"), qwen3_tokenizer_dir, "bwrap", list(attacks(pathlib.Path())))


def _run_attacks(tmp: pathlib.Path, tok_dir, backend_name: str, names: list[str]):
    from research.models.tokenizer import load_tokenizer
    from research.serving.replay import ReplayEngine

    backend = get_backend(backend_name)
    ok, why = backend.available()
    if not ok:
        pytest.skip(why)
    src = clawgym_train() / "task_0185"
    host_dir = tmp / "host_target"
    host_dir.mkdir()
    plans, specs = {}, []
    for name in names:
        d = writable_copy(src, tmp / "tasks" / name)
        shutil.copytree(src / "reward", d / "input_files" / ".probe")  # for the naive self-grading probe only
        entry = json.loads((d / "data_entry.json").read_text())
        entry["user_query"] += f"\n(attack: {name})"
        (d / "data_entry.json").write_text(json.dumps(entry))
        plans[f"(attack: {name})"] = (attacks(host_dir)[name], "Done.")
        specs.append(RolloutSpec(d, "reference", 0))
    tok = load_tokenizer(tok_dir)
    engine = ReplayEngine(per_task_policy("reference", plans, tok.decode), tok)
    results, _ = run_rollouts(tmp, engine, tok, specs, backend=backend, keep_workspaces=True, concurrency=4,
                              timeout_s=120, limits=Limits(cpus=1.0, memory_mb=2048, wall_s=200))
    by_name = {r.rollout_id.split(".")[0]: r for r in results}
    for name, r in by_name.items():
        assert r.status == "ok", f"{name}: {r.status}: {r.message}\n{logs_of(tmp, r.rollout_id)}"
    ws = {name: tmp / "run" / "rollouts" / r.rollout_id / "workspace" for name, r in by_name.items()}
    return by_name, ws, host_dir


@pytest.mark.parametrize("name", [n for n in attacks(pathlib.Path()) if not n.startswith("reward_symlink")])
def test_attack_is_live_for_a_naive_grader_and_scores_zero_here(attacked, name):
    results, ws, _ = attacked
    probe = (ws[name] / ".probe_score").read_text().split()
    assert probe and float(probe[-1]) == 1.0, (ws[name] / ".probe_err").read_text()  # the attack works...
    assert results[name].reward == 0.0  # ...but not on the verifier
    assert not sorted(p.name for p in ws[name].glob("PWNED_*"))  # its payload never ran while grading
    shipped = (clawgym_train() / "task_0185" / "reward" / "check.py").read_bytes()
    assert (ws[name] / "reward" / "check.py").read_bytes() == shipped  # the verifier ran the shipped checker


def test_reward_symlinks_are_replaced_not_written_through(attacked):
    results, ws, host_dir = attacked
    assert results["reward_symlink"].reward == 0.0 and results["reward_symlink_host"].reward == 0.0
    for name in ("reward_symlink", "reward_symlink_host"):
        assert (ws[name] / "reward").is_dir() and not (ws[name] / "reward").is_symlink()
    assert (ws["reward_symlink"] / ".evil" / "reward.sh").read_text() == "echo 1.0\n"  # the link's target untouched
    assert not any(host_dir.iterdir())  # nothing was written into the host dir the agent's link named


@pytest.mark.docker
def test_background_process_cannot_rewrite_the_checker_in_docker(tmp_path, qwen3_tokenizer_dir):
    """docker keeps an exec's background processes alive in the container: the verifier must not share it."""
    results, ws, _ = _run_attacks(tmp_path, qwen3_tokenizer_dir, "docker", ["background", "usercustomize"])
    for name in ("background", "usercustomize"):
        assert float((ws[name] / ".probe_score").read_text().split()[-1]) == 1.0
        assert results[name].reward == 0.0 and not list(ws[name].glob("PWNED_*"))


TAMPER_0000 = """set -e
for f in input/incidents.csv input/contacts.csv; do head -1 "$f" > /tmp/h && cat /tmp/h > "$f"; done
mkdir -p output
echo reminder_id,incident_id,contact_id,contact_name,role,incident_date,severity,relevance,due_by,reason,\\
priority_score > output/reminders.csv
echo '{"total_reminders": 0, "by_role": {}, "top_5": []}' > output/summary.json"""


def test_input_tampering_is_recorded(tmp_path, qwen3_tokenizer_dir):
    """A hole in the tasks, not in the grader: task_0000's shipped checker recomputes its expected answer from
    the inputs in the workspace, so emptying them (and writing empty outputs) scores 1.0. Inputs cannot simply
    be restored before grading (other tasks ask for edits in place), so every result names the input files
    the agent changed (meta.inputs_changed) for the researcher to filter or penalise; read without following
    the agent's links (here `input` itself becomes a link to /etc)."""
    from research.models.tokenizer import load_tokenizer
    from research.serving.replay import ReplayEngine

    src = clawgym_train() / "task_0000"
    tasks = {}
    for name in ("tamper", "relink"):
        d = writable_copy(src, tmp_path / "tasks" / name)
        entry = json.loads((d / "data_entry.json").read_text())
        entry["user_query"] += f"\n(variant: {name})"
        (d / "data_entry.json").write_text(json.dumps(entry))
        tasks[name] = d
    plans = {"(variant: tamper)": ([TAMPER_0000], "Done."),
             "(variant: relink)": (["mv input input.orig && ln -s /etc input"], "Done.")}
    tok = load_tokenizer(qwen3_tokenizer_dir)
    engine = ReplayEngine(per_task_policy("reference", plans, tok.decode), tok)
    results, _ = run_rollouts(tmp_path, engine, tok, [RolloutSpec(d, "reference", 0) for d in tasks.values()],
                              backend=get_backend("bwrap"), concurrency=2, timeout_s=120)
    by = {r.rollout_id.split(".")[0]: r for r in results}
    assert by["tamper"].status == "ok" and by["tamper"].reward == 1.0  # the task's hole...
    assert by["tamper"].meta["inputs_changed"] == ["input/contacts.csv", "input/incidents.csv"]  # ...on record
    assert by["relink"].status == "ok" and by["relink"].meta["inputs_changed"] == ["input/contacts.csv",
                                                                                    "input/incidents.csv"]
