"""The ClawGym task format, natively, plus the grading step every backend shares.

A task is a folder (ClawGym's own layout, ../shared/clawgym/DATASET_README.md):
    data_entry.json      {"task_id", "user_query", "input_mount_dir"?, "metadata"?}
    input_files/         optional; copied verbatim into the workspace before the harness starts
    reward/reward.sh     + helpers; copied to <workspace>/reward/ AFTER the harness exited and run there
                         (see `grade`); last stdout line = a float in [0, 1]. Chat-graded tasks read env
                         OPENCLAW_REWARD_PAYLOAD (JSON: task_id, user_query, metadata, final_message,
                         transcript).
    solution/            ours, optional: solve.sh (run in the workspace) and/or final_message.txt —
                         the reference solution that tests and task synthesis validate checkers with
                         (web tasks: plan.json, abstract browser steps).
    env/                 ours, optional: a web app (env/env.json + its code, harness_env/web/env.py) that
                         runs in a sandbox of its own during the rollout; its server-side state reaches
                         the checker as reward/env_state/. Tasks with env/ are web tasks.
`input_mount_dir` is the workspace's absolute path inside the sandbox (ClawGym: /root/.openclaw/workspace,
OpenClaw's own default, also used when a task does not say); any path that is not a system directory
(sandbox.base.check_workspace_dir). Harnesses start in it.

Loading is strict because tasks come from outside: every field is type-checked, and the folder may hold
only regular files, directories and relative symlinks that stay inside input_files/ or reward/ (a link to
/etc/passwd would copy a host file into the workspace; a FIFO would hang the copy). Every problem is a
TaskError naming the path; the runner turns it into status `task_error` (never retried).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import shutil
import stat
from typing import Any

from harness_env.sandbox.base import Sandbox, check_workspace_dir
from harness_env.tasks import sanitize
from harness_env.web.env import WebEnv, load_env

DEFAULT_WORKSPACE = "/root/.openclaw/workspace"  # ClawGym's input_mount_dir (and OpenClaw's default)
REWARD_DIRNAME = "reward"  # the checker's folder, copied to <workspace>/reward/ for grading
PAYLOAD_ENV = "OPENCLAW_REWARD_PAYLOAD"
PAYLOAD_FILE_ENV = "OPENCLAW_REWARD_PAYLOAD_FILE"
MAX_ENV_PAYLOAD = 100_000  # one env string may not exceed 128 KiB (MAX_ARG_STRLEN)
MAX_ENTRY_BYTES = 1 << 20
# The verifier's own environment: nothing from the agent (sandbox.base_env adds HOME, PATH, LANG, TMPDIR).
VERIFIER_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}


class TaskError(ValueError):
    """The task folder is not a valid task (status `task_error`)."""


class RewardError(RuntimeError):
    """reward.sh failed or printed no finite float in [0, 1] (status `reward_error`)."""


@dataclasses.dataclass
class Task:
    task_id: str
    user_query: str
    root: pathlib.Path
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    input_mount_dir: str = DEFAULT_WORKSPACE
    web: WebEnv | None = None  # the task's web app (env/), if it has one

    @property
    def workspace_dir(self) -> str:
        """The workspace's path inside the sandbox: where inputs land, harnesses start and reward/ goes."""
        return self.input_mount_dir

    @property
    def category(self) -> str:
        return str(self.metadata.get("category") or "misc")

    @property
    def input_dir(self) -> pathlib.Path:
        return self.root / "input_files"

    @property
    def reward_dir(self) -> pathlib.Path:
        return self.root / REWARD_DIRNAME

    @property
    def chat_graded(self) -> bool:
        return bool(self.metadata.get("chat_graded", False))

    def populate(self, workspace: pathlib.Path) -> None:
        """Copies input_files/ into the host workspace dir (links as links: they were checked at load),
        made writable by its owner: a read-only task store (like ../shared) must not make the agent's
        inputs read-only. A copy that fails (e.g. inputs over the workspace's disk cap) is the task's problem."""
        workspace.mkdir(parents=True, exist_ok=True)
        if not self.input_dir.is_dir():
            return
        try:
            shutil.copytree(self.input_dir, workspace, symlinks=True, dirs_exist_ok=True)
            os.chmod(workspace, 0o755)  # copytree gave it input_files/'s own mode
            for dirpath, dirnames, filenames in os.walk(workspace):
                for name in dirnames + filenames:
                    q = os.path.join(dirpath, name)
                    st = os.lstat(q)
                    if not stat.S_ISLNK(st.st_mode):
                        os.chmod(q, stat.S_IMODE(st.st_mode) | (0o700 if stat.S_ISDIR(st.st_mode) else 0o600))
        except (OSError, shutil.Error) as e:
            raise TaskError(f"{self.root}: copying input_files into the workspace: {e}") from e

    @property
    def editable_inputs(self) -> list[str] | None:
        """Glob patterns of the inputs the task allows the agent to change (`metadata.editable_inputs`); None
        when the task declares nothing (harness_env/tamper.py picks the rule then)."""
        v = self.metadata.get("editable_inputs")
        return [str(g) for g in v] if isinstance(v, list) else None

    def changed_inputs(self, workspace: pathlib.Path, limit: int = 50) -> list[str]:
        """Input files (relative paths) the agent changed, replaced or removed: see `input_changes`."""
        return [c["path"] for c in self.input_changes(workspace, limit)]

    def input_changes(self, workspace: pathlib.Path, limit: int = 50) -> list[dict]:
        """Input files the agent changed: {path, change: removed | replaced | modified, size_before, size_after}.
        An audit trail and the tamper rule's input (harness_env/tamper.py), because ClawGym checkers recompute
        their expected answers from the inputs in the workspace (emptying the input CSVs of task_0000 and
        writing empty outputs scores 1.0). Call only when no agent process runs; never follows a link, never
        reads a file whose size differs (a 1 TB sparse file in place of an input is not hashed)."""
        out: list[dict] = []
        if not self.input_dir.is_dir():
            return out
        for dirpath, _, filenames in os.walk(self.input_dir):
            for name in sorted(filenames):
                src = os.path.join(dirpath, name)
                if os.path.islink(src):
                    continue
                rel = os.path.relpath(src, self.input_dir)
                size = os.path.getsize(src)
                got = _digest_nofollow(workspace, rel, size)
                if got is not None and got[0] is not None and got[0] == _digest(src):
                    continue
                change = {"path": rel, "size_before": size}
                if got is None:
                    change["change"] = "replaced" if os.path.lexists(os.path.join(workspace, rel)) else "removed"
                else:
                    change.update(change="modified", size_after=got[1])
                out.append(change)
                if len(out) >= limit:
                    return out
        return out


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _digest_nofollow(root: pathlib.Path, rel: str, size: int) -> tuple[str | None, int] | None:
    """(sha256, size) of root/rel if every component is a real directory and the file a regular file, else None;
    a file whose size is not `size` (the input's) is changed without being read, its sha256 None: an agent's
    1 TB sparse file in place of an input would otherwise be hashed for hours."""
    parts = pathlib.PurePosixPath(rel).parts
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        os.close(fd)
        return None
    os.close(fd)
    if not stat.S_ISREG(os.fstat(f).st_mode):  # an input replaced by a directory: fdopen would raise on it
        os.close(f)
        return None
    with os.fdopen(f, "rb") as fh:
        st = os.fstat(fh.fileno())
        if st.st_size != size:
            return None, st.st_size
        return hashlib.file_digest(fh, "sha256").hexdigest(), st.st_size


def _field(d: dict, key: str, entry: pathlib.Path) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v.strip():
        raise TaskError(f"{entry}: {key!r} must be a non-empty string, not {_show(v)}")
    return v


def _show(v: object) -> str:
    return f"{type(v).__name__} {json.dumps(v)[:60] if isinstance(v, int | float | bool | None) else ''}".strip()


def load_task(root: str | pathlib.Path) -> Task:
    root = pathlib.Path(root)
    entry = root / "data_entry.json"
    try:
        st = os.lstat(entry)
    except OSError:
        raise TaskError(f"{root}: no data_entry.json") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY_BYTES:
        raise TaskError(f"{entry}: must be a regular file of at most {MAX_ENTRY_BYTES} bytes")
    try:
        d = json.loads(entry.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise TaskError(f"{entry}: not valid JSON: {e}") from e
    if not isinstance(d, dict):
        raise TaskError(f"{entry}: must be a JSON object")
    task_id, query = _field(d, "task_id", entry), _field(d, "user_query", entry)
    mount = d.get("input_mount_dir")
    if mount is None or mount == "":
        mount = DEFAULT_WORKSPACE
    try:
        mount = check_workspace_dir(mount)
    except ValueError as e:
        raise TaskError(f"{entry}: input_mount_dir: {e}") from None
    meta = d.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise TaskError(f"{entry}: metadata must be an object, not {_show(meta)}")
    if not isinstance(meta.get("category", ""), str):
        raise TaskError(f"{entry}: metadata.category must be a string, not {_show(meta['category'])}")
    if not isinstance(meta.get("chat_graded", False), bool):
        raise TaskError(f"{entry}: metadata.chat_graded must be true or false")
    reward_sh = root / REWARD_DIRNAME / "reward.sh"
    if not reward_sh.is_file() or reward_sh.is_symlink():
        raise TaskError(f"{root}: no reward/reward.sh (a regular file)")
    for sub in ("input_files", REWARD_DIRNAME, "env"):
        check_tree(root / sub)
    try:
        web = load_env(root)
    except ValueError as e:
        raise TaskError(str(e)) from None
    return Task(task_id=task_id, user_query=query, root=root, metadata=meta, input_mount_dir=mount, web=web)


def check_tree(top: pathlib.Path) -> None:
    """Only regular files, dirs and relative symlinks resolving (without a loop) inside `top`."""
    if not os.path.lexists(top):
        return
    if top.is_symlink() or not top.is_dir():
        raise TaskError(f"{top}: must be a directory (not a link or a file)")
    real_top = top.resolve()
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            p = pathlib.Path(dirpath) / name
            mode = os.lstat(p).st_mode
            if stat.S_ISLNK(mode):
                _check_link(p, top, real_top)
            elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise TaskError(f"{p}: not a regular file, directory or symlink")


def _check_link(p: pathlib.Path, top: pathlib.Path, real_top: pathlib.Path) -> None:
    target = os.readlink(p)
    if os.path.isabs(target):
        raise TaskError(f"{p}: symlink to the absolute path {target!r} (links must be relative, inside {top.name}/)")
    lexical = os.path.normpath(os.path.join(os.path.dirname(p), target))
    if os.path.commonpath([lexical, str(top)]) != str(top):
        raise TaskError(f"{p}: symlink {target!r} leaves {top.name}/")
    try:
        resolved = p.resolve(strict=True)
    except RuntimeError:  # Python 3.11: "Symlink loop from ..."
        raise TaskError(f"{p}: symlink loop") from None
    except OSError as e:
        if e.errno == 40:  # ELOOP
            raise TaskError(f"{p}: symlink loop") from None
        raise TaskError(f"{p}: dangling symlink to {target!r}") from None
    if resolved != real_top and real_top not in resolved.parents:
        raise TaskError(f"{p}: symlink {target!r} leaves {top.name}/")


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
    """Last non-empty stdout line = the reward; earlier JSON lines {"sub_scores": {...}} = sub-scores.
    Anything non-finite (a sub-score of 1e999 parses as inf) is a RewardError: results stay valid JSON."""
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
            except (ValueError, RecursionError):
                continue
            if isinstance(obj, dict) and isinstance(obj.get("sub_scores"), dict):
                for k, v in obj["sub_scores"].items():
                    if isinstance(v, int | float) and not isinstance(v, bool):
                        if not math.isfinite(v):
                            raise RewardError(f"sub-score {str(k)[:80]!r} is {v}: not finite")
                        subs[str(k)] = float(v)
    return r, subs


CLEAR_REWARD = ('[ -L "$1" ] || chmod -R u+rwX -- "$1" 2>/dev/null; rm -rf -- "$1"; '
                '! [ -e "$1" ] && ! [ -L "$1" ]')


MAX_ENTRIES = 200_000  # a workspace with more entries is not graded (harness_env/tasks/sanitize.py)


async def grade(sbx: Sandbox, task: Task, final_message: str = "", transcript: list[dict] | None = None,
                timeout: float = 60.0, extra: dict[str, pathlib.Path] | None = None, *,
                max_file_bytes: int = 1 << 30, sanitized: dict | None = None) -> tuple[float, dict[str, float]]:
    """Grades the workspace in `sbx`, which must be the verifier's FRESH sandbox (fresh HOME and TMP, no
    agent process alive: harness_env/runner.py): first what could fool, hang or break the checker is removed
    (links into reward/ or out of the workspace, FIFOs and devices, files over `max_file_bytes`; the owner's
    modes restored: harness_env/tasks/sanitize.py; its report goes into `sanitized`), then whatever the agent
    left at <workspace>/reward (a dir with extra modules, a file, a link) is removed, the task's reward/ copied
    there, and reward.sh run as shipped with cwd = that fresh reward/ dir (a checker's own `python3 -c` then
    imports nothing the agent planted in the workspace). `extra` (name -> host dir) is copied into that fresh
    reward/ too, after the agent is gone: a web task's app state (`env_state`). Raises RewardError."""
    rdir = f"{task.workspace_dir}/{REWARD_DIRNAME}"
    cmd = sanitize.argv(task.workspace_dir, REWARD_DIRNAME, max_file_bytes, MAX_ENTRIES)
    res = await sbx.exec(cmd, cwd="/", env=dict(VERIFIER_ENV), timeout=timeout)
    lost = res.ok and not res.stdout.strip()
    if lost:  # exit 0 and no output at all: the docker exec stream dropped it (seen once on a loaded 2-core CI run);
        # the sanitizer is idempotent (its first run already fixed the workspace), so a second run reports again
        res = await sbx.exec(cmd, cwd="/", env=dict(VERIFIER_ENV), timeout=timeout)
    try:
        report = sanitize.parse_report(res.stdout)
    except ValueError as e:
        raise RewardError(f"sanitizing the workspace before grading: exit {res.exit_code} {res.stderr[-300:]!r} "
                          f"({e})") from None
    if sanitized is not None:
        sanitized.update(report, **({"first_report_lost": True} if lost else {}))
    if report["truncated"]:
        raise RewardError(f"the workspace has more than {MAX_ENTRIES} entries: not graded")
    res = await sbx.exec(["/bin/sh", "-c", CLEAR_REWARD, "sh", rdir], cwd="/", timeout=timeout)
    if not res.ok:
        raise RewardError(f"cannot clear {rdir} before grading: exit {res.exit_code} {res.stderr[-300:]!r}")
    await sbx.copy_in(task.reward_dir, rdir)
    for name, src in (extra or {}).items():
        await sbx.copy_in(src, f"{rdir}/{name}")
    body = json.dumps(payload(task, final_message, transcript))
    env = dict(VERIFIER_ENV)
    if len(body) > MAX_ENV_PAYLOAD:  # keep the env var parseable: drop the transcript, full payload in a file
        tmp = _write_tmp(body)
        try:
            await sbx.copy_in(tmp, f"{rdir}/payload.json")
        finally:
            tmp.unlink()
        env[PAYLOAD_FILE_ENV] = f"{rdir}/payload.json"
        body = json.dumps(payload(task, final_message, None))
    env[PAYLOAD_ENV] = body
    res = await sbx.exec(["/bin/bash", f"{rdir}/reward.sh"], env=env, cwd=rdir, timeout=timeout)
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


def new_task_dir(out_dir: str | pathlib.Path, task_id: str, subdirs: tuple[str, ...]) -> pathlib.Path:
    """An empty task folder `out_dir/task_id` with `subdirs` (a generated family's writer: a rewrite leaves no
    stale file of an earlier version behind)."""
    d = pathlib.Path(out_dir) / task_id
    shutil.rmtree(d, ignore_errors=True)
    for sub in subdirs:
        (d / sub).mkdir(parents=True, exist_ok=True)
    return d
