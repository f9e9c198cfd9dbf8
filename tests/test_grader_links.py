"""What the sanitizer (harness_env/tasks/sanitize.py) need not do, and the host's bounds: hard links cannot leave the
workspace, a sparse terabyte is neither hashed nor copied to the host, a gigabyte of stdout is read and dropped.
The link / FIFO / sparse / chmod attacks themselves, each rule switched off alone, run in tests/test_redteam.py."""

import hashlib
import pathlib

import pytest
from rollout_kit import WS, writable_copy

from harness_env.sandbox import Limits, get_backend
from harness_env.tasks import LIBRARY


def test_no_hard_link_leaves_the_workspace(tmp_path):
    """Hard links cannot reach what a symlink could: a link out of the workspace mount fails (EXDEV) inside the
    sandbox, so the sanitizer has no hard links to look for."""
    import asyncio

    from harness_env.sandbox import SandboxSpec

    ws = tmp_path / "ws"
    ws.mkdir()

    async def go():
        sbx = await get_backend("bwrap").create(SandboxSpec(workspace=ws, home=None, limits=Limits(wall_s=60),
                                                            name="hardlink", shim=False, workspace_dir=WS))
        try:
            return await sbx.exec(["/bin/sh", "-c", "ln /etc/hostname h; ln /usr/bin/env e; ls"], cwd=WS,
                                  timeout=30)
        finally:
            await sbx.close()

    res = asyncio.run(go())
    assert not (ws / "h").exists() and not (ws / "e").exists(), res.stdout
    assert "Invalid cross-device link" in res.stderr or "Read-only" in res.stderr or "denied" in res.stderr, res.stderr


def test_a_sparse_terabyte_is_neither_hashed_nor_copied_to_the_host(tmp_path):
    """Host side: `meta.inputs_changed` does not read a replaced input whose size differs (a 1 TB sparse file took
    hours to hash), and a log file in the agent's HOME over MAX_LOG_BYTES is named, not copied."""
    import time

    from harness_env.harnesses import get_harness
    from harness_env.harnesses.base import MAX_LOG_BYTES
    from harness_env.tasks import load_task

    task = load_task(writable_copy(LIBRARY / "csv_region_totals", tmp_path / "task"))
    ws = tmp_path / "ws"
    task.populate(ws)
    victim = sorted(p for p in ws.rglob("*") if p.is_file())[0]  # inputs are copied to the workspace's root
    victim.unlink()
    with open(victim, "wb") as f:
        f.truncate(1 << 40)
    t = time.monotonic()
    changed = task.changed_inputs(ws)
    took = time.monotonic() - t
    assert str(victim.relative_to(ws)) in changed, changed
    # the alternative it rules out, timed in the same run on the same file: hashing it. Its first 256 MiB (1/4096
    # of it) take longer than the whole check, so the check read far less than the file
    t, digest = time.monotonic(), hashlib.sha256()
    with open(victim, "rb") as f:
        for _ in range(64):
            digest.update(f.read(4 << 20))
    assert took < time.monotonic() - t, took
    harness = get_harness("claude_code")
    home = tmp_path / "home"
    pattern = harness.log_globs[0].replace("**/", "").replace("*", "big")
    big = home / pattern
    big.parent.mkdir(parents=True, exist_ok=True)
    with open(big, "wb") as f:
        f.truncate(1 << 40)
    kept = harness.save_logs(home, None, tmp_path / "logs")
    assert any(k.startswith(f"skipped (over {MAX_LOG_BYTES} bytes)") for k in kept), kept
    assert sum(p.stat().st_size for p in (tmp_path / "logs").rglob("*") if p.is_file()) < MAX_LOG_BYTES


async def _flood(backend_name: str, ws: pathlib.Path) -> tuple:
    import tracemalloc

    from harness_env.sandbox import SandboxSpec

    sbx = await get_backend(backend_name).create(SandboxSpec(workspace=ws, home=None, limits=Limits(wall_s=120),
                                                             name=f"flood-{backend_name}", shim=False,
                                                             workspace_dir=WS))
    try:
        tracemalloc.start()
        res = await sbx.exec(["/bin/sh", "-c", "yes | head -c 1000000000; echo done >&2"], cwd=WS, timeout=90)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return res, peak
    finally:
        await sbx.close()


@pytest.mark.parametrize("backend_name", ["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def test_a_gigabyte_of_stdout_is_read_and_dropped_not_held(tmp_path, backend_name):
    import asyncio

    from harness_env.sandbox.base import OUTPUT_CAP

    ok, why = get_backend(backend_name).available()
    assert ok, why
    (tmp_path / "ws").mkdir()
    res, peak = asyncio.run(_flood(backend_name, tmp_path / "ws"))
    assert res.exit_code == 0 and not res.timed_out and res.stderr.strip() == "done", res
    assert len(res.stdout) == OUTPUT_CAP and set(res.stdout) == {"y", "\n"}
    assert peak < 8 * OUTPUT_CAP, peak  # ~1 GB went through; the host held a few MiB of it at most
