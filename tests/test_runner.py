"""Runner end to end: reference harness in bwrap -> forwarder -> shim -> replay engine; bad inputs end
with their named status; infra failures are retried, model failures are not; re-runs resume."""
import asyncio
import dataclasses
import json
import pathlib

import pytest
from rollout_kit import ShellHarness

from harness_env.harnesses.base import register
from harness_env.runner import Runner, RunnerConfig, plan
from harness_env.sandbox import Limits, get_backend
from harness_env.tasks import LIBRARY, family
from research.capture import CallRecord, CaptureLog, RolloutResult, read_log

HANG_S = 600  # how long test_hang sleeps: a runner that waited for it instead of its timeout takes this long


@register
class _Hang(ShellHarness):
    name, script = "test_hang", f"sleep {HANG_S}"


@register
class _Crash(ShellHarness):
    name, script = "test_crash", "echo boom >&2; exit 3"


@register
class _BadConfig(ShellHarness):
    name = "test_bad_config"

    def argv(self, prompt, ctx):
        from harness_env.harnesses.base import HarnessError

        raise HarnessError("test_bad_config: no such model")


@register
class _Peek(ShellHarness):
    """Tries to find the checker while it runs: everything it can see named reward* goes to found.txt."""

    name = "test_peek"
    script = "echo probe-ran > found.txt; find / -name 'reward*' -not -path '/proc/*' 2>/dev/null >> found.txt; true"


@register
class _FlakyInstall(ShellHarness):
    """Solves every make_file task without a model; its install fails the first time (infra)."""

    name, script, installs = "test_flaky_install", "echo apple > notes.txt", 0

    async def install(self):
        type(self).installs += 1
        if type(self).installs == 1:
            raise OSError("npm registry unreachable")


@pytest.fixture()
def shim(tmp_path, qwen3_tokenizer_dir):
    from research.models.tokenizer import load_tokenizer
    from research.serving.replay import ReplayEngine
    from research.shim.server import ShimServer

    tok = load_tokenizer(qwen3_tokenizer_dir)
    engine = ReplayEngine(lambda req: family.oracle_reply(tok.decode(req.prompt_ids)), tok)
    log = CaptureLog(tmp_path / "capture.jsonl", fsync=False)
    server = ShimServer(engine, tok, log, unix_socket=str(tmp_path / "shim.sock"))
    yield server, log
    log.close()


def _bad_tasks(root: pathlib.Path) -> dict[str, pathlib.Path]:
    out = {}
    for name, entry, reward in [("no_entry", None, "echo 1.0"),
                                ("no_reward", {"task_id": "nr", "user_query": "q"}, None),
                                ("garbage", {"task_id": "g", "user_query": "q"}, "echo hello"),
                                ("nonzero", {"task_id": "nz", "user_query": "q"}, "echo 1.0; exit 2")]:
        d = root / name
        (d / "reward").mkdir(parents=True)
        if entry:
            (d / "data_entry.json").write_text(json.dumps(entry))
        if reward:
            (d / "reward" / "reward.sh").write_text(reward + "\n")
        out[name] = d
    return out


def _run(server, log, cfg, specs):
    async def go():
        await server.start()
        runner = Runner(cfg, server, capture_log=log)
        try:
            return await runner.run(specs)
        finally:
            runner.close()
            await server.stop()
    return asyncio.run(go())


def test_reference_harness_end_to_end_captured_and_resumable(shim, tmp_path):
    server, log = shim
    tasks = family.generate(tmp_path / "tasks", "train", n=3, seed=0)
    cfg = RunnerConfig(out_dir=tmp_path / "run", concurrency=3, timeout_s=60, progress=False)
    specs = plan(tasks, ["reference"], samples=2)
    results = _run(server, log, cfg, specs)
    assert len(results) == 6
    assert all(r.status == "ok" and r.reward == 1.0 for r in results), [(r.status, r.message) for r in results]
    recs = list(read_log(tmp_path / "capture.jsonl"))
    calls = [r for r in recs if isinstance(r, CallRecord)]
    assert len(calls) == 12  # bash + finish per rollout, every call captured
    assert {c.rollout_id for c in calls} == {s.rollout_id for s in specs}
    assert sum(isinstance(r, RolloutResult) for r in recs) == 6
    r0 = results[0]
    assert r0.session_ids and r0.meta["calls"] == 2 and r0.timings["harness_s"] > 0
    assert (cfg.out_dir / "rollouts" / r0.rollout_id / "logs" / "stdout.txt").exists()
    assert _run(server, log, cfg, specs) == []  # resumed: everything finished already
    assert sum(1 for _ in read_log(cfg.out_dir / "results.jsonl")) == 6


def test_bad_inputs_end_with_named_statuses_and_the_run_goes_on(shim, tmp_path):
    server, log = shim
    bad = _bad_tasks(tmp_path / "bad")
    good = family.write_task(tmp_path / "good", "notes.txt", "apple")
    cfg = RunnerConfig(out_dir=tmp_path / "run", concurrency=4, timeout_s=60, progress=False,
                       limits=Limits(memory_mb=512, pids=128))
    specs = plan([*bad.values(), good], ["test_flaky_install"], 1) + plan([good], ["test_crash"], 1)
    res = {r.rollout_id: r for r in _run(server, log, cfg, specs)}
    # The hang gets its own short timeout (a loaded machine must not turn the others into timeouts).
    hang_cfg = dataclasses.replace(cfg, out_dir=tmp_path / "run_hang", timeout_s=1.5)
    res.update({r.rollout_id: r for r in _run(server, log, hang_cfg, plan([good], ["test_hang"], 1))})
    by = lambda task, h: res[f"{task}.{h}.0"]
    assert by("no_entry", "test_flaky_install").status == "task_error"
    assert "data_entry.json" in by("no_entry", "test_flaky_install").message
    assert by("no_reward", "test_flaky_install").status == "task_error"
    assert by("garbage", "test_flaky_install").status == "reward_error"
    assert "not a float" in by("garbage", "test_flaky_install").message
    assert by("nonzero", "test_flaky_install").status == "reward_error"
    assert "exited 2" in by("nonzero", "test_flaky_install").message
    hang = by(good.name, "test_hang")
    # killed at its 1.5 s timeout, not after the sleep (a bound far above the timeout: a loaded machine)
    assert hang.status == "timeout" and hang.timings["harness_s"] < HANG_S / 20
    crash = by(good.name, "test_crash")
    assert crash.status == "harness_error" and "boom" in crash.message and crash.meta["attempts"] == 1
    solved = by(good.name, "test_flaky_install")
    assert solved.status == "ok" and solved.reward == 1.0
    assert _FlakyInstall.installs >= 2  # the failed install was retried (an infra failure)


def test_library_task_through_runner_with_the_reference_harness(shim, tmp_path):
    """A chat-graded library task: the oracle cannot solve it, so the checker must say 0 (not crash)."""
    server, log = shim
    cfg = RunnerConfig(out_dir=tmp_path / "run", timeout_s=60, progress=False)
    (r,) = _run(server, log, cfg, plan([LIBRARY / "chat_sum_numbers"], ["reference"], 1))
    assert r.status == "ok" and r.reward == 0.0 and r.meta["category"] == "chat"


def test_unknown_harness_fails_before_anything_runs(shim, tmp_path):
    server, log = shim
    cfg = RunnerConfig(out_dir=tmp_path / "run", progress=False)
    with pytest.raises(Exception, match="unknown harness"):
        _run(server, log, cfg, plan([LIBRARY / "file_hello"], ["nope"], 1))
    assert get_backend("bwrap").available()[0]


def test_the_harness_cannot_see_the_checker(shim, tmp_path):
    server, log = shim
    task = tmp_path / "tasks" / "peek"
    (task / "reward").mkdir(parents=True)
    (task / "data_entry.json").write_text(json.dumps({"task_id": "peek", "user_query": "q"}))
    # run in <workspace>/reward (loader.grade): 1 only if the probe ran (its marker) and found nothing named reward*
    (task / "reward" / "reward.sh").write_text('F=../found.txt; cat $F >&2; grep -q probe-ran $F || { echo 0; exit; }; '
                                               'if grep -q reward $F; then echo 0; else echo 1; fi\n')
    cfg = RunnerConfig(out_dir=tmp_path / "run", timeout_s=60, progress=False)
    (r,) = _run(server, log, cfg, plan([task], ["test_peek"], 1))
    assert r.status == "ok" and r.reward == 1.0, r


@pytest.mark.docker
def test_reference_harness_in_docker_end_to_end(shim, tmp_path):
    """10 at once: more in-flight docker execs than the default thread pool has threads (a regression
    test: blocking docker calls on the default executor starved the shim's capture appends -> deadlock)."""
    if not get_backend("docker").available()[0]:
        pytest.skip("no docker daemon")
    server, log = shim
    tasks = family.generate(tmp_path / "tasks", "heldout", n=10, seed=1)
    cfg = RunnerConfig(out_dir=tmp_path / "run", backend="docker", concurrency=10, timeout_s=120, progress=False)
    results = _run(server, log, cfg, plan(tasks, ["reference"], 1))
    assert [(r.status, r.reward) for r in results] == [("ok", 1.0)] * 10, [r.message for r in results]
    assert sum(isinstance(r, CallRecord) for r in read_log(tmp_path / "capture.jsonl")) == 20


def test_shim_hiccup_is_retried_and_adapter_errors_are_harness_errors(shim, tmp_path):
    server, log = shim

    class Flaky:  # the shim refuses the first session (e.g. restarting), then works
        def __init__(self):
            self.unix_socket, self.calls = server.unix_socket, 0

        async def open_session(self, *a, **kw):
            self.calls += 1
            if self.calls == 1:
                raise ConnectionError("shim restarting")
            return await server.open_session(*a, **kw)

        async def close_session(self, sid):
            return await server.close_session(sid)

    good = family.write_task(tmp_path / "good", "notes.txt", "apple")
    cfg = RunnerConfig(out_dir=tmp_path / "run", concurrency=1, timeout_s=60, progress=False)

    async def go():
        await server.start()
        runner = Runner(cfg, Flaky(), capture_log=log)
        try:
            return await runner.run(plan([good], ["reference", "test_bad_config"], 1))
        finally:
            runner.close()
            await server.stop()

    ok, bad = asyncio.run(go())
    assert ok.status == "ok" and ok.reward == 1.0 and ok.meta["attempts"] == 2
    assert bad.status == "harness_error" and "no such model" in bad.message and bad.meta["attempts"] == 1
