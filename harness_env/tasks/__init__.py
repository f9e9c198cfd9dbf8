"""Tasks in the ClawGym format: loader + grading, our task library, the make_file family, synthesis."""

import pathlib

from harness_env.tasks.loader import RewardError, Task, TaskError, discover, grade, load_task, parse_reward

LIBRARY = pathlib.Path(__file__).with_name("library")

__all__ = ["LIBRARY", "RewardError", "Task", "TaskError", "discover", "grade", "load_task", "parse_reward"]
