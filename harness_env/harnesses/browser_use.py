"""browser-use (PyPI `browser-use`): a browser agent over OpenAI chat completions; web tasks only.

Installed pinned into its own venv over the system Python (install.PyPackage; CI:
`python -m harness_env.harnesses`), mounted read-only, and run by `harness_env/web/browser_use_driver.py`
(its documented `Agent(task, llm).run()`, unmodified) on Debian's headless Chromium. Telemetry, cloud
sync, version checks and default extensions are off (`ANONYMIZED_TELEMETRY=false`, ...). The policy
answers in browser-use's own JSON action format (schema in its system prompt); it sees each page as
browser-use's indexed element list (text). `browser_use_vision` is the same agent with its documented
`use_vision=True`: each step's screenshot also goes to the policy, as an OpenAI `image_url` part (a vision
policy's shim renders it as image tokens and stores it by content; a text policy's sees "[image omitted]").
Output: the driver's last JSON line
`{"type": "hrl_browser_use_result", "done", "success", "final", "steps", "errors", "urls"}`.
"""

from __future__ import annotations

import json
import pathlib

from harness_env.harnesses.base import (
    ExecResultLike,
    Harness,
    HarnessError,
    HarnessOutcome,
    SessionContext,
    as_text,
    json_lines,
    register,
    tail,
)
from harness_env.harnesses.install import PyPackage, ensure_py_installed, py_dir
from harness_env.web import browser as web_browser

DRIVER = pathlib.Path(web_browser.__file__).with_name("browser_use_driver.py")


@register
class BrowserUse(Harness):
    name = "browser_use"
    api = "openai_chat"
    first_request_tokens = 12000  # ~12k per call on the web tasks (Qwen3 template)
    browser = "only"
    vision = False  # screenshots to the policy (browser-use's use_vision)
    py_package = PyPackage("browser-use", "0.13.14")
    log_globs = (".config/browseruse/**/*.log",)

    def py_packages(self) -> list[PyPackage]:
        return [self.py_package]

    async def install(self) -> None:
        await ensure_py_installed(self.py_package)

    def mounts(self, web: bool = False) -> list[pathlib.Path]:
        return [py_dir(self.py_package), *web_browser.mounts()]

    def executable(self) -> str:
        return str(py_dir(self.py_package) / "bin" / "python")

    def env(self, ctx: SessionContext) -> dict[str, str]:
        if ctx.web is None:
            raise HarnessError("browser_use: runs web tasks only (no web context)")
        return {
            **super().env(ctx),
            "HRL_BASE_URL": ctx.openai_base_url, "HRL_API_KEY": ctx.api_key, "HRL_MODEL": ctx.model,
            "HRL_START_URL": ctx.web.start_url, "HRL_ORIGINS": ",".join(ctx.web.origins),
            "HRL_SCREENSHOTS": ctx.web.screenshots_dir, "HRL_STEPS": ctx.web.steps_log,
            "HRL_MAX_STEPS": str(ctx.max_turns), "HRL_CHROMIUM": web_browser.CHROMIUM,
            "HRL_CHROMIUM_ARGS": json.dumps(list(web_browser.CHROMIUM_ARGS)),
            "HRL_USE_VISION": "true" if self.vision else "false",
            "ANONYMIZED_TELEMETRY": "false", "BROWSER_USE_CLOUD_SYNC": "false", "BROWSER_USE_VERSION_CHECK": "false",
            "BROWSER_USE_CLOUD_HINTS": "false", "BROWSER_USE_SETUP_LOGGING": "true",
            "BROWSER_USE_LOGGING_LEVEL": "info",
            "SKIP_LLM_API_KEY_VERIFICATION": "true", "IN_DOCKER": "true", "OPENAI_API_KEY": ctx.api_key,
            "XDG_CONFIG_HOME": f"{ctx.home}/.config", "XDG_CACHE_HOME": f"{ctx.home}/.cache",
        }

    def argv(self, prompt: str, ctx: SessionContext) -> list[str]:
        return [self.executable(), "-s", str(DRIVER), prompt]

    def shell_call(self, command: str) -> dict:
        raise HarnessError("browser_use has no shell tool")

    def parse_output(self, result: ExecResultLike) -> HarnessOutcome:
        stdout = as_text(result.stdout)
        found = [e for e in json_lines(stdout) if e.get("type") == "hrl_browser_use_result"]
        if not found:
            why = "timed out" if result.timed_out else f"exited {result.exit_code} without a result line"
            return HarnessOutcome(completed=False, exit_code=result.exit_code,
                                  error=f"browser_use: {why}; output: {tail(stdout + as_text(result.stderr))}")
        r = found[-1]
        ok = bool(r.get("done")) and result.exit_code == 0
        error = "" if ok else f"browser_use: agent did not finish ({r.get('steps')} steps): {r.get('errors')}"
        return HarnessOutcome(completed=ok, exit_code=result.exit_code, final_message=str(r.get("final") or ""),
                              error=error, num_turns=r.get("steps"),
                              meta={k: r.get(k) for k in ("success", "errors", "urls")})


@register
class BrowserUseVision(BrowserUse):
    """browser-use with its screenshots sent to the policy (`use_vision=True`): for a vision-language policy."""

    name = "browser_use_vision"
    vision = True
    first_request_tokens = 13000  # the text prompt + one 1280x800 screenshot (1,000 image tokens at patch 16, 2x2)
