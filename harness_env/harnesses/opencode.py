"""opencode (`opencode-ai`): OpenAI chat completions via an `@ai-sdk/openai-compatible` provider.

Configured by `$HOME/.config/opencode/opencode.json` (one provider pointing at the shim session,
`model` and `small_model` both on it, so its title-generation side call is captured too) plus env
switches that stop model-list fetches, auto-update, default plugins, LSP downloads and sharing.
`opencode run --format json --pure PROMPT` prints JSON events (`step_start`, `tool_use`, `text`,
`step_finish`, `error`); the final message is the text of the last step.
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
from harness_env.harnesses.install import NpmPackage

PROVIDER = "harnessrl"


@register
class OpenCode(Harness):
    name = "opencode"
    api = "openai_chat"
    first_request_tokens = 7500  # 7503 on ClawGym task_1975 (Qwen3 template)
    package = NpmPackage("opencode-ai", "1.18.33", "node_modules/.bin/opencode")
    shell_tool = "bash"
    log_globs = (".local/share/opencode/log/*.log", ".local/share/opencode/opencode.db*")  # sessions: sqlite+wal

    def config(self, ctx: SessionContext) -> dict:
        model = f"{PROVIDER}/{ctx.model}"
        return {
            "$schema": "https://opencode.ai/config.json",
            "provider": {PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "harness-rl shim",
                "options": {"baseURL": ctx.openai_base_url, "apiKey": ctx.api_key},
                "models": {ctx.model: {"name": ctx.model, "tool_call": True}},
            }},
            "model": model,
            "small_model": model,
            "autoupdate": False,
            "share": "disabled",
            "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
        }

    async def prepare(self, host_home: pathlib.Path, ctx: SessionContext) -> None:
        await super().prepare(host_home, ctx)
        cfg_dir = host_home / ".config" / "opencode"
        cfg_dir.mkdir(parents=True, exist_ok=True)
        (cfg_dir / "opencode.json").write_text(json.dumps(self.config(ctx), indent=1))

    def env(self, ctx: SessionContext) -> dict[str, str]:
        return {
            **super().env(ctx),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            # Reproducibility: no auto-compaction loop on context overflow (it would retry forever on a 400),
            # no config/skills picked up from the task workspace or from other harnesses' dirs.
            "OPENCODE_DISABLE_AUTOCOMPACT": "1",
            "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
            "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
            # It npm-installs @opencode-ai/plugin into its config dir at start; offline: no registry call.
            "npm_config_offline": "true",
            "XDG_CONFIG_HOME": f"{ctx.home}/.config",
            "XDG_DATA_HOME": f"{ctx.home}/.local/share",
            "XDG_CACHE_HOME": f"{ctx.home}/.cache",
            "XDG_STATE_HOME": f"{ctx.home}/.local/state",
        }

    def argv(self, prompt: str, ctx: SessionContext) -> list[str]:
        return [self.executable(), "run", "--format", "json", "--pure", prompt]

    def shell_call(self, command: str) -> dict:
        return {"name": "bash", "arguments": {"command": command, "description": "run a shell command"}}

    def parse_output(self, result: ExecResultLike) -> HarnessOutcome:
        stdout = as_text(result.stdout)
        events = json_lines(stdout)
        errors = [e for e in events if e.get("type") == "error"]
        finishes = [e for e in events if e.get("type") == "step_finish"]
        if not finishes and not errors:
            why = "timed out" if result.timed_out else f"exited {result.exit_code} without JSON events"
            return HarnessOutcome(completed=False, exit_code=result.exit_code,
                                  error=f"opencode: {why}; output: {tail(stdout + as_text(result.stderr))}")
        # The final message: text parts after the last step_start (the model's last turn).
        last_start = max((i for i, e in enumerate(events) if e.get("type") == "step_start"), default=-1)
        texts = [str((e.get("part") or {}).get("text", "")) for e in events[last_start + 1:] if e.get("type") == "text"]
        reason = str((finishes[-1].get("part") or {}).get("reason", "")) if finishes else ""
        ok = not errors and reason not in ("", "tool-calls", "error", "length") and result.exit_code == 0
        error = ""
        if not ok:
            detail = (errors[-1].get("error") or {}) if errors else {}
            msg = (detail.get("data") or {}).get("message") or detail.get("name") or json.dumps(detail)[:300]
            error = f"opencode: {'error: ' + msg if errors else 'last step ended with ' + repr(reason)}"
        tools = [str((e.get("part") or {}).get("tool")) for e in events if e.get("type") == "tool_use"]
        session = next((e.get("sessionID") for e in events if e.get("sessionID")), None)
        return HarnessOutcome(completed=ok, exit_code=result.exit_code, final_message="".join(texts).strip(),
                              error=error, num_turns=len(finishes), session_id=session, meta={"tools": tools})
