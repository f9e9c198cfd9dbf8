"""The ClawGym task format, natively, plus the grading step every backend shares.

A task is a folder:
    data_entry.json      {"task_id", "user_query", "input_mount_dir"?, "metadata"?}
    input_files/         optional; mirrored into the workspace (at input_mount_dir) before the harness
    reward/reward.sh     + helpers; run AFTER the harness exited, cwd = workspace; last stdout line = a
                         float in [0, 1]. Chat-graded tasks read env OPENCLAW_REWARD_PAYLOAD (JSON:
                         task_id, user_query, metadata, final_message, transcript).
    solution/            ours, optional: solve.sh (run in the workspace) and/or final_message.txt —
                         the reference solution that tests and task synthesis validate checkers with.
Loading problems raise TaskError with the path; the runner turns them into status `task_error`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import shutil
from typing import Any

from harness_env.sandbox.base import WORKSPACE, Sandbox

REWARD_IN = "/reward"
PAYLOAD_ENV = "OPENCLAW_REWARD_PAYLOAD"
PAYLOAD_FILE_ENV = "OPENCLAW_REWARD_PAYLOAD_FILE"
MAX_ENV_PAYLOAD = 100_000  # one env string may not exceed 128 KiB (MAX_ARG_STRLEN)


class TaskError(ValueError):
    """The task folder is not a valid task (status `task_error`)."""


class RewardError(RuntimeError):
    """reward.sh failed or printed no float in [0, 1] (status `reward_error`)."""


@dataclasses.dataclass
class Task:
    task_id: str
    user_query: str
    root: pathlib.Path
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    input_mount_dir: str = WORKSPACE

    @property
    def category(self) -> str:
        return str(self.metadata.get("category", "misc"))

    @property
    def input_dir(self) -> pathlib.Path:
        return self.root / "input_files"

    @property
    def reward_dir(self) -> pathlib.Path:
        return self.root / "reward"

    @property
    def chat_graded(self) -> bool:
        return bool(self.metadata.get("chat_graded", False))

    def input_target(self, workspace: pathlib.Path) -> pathlib.Path:
        """Host dir the inputs are mirrored to: input_mount_dir resolved inside the workspace."""
        p = pathlib.PurePosixPath(self.input_mount_dir)
        rel = p.relative_to(WORKSPACE) if p.is_absolute() else p
        return workspace / rel

    def populate(self, workspace: pathlib.Path) -> None:
        workspace.mkdir(parents=True, exist_ok=True)
        if self.input_dir.is_dir():
            shutil.copytree(self.input_dir, self.input_target(workspace), dirs_exist_ok=True)


def load_task(root: str | pathlib.Path) -> Task:
    root = pathlib.Path(root)
    entry = root / "data_entry.json"
    if not entry.is_file():
        raise TaskError(f"{root}: no data_entry.json")
    try:
        d = json.loads(entry.read_text())
    except (OSError, ValueError) as e:
        raise TaskError(f"{entry}: not valid JSON: {e}") from e
    if not isinstance(d, dict):
        raise TaskError(f"{entry}: must be a JSON object")
    for key in ("task_id", "user_query"):
        if not isinstance(d.get(key), str) or not d[key].strip():
            raise TaskError(f"{entry}: missing or empty string field {key!r}")
    if not (root / "reward" / "reward.sh").is_file():
        raise TaskError(f"{root}: no reward/reward.sh")
    mount = d.get("input_mount_dir") or WORKSPACE
    p = pathlib.PurePosixPath(mount)
    if ".." in p.parts or (p.is_absolute() and not (p == pathlib.PurePosixPath(WORKSPACE)
                                                     or pathlib.PurePosixPath(WORKSPACE) in p.parents)):
        raise TaskError(f"{entry}: input_mount_dir {mount!r} must lie inside {WORKSPACE}")
    meta = d.get("metadata") or {}
    if not isinstance(meta, dict):
        raise TaskError(f"{entry}: metadata must be an object")
    return Task(task_id=d["task_id"], user_query=d["user_query"], root=root, metadata=meta, input_mount_dir=mount)


def discover(root: str | pathlib.Path) -> list[pathlib.Path]:
    """Task folders under root (or root itself): every non-hidden subdirectory, valid or not, so a
    broken task shows up as `task_error` instead of silently disappearing from the eval."""
    root = pathlib.Path(root)
    if (root / "data_entry.json").exists():
        return [root]
    if not root.is_dir():
        raise TaskError(f"{root}: no such task directory")
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def payload(task: Task, final_message: str, transcript: list[dict] | None = None) -> dict:
    return {"task_id": task.task_id, "user_query": task.user_query, "metadata": task.metadata,
            "final_message": final_message, "transcript": transcript or []}


def parse_reward(stdout: str) -> tuple[float, dict[str, float]]:
    """Last non-empty stdout line = the reward; earlier JSON lines {"sub_scores": {...}} = sub-scores."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        raise RewardError("reward.sh printed nothing")
    try:
        r = float(lines[-1])
    except ValueError:
        raise RewardError(f"reward.sh's last line is not a float: {lines[-1][:200]!r}") from None
    if not math.isfinite(r) or not 0.0 <= r <= 1.0:
        raise RewardError(f"reward {r} outside [0, 1]")
    subs: dict[str, float] = {}
    for ln in lines[:-1]:
        if ln.startswith("{"):
            try:
                obj = json.loads(ln)
            except ValueError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("sub_scores"), dict):
                subs.update({str(k): float(v) for k, v in obj["sub_scores"].items() if isinstance(v, int | float)})
    return r, subs


async def grade(sbx: Sandbox, task: Task, final_message: str = "", transcript: list[dict] | None = None,
                timeout: float = 60.0) -> tuple[float, dict[str, float]]:
    """Copies reward/ in (only now: the harness has exited) and runs reward.sh; raises RewardError."""
    await sbx.copy_in(task.reward_dir, REWARD_IN)
    body = json.dumps(payload(task, final_message, transcript))
    env = {}
    if len(body) > MAX_ENV_PAYLOAD:  # keep the env var parseable: drop the transcript, full payload in a file
        tmp = _write_tmp(body)
        try:
            await sbx.copy_in(tmp, f"{REWARD_IN}/payload.json")
        finally:
            tmp.unlink()
        env[PAYLOAD_FILE_ENV] = f"{REWARD_IN}/payload.json"
        body = json.dumps(payload(task, final_message, None))
    env[PAYLOAD_ENV] = body
    res = await sbx.exec(["/bin/bash", f"{REWARD_IN}/reward.sh"], env=env, cwd=WORKSPACE, timeout=timeout)
    if res.timed_out:
        raise RewardError(f"reward.sh timed out after {timeout:.0f}s")
    if res.exit_code != 0:
        raise RewardError(f"reward.sh exited {res.exit_code}: {(res.stderr or res.stdout)[-400:].strip()}")
    return parse_reward(res.stdout)


def _write_tmp(text: str) -> pathlib.Path:
    import tempfile

    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    with f:
        f.write(text)
    return pathlib.Path(f.name)
