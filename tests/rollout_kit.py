"""Shared by the ClawGym / grader tests: real tasks, scripted per-task policies, one runner call."""
from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import stat

import pytest

from harness_env.harnesses.base import Harness, HarnessOutcome
from harness_env.harnesses.scripted import per_task_policy  # noqa: F401 - the tests import it from here
from harness_env.runner import RolloutSpec, RunnerConfig, run_through_shim
from harness_env.sandbox import Limits
from research.capture import CallRecord, RolloutResult

# $HARNESS_RL_CLAWGYM, else ../shared beside the clone (this repo's CI layout), else this workplace's /work/shared
_CLAWGYM_CANDIDATES = [pathlib.Path(p) for p in (os.environ.get("HARNESS_RL_CLAWGYM", ""),) if p] + [
    pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "clawgym" / "train",
    pathlib.Path("/work/shared/clawgym/train")]
CLAWGYM_TRAIN = next((p for p in _CLAWGYM_CANDIDATES if (p / "task_0185" / "data_entry.json").exists()),
                     _CLAWGYM_CANDIDATES[0])
WS = "/root/.openclaw/workspace"

# task_0185 (real, as shipped): read input/project.json, write output/plan.json + output/USAGE.md. The checker
# is all-or-nothing (1.0 only when every check passes). The script uses relative paths on purpose: it only
# works when the harness runs it in the task's workspace.
SOLVE_0185 = """mkdir -p output && python3 - <<'PY'
import json
p = json.load(open("input/project.json"))
cmds = []
for s in p["steps"]:
    if isinstance(s, str):
        cmds.append("bash-themes " + s)
    else:
        (name, arg), = s.items()
        cmds.append("bash-themes %s %s" % (name, arg["target"]))
json.dump({"project_name": p["name"], "bash_themes_dir": p["bash_themes_dir"], "commands": cmds},
          open("output/plan.json", "w"), indent=2)
lines = ["# Usage", "", "export BASH_THEMES_DIR=" + p["bash_themes_dir"], ""] + ["$ " + c for c in cmds]
open("output/USAGE.md", "w").write("\\n".join(lines + ["", "Each line runs one step, in order."]) + "\\n")
PY
ls output"""
SOLVED_0185 = "I wrote output/plan.json and output/USAGE.md."
DO_NOTHING = "I did not change anything."


class ShellHarness(Harness):
    """A test harness that is one bash script (`script`), run in the workspace: for runner and sandbox tests."""

    api = "openai_chat"
    script = ""

    def argv(self, prompt, ctx):  # noqa: ANN001, ANN201
        return ["/bin/bash", "-c", self.script]

    def parse_output(self, r):  # noqa: ANN001, ANN201
        return HarnessOutcome(completed=r.exit_code == 0 and not r.timed_out, exit_code=r.exit_code,
                              final_message=r.stdout.strip()[-200:], error=f"exit {r.exit_code}: {r.stderr[-200:]}")


def clawgym_train() -> pathlib.Path:
    """The 2000 real ClawGym tasks (../shared/clawgym/train, this repo's CI layout), else skip."""
    if not (CLAWGYM_TRAIN / "task_0185" / "data_entry.json").exists():
        pytest.skip(f"the ClawGym tasks are not at any of {[str(p) for p in _CLAWGYM_CANDIDATES]}")
    return CLAWGYM_TRAIN


def query_marker(task_dir: pathlib.Path) -> str:
    """A piece of the task's query that identifies it in a rendered prompt."""
    import json

    return json.loads((task_dir / "data_entry.json").read_text())["user_query"][:80]


def writable_copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    """A copy of a (read-only, shared) task folder that tests may extend and pytest may delete."""
    shutil.copytree(src, dst, symlinks=True)
    for dirpath, dirnames, filenames in os.walk(dst):
        for name in [*dirnames, *filenames]:
            p = os.path.join(dirpath, name)
            os.chmod(p, os.lstat(p).st_mode | stat.S_IWUSR | (stat.S_IXUSR if os.path.isdir(p) else 0))
    os.chmod(dst, 0o755)
    return dst


def run_rollouts(tmp_path: pathlib.Path, engine, tok, specs: list[RolloutSpec], *, backend=None,
                 shim_options=None, **cfg_kw) -> tuple[list[RolloutResult], list[CallRecord]]:
    """One runner call through a real shim (Unix socket) into the given engine; returns results and calls."""
    cfg_kw.setdefault("limits", Limits(cpus=2.0, memory_mb=4096, pids=1024, wall_s=330))
    if backend is not None:  # the config names the backend the runner is given (results record it)
        cfg_kw.setdefault("backend", backend.name)
    cfg = RunnerConfig(out_dir=tmp_path / "run", progress=False, infra_retries=0,
                       **{"timeout_s": 300, "max_turns": 8, **cfg_kw})
    return asyncio.run(run_through_shim(tmp_path, engine, tok, specs, cfg, backend=backend,
                                        shim_options=shim_options))


def logs_of(tmp_path: pathlib.Path, rollout_id: str) -> str:
    d = tmp_path / "run" / "rollouts" / rollout_id / "logs"
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in (d / "stdout.txt", d / "stderr.txt")
                     if p.exists())
