"""Checks that a task's checker really checks: the reference solution scores 1.0, doing nothing does not.

Both runs happen in a real sandbox (the same `grade` path rollouts use), so a checker that only works
on the host, or reads files the sandbox does not have, fails validation here rather than in training.
"""

from __future__ import annotations

import dataclasses
import pathlib
import tempfile

from harness_env.sandbox.base import Backend, Limits, SandboxSpec
from harness_env.tasks.loader import RewardError, Task, TaskError, grade, load_task


@dataclasses.dataclass
class Validation:
    task_id: str
    solution_reward: float | None
    empty_reward: float | None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.solution_reward == 1.0 and self.empty_reward is not None and self.empty_reward < 1.0


async def run_solution(backend: Backend, task: Task, *, populate: bool = True, solve: bool = True,
                       timeout: float = 60.0) -> float:
    """Fresh workspace (+ inputs), optionally the reference solution, then the checker in a fresh sandbox
    (as rollouts are graded) -> reward."""
    with tempfile.TemporaryDirectory(prefix="hrl-validate-") as tmp:
        ws = pathlib.Path(tmp) / "workspace"
        ws.mkdir()
        if populate:
            task.populate(ws)
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
    try:
        task = load_task(root)
    except TaskError as e:
        return Validation(pathlib.Path(root).name, None, None, str(e))
    try:
        solved = await run_solution(backend, task)
        empty = await run_solution(backend, task, populate=False, solve=False)
    except (TaskError, RewardError) as e:
        return Validation(task.task_id, None, None, str(e))
    v = Validation(task.task_id, solved, empty)
    if not v.ok:
        v.message = f"{task.task_id}: reference solution scored {solved}, empty workspace {empty}"
    return v
