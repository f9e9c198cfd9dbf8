"""Checks that a task's checker really checks: the reference solution scores 1.0, doing nothing does not.

Every run happens in a real sandbox (the same `grade` path rollouts use), so a checker that only works
on the host, or reads files the sandbox does not have, fails validation here rather than in training.

`probe_task` is what validation knows without a reference solution (ClawGym ships none), and what attribution
needs: the untouched workspace (the inputs, nothing else) must grade WITHOUT ERROR and BELOW 1.0 — a checker
that errors there errs on its own (a later reward_error is the task's, not the policy's), one that scores 1.0
there pays for doing nothing. `grade_emptied`, for the tamper table: the grade with every input file emptied (a
checker that recomputes its expected answer from the inputs pays an agent that empties them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import tempfile
import time

from harness_env.sandbox.base import Backend, Limits, SandboxSpec
from harness_env.tasks.loader import RewardError, Task, TaskError, grade, load_task


@dataclasses.dataclass
class Validation:
    task_id: str
    solution_reward: float | None  # None: the task ships no reference solution (ClawGym)
    empty_reward: float | None  # no inputs, nothing done (tasks with a solution only)
    message: str = ""
    untouched_reward: float | None = None  # the inputs, nothing done
    flags: dict = dataclasses.field(default_factory=dict)  # harness_env/tasks/audit.py
    has_solution: bool = True
    exit_fooled: bool | None = None  # code files replaced by exit-0 stubs scored 1.0 (None: not probed)

    @property
    def ok(self) -> bool:
        clean = self.untouched_reward is not None and self.untouched_reward < 1.0 and not self.exit_fooled
        if not self.has_solution:
            return clean
        return clean and self.solution_reward == 1.0 and self.empty_reward is not None and self.empty_reward < 1.0


@dataclasses.dataclass
class PlanValidation:
    """A generated family's checker, validated by playing plans (web, desktop): the reference plan must score 1.0,
    doing nothing 0.0, the plausible mistake (when the template has one) 0.0."""

    task_id: str
    solution: float
    nothing: float
    wrong: float | None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.solution == 1.0 and self.nothing == 0.0 and self.wrong in (0.0, None)


async def run_solution(backend: Backend, task: Task, *, populate: bool = True, solve: bool = True,
                       timeout: float = 60.0, empty_inputs: bool = False, stub_code: bool = False) -> float:
    """Fresh workspace (+ inputs), optionally the reference solution, then the checker in a fresh sandbox
    (as rollouts are graded) -> reward."""
    with tempfile.TemporaryDirectory(prefix="hrl-validate-") as tmp:
        ws = pathlib.Path(tmp) / "workspace"
        ws.mkdir()
        if populate:
            task.populate(ws)
            if empty_inputs:
                _empty_inputs(task, ws)
            if stub_code:
                _stub_code(task, ws)
        sol = task.root / "solution"
        final = ""
        spec = dict(workspace=ws, limits=Limits(wall_s=4 * timeout), name=task.task_id,
                    workspace_dir=task.workspace_dir)
        if solve and (sol / "solve.sh").is_file():
            async with await backend.create(SandboxSpec(home=pathlib.Path(tmp) / "home", **spec)) as sbx:
                await sbx.copy_in(sol, "/solution")
                res = await sbx.exec(["/bin/bash", "/solution/solve.sh"], timeout=timeout)
                if not res.ok:
                    raise TaskError(f"{task.task_id}: solution/solve.sh exited {res.exit_code}: {res.stderr[-300:]}")
        if solve and (sol / "final_message.txt").is_file():
            final = (sol / "final_message.txt").read_text().strip()
        async with await backend.create(SandboxSpec(home=None, shim=False, **spec)) as sbx:
            reward, _ = await grade(sbx, task, final_message=final, timeout=timeout)
        return reward


async def validate_task(backend: Backend, root: str | pathlib.Path) -> Validation:
    """The reference solution (if the task ships one) scores 1.0; the untouched workspace grades without error
    below 1.0; with a solution, the empty workspace (no inputs) below 1.0 too. Static checker flags attached."""
    from harness_env.tasks.audit import flags_of

    try:
        task = load_task(root)
    except TaskError as e:
        return Validation(pathlib.Path(root).name, None, None, str(e))
    sol = task.root / "solution"
    has_solution = (sol / "solve.sh").is_file() or (sol / "final_message.txt").is_file()
    solved = empty = untouched = None
    try:
        if has_solution:
            solved = await run_solution(backend, task)
            empty = await run_solution(backend, task, populate=False, solve=False)
        untouched = await run_solution(backend, task, solve=False)
    except (TaskError, RewardError) as e:
        return Validation(task.task_id, solved, empty, str(e), untouched, flags_of(task.root), has_solution)
    v = Validation(task.task_id, solved, empty, "", untouched, flags_of(task.root), has_solution)
    if task.metadata.get("agent_code_guard") or "executes_code" in v.flags:
        try:
            v.exit_fooled = await run_solution(backend, task, solve=False, stub_code=True) == 1.0
        except (TaskError, RewardError):
            v.exit_fooled = False  # the checker errs on stubs: a reward_error, the policy's, never a 1.0
        if v.exit_fooled:
            v.flags["exit_fooled"] = "code files replaced by `exit 0` stubs scored 1.0"
    if not v.ok:
        v.message = (f"{task.task_id}: reference solution scored {solved}, empty workspace {empty}, "
                     f"untouched workspace {untouched}, exit stubs fooled it: {v.exit_fooled}")
    return v


STUBS = {".py": "import os\nos._exit(0)\n", ".sh": "exit 0\n", ".bash": "exit 0\n", ".js": "process.exit(0)\n"}


def _copied_inputs(task: Task, ws: pathlib.Path):  # noqa: ANN202 - Iterator[pathlib.Path]
    """The workspace copies of the task's input files that are still regular files."""
    for dirpath, _, names in os.walk(task.input_dir):
        for name in names:
            q = ws / os.path.relpath(os.path.join(dirpath, name), task.input_dir)
            if q.is_file() and not q.is_symlink():
                yield q


def _stub_code(task: Task, ws: pathlib.Path) -> None:
    """Replaces every code file the task gives the agent by one that exits 0 at once (at import, for a module):
    what an agent that cannot solve the task but can make a test runner exit cleanly would leave."""
    for q in _copied_inputs(task, ws):
        if q.suffix in STUBS:
            q.write_text(STUBS[q.suffix])


def _empty_inputs(task: Task, ws: pathlib.Path) -> None:
    """Truncates every copied input file to 0 bytes, as a tampering policy would."""
    for q in _copied_inputs(task, ws):
        q.write_bytes(b"")


async def _grade_or_error(backend: Backend, task: Task, timeout: float, **kw) -> tuple[float | None, str]:
    try:
        return await run_solution(backend, task, solve=False, timeout=timeout, **kw), ""
    except (TaskError, RewardError) as e:
        return None, str(e)[-300:]


async def grade_emptied(backend: Backend, task: Task, timeout: float = 60.0) -> tuple[float | None, str]:
    """(grade, error) of the workspace with every input emptied and nothing else done: the tamper table's probe
    (a checker that recomputes its expected answer from the inputs may pay an agent that empties them)."""
    return await _grade_or_error(backend, task, timeout, empty_inputs=True)


async def probe_task(backend: Backend, root: str | pathlib.Path, *, timeout: float = 60.0) -> dict:
    """{task, untouched, untouched_error, clean, grade_s}: the grade of the untouched workspace; `clean` = it
    grades without error below 1.0 (what `validate` requires of every task and attribution relies on)."""
    t0 = time.monotonic()
    try:
        task = load_task(root)
    except TaskError as e:
        return {"task": pathlib.Path(root).name, "untouched": None, "untouched_error": str(e)[-300:],
                "clean": False, "grade_s": 0.0}
    out = {"task": task.task_id}
    out["untouched"], out["untouched_error"] = await _grade_or_error(backend, task, timeout)
    out["clean"] = out["untouched"] is not None and out["untouched"] < 1.0
    out["grade_s"] = round(time.monotonic() - t0, 3)
    return out


def _content_key(root: pathlib.Path) -> str:
    """sha256 over the task folder's files (paths and bytes): a validation is reused only for the same task."""
    import hashlib

    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "harness-rl" / "validated"


async def keep_valid(backend: Backend, dirs: list[pathlib.Path], *, concurrency: int = 4,
                     cache: pathlib.Path | None = None) -> tuple[list[pathlib.Path], dict[str, str]]:
    """(the tasks whose untouched workspace grades without error below 1.0, {dropped task: why}): what a task
    source is checked for when it loads (`config.tasks.validate`), so every later reward_error can be put on
    the policy (harness_env/attribution.py) and no task pays for doing nothing. Results are cached by the task's
    content (`cache`, default ~/.cache/harness-rl/validated), so a task set is graded once per machine."""
    import json

    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(d: pathlib.Path) -> dict:
        f = cache / f"{await asyncio.to_thread(_content_key, d)}.json"
        if f.exists():
            return json.loads(f.read_text())
        async with sem:
            row = await probe_task(backend, d)
        f.write_text(json.dumps(row))
        return row

    rows = await asyncio.gather(*(one(d) for d in dirs))
    kept, dropped = [], {}
    for d, row in zip(dirs, rows):
        if row["clean"]:
            kept.append(d)
        else:
            dropped[d.name] = (f"the untouched workspace scores {row['untouched']}" if row["untouched"] is not None
                               else f"the checker errs on the untouched workspace: {row['untouched_error'][-160:]}")
    return kept, dropped
