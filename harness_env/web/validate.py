"""Checker validation of web tasks without a browser: the site in this process, plans through the mini browser.

`validate(task_dir)` runs the task's site (env/site.json through harness_env/web/site_app.py, the code the task
ships as env/app.py) on a free loopback port three times - reference plan, nothing, plausible mistake - and grades
each final app state with the task's reward.sh exactly as the verifier does (a fresh reward/ holding env_state/).
A valid task scores (1.0, 0.0, 0.0). `python -m harness_env.tasks web --validate` and the tests use it.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import tempfile
import threading

from harness_env.tasks import web_family
from harness_env.tasks.validate import PlanValidation
from harness_env.web import site_app
from harness_env.web.minibrowser import StepError, run_plan

Validation = PlanValidation


def serve(task: pathlib.Path, state: pathlib.Path):
    """The task's site on a free loopback port in this process; returns (server, base URL)."""
    spec = json.loads((task / "env" / "site.json").read_text())
    state.mkdir(parents=True, exist_ok=True)
    handler = site_app.make_handler(site_app.Site(spec, str(state)))
    srv = site_app.http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def grade_state(task: pathlib.Path, state: pathlib.Path, scratch: pathlib.Path) -> tuple[float, dict]:
    """reward.sh run as the verifier runs it: from a fresh reward/ dir holding env_state/."""
    rdir = scratch / "reward"
    shutil.rmtree(rdir, ignore_errors=True)
    shutil.copytree(task / "reward", rdir)
    shutil.copytree(state, rdir / "env_state")
    out = subprocess.run(["/bin/bash", str(rdir / "reward.sh")], capture_output=True, text=True, timeout=60)
    lines = out.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{task.name}: reward.sh printed nothing: {out.stderr[-300:]}")
    subs = json.loads(lines[0])["sub_scores"] if len(lines) > 1 else {}
    return float(lines[-1]), subs


def play(task: pathlib.Path, plan: list[dict] | None, scratch: pathlib.Path) -> float:
    """The reward after running `plan` (None: nothing) on a fresh instance of the task's site."""
    state = scratch / "state"
    shutil.rmtree(state, ignore_errors=True)
    srv, base = serve(task, state)
    try:
        if plan is not None:
            run_plan(base, [dict(s, url=s["url"].replace(web_family.START, base)) if "url" in s else s for s in plan])
    finally:
        srv.shutdown()
        srv.server_close()
    return grade_state(task, state, scratch)[0]


def validate(task: str | pathlib.Path) -> Validation:
    task = pathlib.Path(task)
    tid = json.loads((task / "data_entry.json").read_text())["task_id"]
    plans = {name: json.loads((task / "solution" / name).read_text()) if (task / "solution" / name).is_file() else None
             for name in ("plan.json", "wrong_plan.json")}
    with tempfile.TemporaryDirectory(prefix="hrl-webval-") as tmp:
        scratch = pathlib.Path(tmp)
        try:
            sol = play(task, plans["plan.json"], scratch) if plans["plan.json"] is not None else 0.0
            nothing = play(task, None, scratch)
            wrong = play(task, plans["wrong_plan.json"], scratch) if plans["wrong_plan.json"] is not None else None
        except (StepError, OSError, RuntimeError, ValueError) as e:
            return Validation(tid, 0.0, 0.0, None, f"{type(e).__name__}: {e}")
    return Validation(tid, sol, nothing, wrong)
