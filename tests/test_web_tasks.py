"""Web tasks without a browser: the family and its split, every template's checker validated through the site
app (plan 1.0, nothing 0.0, plausible mistake 0.0), env.json validation, the scripted web policy's dialects,
the screenshotting MCP relay, the forwarder's app ports, and the shim's Codex namespace tools."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from harness_env.tasks import web_family as wf
from harness_env.tasks.loader import TaskError, load_task
from harness_env.web import env as webenv
from harness_env.web import policy, site_app
from harness_env.web import validate as validate_mod
from harness_env.web.minibrowser import StepError, run_plan
from harness_env.web.validate import serve

REPO = pathlib.Path(__file__).resolve().parents[1]


def play(task: pathlib.Path, plan_file: str | None, tmp: pathlib.Path) -> float:
    plan = json.loads((task / "solution" / plan_file).read_text()) if plan_file else None
    return validate_mod.play(task, plan, tmp)


def test_family_size_split_and_determinism(tmp_path):
    assert len(wf.TEMPLATES) >= 12
    tr, ho = wf.variants("train", 10), wf.variants("heldout", 10)
    assert not set(tr) & set(ho) and len(tr) + len(ho) == 10 * len(wf.TEMPLATES)
    assert len(ho) / (len(tr) + len(ho)) == 0.2
    assert {t for t, _ in ho} == set(wf.TEMPLATES)  # every template has held-out variants
    a, b = wf.write_task(tmp_path / "a", "checkout", 3), wf.write_task(tmp_path / "b", "checkout", 3)
    for f in ("data_entry.json", "env/site.json", "reward/expected.json", "solution/plan.json"):
        assert (a / f).read_text() == (b / f).read_text()
    assert (a / "env/site.json").read_text() != wf.write_task(tmp_path / "c", "checkout", 4).joinpath(
        "env/site.json"
    ).read_text()  # another index, another variant
    dirs = wf.generate(tmp_path / "gen", "heldout", n=14, seed=1)
    assert len({json.loads((d / "data_entry.json").read_text())["metadata"]["template"] for d in dirs}) >= 10
    task = load_task(dirs[0])
    assert task.web is not None and task.web.port == wf.PORT and task.category == "web"


@pytest.mark.parametrize("template", sorted(wf.TEMPLATES))
def test_checker_validated(template, tmp_path):
    """For 3 variants: the reference plan scores 1.0, doing nothing 0.0, the plausible mistake 0.0."""
    for index in range(3):
        task = wf.write_task(tmp_path / "tasks", template, index)
        v = validate_mod.validate(task)
        assert (v.solution, v.nothing, v.wrong, v.ok) == (1.0, 0.0, 0.0, True), (template, index, v.message)


def test_validation_catches_a_broken_checker(tmp_path):
    """A checker that ignores the state (always 1.0) and a plan that does not fit the site both fail validation."""
    task = wf.write_task(tmp_path / "a", "survey", 0)
    (task / "reward" / "reward.sh").write_text('echo \'{"sub_scores": {}}\'\necho 1.0\n')
    v = validate_mod.validate(task)
    assert (v.solution, v.nothing, v.wrong, v.ok) == (1.0, 1.0, 1.0, False)
    task = wf.write_task(tmp_path / "c", "survey", 0)
    (task / "reward" / "expected.json").write_text(json.dumps({"checks": []}))  # no checks never pass
    assert validate_mod.validate(task).solution == 0.0
    task = wf.write_task(tmp_path / "b", "survey", 0)
    (task / "solution" / "plan.json").write_text(json.dumps([{"op": "click", "role": "button", "name": "Nope"}]))
    v = validate_mod.validate(task)
    assert not v.ok and "StepError" in v.message


def test_state_log_and_failed_action(tmp_path):
    task = wf.write_task(tmp_path / "t", "contact_form", 0)
    state = tmp_path / "s"
    srv, base = serve(task, state)
    try:
        b = run_plan(
            base, [{"op": "goto", "url": base + "/contact"}, {"op": "click", "role": "button", "name": "Send message"}]
        )
        assert (
            b.status == 400
            and "Please fill in" in " ".join(c.label for c in b.page.controls) + str(b.page.links)
            or b.status == 400
        )
        with pytest.raises(StepError):
            run_plan(base, [{"op": "goto", "url": base + "/"}, {"op": "click", "role": "link", "name": "Nope"}])
        req = urllib.request.Request(base + "/", headers={webenv.PROBE_HEADER: "1"})
        urllib.request.urlopen(req).read()
    finally:
        srv.shutdown()
        srv.server_close()
    s = webenv.summarize(state)
    assert s["actions"] == 1 and s["failed_actions"] == 1 and s["recovered"] is False
    assert s["pages_visited"] == 2  # /contact and / (the probe is not logged)
    log = json.loads((state / "state.json").read_text())["log"]
    assert all(e["form"].get("password") in (None, "***") for e in log)


def test_env_json_validation(tmp_path):
    task = wf.write_task(tmp_path, "todo", 0)
    env = task / "env" / "env.json"
    good = json.loads(env.read_text())
    for bad, why in (
        (dict(good, port=18080), "port"),
        (dict(good, port="8000"), "port"),
        (dict(good, command=[]), "command"),
        (dict(good, ready_path="x"), "ready_path"),
        (dict(good, state_mb=True), "state_mb"),
    ):
        env.write_text(json.dumps(bad))
        with pytest.raises(TaskError, match=why):
            load_task(task)
    env.unlink()
    with pytest.raises(TaskError, match="env.json"):
        load_task(task)
    env.symlink_to("/etc/passwd")
    with pytest.raises(TaskError):
        load_task(task)



def test_shipped_app_runs_alone_from_the_task_folder(tmp_path):
    """env/app.py imports its package (env/webapp/) under `python3 -I`, as the web-env sandbox runs it: no repo on
    the path, the script's folder off it; and it writes no __pycache__ into env/ (task content, hashed)."""
    task = wf.write_task(tmp_path / "t", "todo", 0)
    state, port = tmp_path / "state", _free_port()
    state.mkdir()
    argv = [*json.loads((task / "env" / "env.json").read_text())["command"]]
    argv[0] = argv[0] if os.path.exists(argv[0]) else sys.executable
    env = {"PATH": "/usr/bin:/bin", "HRL_STATE_DIR": str(state), "PORT": str(port)}
    proc = subprocess.Popen(argv, cwd=task / "env", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(proc.communicate()[0].decode()) from None
                time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    assert "To-do list" in body and json.loads((state / "state.json").read_text())["log"][0]["path"] == "/"
    assert not list((task / "env").rglob("__pycache__"))

SNAPSHOT = """### Page
- Page URL: http://127.0.0.1:8000/contact
### Snapshot
```yaml
- generic [ref=e1]:
  - textbox "Name" [ref=e5]
  - combobox "Topic" [ref=e7]:
    - option "Billing"
  - checkbox "Email newsletter" [checked] [ref=e9]
  - button "Send message" [ref=e12]
```"""


def _prompt(n_results: int, last: str = SNAPSHOT, query: str = "Q") -> str:
    tools = (
        '<tools>\n{"type": "function", "function": {"name": "mcp__playwright__browser_click"}}\n'
        '{"type": "function", "function": {"name": "mcp__playwright__browser_type"}}\n</tools>'
    )
    results = "".join(
        f"<tool_response>\n{last if i == n_results - 1 else 'ok'}\n</tool_response>" for i in range(n_results)
    )
    return f"<|im_start|>system\n{tools}<|im_end|>\n<|im_start|>user\n{query}<|im_end|>\n{results}"


def test_mcp_dialect_reads_refs_from_the_snapshot():
    plan = [
        {"op": "goto", "url": "http://127.0.0.1:8000/contact"},
        {"op": "fill", "label": "Name", "value": "Ada"},
        {"op": "check", "role": "checkbox", "name": "Email newsletter"},
        {"op": "click", "role": "button", "name": "Send message"},
    ]
    assert [s["op"] for s in policy.expand_mcp(plan)] == ["goto", "snapshot", "fill", "check", "click"]
    call = lambda n: json.loads(policy.mcp_reply(_prompt(n), plan, "Done.").split("\n")[1])  # noqa: E731
    assert call(0) == {"name": "browser_navigate", "arguments": {"url": plan[0]["url"]}}  # not in <tools>: default
    assert call(2) == {
        "name": "mcp__playwright__browser_type",
        "arguments": {"element": "textbox Name", "target": "e5", "text": "Ada"},
    }
    assert call(3)["name"].endswith("browser_snapshot")  # already checked: no toggle
    assert call(4) == {
        "name": "mcp__playwright__browser_click",
        "arguments": {"element": "button Send message", "target": "e12"},
    }
    assert policy.mcp_reply(_prompt(5), plan, "Done.") == "Done."


BU_STATE = """<browser_state>
Interactive elements:
Name
|SHADOW(open)|[4]<input id=f-name name=name type=text />
[7]<input type=radio name=time value=18:30 />
\t18:30
[9]<button type=submit />
\tBook table
</browser_state>
<step_info>Step2 maximum:30
"""


def test_browser_use_dialect_reads_indices():
    plan = [
        {"op": "goto", "url": "http://x/"},
        {"op": "fill", "label": "Name", "value": "Ada"},
        {"op": "check", "role": "radio", "name": "18:30"},
        {"op": "click", "role": "button", "name": "Book table"},
    ]
    reply = lambda state: json.loads(policy.bu_reply(state, plan, "ok"))["action"][0]  # noqa: E731
    assert reply(BU_STATE) == {"input": {"index": 4, "text": "Ada"}}
    assert reply(BU_STATE.replace("Step2", "Step3")) == {"click": {"index": 7}}
    assert reply(BU_STATE.replace("Step2", "Step4")) == {"click": {"index": 9}}
    assert reply(BU_STATE.replace("Step2", "Step5")) == {"done": {"text": "ok", "success": True}}


FAKE_MCP = r"""
import json, os, sys
out = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("method") != "tools/call":
        print(json.dumps({"jsonrpc": "2.0", "id": m.get("id"), "result": {}}), flush=True)
        continue
    name = m["params"]["name"]
    if name == "browser_take_screenshot":
        open(os.path.join(out, "page-%s.png" % m["id"]), "wb").write(b"\x89PNG")
    text = "### Page\n- Page URL: http://127.0.0.1:8000/%s\n" % name
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"content": [{"type": "text", "text": text}],
                      "isError": name == "browser_click"}}), flush=True)
"""


def test_mcp_recorder_screenshots_each_page_changing_step(tmp_path):
    fake = tmp_path / "fake_mcp.py"
    fake.write_text(FAKE_MCP)
    out, shots, steps = tmp_path / "out", tmp_path / "shots", tmp_path / "steps.jsonl"
    out.mkdir()
    argv = [
        sys.executable,
        str(REPO / "harness_env/web/mcp_recorder.py"),
        "--screenshots",
        str(shots),
        "--steps",
        str(steps),
        "--outdir",
        str(out),
        "--",
        sys.executable,
        str(fake),
        str(out),
    ]
    reqs = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "browser_navigate", "arguments": {}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "browser_snapshot", "arguments": {}}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "browser_click", "arguments": {}}},
    ]
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    answers = []
    for r in reqs:  # a client waits for each answer, as an MCP client does
        p.stdin.write(json.dumps(r) + "\n")
        p.stdin.flush()
        answers.append(json.loads(p.stdout.readline()))
    p.stdin.close()
    assert p.wait(timeout=30) == 0
    assert [a["id"] for a in answers] == [1, 2, 3, 4]  # the client sees its own answers only, in order
    assert "browser_navigate" in answers[1]["result"]["content"][0]["text"]
    log = [json.loads(x) for x in steps.read_text().splitlines()]
    assert [(s["tool"], s["ok"], s["screenshot"]) for s in log] == [
        ("browser_navigate", True, "step_001.png"),
        ("browser_snapshot", True, None),
        ("browser_click", False, "step_003.png"),
    ]
    assert log[0]["url"] == "http://127.0.0.1:8000/browser_navigate"
    assert sorted(os.listdir(shots)) == ["step_001.png", "step_003.png"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_forwarder_app_ports_both_ways(tmp_path):
    """--forward PORT=SOCK (agent side) and --listen-unix SOCK --socket HOST:PORT (app side), chained."""
    app_port, agent_port = _free_port(), _free_port()
    srv = site_app.http.server.ThreadingHTTPServer(
        ("127.0.0.1", app_port),
        site_app.make_handler(site_app.Site({"kind": "todo", "title": "T", "data": {"todos": []}}, str(tmp_path))),
    )
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    sock = tmp_path / "app.sock"
    fwd = str(REPO / "harness_env/sandbox/forwarder.py")
    procs = [
        subprocess.Popen([sys.executable, fwd, "--listen-unix", str(sock), "--socket", f"127.0.0.1:{app_port}"]),
        subprocess.Popen([sys.executable, fwd, "--forward", f"{agent_port}={sock}"]),
    ]
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{agent_port}/", timeout=5).read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert "To-do list" in body
    finally:
        for p in procs:
            p.kill()
            p.wait()
        srv.shutdown()
        srv.server_close()


def test_shim_flattens_codex_namespace_tools():
    from research.shim.openai_responses import _fold_item, _Items, parse_tools
    from research.shim.parse import ParsedToolCall

    body = {
        "tools": [
            {"type": "function", "name": "exec_command", "parameters": {}},
            {
                "type": "namespace",
                "name": "mcp__playwright",
                "tools": [{"type": "function", "name": "browser_click", "parameters": {"type": "object"}}],
            },
        ]
    }
    tools, custom, spaced = parse_tools(body)
    assert [t["function"]["name"] for t in tools] == ["exec_command", "mcp__playwright__browser_click"]
    assert spaced == {"mcp__playwright__browser_click": ["mcp__playwright", "browser_click"]} and not custom
    items = _Items(set(), spaced)
    items.add(ParsedToolCall(name="mcp__playwright__browser_click", arguments={"target": "e1"}, raw=""))
    item = items.items[-1]
    assert (item["name"], item["namespace"]) == ("browser_click", "mcp__playwright")
    out: list = []
    _fold_item(
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "browser_click",
            "namespace": "mcp__playwright",
            "arguments": "{}",
        },
        0,
        out,
        None,
    )
    assert out[0].tool_calls[0].name == "mcp__playwright__browser_click"


def _ctx(home: str = "/home/agent"):
    from harness_env.harnesses.base import SessionContext, WebContext

    web = WebContext("http://127.0.0.1:8000/", ("http://127.0.0.1:8000",), f"{home}/.hrl/screenshots",
                     f"{home}/.hrl/browser_steps.jsonl")
    return SessionContext(base_url="http://127.0.0.1:18080/s/x", api_key="k", home=home, web=web)


def test_browser_adapters_configure_the_browser_only_on_web_tasks(tmp_path):
    import asyncio
    import dataclasses

    from harness_env.harnesses import get_harness
    from harness_env.web import browser

    ctx, cli = _ctx(), dataclasses.replace(_ctx(), web=None)
    cc, cx, bu, ref = (get_harness(n) for n in ("claude_code", "codex", "browser_use", "reference"))
    assert [h.supports(True) is None for h in (cc, cx, bu, ref)] == [True, True, True, False]
    assert [h.supports(False) is None for h in (cc, cx, bu, ref)] == [True, True, False, True]
    argv = cc.argv("p", ctx)
    assert argv[argv.index("--mcp-config") + 1] == "/home/agent/.hrl/claude-mcp.json" and "--strict-mcp-config" in argv
    assert "--mcp-config" not in cc.argv("p", cli) and "ENABLE_TOOL_SEARCH" not in cc.env(cli)
    assert cc.env(ctx)["ENABLE_TOOL_SEARCH"] == "false"
    asyncio.run(cc.prepare(tmp_path / "cc", ctx))
    server = json.loads((tmp_path / "cc/.hrl/claude-mcp.json").read_text())["mcpServers"]["playwright"]
    assert server["args"][2].endswith("mcp_recorder.py") and browser.PLAYWRIGHT_MCP.bin in " ".join(server["args"])
    conf = json.loads((tmp_path / "cc/.hrl/playwright-mcp.json").read_text())
    assert conf["browser"]["launchOptions"]["executablePath"] == browser.CHROMIUM
    assert "--no-sandbox" in conf["browser"]["launchOptions"]["args"] and conf["imageResponses"] == "omit"
    assert conf["network"]["allowedOrigins"] == ["http://127.0.0.1:8000"]
    toml = cx.config_toml(ctx)
    assert "[mcp_servers.playwright]" in toml and "required = true" in toml
    assert "mcp_servers" not in cx.config_toml(cli)
    assert browser.HERE in cc.mounts(web=True) and browser.HERE not in cc.mounts()
    env = bu.env(ctx)
    assert env["ANONYMIZED_TELEMETRY"] == "false" and env["BROWSER_USE_CLOUD_SYNC"] == "false"
    assert env["HRL_BASE_URL"] == "http://127.0.0.1:18080/s/x/v1" and env["HRL_CHROMIUM"] == browser.CHROMIUM
    assert bu.argv("task", ctx)[-1] == "task"


def test_browser_use_output_parsing():
    from harness_env.harnesses import get_harness
    from harness_env.sandbox.base import ExecResult

    bu = get_harness("browser_use")
    line = json.dumps({"type": "hrl_browser_use_result", "done": True, "success": True, "final": "Booked.",
                       "steps": 4, "errors": [], "urls": ["http://127.0.0.1:8000/"]})
    out = bu.parse_output(ExecResult(0, "INFO noise\n" + line + "\n", ""))
    assert out.completed and out.final_message == "Booked." and out.num_turns == 4
    out = bu.parse_output(ExecResult(0, line.replace('"done": true', '"done": false'), ""))
    assert not out.completed and "did not finish" in out.error
    assert not bu.parse_output(ExecResult(1, "Traceback", "boom", timed_out=True)).completed


def test_web_aggregate_and_browser_step_summary(tmp_path):
    from harness_env.eval import analytics
    from harness_env.web import browser
    from research.capture import RolloutResult

    logs = tmp_path / "logs"
    (logs / "home" / browser.SCREENSHOTS).mkdir(parents=True)
    (logs / "home" / browser.SCREENSHOTS / "step_001.png").write_bytes(b"x")
    steps = [{"tool": "browser_click", "ok": False, "url": "http://a/"}, {"tool": "browser_click", "ok": True,
                                                                         "url": "http://a/b"}]
    (logs / "home" / browser.STEPS_LOG).write_text("\n".join(json.dumps(s) for s in steps) + "\nnot json\n")
    s = browser.summarize_steps(logs)
    assert s == {"browser_steps": 2, "browser_failed_steps": 1, "screenshots": 1, "urls_visited": 2,
                 "browser_recovered": True}
    mk = lambda web: RolloutResult(rollout_id="r", group_id="g", harness="h", status="ok", reward=1.0,  # noqa: E731
                                   meta={"web": web})
    agg = analytics.web_aggregate([mk({**s, "actions": 2, "failed_actions": 1, "recovered": False}),
                                   mk({"actions": 4, "failed_actions": 0, "recovered": None, "browser_steps": 4})])
    assert agg["rollouts"] == 2 and agg["actions_mean"] == 3.0 and agg["recovery_rate"] == 0.0
    assert agg["browser_recovery_rate"] == 1.0 and agg["failed_actions_rollout_rate"] == 0.5
    assert analytics.web_aggregate([mk(None)]) == {"rollouts": 0}


def test_runner_statuses_for_web_tasks_without_a_browser_run(tmp_path, qwen3_tokenizer_dir):
    """No browser starts here: a CLI harness on a web task and a browser agent on a CLI task are harness_error
    (before any sandbox), an app that exits at start is task_error (with its output)."""
    from rollout_kit import run_rollouts

    from harness_env.runner import RolloutSpec
    from harness_env.sandbox import get_backend
    from harness_env.tasks import family
    from research.models.tokenizer import load_tokenizer
    from research.serving.replay import ReplayEngine

    ok, why = get_backend("bwrap").available()
    if not ok:
        pytest.skip(why)
    tok = load_tokenizer(qwen3_tokenizer_dir)
    web = wf.write_task(tmp_path / "t", "todo", 0)
    broken = wf.write_task(tmp_path / "t2", "todo", 1)
    env = json.loads((broken / "env" / "env.json").read_text())
    (broken / "env" / "env.json").write_text(json.dumps({**env, "command": ["/bin/sh", "-c", "echo boom >&2; exit 3"]}))
    cli = family.write_task(tmp_path / "t", "a.txt", "apple")
    specs = [RolloutSpec(web, "reference", 0), RolloutSpec(cli, "browser_use", 0),
             RolloutSpec(broken, "claude_code", 0)]
    res, calls = run_rollouts(tmp_path, ReplayEngine(["Done."], tok, cycle=True), tok, specs)
    st = {r.rollout_id.split(".")[1]: (r.status, r.message) for r in res}
    assert st["reference"][0] == "harness_error" and "no browser tools" in st["reference"][1]
    assert st["browser_use"][0] == "harness_error" and "web tasks only" in st["browser_use"][1]
    assert st["claude_code"][0] == "task_error" and "exited" in st["claude_code"][1] and "boom" in st["claude_code"][1]
    assert not calls
