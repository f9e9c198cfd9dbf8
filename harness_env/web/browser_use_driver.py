"""Runs INSIDE the agent's sandbox with the pinned browser-use venv's Python: one browser-use Agent run.

browser-use is a library (its `Agent(task, llm).run()` is the agent loop), so its "CLI" is these few
lines of documented public API, nothing patched: the OpenAI-compatible `ChatOpenAI` pointed at the shim
session, the system Chromium (harness_env/web/browser.py flags) headless in an in-memory profile, text
only by default (`use_vision=False`: the policy reads browser-use's element list, not pixels) or with
HRL_USE_VISION=true its documented `use_vision=True` (each step's screenshot goes to the policy as an
OpenAI `image_url` part, beside the element list), the JSON schema of
its action output in the system prompt (`add_schema_to_system_prompt`: the shim has no constrained
decoding), no judge / cloud / telemetry side calls. After every step the page is screenshotted into
$HRL_SCREENSHOTS/step_NNN.png and the step's actions, errors and URL appended to $HRL_STEPS. The
result is printed as one JSON line `{"type": "hrl_browser_use_result", ...}` for the adapter to parse.

Configured by environment (the adapter sets it): HRL_BASE_URL (OpenAI base, with /v1), HRL_API_KEY,
HRL_MODEL, HRL_START_URL, HRL_ORIGINS (comma-separated), HRL_SCREENSHOTS, HRL_STEPS, HRL_MAX_STEPS,
HRL_CHROMIUM, HRL_CHROMIUM_ARGS (JSON list), HRL_USE_VISION (true/false). The task text is argv[1].
"""

import asyncio
import json
import os
import sys
import time


def _step_record(agent, t0: float) -> dict:
    """What this step did, from the agent's public history."""
    h = agent.history.history[-1] if agent.history.history else None
    actions, errors, url = [], [], None
    if h is not None:
        if h.model_output is not None:
            actions = [a.model_dump(exclude_none=True) for a in h.model_output.action]
        errors = [r.error for r in h.result if getattr(r, "error", None)]
        url = getattr(h.state, "url", None)
    return {"step": len(agent.history.history), "actions": actions, "ok": not errors, "errors": errors, "url": url,
            "t": round(time.monotonic() - t0, 3), "screenshot": None}


def _use_vision() -> bool:
    v = os.environ.get("HRL_USE_VISION", "false").lower()
    if v not in ("true", "false"):
        raise SystemExit(f"HRL_USE_VISION={v!r}: expected true or false")
    return v == "true"


async def run(task: str) -> dict:
    from browser_use import Agent, BrowserProfile, BrowserSession, ChatOpenAI

    shots, steps_log = os.environ["HRL_SCREENSHOTS"], os.environ["HRL_STEPS"]
    os.makedirs(shots, exist_ok=True)
    llm = ChatOpenAI(model=os.environ.get("HRL_MODEL", "policy"), base_url=os.environ["HRL_BASE_URL"],
                     api_key=os.environ["HRL_API_KEY"], add_schema_to_system_prompt=True,
                     dont_force_structured_output=True, max_retries=1, timeout=600)
    # No allowed_domains: with it browser-use closes Chromium's first tab (chrome://new-tab-page...) and its
    # start-up stalls; the sandbox's loopback-only network is the boundary anyway.
    profile = BrowserProfile(executable_path=os.environ["HRL_CHROMIUM"], headless=True, chromium_sandbox=False,
                             args=json.loads(os.environ.get("HRL_CHROMIUM_ARGS", "[]")), user_data_dir=None,
                             enable_default_extensions=False, viewport={"width": 1280, "height": 800},
                             keep_alive=False)
    session = BrowserSession(browser_profile=profile)
    agent = Agent(task=task, llm=llm, browser_session=session, use_vision=_use_vision(), use_judge=False,
                  calculate_cost=False, generate_gif=False, enable_signal_handler=False)
    t0 = time.monotonic()

    async def on_step_end(a) -> None:  # noqa: ANN001 - browser_use.Agent
        rec = _step_record(a, t0)
        try:
            data = await a.browser_session.take_screenshot()
            name = f"step_{rec['step']:03d}.png"
            with open(os.path.join(shots, name), "wb") as fh:
                fh.write(data)
            rec["screenshot"] = name
        except Exception as e:  # no page (yet): the step is logged without a picture
            rec["screenshot_error"] = f"{type(e).__name__}: {e}"[:300]
        with open(steps_log, "a") as fh:
            fh.write(json.dumps(rec, default=str) + "\n")

    history = await agent.run(max_steps=int(os.environ.get("HRL_MAX_STEPS", "30")), on_step_end=on_step_end)
    with_errors = [e for e in history.errors() if e]
    return {"type": "hrl_browser_use_result", "done": history.is_done(), "success": history.is_successful(),
            "final": history.final_result() or "", "steps": history.number_of_steps(), "errors": with_errors[-3:],
            "urls": [u for u in history.urls() if u]}


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: browser_use_driver.py TASK", file=sys.stderr)
        return 2
    result = asyncio.run(run(sys.argv[1]))
    sys.stdout.write(json.dumps(result, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
