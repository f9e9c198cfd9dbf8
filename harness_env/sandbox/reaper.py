"""Who owns a sandbox, and cleaning up after owners that died without `close()` (kill -9, OOM).

Every process sandbox writes `STATE_DIR/<sandbox id>/owner.json` (orchestrator pid + its kernel start
time, so a recycled pid is not mistaken for a live owner) BEFORE it creates its cgroup or starts a
process, and appends each started process (pid + start time) to `pids`. `reap_process_sandboxes()`
runs at backend start-up: for every state dir whose owner is gone it kills the sandbox's cgroup and
recorded processes and removes both. Docker/kubernetes backends reap by label instead.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import time

from harness_env.sandbox import limits as limits_mod

STATE_DIR = pathlib.Path(os.environ.get("HRL_SANDBOX_STATE", "/tmp/harness-rl/sandboxes"))


YOUNG_S = 30.0  # a state dir without a readable owner younger than this is still being set up


def _age_s(p: pathlib.Path) -> float:
    try:
        return time.time() - p.stat().st_mtime
    except OSError:
        return 0.0


def proc_start_time(pid: int) -> int | None:
    """Kernel start time (clock ticks since boot) of pid; None when it does not exist."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def owner_record() -> dict:
    pid = os.getpid()
    return {"pid": pid, "start": proc_start_time(pid)}


def alive(rec: dict) -> bool:
    return rec.get("pid") is not None and proc_start_time(rec["pid"]) == rec.get("start")


def write_owner(state: pathlib.Path, extra: dict) -> None:
    """Atomically (rename), so a concurrent reaper never reads a half-written owner."""
    state.mkdir(parents=True, exist_ok=True)
    tmp = state / f".owner.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"owner": owner_record(), **extra}))
    os.replace(tmp, state / "owner.json")


def record_pid(state: pathlib.Path, pid: int) -> None:
    with open(state / "pids", "a") as f:
        f.write(json.dumps({"pid": pid, "start": proc_start_time(pid)}) + "\n")


def kill_recorded(state: pathlib.Path) -> None:
    try:
        lines = (state / "pids").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        rec = json.loads(line)
        if alive(rec):
            try:
                os.killpg(rec["pid"], signal.SIGKILL)
            except OSError:
                pass
            try:
                os.kill(rec["pid"], signal.SIGKILL)
            except OSError:
                pass


def destroy(state: pathlib.Path, sandbox_id: str, mode: str) -> None:
    """Kills everything of one sandbox and removes its cgroup and state dir."""
    kill_recorded(state)
    cg = limits_mod.Cgroup(mode, sandbox_id)
    cg.kill_all()
    cg.remove()
    shutil.rmtree(state, ignore_errors=True)


def reap_process_sandboxes(mode: str, state_dir: pathlib.Path | None = None) -> int:
    """Destroys every process sandbox whose owner is dead, plus cgroups with no state at all."""
    state_dir = state_dir or STATE_DIR
    n = 0
    known: set[str] = set()
    if state_dir.is_dir():
        for state in state_dir.iterdir():
            known.add(state.name)
            try:
                owner = json.loads((state / "owner.json").read_text())["owner"]
            except (OSError, ValueError, KeyError):
                owner = {}
                if _age_s(state) < YOUNG_S:  # being created right now by a live orchestrator
                    continue
            if owner and alive(owner):
                continue
            destroy(state, state.name, mode)
            n += 1
    if state_dir != STATE_DIR:  # cgroups are host-wide; only the default state dir knows them all
        return n
    for name in limits_mod.leftover_cgroups(mode):
        if name not in known and not (state_dir / name).exists():
            cg = limits_mod.Cgroup(mode, name)
            cg.kill_all()
            cg.remove()
            n += 1
    return n
