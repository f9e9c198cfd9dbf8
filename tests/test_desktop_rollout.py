"""Desktop tasks through the rollout runner (harness_env/desktop/rollout.py): the runner starts the task's desktop
(Xvfb, openbox, the real app) in the agent's sandbox, the harness runs with its DISPLAY, the final screen is kept
with the rollout and the desktop is torn down before grading. The agent here is the reference agent with a shell,
its scripted policy running the task's plan as xdotool commands (`plan.shell_script`): the plan scores 1.0,
the plausible mistake 0.0 and doing nothing 0.0, all through the same runner, in bwrap and docker."""

import json
import shutil

import pytest
from rollout_kit import logs_of, run_rollouts

from harness_env.desktop.plan import shell_script
from harness_env.desktop.rollout import FINAL_SHOT, desktop_spec
from harness_env.harnesses.base import get_harness
from harness_env.harnesses.scripted import scripted_reply
from harness_env.runner import RolloutSpec
from harness_env.sandbox import get_backend
from harness_env.tasks import desktop_family as F
from harness_env.tasks.loader import load_task

pytestmark = [pytest.mark.slow, pytest.mark.harness]
TOOLS = ("Xvfb", "xdotool", "xwd", "openbox", "dbus-daemon", "mousepad")


def _policy(tok, plans: dict[str, list[dict] | None], workspace: str):
    """Per task query: one shell call running its plan (None: no call), then a final answer."""
    from research.serving.replay import ReplayEngine

    ref = get_harness("reference")

    def reply(req) -> str:  # noqa: ANN001
        prompt = tok.decode(list(req.prompt_ids))
        plan = next((p for q, p in plans.items() if q in prompt), None)
        commands = [] if plan is None else [shell_script(plan, workspace)]
        return scripted_reply(ref, commands, "Done.", prompt)

    return ReplayEngine(reply, tok)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend_name", ["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def test_runner_starts_the_desktop_and_grades_what_the_app_saved(tmp_path, qwen3_tokenizer_dir, backend_name):
    from research.models.tokenizer import load_tokenizer

    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"desktop tools not installed: {missing} (.ci/setup.d/45-desktop.sh)")
    ok, why = get_backend(backend_name).available()
    if not ok:
        pytest.skip(why)
    tok = load_tokenizer(qwen3_tokenizer_dir)
    dirs = {k: F.write_task(tmp_path / k, "mousepad_append_line", i) for k, i in (("plan", 0), ("wrong", 1),
                                                                                  ("nothing", 2))}
    tasks = {k: load_task(d) for k, d in dirs.items()}
    assert all(desktop_spec(t.metadata) for t in tasks.values())
    plans = {tasks["plan"].user_query: json.loads((dirs["plan"] / "solution/plan.json").read_text()),
             tasks["wrong"].user_query: json.loads((dirs["wrong"] / "solution/wrong_plan.json").read_text())}
    engine = _policy(tok, plans, tasks["plan"].workspace_dir)
    specs = [RolloutSpec(dirs[k], "reference", 0) for k in ("plan", "wrong", "nothing")]
    backend = None if backend_name == "bwrap" else get_backend(backend_name)
    results, calls = run_rollouts(tmp_path / "run", engine, tok, specs, backend=backend, concurrency=1,
                                  timeout_s=240, max_turns=4)
    by_id = {r.rollout_id: r for r in results}
    rewards = {k: by_id[spec.rollout_id] for k, spec in zip(("plan", "wrong", "nothing"), specs)}
    for k, want in (("plan", 1.0), ("wrong", 0.0), ("nothing", 0.0)):
        r = rewards[k]
        why = f"{k}: {r.status} {r.message}\n{logs_of(tmp_path / 'run', r.rollout_id)}"
        assert (r.status, r.reward) == ("ok", want), why
        d = r.meta["desktop"]
        assert d["apps"] == ["mousepad"] and d.get("final_screenshot") == FINAL_SHOT, d
        shot = tmp_path / "run" / "run" / "rollouts" / r.rollout_id / "logs" / FINAL_SHOT
        assert shot.read_bytes().startswith(b"\x89PNG") and r.timings["desktop_start_s"] > 0
    assert len(by_id) == 3 and len(calls) >= 5  # plan and mistake: a shell call and an answer; nothing: an answer
