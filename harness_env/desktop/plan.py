"""Scripted GUI plans: a task's reference solution (and its plausible mistake) as a list of desktop actions.

A plan is JSON (a task's solution/plan.json, solution/wrong_plan.json), one dict per step, run through a
`DesktopSession` exactly as an agent's actions would be: keys, typed text and clicks reach the real apps through
X, never the files. Besides the agent's actions (key, type, click, double_click, drag, scroll) a plan has sync
steps (wait_window, wait_gone, wait_file, activate, sleep) so it keeps in step with the apps on a loaded machine
instead of racing them; an agent gets the same information from its screenshots.

`{workspace}` in any string of a step is the sandbox's workspace path (SandboxSpec.workspace_dir), so a task's
plan does not hard-code /workspace.
"""

from __future__ import annotations

import asyncio
import re
import shlex

from harness_env.desktop.session import DesktopError, DesktopSession

OPS = ("key", "type", "click", "double_click", "drag", "scroll", "sleep", "wait_window", "wait_gone", "wait_file",
       "wait_file_gone", "activate")


def _fill(value, workspace: str):
    if isinstance(value, str):  # a regex (wait_window's name) holds the placeholder escaped
        return value.replace(re.escape("{workspace}"), re.escape(workspace)).replace("{workspace}", workspace)
    if isinstance(value, list):
        return [_fill(v, workspace) for v in value]
    return value


async def run_step(d: DesktopSession, step: dict) -> None:
    step = {k: _fill(v, d.sandbox.spec.workspace_dir) for k, v in step.items()}
    op = step.get("op")
    if op == "key":
        await d.key(*step["keys"], delay_ms=step.get("delay_ms", 40))
    elif op == "type":
        await d.type_text(step["text"])
    elif op == "click":
        await d.click(step["x"], step["y"], step.get("button", 1))
    elif op == "double_click":
        await d.double_click(step["x"], step["y"])
    elif op == "drag":
        await d.drag(*step["from"], *step["to"])
    elif op == "scroll":
        await d.scroll(step["x"], step["y"], step["clicks"])
    elif op == "sleep":
        await asyncio.sleep(float(step["s"]))
    elif op == "wait_window":
        await d.wait_window(step["name"], step.get("timeout_s", 15.0))
    elif op == "wait_gone":
        await d.wait_window(step["name"], step.get("timeout_s", 15.0), gone=True)
    elif op == "wait_file":
        await d.wait_file(step["path"], step.get("timeout_s", 10.0))
    elif op == "wait_file_gone":
        await d.wait_file(step["path"], step.get("timeout_s", 10.0), gone=True)
    elif op == "activate":
        await d.activate(step["name"])
    else:
        raise DesktopError(f"unknown plan op {op!r}; known: {', '.join(OPS)}")


async def run_plan(d: DesktopSession, plan: list[dict]) -> None:
    for i, step in enumerate(plan):
        try:
            await run_step(d, step)
        except DesktopError as e:
            raise DesktopError(f"plan step {i} {step}: {e}") from e


# --- step builders the task family writes its plans with ------------------------------------------------------
def key(*keys: str, delay_ms: int | None = None) -> dict:
    return {"op": "key", "keys": list(keys), **({} if delay_ms is None else {"delay_ms": delay_ms})}


def type_(text: str) -> dict:
    return {"op": "type", "text": text}


def sleep(s: float) -> dict:
    return {"op": "sleep", "s": s}


def wait_window(name: str, timeout_s: float = 15.0) -> dict:
    return {"op": "wait_window", "name": name, "timeout_s": timeout_s}


def wait_gone(name: str, timeout_s: float = 15.0) -> dict:
    return {"op": "wait_gone", "name": name, "timeout_s": timeout_s}


def wait_file(path: str, gone: bool = False) -> dict:
    return {"op": "wait_file_gone" if gone else "wait_file", "path": path}


def activate(name: str) -> dict:
    return {"op": "activate", "name": name}


def exact_title(title: str) -> str:
    """A wait_window regex matching exactly this window title."""
    return "^" + re.escape(title) + "$"


# --- the same plan as one shell script: what an agent with a shell and xdotool would run ----------------------
_SH_HELPERS = """set -e
waitw() { for _ in $(seq $(( ${2%.*} * 10 ))); do xdotool search --onlyvisible --name "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "window $1 not shown" >&2; return 1; }
gonew() { for _ in $(seq $(( ${2%.*} * 10 ))); do xdotool search --onlyvisible --name "$1" >/dev/null 2>&1 || return 0; sleep 0.1; done; echo "window $1 still there" >&2; return 1; }
waitf() { for _ in $(seq $(( ${2%.*} * 10 ))); do [ -e "$1" ] && return 0; sleep 0.1; done; echo "$1 not written" >&2; return 1; }
gonef() { for _ in $(seq $(( ${2%.*} * 10 ))); do [ -e "$1" ] || return 0; sleep 0.1; done; echo "$1 still exists" >&2; return 1; }
act() { waitw "$1" 15; xdotool windowactivate --sync "$(xdotool search --onlyvisible --name "$1" | head -n 1)"; }
"""  # noqa: E501 - shell one-liners


def shell_script(plan: list[dict], workspace: str) -> str:
    """`plan` as a bash script of xdotool calls against $DISPLAY, step for step what `run_step` does through a
    `DesktopSession`: how a shell-driving agent acts on the desktop the runner started for its task."""
    q = shlex.quote
    out = [_SH_HELPERS]
    for step in plan:
        s = {k: _fill(v, workspace) for k, v in step.items()}
        op = s.get("op")
        if op == "key":
            out.append(f"xdotool key --delay {s.get('delay_ms', 40)} {' '.join(q(k) for k in s['keys'])}")
        elif op == "type":
            for i, line in enumerate(s["text"].split("\n")):  # newlines as Return presses, as type_text does
                out += ["xdotool key Return"] if i else []
                out += [f"xdotool type --delay 8 -- {q(line)}"] if line else []
        elif op in ("click", "double_click"):
            rep = 2 if op == "double_click" else 1
            out.append(f"xdotool mousemove --sync {int(s['x'])} {int(s['y'])} click --repeat {rep} --delay 80 "
                       f"{s.get('button', 1)}")
        elif op == "drag":
            (x0, y0), (x1, y1) = s["from"], s["to"]
            out.append(f"xdotool mousemove --sync {x0} {y0} mousedown 1 sleep 0.1 mousemove --sync {x1} {y1} "
                       "sleep 0.1 mouseup 1")
        elif op == "scroll":
            n = int(s["clicks"])
            out.append(f"xdotool mousemove --sync {s['x']} {s['y']} click --repeat {abs(n)} --delay 80 "
                       f"{5 if n > 0 else 4}")
        elif op == "sleep":
            out.append(f"sleep {float(s['s'])}")
        elif op in ("wait_window", "wait_gone"):
            out.append(f"{'waitw' if op == 'wait_window' else 'gonew'} {q(s['name'])} {s.get('timeout_s', 15.0)}")
        elif op in ("wait_file", "wait_file_gone"):
            out.append(f"{'waitf' if op == 'wait_file' else 'gonef'} {q(s['path'])} {s.get('timeout_s', 10.0)}")
        elif op == "activate":
            out.append(f"act {q(s['name'])}")
        else:
            raise DesktopError(f"unknown plan op {op!r}; known: {', '.join(OPS)}")
    return "\n".join(out) + "\necho plan done\n"
