"""A scripted policy for any harness: emits that harness's own shell tool calls in the policy's format.

Why: the acceptance runs put a real, unmodified harness CLI behind the shim with a replay engine, so
the "model" must answer in Qwen3's `<tool_call>` format *with the tool names and argument shapes of
that harness* (Claude Code `Bash{command}`, Codex `exec_command{cmd}`, opencode `bash{command,
description}`, OpenClaw `exec{command}`, reference `bash{command}`). The step is decided from the
rendered prompt alone (how many tool results it already holds), so the policy is stateless, safe
under concurrency, and ignores the harnesses' side calls (title generation: no tools in the prompt).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from harness_env.harnesses.base import Harness, get_harness

TOOL_RESPONSE = "<tool_response>"
TOOLS_BLOCK = "<tools>"


def tool_call_text(call: dict) -> str:
    """One tool call in Qwen3's chat format (what the shim's parser turns back into an API tool call)."""
    return "<tool_call>\n" + json.dumps({"name": call["name"], "arguments": call["arguments"]}) + "\n</tool_call>"


def scripted_reply(harness: Harness, commands: Sequence[str], final: str, prompt_text: str,
                   *, side_reply: str = "Scripted session") -> str:
    """The reply for a rendered prompt: the next shell command, or `final` once all have run."""
    if TOOLS_BLOCK not in prompt_text:  # a side call without tools (e.g. opencode's title)
        return side_reply
    # Tool results already in the prompt = commands already run (one task query per rollout).
    step = prompt_text.count(TOOL_RESPONSE)
    if step < len(commands):
        return tool_call_text(harness.shell_call(commands[step]))
    return final


def scripted_policy(harness: Harness, commands: Sequence[str], final: str,
                    decode: Callable[[list[int]], str]) -> Callable:
    """A `ReplayEngine` script (a function of the GenerateRequest) for `harness`."""

    def reply(req) -> str:  # noqa: ANN001 - research.serving.api.GenerateRequest
        return scripted_reply(harness, commands, final, decode(list(req.prompt_ids)))

    return reply


def per_task_policy(harness_name: str, plans: dict[str, tuple[Sequence[str], str]],
                    decode: Callable[[list[int]], str]) -> Callable:
    """A `ReplayEngine` script for many tasks at once: for the task whose marker (a piece of its query) is in the
    rendered prompt, run its commands with this harness's own shell tool, then answer its final message."""
    harness = get_harness(harness_name)

    def reply(req) -> str:  # noqa: ANN001 - research.serving.api.GenerateRequest
        text = decode(list(req.prompt_ids))
        for marker, (commands, final) in plans.items():
            if marker in text:
                return scripted_reply(harness, commands, final, text)
        return "No task found."

    return reply
