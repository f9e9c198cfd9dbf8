"""The Harness base/registry and the reference harness against the scripted mock endpoint (no sandbox)."""

import asyncio
import json
import pathlib
import types

import pytest

from harness_env.harnesses.base import HarnessError, SessionContext, get_harness, harness_names, json_lines
from harness_env.harnesses.local import run_local
from harness_env.harnesses.mock_endpoint import MockEndpoint


def test_registry_knows_reference_and_rejects_unknown():
    assert "reference" in harness_names()
    h = get_harness("reference")
    assert h.api == "openai_chat" and h.npm_packages() == []
    with pytest.raises(HarnessError, match="unknown harness 'nope'"):
        get_harness("nope")


def test_session_context_openai_url():
    ctx = SessionContext(base_url="http://127.0.0.1:9/s/abc/", api_key="k")
    assert ctx.openai_base_url == "http://127.0.0.1:9/s/abc/v1"


def test_json_lines_skips_noise():
    text = 'warning: x\n{"a": 1}\n{broken\n[1,2]\n  {"b": 2}  \n'
    assert json_lines(text) == [{"a": 1}, {"b": 2}]


def _run(script, tmp_path, prompt="make hello.txt", harness="reference", **kw):
    async def go():
        mock = MockEndpoint(script)
        url = await mock.start()
        try:
            outcome, res = await run_local(get_harness(harness), prompt, base_url=url, api_key="sk-test",
                                           root=tmp_path, timeout_s=60, **kw)
        finally:
            await mock.stop()
        return outcome, res, mock

    return asyncio.run(go())


def test_reference_runs_tools_and_finishes(tmp_path: pathlib.Path):
    script = [
        {"tool": "write_file", "arguments": {"path": "hello.txt", "content": "hi there\n"}},
        {"tool": "bash", "arguments": {"command": "wc -c < hello.txt"}},
        {"tool": "finish", "arguments": {"message": "wrote hello.txt"}},
    ]
    outcome, res, mock = _run(script, tmp_path)
    assert res.exit_code == 0, res.stderr
    assert outcome.completed and outcome.final_message == "wrote hello.txt"
    assert outcome.num_turns == 3
    assert outcome.meta["tool_calls"] == ["write_file", "bash", "finish"]
    tr = outcome.meta["transcript"]  # for chat-graded checkers: user, then assistant/tool turns
    assert tr[0] == {"role": "user", "content": "make hello.txt"}
    assert [m["role"] for m in tr[1:3]] == ["assistant", "tool"]
    assert tr[-1]["tool_call_id"] and len(tr) == 7
    assert (tmp_path / "workspace" / "hello.txt").read_text() == "hi there\n"
    # The bash result went back to the model as a tool message with the real output.
    last = mock.requests[-1]["body"]["messages"]
    tool_msgs = [m for m in last if m["role"] == "tool"]
    assert tool_msgs[1]["content"].startswith("exit code 0\n9")
    assert mock.requests[0]["headers"]["Authorization"] == "Bearer sk-test"
    # Logs kept with the rollout: stdout/stderr and the transcript.
    transcript = (tmp_path / "logs" / "home" / ".reference" / "transcript.jsonl").read_text().splitlines()
    assert json.loads(transcript[1]) == {"role": "user", "content": "make hello.txt"}
    assert (tmp_path / "logs" / "stdout.txt").exists()


def test_reference_plain_answer_completes_and_max_turns_does_not(tmp_path: pathlib.Path):
    outcome, _, _ = _run([{"text": "nothing to do"}], tmp_path / "a")
    assert outcome.completed and outcome.final_message == "nothing to do" and outcome.num_turns == 1
    loop = [{"tool": "bash", "arguments": {"command": "true"}}] * 5
    outcome, res, _ = _run(loop, tmp_path / "b", max_turns=2)
    assert not outcome.completed and res.exit_code == 3
    assert "max_turns" in outcome.error and outcome.num_turns == 2


def test_reference_reports_model_errors(tmp_path: pathlib.Path):
    async def go():
        h = get_harness("reference")
        # Nothing listens on port 9 (discard): connection refused after the capped retries.
        return await run_local(h, "x", base_url="http://127.0.0.1:9", api_key="k", root=tmp_path, timeout_s=60)

    outcome, res = asyncio.run(go())
    assert not outcome.completed and res.exit_code == 2
    assert "connection failed" in outcome.error


def test_reference_parse_output_without_result_event():
    h = get_harness("reference")
    res = types.SimpleNamespace(exit_code=None, stdout=b'{"type": "turn", "turn": 1}\n', stderr=b"boom",
                                timed_out=True)
    out = h.parse_output(res)
    assert not out.completed and "timed out" in out.error and out.num_turns == 1


def test_reference_bash_sends_one_tool_and_its_short_system_prompt(tmp_path: pathlib.Path):
    script = [{"tool": "bash", "arguments": {"command": "echo apple > a.txt"}}, {"text": "Done."}]
    outcome, res, mock = _run(script, tmp_path, harness="reference_bash")
    assert res.exit_code == 0, res.stderr
    assert outcome.completed and outcome.final_message == "Done." and outcome.num_turns == 2
    assert (tmp_path / "workspace" / "a.txt").read_text() == "apple\n"
    body = mock.requests[0]["body"]
    assert [t["function"]["name"] for t in body["tools"]] == ["bash"]
    assert body["messages"][0] == {"role": "system", "content": "You are a software agent. Use the bash tool."}
    # the default harness still offers all four tools with its long system prompt
    _, _, mock = _run([{"text": "ok"}], tmp_path / "default")
    assert [t["function"]["name"] for t in mock.requests[0]["body"]["tools"]] == [
        "bash", "read_file", "write_file", "finish"]


def test_reference_agent_rejects_unknown_tools(tmp_path: pathlib.Path):
    import subprocess
    import sys

    from harness_env.harnesses.reference import AGENT_SRC

    p = subprocess.run([sys.executable, str(AGENT_SRC), "--base-url", "http://127.0.0.1:9", "--tools", "bash,rm_rf",
                        "x"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "unknown ['rm_rf']" in p.stderr
