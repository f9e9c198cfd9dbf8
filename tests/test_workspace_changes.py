"""harness_env/workspace_changes.py: what a rollout's agent created, modified and deleted, against the task's inputs.

A real task folder (input_files/ with a nested dir and a relative link) populated into a workspace by the loader,
then changed the ways an agent does: a file written, an input edited, an input deleted, an input replaced by a
directory, a link planted, a 1 GiB sparse file. Hashes are checked against hashlib on the files themselves.
"""

import hashlib
import json
import os
import pathlib

import pytest

from harness_env import workspace_changes as W
from harness_env.tasks.loader import load_task


def _sha(p: pathlib.Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()[:W.SHA_CHARS]


@pytest.fixture
def task(tmp_path):
    root = tmp_path / "task"
    (root / "input_files" / "data").mkdir(parents=True)
    (root / "input_files" / "notes.md").write_text("# notes\n" * 20)
    (root / "input_files" / "data" / "a.csv").write_text("x,y\n1,2\n")
    (root / "input_files" / "data" / "b.csv").write_text("x,y\n3,4\n")
    (root / "input_files" / "keep.txt").write_text("untouched\n")
    os.symlink("keep.txt", root / "input_files" / "alias.txt")
    (root / "reward").mkdir()
    (root / "reward" / "reward.sh").write_text("echo 1\n")
    (root / "data_entry.json").write_text(json.dumps({"task_id": "t", "user_query": "do it"}))
    return load_task(root)


def test_created_modified_deleted_with_sizes_and_hashes(task, tmp_path):
    ws = tmp_path / "ws"
    task.populate(ws)
    assert W.changes(task.input_dir, ws, task.input_changes(ws)) == ([], 0)  # a fresh copy: nothing changed
    (ws / "out").mkdir()
    (ws / "out" / "answer.txt").write_text("42\n")
    (ws / "notes.md").write_text("# notes\nedited\n")
    (ws / "data" / "a.csv").unlink()
    (ws / "data" / "b.csv").unlink()
    (ws / "data" / "b.csv").mkdir()  # an input replaced by a directory
    (ws / "data" / "b.csv" / "inner.txt").write_text("in\n")
    os.symlink("/etc/passwd", ws / "link")
    with open(ws / "sparse.bin", "wb") as f:
        f.truncate(1 << 30)
    entries, more = W.changes(task.input_dir, ws, task.input_changes(ws))
    by = {e["path"]: e for e in entries}
    assert more == 0 and [e["path"] for e in entries] == sorted(by)
    assert {p: e["change"] for p, e in by.items()} == {
        "out/answer.txt": "created", "notes.md": "modified", "data/a.csv": "deleted", "data/b.csv": "deleted",
        "data/b.csv/inner.txt": "created", "link": "created", "sparse.bin": "created"}
    for p in ("out/answer.txt", "notes.md", "data/b.csv/inner.txt"):
        assert (by[p]["kind"], by[p]["size"], by[p]["sha256"]) == ("file", (ws / p).stat().st_size, _sha(ws / p))
    for p in ("data/a.csv", "data/b.csv"):  # a deleted input: the input's size and hash
        src = task.input_dir / p
        assert (by[p]["size"], by[p]["sha256"]) == (src.stat().st_size, _sha(src))
    assert by["link"]["kind"] == "link" and by["link"]["sha256"] is None  # never followed
    assert (by["sparse.bin"]["size"], by["sparse.bin"]["sha256"]) == (1 << 30, None)  # over HASH_MAX: not read


def test_the_entry_limit_counts_what_it_leaves_out(task, tmp_path):
    ws = tmp_path / "ws"
    task.populate(ws)
    for i in range(12):
        (ws / f"f{i:02d}.txt").write_text(str(i))
    entries, more = W.changes(task.input_dir, ws, task.input_changes(ws), limit=5)
    assert [e["path"] for e in entries] == [f"f{i:02d}.txt" for i in range(5)] and more == 7
