"""The checker never reads through the agent's links, blocks on its FIFOs, chokes on its sparse files or fails on
its chmods (harness_env/tasks/sanitize.py, run in the verifier's sandbox before reward/ is copied in).

Each attack is one rollout of the reference harness on the library task `file_find_largest` (its checker reads
`largest.txt` and compares it with reward/expected.txt) with a scripted policy. With the defence on, every attack
ends `ok` with reward 0 within seconds, and the rollout names what was removed; a legitimate link inside the
workspace is kept (and scores). With the defence switched off, the same attacks win (1.0) or break grading: the
test would notice if the defence stopped acting.
"""

import json
import pathlib

import pytest
from rollout_kit import WS, logs_of, per_task_policy, run_rollouts, writable_copy

from harness_env.runner import RolloutSpec
from harness_env.sandbox import Limits, get_backend
from harness_env.tasks import LIBRARY, sanitize

TASK = LIBRARY / "file_find_largest"
ANSWER = (TASK / "reward" / "expected.txt").read_text().strip()
ATTACKS = {
    "rel_link": ["ln -s reward/expected.txt largest.txt"],
    "abs_link": [f"ln -s {WS}/reward/expected.txt largest.txt"],
    "chained_link": ["mkdir -p d && ln -s .. d/up && ln -s d/up/reward/expected.txt largest.txt"],
    "dir_link": ["ln -s reward r && ln -s r/expected.txt largest.txt"],
    "outside_link": ["ln -s /etc/hostname largest.txt"],
    "fifo": ["mkfifo largest.txt"],
    "chmod": ["echo wrong.txt > largest.txt && chmod 000 largest.txt && chmod 000 ."],
    "sparse": ["truncate -s 400G largest.txt"],
    "legit_link": [f"echo {ANSWER} > .answer && ln -s .answer largest.txt"],
}


def _run(tmp: pathlib.Path, tok_dir, backend_name: str, names: list[str], reward_timeout_s: float = 30.0):
    from research.models.tokenizer import load_tokenizer
    from research.serving.replay import ReplayEngine

    backend = get_backend(backend_name)
    ok, why = backend.available()
    assert ok, why
    plans, specs = {}, []
    for name in names:
        d = writable_copy(TASK, tmp / "tasks" / name)
        entry = json.loads((d / "data_entry.json").read_text())
        entry["user_query"] += f"\n(attack: {name})"
        (d / "data_entry.json").write_text(json.dumps(entry))
        plans[f"(attack: {name})"] = (ATTACKS[name], "Done.")
        specs.append(RolloutSpec(d, "reference", 0))
    tok = load_tokenizer(tok_dir)
    engine = ReplayEngine(per_task_policy("reference", plans, tok.decode), tok)
    results, _ = run_rollouts(tmp, engine, tok, specs, backend=backend, concurrency=3, timeout_s=120,
                              reward_timeout_s=reward_timeout_s,
                              limits=Limits(cpus=1.0, memory_mb=1024, wall_s=200, workspace_mb=64))
    return {r.rollout_id.split(".")[0]: r for r in results}


@pytest.fixture(scope="module")
def defended(tmp_path_factory, qwen3_tokenizer_dir):
    return _run(tmp_path_factory.mktemp("links"), qwen3_tokenizer_dir, "bwrap", list(ATTACKS))


REMOVED = {"rel_link": ("links", "largest.txt"), "abs_link": ("links", "largest.txt"),
           "chained_link": ("links", "largest.txt"), "dir_link": ("links", "r"),
           "outside_link": ("links", "largest.txt"), "fifo": ("special", "largest.txt"),
           "sparse": ("oversize", "largest.txt")}


@pytest.mark.parametrize("name", [n for n in ATTACKS if n != "legit_link"])
def test_attack_scores_zero_quickly_and_is_on_record(defended, name):
    r = defended[name]
    assert r.status == "ok" and r.reward == 0.0, (name, r.status, r.message)
    assert r.timings["reward_s"] < 15, r.timings  # a FIFO no longer holds the checker until its timeout
    if name in REMOVED:
        kind, path = REMOVED[name]
        assert path in r.meta["sanitized"][kind], r.meta["sanitized"]
    if name == "chained_link":  # the inner link stays inside the workspace: kept, only the escape is removed
        assert r.meta["sanitized"]["links"] == ["largest.txt"]
    if name == "chmod":
        assert r.meta["sanitized"]["modes"] >= 2  # the workspace and largest.txt made readable again


def test_a_link_inside_the_workspace_is_kept_and_graded(defended):
    r = defended["legit_link"]
    assert r.status == "ok" and r.reward == 1.0 and "links" not in r.meta["sanitized"], r.meta


def test_with_the_defence_off_the_attacks_win(tmp_path, qwen3_tokenizer_dir, monkeypatch):
    """The same rollouts with a sanitizer that removes nothing: the link scores 1.0, the chmod breaks grading,
    the FIFO holds the checker until the reward timeout."""
    monkeypatch.setattr(sanitize, "SCRIPT", "import json; print(json.dumps({'entries': 0, 'truncated': False}))")
    res = _run(tmp_path, qwen3_tokenizer_dir, "bwrap", ["rel_link", "chmod", "fifo"], reward_timeout_s=4.0)
    assert res["rel_link"].status == "ok" and res["rel_link"].reward == 1.0, logs_of(tmp_path, "rel_link")
    assert res["chmod"].status == "reward_error", (res["chmod"].status, res["chmod"].message)
    assert res["fifo"].status == "reward_error" and "timed out" in res["fifo"].message


@pytest.mark.docker
def test_link_fifo_and_chmod_are_defended_in_docker(tmp_path, qwen3_tokenizer_dir):
    res = _run(tmp_path, qwen3_tokenizer_dir, "docker", ["rel_link", "fifo", "chmod", "legit_link"])
    for name in ("rel_link", "fifo", "chmod"):
        assert res[name].status == "ok" and res[name].reward == 0.0, (name, res[name].status, res[name].message)
    assert res["legit_link"].reward == 1.0


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
    assert time.monotonic() - t < 5 and str(victim.relative_to(ws)) in changed, changed
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
