"""CPU / memory / pids limits for process sandboxes (bwrap): cgroups when writable, else rlimits.

Measured on the dev machine (kernel 6.18, Debian 12, root): cgroup v1 hierarchies for memory, pids
and cpu are mounted and writable, the v2 mount has no controllers -> `cgroup_v1`. On a pure v2 host
(`/sys/fs/cgroup/cgroup.controllers` lists memory and pids) -> `cgroup_v2`. Without either (e.g. an
unprivileged container) -> `rlimit`: RLIMIT_AS caps memory per process and RLIMIT_NPROC caps
processes, which the kernel does not enforce for root, so the fork-bomb guarantee needs cgroups.
A cgroup also gives a reliable "kill the whole tree": every process in it, however it daemonized.
"""

from __future__ import annotations

import os
import pathlib
import signal
import time

from harness_env.sandbox.base import LABEL, Limits

CG_ROOT = pathlib.Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu")


def _writable(p: pathlib.Path) -> bool:
    return p.is_dir() and os.access(p, os.W_OK)


def detect_mode(root: pathlib.Path = CG_ROOT) -> str:
    ctl = root / "cgroup.controllers"
    if ctl.exists() and {"memory", "pids"} <= set(ctl.read_text().split()) and _writable(root):
        return "cgroup_v2"
    if all(_writable(root / c) for c in V1_CONTROLLERS):
        return "cgroup_v1"
    return "rlimit"


class Cgroup:
    """The cgroup(s) of one sandbox: join via `procs_files`, then `kill_all`, then `remove`."""

    def __init__(self, mode: str, name: str, root: pathlib.Path = CG_ROOT):
        self.mode, self.name, self.root = mode, name, root
        if mode == "cgroup_v1":
            self.dirs = [root / c / LABEL / name for c in V1_CONTROLLERS]
        elif mode == "cgroup_v2":
            self.dirs = [root / LABEL / name]
        else:
            self.dirs = []

    def create(self, limits: Limits) -> None:
        if self.mode == "cgroup_v2":
            parent = self.root / LABEL
            parent.mkdir(exist_ok=True)
            for d in (self.root, parent):
                try:
                    (d / "cgroup.subtree_control").write_text("+memory +pids +cpu")
                except OSError:
                    (d / "cgroup.subtree_control").write_text("+memory +pids")
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)
        mem = str(limits.memory_mb << 20)
        quota = str(max(1000, int(limits.cpus * 100_000)))
        if self.mode == "cgroup_v1":
            mem_d, pids_d, cpu_d = self.dirs
            (mem_d / "memory.limit_in_bytes").write_text(mem)
            (pids_d / "pids.max").write_text(str(limits.pids))
            (cpu_d / "cpu.cfs_period_us").write_text("100000")
            (cpu_d / "cpu.cfs_quota_us").write_text(quota)
        elif self.mode == "cgroup_v2":
            d = self.dirs[0]
            (d / "memory.max").write_text(mem)
            (d / "memory.swap.max").write_text("0") if (d / "memory.swap.max").exists() else None
            (d / "pids.max").write_text(str(limits.pids))
            if (d / "cpu.max").exists():
                (d / "cpu.max").write_text(f"{quota} 100000")

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        out: set[int] = set()
        for f in self.procs_files:
            try:
                out |= {int(x) for x in pathlib.Path(f).read_text().split()}
            except (OSError, ValueError):
                pass
        return out

    def kill_all(self, timeout_s: float = 5.0) -> None:
        """SIGKILLs every member until none is left (new forks land in the same cgroup)."""
        deadline = time.monotonic() + timeout_s
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)

    def oom_killed(self) -> bool:
        files = {"cgroup_v1": "memory.oom_control", "cgroup_v2": "memory.events"}
        if self.mode not in files:
            return False
        try:
            text = (self.dirs[0] / files[self.mode]).read_text()
        except OSError:
            return False
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill" and v.strip().isdigit():
                return int(v) > 0
        return False

    def remove(self) -> None:
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # still busy: members exiting
                    time.sleep(0.01)


def leftover_cgroups(mode: str, root: pathlib.Path = CG_ROOT) -> list[str]:
    """Names of every sandbox cgroup on the host (the reaper decides which are orphans)."""
    parent = {"cgroup_v1": root / "pids" / LABEL, "cgroup_v2": root / LABEL}.get(mode)
    if parent is None or not parent.is_dir():
        return []
    return sorted(p.name for p in parent.iterdir() if p.is_dir())


def rlimit_prefix(limits: Limits) -> list[str]:
    """argv prefix applying the rlimit fallback (util-linux prlimit)."""
    return ["prlimit", f"--as={limits.memory_mb << 20}", f"--nproc={limits.pids}", "--"]
