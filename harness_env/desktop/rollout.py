"""A desktop task's desktop for one rollout: started in the agent's sandbox before the harness runs, torn down
after it, before grading (harness_env/runner.py).

The task names its apps and screen size in `metadata.desktop` (harness_env/tasks/desktop_family.py). The harness
runs with the session's DISPLAY and D-Bus address in its environment, so anything it starts (a computer-use
agent's screenshots and xdotool actions, or a shell command) reaches the task's real apps. After the harness
ends, the final screen is kept with the rollout (`logs/desktop_final.png`), then every desktop process is
stopped. The checker reads only the files the apps saved, as in validation.
"""

from __future__ import annotations

import pathlib
import time

from harness_env.desktop.session import DesktopError, DesktopSession
from harness_env.sandbox.base import Sandbox

FINAL_SHOT = "desktop_final.png"


def desktop_spec(metadata: dict) -> dict | None:
    """The task's `metadata.desktop` ({"apps": [...], "size": [w, h]}), checked; None for a task without one."""
    d = metadata.get("desktop")
    if d is None:
        return None
    if not isinstance(d, dict) or not isinstance(d.get("apps"), list) or len(d.get("size", ())) != 2:
        raise ValueError(f"metadata.desktop must be {{'apps': [...], 'size': [w, h]}}, not {d!r}")
    return d


async def start(sbx: Sandbox, spec: dict, timings: dict) -> DesktopSession:
    """Xvfb, the window manager and the task's apps in `sbx`, each app's window shown."""
    from harness_env.tasks.desktop_family import apps_of

    t = time.monotonic()
    session = DesktopSession(sbx, apps_of(spec["apps"], sbx.spec.workspace_dir), size=tuple(spec["size"]))
    await session.start()
    timings["desktop_start_s"] = time.monotonic() - t
    return session


async def finish(session: DesktopSession, logs: pathlib.Path) -> dict:
    """The final screenshot into `logs`, then the desktop stopped; what the rollout's meta records."""
    out: dict = {"apps": [a.name for a in session.apps]}
    try:
        logs.mkdir(parents=True, exist_ok=True)
        (logs / FINAL_SHOT).write_bytes(await session.screenshot())
        out["final_screenshot"] = FINAL_SHOT
    except (DesktopError, OSError) as e:  # e.g. the agent killed Xvfb: the rollout goes on to grading
        out["screenshot_error"] = f"{type(e).__name__}: {e}"[:300]
    await session.close()
    out["peak_kib"] = {p["name"]: p["peak_kib"] for p in session.stats}
    return out
