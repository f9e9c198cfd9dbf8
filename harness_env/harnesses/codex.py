"""Codex (`@openai/codex`): OpenAI Responses API via a custom model provider, `codex exec --json`.

Configured entirely by `$CODEX_HOME/config.toml` (a custom `[model_providers.X]` with
`wire_api = "responses"`), with analytics and plugins off. Its own bwrap sandbox cannot start inside
ours, so it runs with `--dangerously-bypass-approvals-and-sandbox` (our sandbox is the boundary).
CODEX_HOME must not live in the system temp dir (it then refuses its helper binaries), so it is
`$HOME/.codex`. Output: JSON lines `thread.started`, `turn.started`, `item.started/completed`
(`agent_message`, `command_execution`, ...), `turn.completed` | `turn.failed`, `error`.

Web tasks: the browser is the `@playwright/mcp` server (harness_env/web/browser.py) as an
`[mcp_servers.playwright]` entry of config.toml.
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
from harness_env.web import browser as web_browser

PROVIDER = "harness_rl"
KEY_ENV = "HARNESS_RL_API_KEY"


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


@register
class Codex(Harness):
    name = "codex"
    api = "openai_responses"
    first_request_tokens = 9300  # 9238 on ClawGym task_1975 (Qwen3 template)
    package = NpmPackage("@openai/codex", "0.171.0", "node_modules/.bin/codex")
    shell_tool = "exec_command"
    log_globs = (".codex/sessions/**/*.jsonl",)
    max_retries = 2
    browser = "mcp"
    extra_packages = (web_browser.PLAYWRIGHT_MCP,)
    browser_mounts = tuple(web_browser.mounts())

    def config_toml(self, ctx: SessionContext) -> str:
        q = _toml_str
        return "\n".join([
            f"model = {q(ctx.model)}",
            f"model_context_window = {int(ctx.context_window)}",
            f"model_provider = {q(PROVIDER)}",
            'approval_policy = "never"',
            'sandbox_mode = "danger-full-access"',
            "check_for_update_on_startup = false",
            'web_search = "disabled"',
            "",
            f"[model_providers.{PROVIDER}]",
            'name = "harness-rl shim"',
            f"base_url = {q(ctx.openai_base_url)}",
            f"env_key = {q(KEY_ENV)}",
            'wire_api = "responses"',
            f"request_max_retries = {self.max_retries}",
            f"stream_max_retries = {self.max_retries}",
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[features]",
            "plugins = false",
            "",
            *self.mcp_toml(ctx),
        ])

    def mcp_toml(self, ctx: SessionContext) -> list[str]:
        if ctx.web is None:
            return []
        command, args = web_browser.mcp_server(ctx)
        return [f"[mcp_servers.{web_browser.MCP_SERVER_NAME}]", f"command = {_toml_str(command)}",
                "args = [" + ", ".join(_toml_str(a) for a in args) + "]", "startup_timeout_sec = 60",
                "required = true",  # its tools are in the very first request (else they come a turn late)
                "tool_timeout_sec = 120", ""]

    async def prepare(self, host_home: pathlib.Path, ctx: SessionContext) -> None:
        await super().prepare(host_home, ctx)
        codex_home = host_home / ".codex"
        codex_home.mkdir(parents=True, exist_ok=True)
        (codex_home / "config.toml").write_text(self.config_toml(ctx))
        if ctx.web is not None:
            web_browser.write_mcp_config(host_home, ctx)

    def env(self, ctx: SessionContext) -> dict[str, str]:
        return {**super().env(ctx), "CODEX_HOME": f"{ctx.home}/.codex", KEY_ENV: ctx.api_key,
                "RUST_LOG": "error"}

    def argv(self, prompt: str, ctx: SessionContext) -> list[str]:
        return [self.executable(), "exec", "--skip-git-repo-check", "--json",
                "--dangerously-bypass-approvals-and-sandbox", "-C", ctx.workspace, prompt]

    def shell_call(self, command: str) -> dict:
        return {"name": "exec_command", "arguments": {"cmd": command}}

    def parse_output(self, result: ExecResultLike) -> HarnessOutcome:
        stdout = as_text(result.stdout)
        events = json_lines(stdout)
        if not events:
            why = "timed out" if result.timed_out else f"exited {result.exit_code} without JSON events"
            return HarnessOutcome(completed=False, exit_code=result.exit_code,
                                  error=f"codex: {why}; output: {tail(stdout + as_text(result.stderr))}")
        thread = next((e.get("thread_id") for e in events if e.get("type") == "thread.started"), None)
        items = [e["item"] for e in events if e.get("type") == "item.completed" and isinstance(e.get("item"), dict)]
        messages = [str(i.get("text", "")) for i in items if i.get("type") == "agent_message"]
        # `error` events are also progress notes ("Reconnecting..."); only turn.failed ends a turn badly.
        errors = [e.get("message") or (e.get("error") or {}).get("message", "")
                  for e in events if e.get("type") in ("error", "turn.failed")]
        failed = any(e.get("type") == "turn.failed" for e in events)
        turns = [e for e in events if e.get("type") == "turn.completed"]
        ok = bool(turns) and not failed and result.exit_code == 0
        error = ""
        if not ok:
            why = "timed out" if result.timed_out else f"exit {result.exit_code}"
            last = f"last error: {errors[-1]}" if errors else f"stderr: {tail(as_text(result.stderr))}"
            error = f"codex: {why}, {'turn failed' if failed else 'no turn.completed'}; {last}"
        kinds: dict[str, int] = {}
        for i in items:
            kinds[str(i.get("type"))] = kinds.get(str(i.get("type")), 0) + 1
        return HarnessOutcome(
            completed=ok, exit_code=result.exit_code, final_message=messages[-1] if messages else "", error=error,
            num_turns=sum(1 for i in items if i.get("type") != "error"), session_id=thread,
            meta={"items": kinds, "usage": turns[-1].get("usage") if turns else None},
        )
