"""Scripted experts for the SFT warm start: engines that answer a harness like an agent that knows the task.

Why engines and not hand-written token sequences: demonstrations are captured through the real harness,
shim and sandbox (harness_env/rl/sft.py), so the policy learns exactly the token sequences it will see
at rollout time. An expert is a function of the rendered prompt text -> the reply (text in Qwen3's
tool-call format, with the reference agent's `bash{command}` tool); `expert_engine` wraps it in a ReplayEngine
that re-addresses that shell call to the shell tool of the harness whose tools the prompt lists (Codex
`exec_command{cmd}`, Claude Code `Bash{command}`, OpenClaw `exec{command}`, ...), so one expert demonstrates
through every CLI, each with its own tools, as a user of that CLI would see it. The task families own their
experts: "make_file" is the family's perfect expert, "make_file_imperfect" its literal-minded one and
"make_file_sloppy" a sloppy one (~60% of the tasks wrong in one systematic way each:
harness_env/tasks/family.py), as real demonstrations are imperfect; "relay_literal" reads the relay family's
clue and copies it, on most tasks in a literal form (harness_env/tasks/relay.py); "recover_giveup" gives up after
the recover family's failed first command on most of the tasks where it fails (harness_env/tasks/recover.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from harness_env.harnesses.base import get_harness
from harness_env.harnesses.scripted import tool_call_text
from harness_env.tasks import family, recover, relay
from research.serving.api import GenerateRequest
from research.serving.replay import ReplayEngine

EXPERTS: dict[str, Callable[[str], str]] = {"make_file": family.oracle_reply,
                                            "make_file_imperfect": family.imperfect_reply,
                                            "make_file_sloppy": family.sloppy_reply,
                                            "make_file_cut": family.cut_reply,
                                            "relay": relay.oracle_reply, "relay_literal": relay.expert_reply,
                                            "recover": recover.oracle_reply, "recover_giveup": recover.expert_reply}

_TOOLS = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)
_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
# The shell tool that identifies each CLI in a rendered prompt's <tools> block; opencode's `bash` is told from the
# reference agent's by a tool only opencode lists.
_SHELL_OF = (("exec_command", "codex"), ("Bash", "claude_code"), ("exec", "openclaw"))
_OPENCODE_ONLY = "todowrite"


def harness_of_prompt(prompt_text: str) -> str:
    """The harness whose shell tool the prompt's tool list names ("reference" when none of the CLIs')."""
    names = set()
    for block in _TOOLS.findall(prompt_text):
        for line in block.splitlines():  # the chat template writes one tool's JSON per line
            try:
                tool = json.loads(line)
            except json.JSONDecodeError:
                continue
            names.add((tool.get("function") or tool).get("name"))
    for tool, harness in _SHELL_OF:
        if tool in names:
            return harness
    return "opencode" if _OPENCODE_ONLY in names else "reference"


def readdress(reply: str, harness: str) -> str:
    """`reply` with each reference-style `bash{command}` call rewritten as `harness`'s own shell call."""
    if harness == "reference":
        return reply

    def one(m: re.Match) -> str:
        try:
            call = json.loads(m.group(1))
        except json.JSONDecodeError:
            return m.group(0)
        cmd = (call.get("arguments") or {}).get("command") if call.get("name") == "bash" else None
        return tool_call_text(get_harness(harness).shell_call(cmd)) if isinstance(cmd, str) else m.group(0)

    return _CALL.sub(one, reply)


def expert_engine(name: str, tokenizer, *, max_context: int) -> ReplayEngine:  # noqa: ANN001
    """A ReplayEngine answering every request with expert `name`'s reply to the decoded prompt, its shell call
    addressed to the tool of the harness that sent the request. `max_context` must be the policy engine's: the
    CLIs are told the model's context window and shape their prompts by it (Codex lists fewer skills, with
    shorter descriptions, under a smaller window), so demonstrations captured under another window teach the
    policy a prompt it never sees (through Codex: SFT NLL 0.07, yet every sampled tool call malformed)."""
    try:
        policy = EXPERTS[name]
    except KeyError:
        raise ValueError(f"unknown expert {name!r}; known: {sorted(EXPERTS)}") from None

    def script(req: GenerateRequest) -> str:
        text = tokenizer.decode(req.prompt_ids)
        return readdress(policy(text), harness_of_prompt(text))

    return ReplayEngine(script, tokenizer, max_context=max_context)
