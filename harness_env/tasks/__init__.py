"""Tasks in the ClawGym format: loader + grading, our task library, the make_file family, synthesis, and
the one task-selection function (select.py) that launch.eval and the RL loop share."""

from harness_env.tasks.loader import (
    DEFAULT_WORKSPACE,
    RewardError,
    Task,
    TaskError,
    discover,
    grade,
    load_task,
    parse_reward,
)
from harness_env.tasks.select import LIBRARY, select_tasks, split_of

__all__ = ["DEFAULT_WORKSPACE", "LIBRARY", "RewardError", "Task", "TaskError", "discover", "grade", "load_task",
           "parse_reward", "select_tasks", "split_of"]
