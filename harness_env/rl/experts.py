"""Scripted experts for the SFT warm start: engines that answer a harness like an agent that knows the task.

Why engines and not hand-written token sequences: demonstrations are captured through the real harness,
shim and sandbox (harness_env/rl/sft.py), so the policy learns exactly the token sequences it will see
at rollout time. An expert is a function of the rendered prompt text -> the reply (text in Qwen3's
tool-call format); `expert_engine` wraps it in a ReplayEngine. The task families own their experts:
"make_file" is the family's perfect expert, "make_file_imperfect" its literal-minded one and
"make_file_sloppy" a sloppy one (~60% of the tasks wrong in one systematic way each:
harness_env/tasks/family.py), as real demonstrations are imperfect.
"""

from __future__ import annotations

from collections.abc import Callable

from harness_env.tasks import family
from research.serving.api import GenerateRequest
from research.serving.replay import ReplayEngine

EXPERTS: dict[str, Callable[[str], str]] = {"make_file": family.oracle_reply,
                                            "make_file_imperfect": family.imperfect_reply,
                                            "make_file_sloppy": family.sloppy_reply,
                                            "make_file_cut": family.cut_reply}


def expert_engine(name: str, tokenizer) -> ReplayEngine:  # noqa: ANN001
    """A ReplayEngine answering every request with expert `name`'s reply to the decoded prompt."""
    try:
        policy = EXPERTS[name]
    except KeyError:
        raise ValueError(f"unknown expert {name!r}; known: {sorted(EXPERTS)}") from None

    def script(req: GenerateRequest) -> str:
        return policy(tokenizer.decode(req.prompt_ids))

    return ReplayEngine(script, tokenizer)
