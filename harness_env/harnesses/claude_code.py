"""Claude Code (`@anthropic-ai/claude-code`): Anthropic Messages, `claude -p --output-format json`.

It always streams to `/v1/messages?beta=true`. Without the traffic switches it contacts several
vendor hosts at start; with them off it talks only to ANTHROPIC_BASE_URL. As root it refuses
`bypassPermissions` unless IS_SANDBOX=1, which is true here: it always runs inside our sandbox.
Output: one JSON object `{"type": "result", "subtype": "success" | "error_max_turns" | ...,
"is_error", "num_turns", "result", "session_id", ...}` on stdout.

Web tasks: the browser is the `@playwright/mcp` server (harness_env/web/browser.py) given by
`--mcp-config` (+ `--strict-mcp-config`: no other MCP server from anywhere), its tools appearing as
`mcp__playwright__browser_*` beside Claude Code's own (listed with their schemas: ENABLE_TOOL_SEARCH=false).
"""

from __future__ import annotations

import json

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


@register
class ClaudeCode(Harness):
    name = "claude_code"
    api = "anthropic_messages"
    first_request_tokens = 12300  # 12248 on ClawGym task_1975 (Qwen3 template); ~19k reported with browser tools
    package = NpmPackage("@anthropic-ai/claude-code", "2.1.332", "node_modules/.bin/claude")
    shell_tool = "Bash"
    log_globs = (".claude/projects/**/*.jsonl",)
    max_retries = 2  # it retries 5xx/429 ~11 times with backoff by default: too slow for a failing rollout
    browser = "mcp"
    extra_packages = (web_browser.PLAYWRIGHT_MCP,)
    browser_mounts = tuple(web_browser.mounts())
    mcp_config_file = ".hrl/claude-mcp.json"

    async def prepare(self, host_home, ctx: SessionContext) -> None:  # noqa: ANN001 - pathlib.Path
        await super().prepare(host_home, ctx)
        if ctx.web is not None:
            web_browser.write_mcp_config(host_home, ctx)
            command, args = web_browser.mcp_server(ctx)
            servers = {web_browser.MCP_SERVER_NAME: {"type": "stdio", "command": command, "args": args, "env": {}}}
            (host_home / self.mcp_config_file).write_text(json.dumps({"mcpServers": servers}, indent=1))

    def env(self, ctx: SessionContext) -> dict[str, str]:
        return {
            **super().env(ctx),
            "ANTHROPIC_BASE_URL": ctx.base_url,
            "ANTHROPIC_API_KEY": ctx.api_key,
            "ANTHROPIC_MODEL": ctx.model,
            "ANTHROPIC_SMALL_FAST_MODEL": ctx.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": ctx.model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": ctx.model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": ctx.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_BUG_COMMAND": "1",
            "CLAUDE_CODE_MAX_RETRIES": str(self.max_retries),
            "IS_SANDBOX": "1",
            "MCP_TIMEOUT": "60000",  # ms to start the MCP server (a loaded 2-core machine)
            "MCP_TOOL_TIMEOUT": "120000",
            # MCP tools in the tool list with their schemas (not deferred behind ToolSearch): the policy
            # sees the browser tools it can call, as with any other tool.
            **({"ENABLE_TOOL_SEARCH": "false"} if ctx.web is not None else {}),
        }

    def argv(self, prompt: str, ctx: SessionContext) -> list[str]:
        mcp = ["--mcp-config", f"{ctx.home}/{self.mcp_config_file}", "--strict-mcp-config"] if ctx.web else []
        return [
            self.executable(), "-p", prompt, "--output-format", "json", "--model", ctx.model,
            "--permission-mode", "bypassPermissions", "--max-turns", str(ctx.max_turns), *mcp,
        ]

    def parse_output(self, result: ExecResultLike) -> HarnessOutcome:
        stdout = as_text(result.stdout)
        events = [e for e in json_lines(stdout) if e.get("type") == "result"]
        if not events:
            why = "timed out" if result.timed_out else f"exited {result.exit_code} without a result object"
            return HarnessOutcome(completed=False, exit_code=result.exit_code,
                                  error=f"claude_code: {why}; output: {tail(stdout + as_text(result.stderr))}")
        r = events[-1]
        ok = r.get("subtype") == "success" and not r.get("is_error") and result.exit_code == 0
        # On API errors it reports subtype "success" with is_error and the error text as `result`.
        why = r.get("terminal_reason") or r.get("subtype")
        error = "" if ok else f"claude_code: {why}: {tail(str(r.get('result') or r.get('errors') or ''))}"
        return HarnessOutcome(
            completed=ok, exit_code=result.exit_code, final_message=str(r.get("result") or "") if ok else "",
            error=error, num_turns=r.get("num_turns"), session_id=r.get("session_id"),
            meta={k: r[k] for k in ("duration_ms", "duration_api_ms", "usage", "stop_reason", "terminal_reason",
                                    "api_error", "permission_denials") if k in r},
        )
