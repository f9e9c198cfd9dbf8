"""What a hostile task or agent can do to the runner, and the named status it gets instead (issue 11, part 2):
disk caps (workspace, HOME; tmpfs and watch modes), wrong-typed data_entry fields and symlinked / looping /
special inputs with other rollouts in flight (task_error, no hang), non-finite rewards (reward_error, results
stay strict JSON), a cancelled run (no sandbox process left), and the orchestrator's environment (not readable
from /proc/1/environ)."""
import asyncio
import collections
import json
import os
import pathlib
import subprocess
import sys
import time
import types

import pytest
from rollout_kit import ShellHarness

from harness_env.harnesses.base import register
from harness_env.runner import Runner, RunnerConfig, plan
from harness_env.sandbox import Limits, SandboxSpec, get_backend
from harness_env.sandbox import disk as disk_mod
from research.capture import RolloutResult, read_log


@register
class _FillWorkspace(ShellHarness):
    name, script = "test_fill_workspace", "head -c 40000000 /dev/zero > big; sleep 600"


@register
class _FillHome(ShellHarness):
    name, script = "test_fill_home", 'head -c 40000000 /dev/zero > "$HOME/big"; sleep 600'


@register
class _SlowOk(ShellHarness):
    name, script = "test_slow_ok", "sleep 2; echo apple > notes.txt; pwd > where.txt"


@register
class _Forever(ShellHarness):
    name, script = "test_forever_hrl_cancel_marker", "exec sleep 431"


class NoShim:
    """The gateway a runner needs when no model is ever called."""

    unix_socket = None

    async def open_session(self, rollout_id, group_id, harness, meta=None):
        return types.SimpleNamespace(session_id=rollout_id, api_key="k", base_url="http://127.0.0.1:1/s/x")

    async def close_session(self, session_id):
        return []


@pytest.fixture(scope="module")
def bwrap():
    b = get_backend("bwrap")
    ok, why = b.available()
    if not ok:
        pytest.skip(why)
    return b


def _task(root: pathlib.Path, name: str, entry: dict | str | None = None, reward: str = "echo 1.0",
          inputs: dict[str, str] | None = None) -> pathlib.Path:
    d = root / name
    (d / "reward").mkdir(parents=True)
    body = {"task_id": name, "user_query": "Create notes.txt."} if entry is None else entry
    (d / "data_entry.json").write_text(body if isinstance(body, str) else json.dumps(body))
    (d / "reward" / "reward.sh").write_text(reward + "\n")
    for rel, text in (inputs or {}).items():
        (d / "input_files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / "input_files" / rel).write_text(text)
    return d


def _run(tmp_path, specs, backend, **kw):
    cfg = RunnerConfig(out_dir=tmp_path / "run", progress=False, timeout_s=kw.pop("timeout_s", 60), **kw)

    async def go():
        runner = Runner(cfg, NoShim(), backend=backend)
        try:
            return await runner.run(specs)
        finally:
            runner.close()

    return asyncio.run(go())


@pytest.mark.parametrize("mode", ["tmpfs", "watch"])
@pytest.mark.parametrize("harness", ["test_fill_workspace", "test_fill_home"])
def test_disk_caps_end_the_rollout_with_disk_limit(bwrap, tmp_path, harness, mode):
    if mode == "tmpfs" and disk_mod.detect_mode() != "tmpfs":
        pytest.skip("this process may not mount a tmpfs")
    task = _task(tmp_path, "fill")
    t0 = time.monotonic()
    # timeout_s 400: a rollout the cap did not end runs into the harness's timeout, never its 600 s sleep, and the
    # runner's check after the harness ends would still call it disk_limit: only the time below tells them apart
    (res,) = _run(tmp_path, plan([task], [harness], 1), bwrap, disk_mode=mode, timeout_s=400,
                  limits=Limits(workspace_mb=8, home_mb=8, memory_mb=512))
    assert res.status == "disk_limit", res
    assert ("workspace" if harness == "test_fill_workspace" else "HOME") in res.message
    # ended by the cap while the harness slept, not by its timeout (400 s) or its own end (600 s): the bound is
    # tied to those, far from what the rollout takes on any machine (seconds), so a loaded one cannot miss it
    assert time.monotonic() - t0 < 300, res
    assert not [m for m in _mount_points() if str(tmp_path) in m]  # the capped mounts are gone


@pytest.mark.docker
def test_disk_cap_in_docker(tmp_path):
    """The capped host mount is what the container binds: the same wall, the same status."""
    backend = get_backend("docker")
    ok, why = backend.available()
    if not ok:
        pytest.skip(why)
    (res,) = _run(tmp_path, plan([_task(tmp_path, "fill")], ["test_fill_workspace"], 1), backend,
                  limits=Limits(workspace_mb=8, home_mb=8, memory_mb=512))
    assert res.status == "disk_limit" and "workspace" in res.message, res


def test_uncapped_disk_and_the_harness_starts_in_the_tasks_workspace(bwrap, tmp_path):
    task = _task(tmp_path, "ok", {"task_id": "ok", "user_query": "q", "input_mount_dir": "/srv/job ws"},
                 reward='cd "$(dirname "$0")/.." && [ "$(cat where.txt)" = "/srv/job ws" ] && echo 1.0 || echo 0.0')
    (res,) = _run(tmp_path, plan([task], ["test_slow_ok"], 1), bwrap, limits=Limits(workspace_mb=None, home_mb=None))
    assert res.status == "ok" and res.reward == 1.0, res
    assert res.meta["workspace_dir"] == "/srv/job ws"


BAD_ENTRIES = {
    "mount_int": {"task_id": "a", "user_query": "q", "input_mount_dir": 5},
    "mount_list": {"task_id": "a", "user_query": "q", "input_mount_dir": ["/x"]},
    "mount_relative": {"task_id": "a", "user_query": "q", "input_mount_dir": "work/space"},
    "mount_system": {"task_id": "a", "user_query": "q", "input_mount_dir": "/usr/local/ws"},
    "mount_dotdot": {"task_id": "a", "user_query": "q", "input_mount_dir": "/srv/../etc"},
    "task_id_int": {"task_id": 7, "user_query": "q"},
    "query_list": {"task_id": "a", "user_query": ["q"]},
    "metadata_str": {"task_id": "a", "user_query": "q", "metadata": "x"},
    "category_int": {"task_id": "a", "user_query": "q", "metadata": {"category": 3}},
    "not_an_object": [1, 2],
    "deep_nesting": "[" * 100_000 + "]" * 100_000,
    "not_json": "{task_id: a",
}


def test_wrong_typed_fields_are_task_errors_while_other_rollouts_run(bwrap, tmp_path):
    """Bad tasks next to good ones in flight, through the launch.eval library path: every bad one is a
    task_error with a message naming its field, the good ones finish, nothing hangs or crashes."""
    good = [_task(tmp_path / "tasks", f"good{i}", reward='cd "$(dirname "$0")/.." && [ -f notes.txt ] && echo 1.0')
            for i in range(3)]
    bad = {k: _task(tmp_path / "tasks", k, json.dumps(v) if isinstance(v, list) else v) for k, v in BAD_ENTRIES.items()}
    results = _run(tmp_path, plan([*good, *bad.values()], ["test_slow_ok"], 1), bwrap, concurrency=16)
    by = {r.rollout_id.split(".")[0]: r for r in results}
    assert all(by[g.name].status == "ok" and by[g.name].reward == 1.0 for g in good), [by[g.name] for g in good]
    for name in bad:
        assert by[name].status == "task_error", (name, by[name])
        assert "attempts" not in by[name].meta  # never retried
    assert "input_mount_dir" in by["mount_int"].message and "int" in by["mount_int"].message
    assert "task_id" in by["task_id_int"].message and "metadata" in by["metadata_str"].message


def _link_tasks(root: pathlib.Path) -> dict[str, pathlib.Path]:
    out = {}
    leak = _task(root, "leak", inputs={"a.txt": "a"})
    os.symlink("/etc/passwd", leak / "input_files" / "leak")
    out["leak"] = leak
    up = _task(root, "up", inputs={"a.txt": "a"})
    os.symlink("../" * 40 + "etc/hostname", up / "input_files" / "up")
    out["up"] = up
    loop = _task(root, "loop", inputs={"a.txt": "a"})
    os.symlink("loop2", loop / "input_files" / "loop1")
    os.symlink("loop1", loop / "input_files" / "loop2")
    out["loop"] = loop
    fifo = _task(root, "fifo", inputs={"a.txt": "a"})
    os.mkfifo(fifo / "input_files" / "pipe")
    out["fifo"] = fifo
    reward_link = _task(root, "reward_link")
    os.symlink("/etc/shadow", reward_link / "reward" / "extra")
    out["reward_link"] = reward_link
    return out


def test_symlinked_looping_and_special_inputs_are_task_errors(bwrap, tmp_path):
    bad = _link_tasks(tmp_path / "tasks")
    inside = _task(tmp_path / "tasks", "inside", inputs={"data/a.txt": "A"},
                   reward='cd "$(dirname "$0")/.." && [ -L alias ] && [ "$(cat alias)" = A ] && echo 1.0 || echo 0.0')
    os.symlink("data/a.txt", inside / "input_files" / "alias")
    results = _run(tmp_path, plan([*bad.values(), inside], ["test_slow_ok"], 1), bwrap, concurrency=8)
    by = {r.rollout_id.split(".")[0]: r for r in results}
    assert by["inside"].status == "ok" and by["inside"].reward == 1.0, by["inside"]  # a link inside is kept
    expect = {"leak": "absolute", "up": "leaves input_files", "loop": "loop", "fifo": "not a regular file",
              "reward_link": "absolute"}
    for name, why in expect.items():
        assert by[name].status == "task_error" and why in by[name].message, (name, by[name])
    assert not list((tmp_path / "run").rglob("passwd")) and not list((tmp_path / "run").rglob("leak"))


def test_non_finite_rewards_are_reward_errors_and_results_stay_strict_json(bwrap, tmp_path):
    tasks = [_task(tmp_path / "tasks", "inf_sub", reward='echo \'{"sub_scores": {"a": 1e999}}\'; echo 1.0'),
             _task(tmp_path / "tasks", "nan", reward="echo nan"),
             _task(tmp_path / "tasks", "inf", reward="echo 1e999"),
             _task(tmp_path / "tasks", "fine", reward='echo \'{"sub_scores": {"a": 0.5}}\'; echo 0.5')]
    results = _run(tmp_path, plan(tasks, ["test_slow_ok"], 1), bwrap, concurrency=4)
    by = {r.rollout_id.split(".")[0]: r for r in results}
    assert [by[n].status for n in ("inf_sub", "nan", "inf")] == ["reward_error"] * 3
    assert by["fine"].status == "ok" and by["fine"].sub_scores == {"a": 0.5}

    def strict(c):
        raise ValueError(f"non-finite constant {c} in results.jsonl")

    for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=strict)


def test_cancelling_a_run_kills_its_sandboxes_and_returns_promptly(bwrap, tmp_path):
    """The caller gives up (e.g. Ctrl-C, a wait_for): the rollouts in flight are cancelled, their bwrap
    process trees are killed and reaped, and the cancellation comes back within seconds."""
    tasks = [_task(tmp_path / "tasks", f"t{i}") for i in range(3)]
    cfg = RunnerConfig(out_dir=tmp_path / "run", progress=False, timeout_s=600, concurrency=3)

    t0 = time.monotonic()
    _cancel_run_after(cfg, tasks, bwrap, 3)
    assert time.monotonic() - t0 < 120  # the harness would sleep 431 s: far sooner means the cancel ended it
    assert not _procs_running("sleep 431")
    assert not [m for m in _mount_points() if str(tmp_path) in m]


def test_cancelled_while_mounting_the_caps_leaves_no_mount(bwrap, tmp_path, monkeypatch):
    """A cancellation that lands while a cap's tmpfs is being mounted (in a thread): the mount finishes,
    then the release undoes it. (Abandoning the thread let a HOME mount land after its release.)"""
    if disk_mod.detect_mode() != "tmpfs":
        pytest.skip("needs tmpfs caps (root with CAP_SYS_ADMIN)")
    setup = disk_mod.DiskCap.setup

    def slow_setup(self):
        time.sleep(1.0)
        setup(self)

    monkeypatch.setattr(disk_mod.DiskCap, "setup", slow_setup)
    tasks = [_task(tmp_path / "tasks", "t0")]
    cfg = RunnerConfig(out_dir=tmp_path / "run", progress=False, timeout_s=600, concurrency=1,
                       limits=Limits(home_mb=16, workspace_mb=16))

    _cancel_run_after(cfg, tasks, bwrap, 1.5)
    assert not [m for m in _mount_points() if str(tmp_path) in m]


def _cancel_run_after(cfg: RunnerConfig, tasks, backend, seconds: float) -> None:
    """Runs never-ending rollouts of `tasks` and gives up after `seconds` (a wait_for: TimeoutError)."""
    async def go():
        runner = Runner(cfg, NoShim(), backend=backend)
        try:
            await asyncio.wait_for(runner.run(plan(tasks, ["test_forever_hrl_cancel_marker"], 1)), seconds)
        finally:
            runner.close()

    with pytest.raises(TimeoutError):
        asyncio.run(go())


@pytest.mark.parametrize("backend_name", ["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def test_the_orchestrators_environment_does_not_reach_the_sandbox(backend_name, tmp_path, monkeypatch):
    backend = get_backend(backend_name)
    ok, why = backend.available()
    if not ok:
        pytest.skip(why)
    marker = "hrl-orchestrator-secret-6f1d"
    monkeypatch.setenv("HRL_TEST_SECRET", marker)
    (tmp_path / "ws").mkdir()

    async def go():
        spec = SandboxSpec(workspace=tmp_path / "ws", home=tmp_path / "home", name="envleak")
        async with await backend.create(spec) as sbx:
            return await sbx.exec(["/bin/sh", "-c", "cat /proc/1/environ; echo; for p in /proc/[0-9]*; do "
                                                  "cat $p/environ 2>/dev/null; echo; done; env"])

    res = asyncio.run(go())
    assert res.exit_code == 0 and "HOME=/home/agent" in res.stdout  # it did read the environments
    assert marker not in res.stdout and "HRL_TEST_SECRET" not in res.stdout


def _procs_running(cmdline: str) -> list[int]:
    out = []
    for p in pathlib.Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if (p / "cmdline").read_bytes().replace(b"\0", b" ").strip() == cmdline.encode():
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def _mount_points() -> list[str]:
    return [line.split()[4] for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines()]


def test_disk_limit_is_a_valid_capture_status(tmp_path):
    """research/capture.py accepts the new status (its schema check rejects unknown ones)."""
    from research.capture import CaptureLog

    log = CaptureLog(tmp_path / "r.jsonl", fsync=False)
    log.append(RolloutResult(rollout_id="a", group_id="g", harness="h", status="disk_limit", message="m"))
    log.close()
    (r,) = read_log(tmp_path / "r.jsonl")
    assert r.status == "disk_limit"


def test_a_command_faking_a_bwrap_failure_is_not_infrastructure(bwrap, tmp_path):
    """Only bwrap's own start failures are infra errors (retried, then dropped from training): an agent that
    prints "bwrap: ..." and exits 1 must not turn its rollout into one."""
    from harness_env.sandbox import Mount, SandboxStartError

    (tmp_path / "ws").mkdir()

    async def go(**kw):
        async with await bwrap.create(SandboxSpec(workspace=tmp_path / "ws", home=tmp_path / "h", name="f", **kw)) as s:
            return await s.exec(["/bin/sh", "-c", 'echo "bwrap: Can\'t mount proc" >&2; exit 1'])

    res = asyncio.run(go())
    assert res.exit_code == 1 and res.stderr.startswith("bwrap:")  # the command's own failure, returned
    with pytest.raises(SandboxStartError, match="nonexistent"):
        asyncio.run(go(mounts=[Mount("/nonexistent-hrl", "/x")]))


def test_disk_cap_keep_and_orphan_reaping(tmp_path):
    if disk_mod.detect_mode() != "tmpfs":
        pytest.skip("this process may not mount a tmpfs")
    records = tmp_path / "records"
    disk_mod.RECORDS, saved = records, disk_mod.RECORDS
    try:
        cap = disk_mod.DiskCap(tmp_path / "ws", 4)
        cap.setup()
        assert cap.mounted and os.path.ismount(cap.path) and len(list(records.glob("*.json"))) == 1
        (cap.path / "f.txt").write_text("x")
        os.symlink("/etc/passwd", cap.path / "link")
        with pytest.raises(OSError):  # the cap is a wall: ENOSPC
            (cap.path / "big").write_bytes(b"\0" * (5 << 20))
        assert cap.exceeded()
        (cap.path / "big").unlink()
        assert not cap.exceeded()
        cap.release(keep=True)  # the contents stay, now on disk
        assert not os.path.ismount(cap.path) and (cap.path / "f.txt").read_text() == "x"
        assert os.readlink(cap.path / "link") == "/etc/passwd" and not list(records.glob("*.json"))
        # A mount whose owner died (kill -9) is detached by the next start; a live one is left alone.
        dead, live = disk_mod.DiskCap(tmp_path / "dead", 4), disk_mod.DiskCap(tmp_path / "live", 4)
        dead.setup()
        live.setup()
        rec = json.loads(dead.record.read_text())
        rec["owner"] = {"pid": 2**22 + 11, "start": 1}
        dead.record.write_text(json.dumps(rec))
        assert disk_mod.reap_orphans(records) == 1
        assert not os.path.ismount(dead.path) and os.path.ismount(live.path)
        assert disk_mod.release_stale(tmp_path, records) == 0  # a live orchestrator's mount is not stale
        assert os.path.ismount(live.path)
        live.release()
    finally:
        disk_mod.RECORDS = saved
        for d in ("ws", "dead", "live"):
            if os.path.ismount(tmp_path / d):
                subprocess.run(["umount", "-l", str(tmp_path / d)])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_launch_eval_with_broken_tasks_among_good_ones_finishes(bwrap, tmp_path, qwen3_tokenizer_dir):
    """The reported crash/hang, as a user hits it: `python -m launch.eval` over a folder where some tasks have
    wrong-typed fields and others are fine (make_file family tasks the oracle solves), rollouts in flight."""
    from harness_env.tasks import family

    tasks = tmp_path / "tasks"
    for name, word in (("notes.txt", "apple"), ("a.txt", "river"), ("b.txt", "cloud")):
        family.write_task(tasks, name, word)
    for k in ("mount_int", "mount_list", "task_id_int", "metadata_str", "deep_nesting"):
        v = BAD_ENTRIES[k]
        _task(tasks, k, json.dumps(v) if isinstance(v, list) else v)
    out = tmp_path / "out"
    repo = pathlib.Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-m", "launch.eval", f"--tasks={tasks}", "--harness=reference", "--k=2",
                        "--endpoint=oracle", f"--out={out}", f"--tokenizer={qwen3_tokenizer_dir}", "--concurrency=8",
                        "--timeout_s=60"], cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)},
                       capture_output=True, text=True, timeout=200)
    assert p.returncode == 0, p.stderr[-3000:]
    results = [r for r in read_log(out / "results.jsonl") if isinstance(r, RolloutResult)]
    by = collections.Counter((r.group_id.split("/")[0].split("-")[0], r.status) for r in results)
    assert by[("make_file", "ok")] == 6 and sum(n for (t, s), n in by.items() if s == "task_error") == 10, by
    assert all(r.reward == 1.0 for r in results if r.status == "ok")
