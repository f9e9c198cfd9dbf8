"""Each real harness CLI (pinned npm install), headless, against the scripted mock endpoint, no sandbox.

Checks the adapter end to end on the real binary: its config reaches the endpoint (URL, key, model),
the harness executes the shell tool call we script in *its* tool format, sends the result back, and
its output parses to a completed outcome with the scripted final message. Run under `strace -f`, it
also proves the side traffic is off: the only socket connect of the whole process tree (telemetry,
update checks, registry look-ups, DNS included) is to the endpoint.
"""

import asyncio
import json
import re
import shutil

import pytest

from harness_env.harnesses.base import get_harness
from harness_env.harnesses.local import run_local
from harness_env.harnesses.mock_endpoint import MockEndpoint

pytestmark = [pytest.mark.slow, pytest.mark.harness]

FIRST_PATH = {"claude_code": "/v1/messages?beta=true", "codex": "/v1/responses", "opencode": "/v1/chat/completions",
              "openclaw": "/v1/chat/completions"}


def _tool_results(api: str, body: dict) -> list[str]:
    """The text of every tool result the harness sent back, in its API's format."""
    if api == "anthropic_messages":
        out = []
        for m in body["messages"]:
            for b in m["content"] if isinstance(m["content"], list) else []:
                if b.get("type") == "tool_result":
                    c = b.get("content")
                    out.append(c if isinstance(c, str) else "".join(x.get("text", "") for x in c or []))
        return out
    if api == "openai_responses":
        return [str(it.get("output")) for it in body["input"] if it.get("type") == "function_call_output"]
    return [m["content"] if isinstance(m["content"], str) else json.dumps(m["content"])
            for m in body["messages"] if m["role"] == "tool"]


CONNECT = re.compile(r'connect\(\d+, \{sa_family=AF_INET6?, sin6?_port=htons\((\d+)\),'
                     r'.*?inet_(?:addr\("|pton\(AF_INET6, ")([^"]+)"')


def _connects(trace: str) -> set[tuple[str, int]]:
    return {(addr, int(port)) for port, addr in CONNECT.findall(trace)}


def test_connect_parser():
    trace = ('12 connect(11, {sa_family=AF_INET, sin_port=htons(443), sin_addr=inet_addr("203.0.113.80")}, 16) = -1\n'
             '13 connect(3, {sa_family=AF_INET6, sin6_port=htons(53), sin6_flowinfo=htonl(0), '
             'inet_pton(AF_INET6, "::1", &sin6_addr), sin6_scope_id=0}, 28) = 0\n'
             '14 connect(5, {sa_family=AF_UNIX, sun_path="/run/x.sock"}, 110) = 0\n')
    assert _connects(trace) == {("203.0.113.80", 443), ("::1", 53)}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["claude_code", "codex", "opencode", "openclaw"])
def test_real_harness_against_mock(name, tmp_path):
    if shutil.which("strace") is None:
        pytest.skip("strace not installed (.ci/setup.d/40-harnesses.sh installs it)")
    h = get_harness(name)
    trace = tmp_path / "connects.txt"
    real_argv = h.argv
    h.argv = lambda prompt, ctx: ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace),
                                  *real_argv(prompt, ctx)]
    call = h.shell_call("printf 'hello %s' $((6*7)) > out.txt && cat out.txt")
    script = [{"tool": call["name"], "arguments": call["arguments"]}, {"text": "All done: out.txt written."}]

    async def go():
        mock = MockEndpoint(script)
        url = await mock.start()
        try:
            return (*await run_local(h, "Write hello 42 into out.txt", base_url=url, api_key="sk-abc",
                                     root=tmp_path, timeout_s=240, max_turns=5), mock.requests, mock.port)
        finally:
            await mock.stop()

    outcome, res, requests, port = asyncio.run(go())
    assert outcome.completed, f"{outcome.error}\nstdout: {res.stdout[-2000:]}\nstderr: {res.stderr[-2000:]}"
    assert outcome.final_message == "All done: out.txt written."
    assert (tmp_path / "workspace" / "out.txt").read_text() == "hello 42"
    model_calls = [r for r in requests if r["api"] == h.api]
    assert model_calls and model_calls[0]["path"] == FIRST_PATH[name]
    assert [r for r in requests if r["api"] == "other"] == []  # no stray routes (telemetry, model lists)
    auth = {k.lower(): v for k, v in model_calls[-1]["headers"].items()}
    assert auth.get("x-api-key") == "sk-abc" or auth.get("authorization") == "Bearer sk-abc"
    assert model_calls[-1]["body"]["model"] == "policy"
    assert any("hello 42" in r for r in _tool_results(h.api, model_calls[-1]["body"]))
    assert (tmp_path / "logs" / "stdout.txt").read_text() == res.stdout
    assert _connects(trace.read_text()) == {("127.0.0.1", port)}
