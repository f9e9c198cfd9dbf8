"""Web tasks through real, unmodified browser harnesses (Claude Code + @playwright/mcp, Codex + @playwright/mcp,
browser-use) on Debian's headless Chromium, with the scripted web policy behind the shim: each harness solves 2 web
tasks in bwrap and in docker (every call captured, the group's prefix tree built, one screenshot per page-changing
step kept), a wrong plan and doing nothing score 0.0, and the isolation holds (the browser reaches the app and
nothing else; the app's code and state are not in the agent's sandbox; forging the state does not pay).

Browser-heavy: at most 2 rollouts (2 Chromiums) at once. `python -m pytest -s` prints the per-harness times."""

import asyncio
import json
import pathlib
import threading
import time

import pytest
from rollout_kit import logs_of, run_rollouts

from harness_env.harnesses.base import get_harness
from harness_env.harnesses.scripted import scripted_reply
from harness_env.runner import RolloutSpec
from harness_env.sandbox import Limits, SandboxSpec, get_backend
from harness_env.tasks import web_family as wf
from harness_env.web import browser
from harness_env.web import env as webenv
from harness_env.web.policy import WebOracle, web_script
from research.trees.builder import build_tree

pytestmark = [pytest.mark.slow, pytest.mark.harness]
HARNESSES = ("claude_code", "codex", "browser_use")
TASKS = (("todo", 0), ("delete_user", 1))  # short plans: the point is the pipeline, not the site


def _need(backend: str) -> None:
    ok, why = browser.chromium_available()
    if not ok:
        pytest.skip(why)
    ok, why = get_backend(backend).available()
    if not ok:
        pytest.skip(why)


def _tasks(tmp_path, which=TASKS) -> list[pathlib.Path]:
    return [wf.write_task(tmp_path / "tasks", t, i) for t, i in which]


def _engine(tok, tasks, **kw):
    from research.serving.replay import ReplayEngine

    return ReplayEngine(web_script(WebOracle(tasks, **kw), tok.decode), tok)


def _solve_all(tmp_path, tok, backend_name):
    tasks = _tasks(tmp_path)
    specs = [RolloutSpec(t, h, 0) for h in HARNESSES for t in tasks]
    backend = None if backend_name == "bwrap" else get_backend(backend_name)
    t0 = time.monotonic()
    results, calls = run_rollouts(
        tmp_path, _engine(tok, tasks), tok, specs, backend=backend, concurrency=2, timeout_s=240, max_turns=40
    )
    wall = time.monotonic() - t0
    for r in results:
        assert (r.status, r.reward) == ("ok", 1.0), (
            f"{r.rollout_id}: {r.status} {r.message}\n{logs_of(tmp_path, r.rollout_id)}"
        )
        web = r.meta["web"]
        assert web["state"] and web["actions"] >= 1 and web["screenshots"] >= 1 and web["browser_steps"] >= 2
        shots = tmp_path / "run" / "rollouts" / r.rollout_id / "logs" / "home" / browser.SCREENSHOTS
        assert sorted(p.name for p in shots.glob("*.png"))[0].startswith("step_")
        mine = [c for c in calls if c.rollout_id == r.rollout_id]
        assert len(mine) == r.meta["calls"] >= 3 and all(c.status == "ok" for c in mine)
        tree = build_tree(mine, [r])  # one rollout's calls: their shared prefixes merge
        assert tree.num_nodes < sum(len(c.prompt_ids) + len(c.completion_ids) for c in mine)
    print(f"\n[web e2e {backend_name}] {len(results)} rollouts in {wall:.1f} s (2 at once)")
    for r in sorted(results, key=lambda r: r.rollout_id):
        t = r.timings
        print(
            f"  {r.rollout_id}: total {t['total_s']:.1f} s (app start {t['app_start_s']:.2f} s, harness "
            f"{t['harness_s']:.1f} s, grading {t['reward_s']:.2f} s), {r.meta['calls']} calls, "
            f"{r.meta['web']['browser_steps']} browser steps, {r.meta['web']['screenshots']} screenshots"
        )
    return results


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_each_harness_solves_two_web_tasks_bwrap(tmp_path, qwen3_tokenizer_dir):
    from research.models.tokenizer import load_tokenizer

    _need("bwrap")
    _solve_all(tmp_path, load_tokenizer(qwen3_tokenizer_dir), "bwrap")


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(900)
def test_each_harness_solves_two_web_tasks_docker(tmp_path, qwen3_tokenizer_dir):
    from research.models.tokenizer import load_tokenizer

    _need("docker")
    _solve_all(tmp_path, load_tokenizer(qwen3_tokenizer_dir), "docker")


@pytest.mark.timeout(600)
def test_wrong_plan_and_doing_nothing_score_zero_in_a_real_browser(tmp_path, qwen3_tokenizer_dir):
    from research.models.tokenizer import load_tokenizer
    from research.serving.replay import ReplayEngine

    _need("bwrap")
    tok = load_tokenizer(qwen3_tokenizer_dir)
    tasks = _tasks(tmp_path, [("book_table", 2)])
    wrong, _ = run_rollouts(
        tmp_path / "wrong",
        _engine(tok, tasks, wrong=True),
        tok,
        [RolloutSpec(tasks[0], "claude_code", 0)],
        timeout_s=240,
        max_turns=40,
    )
    idle, _ = run_rollouts(
        tmp_path / "idle",
        ReplayEngine(["Done."], tok, cycle=True),
        tok,
        [RolloutSpec(tasks[0], "claude_code", 0)],
        timeout_s=240,
    )
    assert (wrong[0].status, wrong[0].reward) == ("ok", 0.0), wrong[0].message
    assert wrong[0].meta["web"]["actions"] == 1  # it did book: the wrong time
    assert (idle[0].status, idle[0].reward) == ("ok", 0.0) and idle[0].meta["web"]["requests"] == 0


@pytest.mark.timeout(600)
def test_recovery_after_a_failed_action_is_measured(tmp_path, qwen3_tokenizer_dir):
    """Submitting the contact form empty first (the app answers 400), then filling it in: solved, and the rollout
    reports one failed action and a recovery; launch.eval's aggregate counts it."""
    from harness_env.eval import analytics
    from research.models.tokenizer import load_tokenizer

    _need("bwrap")
    tok = load_tokenizer(qwen3_tokenizer_dir)
    task = _tasks(tmp_path, [("contact_form", 1)])[0]
    plan = json.loads((task / "solution" / "plan.json").read_text())
    send = next(s for s in plan if s.get("name") == "Send message")
    (task / "solution" / "plan.json").write_text(json.dumps([plan[0], plan[1], send, *plan[2:]]))
    res, _ = run_rollouts(tmp_path, _engine(tok, [task]), tok, [RolloutSpec(task, "claude_code", 0)], timeout_s=240,
                          max_turns=40)
    r = res[0]
    assert (r.status, r.reward) == ("ok", 1.0), (r.message, logs_of(tmp_path, r.rollout_id))
    assert r.meta["web"]["failed_actions"] == 1 and r.meta["web"]["recovered"] is True
    agg = analytics.web_aggregate(res)
    assert agg["recovery_rate"] == 1.0 and agg["failed_actions_rollout_rate"] == 1.0


@pytest.mark.timeout(600)
def test_launch_eval_reports_web_tasks(tmp_path, qwen3_tokenizer_dir):
    """launch.eval's library path on `--tasks=web:heldout:2 --harness=codex --k=2 --endpoint=oracle`: the seeded
    held-out sample, the oracle playing each task's plan through the browser, pass@k per harness and category, and
    the web behaviour (pages visited, actions, browser steps, screenshots) in the report."""
    from harness_env.eval.run import build_engine, evaluate, task_dirs
    from harness_env.runner import RunnerConfig
    from research.models.tokenizer import load_tokenizer

    _need("bwrap")
    tok = load_tokenizer(qwen3_tokenizer_dir)
    tasks = task_dirs("web:heldout:2", tmp_path)
    names = [t.name.removeprefix("web-").rsplit("-", 1) for t in tasks]
    assert len(tasks) == 2 and all(wf.split_of(n, int(i)) == "heldout" for n, i in names), names
    out = tmp_path / "out"
    cfg = RunnerConfig(out_dir=out, concurrency=2, timeout_s=240, max_turns=40, progress=False)
    doc = asyncio.run(evaluate(tasks=tasks, harnesses=["codex"], k=2, engine=build_engine("oracle", tok, tasks=tasks),
                               tok=tok, out=out, cfg=cfg))
    (row,) = [r for r in doc["rows"] if r.group == "all"]
    assert row.rollouts == 4 and row.metrics["pass@1"] == 1.0 and row.metrics["pass@2"] == 1.0, row
    assert any(r.group != "all" and r.metrics["pass@1"] == 1.0 for r in doc["rows"])  # per category too
    web = doc["behaviour"]["codex"]["web"]
    assert web["rollouts"] == 4 and web["pages_visited_mean"] >= 1 and web["actions_mean"] >= 1
    assert web["browser_steps_mean"] >= 2 and web["screenshots_mean"] >= 1
    assert doc["behaviour"]["codex"]["tool_calls_by_kind"]["browse"] >= 4
    assert '"web"' in doc["paths"]["txt"].read_text()


# ---- isolation ------------------------------------------------------------------------------------------
SECRET = "host-only-secret-7f3a"


def _host_server() -> tuple[int, callable]:
    """A server on the HOST's loopback that the sandboxed browser must not reach."""
    import http.server

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = f"<html><body>{SECRET}</body></html>".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return srv.server_address[1], srv.shutdown


def _dump_dom(url: str) -> list[str]:
    return [
        "/usr/bin/timeout",
        "60",
        browser.CHROMIUM,
        "--headless",
        *browser.CHROMIUM_ARGS,
        "--user-data-dir=/tmp/chromium-profile",
        "--dump-dom",
        url,
    ]


@pytest.mark.parametrize("backend_name", ["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
@pytest.mark.timeout(300)
def test_browser_reaches_only_the_app_and_sees_none_of_its_state(tmp_path, backend_name):
    _need(backend_name)
    task = _tasks(tmp_path, [("todo", 0)])[0]
    web = webenv.load_env(task)
    host_port, stop_host = _host_server()

    async def go():
        backend = get_backend(backend_name)
        app = await webenv.start(backend, web, tmp_path / "webenv", name="iso-app", wall_s=200)
        ws, home = tmp_path / "ws", tmp_path / "home"
        spec = SandboxSpec(
            workspace=ws,
            home=home,
            limits=Limits(memory_mb=2048, pids=1024, wall_s=200),
            name="iso",
            app_ports={web.port: app.socket},
        )
        sbx = await backend.create(spec)
        try:
            app_dom = await sbx.exec(_dump_dom(web.start_url), timeout=90)
            host_dom = await sbx.exec(_dump_dom(f"http://127.0.0.1:{host_port}/"), timeout=90)
            look = await sbx.exec(
                [
                    "/bin/sh",
                    "-c",
                    "ls /srv/hrl-app /srv/hrl-env 2>&1; "
                    f"ls {tmp_path / 'webenv'} 2>&1; find / -xdev \\( -name site.json -o -name "
                    "state.json -o -name expected.json \\) 2>/dev/null; echo END",
                ],
                timeout=60,
            )
        finally:
            await sbx.close()
            await app.stop()
        return app_dom, host_dom, look

    try:
        app_dom, host_dom, look = asyncio.run(go())
    finally:
        stop_host()
    assert "To-do list" in app_dom.stdout, app_dom.stderr[-1000:]
    assert SECRET not in host_dom.stdout  # the host's loopback is another network namespace
    assert "No such file" in look.stdout and look.stdout.rstrip().endswith("END")
    assert "site.json" not in look.stdout and "state.json" not in look.stdout, look.stdout


FORGE = [
    # 1. plant the state the checker wants where the checker reads it (reward/ is replaced before grading)
    "mkdir -p reward/env_state && python3 -c \"import json; json.dump({'data': json.load(open('/dev/stdin'))}, "
    "open('reward/env_state/state.json', 'w'))\" <<< '{}' ; ls reward/env_state",
    # 2. take over the app's port with a fake app (the forwarder holds it; killing the forwarder kills the agent)
    "timeout 3 python3 -m http.server 8000 --bind 127.0.0.1 2>&1 | tail -1; "
    "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/').status)\"",
    # 3. look for the app's files and state anywhere it could reach
    "find / -xdev \\( -name state.json -o -name site.json \\) -not -path '*/reward/*' 2>/dev/null | head; "
    "echo searched",
]


@pytest.mark.timeout(300)
def test_forging_the_app_state_does_not_pay(tmp_path, qwen3_tokenizer_dir):
    """An agent with a shell plants the expected state in the workspace, replaces the app on its port and searches
    for the real state: the verifier reads the app's own state (untouched), reward 0.0."""
    from research.models.tokenizer import load_tokenizer
    from research.serving.replay import ReplayEngine

    _need("bwrap")
    tok = load_tokenizer(qwen3_tokenizer_dir)
    task = _tasks(tmp_path, [("todo", 0)])[0]
    expected = json.loads((task / "reward" / "expected.json").read_text())["checks"]
    forged = {c["path"]: c["equals"] for c in expected}
    cmds = [FORGE[0].replace("<<< '{}'", f"<<< '{json.dumps(forged)}'"), *FORGE[1:]]
    h = get_harness("claude_code")
    eng = ReplayEngine(lambda req: scripted_reply(h, cmds, "Done.", tok.decode(list(req.prompt_ids))), tok)
    res, calls = run_rollouts(tmp_path, eng, tok, [RolloutSpec(task, "claude_code", 0)], timeout_s=240)
    r = res[0]
    assert r.status == "ok" and r.reward == 0.0, (r.status, r.message, logs_of(tmp_path, r.rollout_id))
    assert r.meta["web"]["actions"] == 0  # the real app never saw a post
    outputs = "".join(tok.decode(c.prompt_ids) for c in calls[-1:])
    assert "Address already in use" in outputs and "searched" in outputs  # the attacks ran
    assert "/srv/hrl-env" not in outputs and "site.json" not in outputs.split("searched")[-2][-400:]
