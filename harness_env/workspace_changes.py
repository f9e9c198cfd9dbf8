"""What the agent did to its workspace: files created, modified and deleted relative to the task's inputs.

Why record it (RolloutResult meta `workspace_changes`, shown on the viewer's rollout page): the verifier's
sub-scores say whether the answer was right, not what the agent left behind; a workspace is kept only with
`keep_workspaces`, and a run's thousands of rollouts cannot all keep theirs. A list of (path, change, size, short
sha256) costs a walk of the workspace and the hashes of the changed files.

Cheap and safe on an agent's workspace (run only when no agent process is left, as the tamper check is): links
are listed, never followed; only regular files are hashed, each at most HASH_MAX bytes and HASH_BUDGET in all (a
1 TB sparse file gets no hash, not hours of reading); at most `limit` entries, the rest counted. Which inputs
changed comes from `Task.input_changes` (harness_env/tasks/loader.py), the tamper rule's input.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import stat

HASH_MAX = 64 << 20
HASH_BUDGET = 256 << 20
SHA_CHARS = 12


def _files(root: pathlib.Path) -> dict[str, os.stat_result]:
    """Relative path -> lstat of every non-directory under `root` (links included, never followed)."""
    out: dict[str, os.stat_result] = {}
    for dirpath, dirnames, filenames in os.walk(root):  # os.walk follows no directory link
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, name)
            try:
                out[os.path.relpath(p, root)] = os.lstat(p)
            except OSError:
                continue
    return out


def _sha(path: pathlib.Path, st: os.stat_result, budget: list[int]) -> str | None:
    if not stat.S_ISREG(st.st_mode) or st.st_size > min(HASH_MAX, budget[0]):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        budget[0] -= st.st_size
        return hashlib.file_digest(f, "sha256").hexdigest()[:SHA_CHARS]


def _entry(rel: str, change: str, root: pathlib.Path, st: os.stat_result, budget: list[int]) -> dict:
    kind = "file" if stat.S_ISREG(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode) else "other"
    return {"path": rel, "change": change, "kind": kind, "size": int(st.st_size),
            "sha256": _sha(root / rel, st, budget)}


def changes(input_dir: pathlib.Path, workspace: pathlib.Path, input_changes: list[dict],
            limit: int = 200) -> tuple[list[dict], int]:
    """(entries sorted by path, how many more were left out). An entry: {path, change: created | modified |
    deleted, kind: file | link | other, size, sha256 (first SHA_CHARS hex digits, None: not hashed)}; a deleted
    input's size and hash are the input's."""
    inputs = _files(input_dir) if input_dir.is_dir() else {}
    now = _files(workspace)
    touched = {c["path"]: c["change"] for c in input_changes}
    found = []
    for rel in sorted(set(now) | set(touched)):
        if rel in now:
            if rel not in inputs or rel in touched:
                found.append((rel, "created" if rel not in inputs else "modified", workspace, now[rel]))
        elif rel in inputs:
            found.append((rel, "deleted", input_dir, inputs[rel]))
    budget = [HASH_BUDGET]
    return [_entry(rel, ch, root, st, budget) for rel, ch, root, st in found[:limit]], max(0, len(found) - limit)
