"""The built-in reference harness: a small Python agent loop (reference_agent.py) over chat completions.

Why it exists: the real CLIs take seconds to start and hundreds of MB to install; this one starts in
~50 ms with the sandbox's own python3, so tests, benchmarks and CPU demos can run many rollouts
through exactly the same runner/shim/sandbox path as the real harnesses.
"""

from __future__ import annotations

import pathlib
import shutil

from harness_env.harnesses.base import (
    ExecResultLike,
    Harness,
    HarnessOutcome,
    SessionContext,
    as_text,
    json_lines,
    register,
    tail,
)

AGENT_SRC = pathlib.Path(__file__).with_name("reference_agent.py")
AGENT_NAME = ".reference/agent.py"


@register
class ReferenceHarness(Harness):
    name = "reference"
    api = "openai_chat"
    first_request_tokens = 400  # 390-400 on the library tasks (Qwen3 template)
    shell_tool = "bash"
    log_globs = (".reference/transcript.jsonl",)
    python = "python3"  # resolved on the sandbox PATH (host /usr is mounted in every backend)
    tools: tuple[str, ...] = ()  # a subset of the agent's tools (empty: all of them)
    system: str = ""  # a system prompt replacing the agent's default (empty: the default)
    answers: int = 1  # plain answers before the agent ends (> 1: a multi-turn chat with `followup`)
    followup: str = ""

    async def prepare(self, host_home: pathlib.Path, ctx: SessionContext) -> None:
        await super().prepare(host_home, ctx)
        target = host_home / AGENT_NAME
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(AGENT_SRC, target)

    def argv(self, prompt: str, ctx: SessionContext) -> list[str]:
        return [
            self.python, f"{ctx.home}/{AGENT_NAME}",
            "--base-url", ctx.openai_base_url, "--api-key", ctx.api_key, "--model", ctx.model,
            "--max-turns", str(ctx.max_turns),
            *(["--tools", ",".join(self.tools)] if self.tools else []),
            *(["--system", self.system] if self.system else []),
            *(["--answers", str(self.answers), "--followup", self.followup] if self.answers > 1 else []),
            prompt,
        ]

    def env(self, ctx: SessionContext) -> dict[str, str]:
        return {**super().env(ctx), "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}

    def parse_output(self, result: ExecResultLike) -> HarnessOutcome:
        events = json_lines(as_text(result.stdout))
        turns = [e for e in events if e.get("type") == "turn"]
        final = next((e for e in reversed(events) if e.get("type") == "result"), None)
        if final is None:
            why = "timed out" if result.timed_out else f"exited {result.exit_code} without a result event"
            return HarnessOutcome(completed=False, exit_code=result.exit_code, num_turns=len(turns),
                                  error=f"reference: {why}; stderr: {tail(as_text(result.stderr))}")
        ok = final.get("status") == "completed" and result.exit_code == 0
        error = "" if ok else f"reference: status {final.get('status')}: {final.get('error', '')}".rstrip(": ")
        return HarnessOutcome(
            completed=ok, exit_code=result.exit_code, final_message=str(final.get("final_message", "")),
            error=error, num_turns=int(final.get("turns", len(turns))),
            meta={"tool_calls": [n for e in turns for n in e.get("tool_calls", [])],
                  "transcript": final.get("transcript") if isinstance(final.get("transcript"), list) else None},
        )

    def shell_call(self, command: str) -> dict:
        return {"name": "bash", "arguments": {"command": command}}


@register
class ReferenceBashHarness(ReferenceHarness):
    """The reference agent with only the `bash` tool and a one-line system prompt (~180 prompt tokens with
    the Qwen3 tool preamble, vs ~400): the harness of the CPU demo, whose tiny policy trains from scratch."""

    name = "reference_bash"
    first_request_tokens = 180  # the make_file family's prompts (the CPU demo)
    tools = ("bash",)
    system = "You are a software agent. Use the bash tool."


@register
class ReferenceDialogHarness(ReferenceHarness):
    """A multi-turn chat through the reference agent: two plain answers, the user saying "Again." in between,
    so every rollout makes >= 2 calls whose prompts extend each other (chat-graded tasks score the transcript)."""

    name = "reference_dialog"
    tools = ("bash",)
    system = "You are a helpful assistant."
    answers = 2
    followup = "Again."
