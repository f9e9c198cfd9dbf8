"""Checker validation of desktop tasks: each plan through the real apps in a real sandbox, graded as the verifier.

`validate(task_dir, backend)` plays the task three times, each in a fresh sandbox over a fresh copy of
input_files/ with a fresh desktop (the task's apps, harness_env/desktop/session.py): the reference plan, nothing,
the plausible mistake. After each, the desktop is torn down (so only what the apps saved remains), reward/ is
copied into the workspace and reward.sh runs there, as the verifier runs it. A valid task scores (1.0, 0.0, 0.0).
Why real apps and not a simulation: the checker is only trustworthy if the files it reads are the ones the
applications really write (Mousepad's trailing newline, PCManFM's moves, Gnumeric's XML), so it is validated
against exactly those. `python -m harness_env.desktop.validate DIR...` (or `--generate OUT [--split S
--per-template N]`) prints one JSON line per task and exits 1 if any is invalid.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from harness_env.desktop.plan import run_plan
from harness_env.desktop.session import DesktopError, DesktopSession
from harness_env.sandbox import Backend, SandboxSpec, get_backend
from harness_env.tasks import desktop_family
from harness_env.tasks.validate import PlanValidation


@dataclasses.dataclass
class Validation(PlanValidation):
    seconds: dict = dataclasses.field(default_factory=dict)  # wall seconds of each play
    peak_kib: dict = dataclasses.field(default_factory=dict)  # peak RSS per process name, the largest over plays


def grade(task: pathlib.Path, workspace: pathlib.Path) -> tuple[float, dict]:
    """reward.sh run from reward/ copied into the final workspace (the verifier's layout)."""
    rdir = workspace / "reward"
    shutil.rmtree(rdir, ignore_errors=True)
    shutil.copytree(task / "reward", rdir)
    out = subprocess.run(["/bin/bash", str(rdir / "reward.sh")], capture_output=True, text=True, timeout=60)
    lines = out.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{task.name}: reward.sh printed nothing: {out.stderr[-300:]}")
    return float(lines[-1]), json.loads(lines[0])["sub_scores"] if len(lines) > 1 else {}


async def play(task: pathlib.Path, plan: list[dict] | None, backend: Backend, scratch: pathlib.Path,
               stats: dict | None = None) -> float:
    """The reward after `plan` (None: nothing) in a fresh sandbox + desktop over a fresh copy of the inputs."""
    entry = json.loads((task / "data_entry.json").read_text())
    desk = entry["metadata"]["desktop"]
    ws, home = scratch / "workspace", scratch / "home"
    for d in (ws, home):
        shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(task / "input_files", ws)
    home.mkdir()
    sbx = await backend.create(SandboxSpec(workspace=ws, home=home, name=entry["task_id"], shim=False))
    async with sbx:
        apps = desktop_family.apps_of(desk["apps"], sbx.spec.workspace_dir)
        session = DesktopSession(sbx, apps, size=tuple(desk["size"]))
        async with session:
            if plan is not None:
                await run_plan(session, plan)
        if stats is not None:
            for proc in session.stats:
                stats[proc["name"]] = max(stats.get(proc["name"], 0), proc["peak_kib"])
    return grade(task, ws)[0]


async def validate(task: str | pathlib.Path, backend: Backend | str = "bwrap") -> Validation:
    task = pathlib.Path(task)
    backend = get_backend(backend) if isinstance(backend, str) else backend
    tid = json.loads((task / "data_entry.json").read_text())["task_id"]
    plans = {n: json.loads((task / "solution" / n).read_text()) if (task / "solution" / n).is_file() else None
             for n in ("plan.json", "wrong_plan.json")}
    seconds: dict = {}
    peak: dict = {}
    scores: dict = {}
    with tempfile.TemporaryDirectory(prefix="hrl-deskval-") as tmp:
        try:
            for label, plan in (("solution", plans["plan.json"]), ("nothing", None),
                                ("wrong", plans["wrong_plan.json"])):
                if label == "wrong" and plan is None:
                    scores[label] = None
                    continue
                t0 = time.monotonic()
                scores[label] = await play(task, plan, backend, pathlib.Path(tmp), peak)
                seconds[label] = round(time.monotonic() - t0, 2)
        except (DesktopError, OSError, RuntimeError, ValueError) as e:
            return Validation(tid, scores.get("solution", 0.0), scores.get("nothing", 0.0), None,
                              f"{type(e).__name__}: {e}", seconds, peak)
    return Validation(tid, scores["solution"], scores["nothing"], scores["wrong"], "", seconds, peak)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tasks", nargs="*", help="task folders")
    ap.add_argument("--backend", default="bwrap")
    ap.add_argument("--generate", metavar="OUT", help="first write the family's tasks into OUT and validate those")
    ap.add_argument("--split", default="all", help="with --generate: train | heldout | all")
    ap.add_argument("--per-template", type=int, default=1, help="with --generate: variants per template")
    args = ap.parse_args(argv)
    tasks = list(args.tasks)
    if args.generate:
        tasks += desktop_family.generate(args.generate, args.split, per_template=args.per_template)
    if not tasks:
        ap.error("no task folders (name some, or --generate OUT)")
    bad = 0
    for t in tasks:
        v = asyncio.run(validate(t, args.backend))
        bad += not v.ok
        print(json.dumps(dataclasses.asdict(v) | {"ok": v.ok}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
