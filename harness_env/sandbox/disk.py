"""Disk caps for a rollout's workspace and HOME: size-limited tmpfs mounts, else a watcher.

Why: an agent can fill the orchestrator's disk (2 GB into the workspace, 512 MB into HOME) and take
every other rollout down with it. The workspace must outlive the agent's sandbox (the verifier's
fresh sandbox grades the same directory) and be reachable by every backend's bind mount, so the cap
lives on the host directory itself:

  - `tmpfs` (root with CAP_SYS_ADMIN, e.g. this machine): the host dir becomes a tmpfs mount with
    `size=` and `nr_inodes=`; writes past the cap fail with ENOSPC inside the sandbox. Its pages are
    charged to the writer's memory cgroup, so a sandbox cannot use the workspace to dodge its memory
    limit either. "Exceeded" = the filesystem is (nearly) full.
  - `watch` (no mount privilege): a plain dir whose size the runner polls while the harness runs;
    "exceeded" = more bytes than the cap. Not a hard wall (a burst between polls gets through), but
    the rollout ends within one poll interval.

Either way the runner ends the rollout with status `disk_limit` (see harness_env/runner.py). Every
mount is recorded with its owner (pid + start time) under the reaper's state dir; `reap_orphans` (run
by every backend's `reap()`, i.e. at the next orchestrator start) detaches those of dead owners.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import shutil
import stat
import subprocess
import tempfile

from harness_env.sandbox import reaper
from harness_env.sandbox.base import LAUNCH_ENV

RECORDS = reaper.STATE_DIR.parent / "disks"  # one JSON per live capped mount: owner + path
SLACK_BYTES = 1 << 20  # a tmpfs with less free space than this (or 1% of the cap) counts as full
INODES_PER_MB = 256


@functools.cache
def detect_mode() -> str:
    """`tmpfs` when this process may mount one (tried once, in a scratch dir), else `watch`."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return "watch"
    d = tempfile.mkdtemp(prefix="hrl-disk-probe-")
    try:
        if _run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d]):
            _run(["umount", d])
            return "tmpfs"
        return "watch"
    finally:
        os.rmdir(d)


def _run(argv: list[str]) -> bool:
    return subprocess.run(argv, env=LAUNCH_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def is_mount(path: pathlib.Path) -> bool:
    return os.path.ismount(path)


def tree_bytes(root: pathlib.Path) -> int:
    """Bytes used under root (blocks actually allocated, so sparse files count what they take); never
    follows a link."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


class DiskCap:
    """One capped host directory. `setup()` before anything is written into it, `release()` at the end."""

    def __init__(self, path: pathlib.Path, limit_mb: int | None, mode: str | None = None):
        self.path, self.limit_mb = pathlib.Path(path), limit_mb
        self.mode = "none" if limit_mb is None else (mode or detect_mode())
        self.mounted = False

    def setup(self) -> None:
        """Creates the directory (empty) and, in tmpfs mode, mounts the capped tmpfs on it."""
        self.path.mkdir(parents=True, exist_ok=True)
        if self.mode != "tmpfs":
            return
        opts = f"size={self.limit_mb}m,nr_inodes={max(1024, self.limit_mb * INODES_PER_MB)},mode=0755,nodev,nosuid"
        self.record = RECORDS / f"{os.getpid()}-{id(self):x}-{self.path.name}.json"
        self.record.parent.mkdir(parents=True, exist_ok=True)
        self.record.write_text(json.dumps({"owner": reaper.owner_record(), "path": str(self.path)}))
        if not _run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(self.path)]):
            self.record.unlink(missing_ok=True)
            raise OSError(f"cannot mount a {self.limit_mb} MiB tmpfs on {self.path}")
        self.mounted = True

    def used_bytes(self) -> int:
        if self.mounted:
            st = os.statvfs(self.path)
            return (st.f_blocks - st.f_bfree) * st.f_frsize
        return tree_bytes(self.path)

    def exceeded(self) -> bool:
        """Did the agent hit the cap? tmpfs: (nearly) full, in bytes or inodes; watch: over the cap."""
        if self.limit_mb is None:
            return False
        cap = self.limit_mb << 20
        if self.mounted:
            st = os.statvfs(self.path)
            free = st.f_bavail * st.f_frsize
            return free < max(SLACK_BYTES, cap // 100) or st.f_favail < 16
        return self.used_bytes() > cap

    def describe(self) -> str:
        return f"{self.used_bytes() / (1 << 20):.1f} MiB used of a {self.limit_mb} MiB cap ({self.mode})"

    def release(self, keep: bool = False) -> None:
        """Unmounts; with `keep`, the contents stay at the same path on disk (copied off the tmpfs first,
        links as links, special files dropped). Idempotent."""
        if not (self.mounted or is_mount(self.path)):
            return
        if keep:
            kept = self.path.with_name(f".{self.path.name}.kept")
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(self.path, kept, symlinks=True, copy_function=_copy_regular)
        if not _run(["umount", str(self.path)]):
            _run(["umount", "-l", str(self.path)])  # still busy: detach now, freed when the last user goes
        self.mounted = False
        if getattr(self, "record", None) is not None:
            self.record.unlink(missing_ok=True)
        if keep:
            self.path.rmdir()
            kept.rename(self.path)


def _copy_regular(src: str, dst: str) -> None:
    """copytree's copier for agent-made trees: regular files only (a FIFO would block the copy forever)."""
    if stat.S_ISREG(os.lstat(src).st_mode):
        shutil.copy2(src, dst, follow_symlinks=False)


def reap_orphans(records: pathlib.Path | None = None) -> int:
    """Detaches the capped mounts of orchestrators that died (kill -9) before releasing them."""
    records = records or RECORDS
    n = 0
    for rec in sorted(records.glob("*.json")) if records.is_dir() else []:
        try:
            d = json.loads(rec.read_text())
        except (OSError, ValueError):
            d = {}
        if d and reaper.alive(d.get("owner", {})):
            continue
        path = pathlib.Path(d.get("path", "/nonexistent"))
        if is_mount(path) and (_run(["umount", str(path)]) or _run(["umount", "-l", str(path)])):
            n += 1
        rec.unlink(missing_ok=True)
    return n


def _live_paths(records: pathlib.Path) -> set[pathlib.Path]:
    out = set()
    for rec in sorted(records.glob("*.json")) if records.is_dir() else []:
        try:
            d = json.loads(rec.read_text())
        except (OSError, ValueError):
            continue
        if reaper.alive(d.get("owner", {})):
            out.add(pathlib.Path(d.get("path", "/")).resolve())
    return out


def release_stale(root: pathlib.Path, records: pathlib.Path | None = None) -> int:
    """Detaches every mount under root (a previous orchestrator's rollout dirs) that no live orchestrator
    claims; returns how many."""
    root = pathlib.Path(root).resolve()
    live = _live_paths(records or RECORDS)
    n = 0
    for target in sorted(_mounts_under(root), key=lambda p: -len(p.parts)):
        if target in live:
            continue
        if _run(["umount", str(target)]) or _run(["umount", "-l", str(target)]):
            n += 1
    return n


def _mounts_under(root: pathlib.Path) -> list[pathlib.Path]:
    out = []
    try:
        lines = pathlib.Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        target = pathlib.Path(fields[4].encode().decode("unicode_escape"))
        if root in target.parents:
            out.append(target)
    return out
