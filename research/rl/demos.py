"""Demonstrations for the SFT warm start, captured through the real harness path.

Why captured rather than rendered by hand: the policy must learn the exact token sequences the shim
will show it at rollout time (the harness's system prompt and tool schemas rendered by the Qwen3 chat
template, tool results, the empty think block). So a scripted "expert" engine (ReplayEngine with a
policy that reads the rendered prompt) answers the reference harness inside the same sandboxes,
through the same shim and runner; the capture log then holds token-exact demonstrations, which the
SFT step trains on like any other group tree. Rollouts whose reward is below `config.sft.min_reward`
are dropped (1.0: only verified successes; 0.0: every demonstration, as unverified human or weaker-model
traces come).

Experts: "make_file" is perfect. "make_file_imperfect" is a literal-minded expert, as real demonstrators
are imperfect: on ~60% of the tasks (a fixed hash of the task) it writes the phrase "the word WORD" into the
file instead of WORD (the checker gives 0.3 for the file alone). SFT on its unverified demonstrations
learns that mixture, so a greedy SFT policy mostly makes the mistake; RL with the verifier can fix it.
"""

from __future__ import annotations

import hashlib
import json
import re

from research.serving.api import GenerateRequest
from research.serving.replay import ReplayEngine

_QUERY = re.compile(r"Create a file named (\S+) containing the word (\w+)\.")


def make_file_expert(prompt_text: str) -> str:
    """The shortest correct behaviour for the make_file family: one bash call, then a plain answer.

    A plain answer (no tool call) ends the reference harness's loop, so the second turn is one word.
    """
    found = _QUERY.findall(prompt_text)
    if not found:
        return "Done."
    name, word = found[-1]
    if "<tool_response>" in prompt_text[prompt_text.rfind(f"containing the word {word}."):]:
        return "Done."
    call = {"name": "bash", "arguments": {"command": f"echo {word} > {name}"}}
    return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


IMPERFECT_RATE = 0.6


def _literal_mistake(name: str, word: str) -> bool:
    h = int(hashlib.sha256(f"literal/{name}/{word}".encode()).hexdigest()[:8], 16)
    return (h % 1000) / 1000 < IMPERFECT_RATE


def make_file_imperfect_expert(prompt_text: str) -> str:
    """make_file_expert, but on ~60% of the tasks it writes "the word WORD" (a literal reading of the task)."""
    found = _QUERY.findall(prompt_text)
    if not found:
        return "Done."
    name, word = found[-1]
    if "<tool_response>" in prompt_text[prompt_text.rfind(f"containing the word {word}."):]:
        return "Done."
    content = f"the word {word}" if _literal_mistake(name, word) else word
    call = {"name": "bash", "arguments": {"command": f"echo {content} > {name}"}}
    return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


EXPERTS = {"make_file": make_file_expert, "make_file_imperfect": make_file_imperfect_expert}


def expert_engine(name: str, tokenizer) -> ReplayEngine:  # noqa: ANN001
    """A ReplayEngine answering every request with expert `name`'s reply to the decoded prompt."""
    try:
        policy = EXPERTS[name]
    except KeyError:
        raise ValueError(f"unknown expert {name!r}; known: {sorted(EXPERTS)}") from None

    def script(req: GenerateRequest) -> str:
        return policy(tokenizer.decode(req.prompt_ids))

    return ReplayEngine(script, tokenizer)
