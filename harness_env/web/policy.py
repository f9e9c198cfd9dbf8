"""A scripted web policy: plays a task's reference plan through any browser harness, reading the page as text.

Why: the pipeline checks (each harness solves web tasks in bwrap and docker, every call captured, a
training step on the captured tree) need a "model" that answers in the policy's format with the
harness's own browser actions, deciding only from the rendered prompt - exactly what a trained policy
sees. Two dialects:
  * MCP browsers (@playwright/mcp under Claude Code, Codex): Qwen3 `<tool_call>`s of the harness's
    tool names (`mcp__playwright__browser_click`, ...: whatever name in the prompt's <tools> ends in
    `browser_click`). Element refs come from the last accessibility snapshot in the prompt
    (`- button "Place order" [ref=e42]`): the plan is expanded so a `browser_snapshot` precedes every
    step that needs a ref after the page may have changed. The step is the number of tool results in
    the prompt.
  * browser-use: its JSON action output (`{"action": [{"click": {"index": 12}}], ...}`), element
    indices read from the prompt's indexed element list; the step is browser-use's own `StepN`.
When the plan is done the reply ends the loop (plain text / `done`). The plan is found by the task's
query in the prompt (`WebOracle` holds the plans of a set of tasks); anything unknown gets a plain
"I cannot help with that." so a harness ends its loop.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Iterable

from harness_env.harnesses.scripted import TOOL_RESPONSE, tool_call_text

REF_LINE = re.compile(r'-\s+(\w+)\s+"((?:[^"\\]|\\.)*)"((?:\s*\[[^\]]*\])*)')
FILL_ROLES = ("textbox", "spinbutton", "searchbox")
NEEDS_REF = ("fill", "select", "check", "uncheck", "click")
CHANGES_PAGE = ("goto", "click")
BU_STEP = re.compile(r"<step_info>\s*Step\s*(\d+)")
BU_ELEMENT = re.compile(r"\[(\d+)\]<(\w+)([^>]*?)\s*/?>")
BU_ATTR = re.compile(r"(\w[\w-]*)=('[^']*'|\"[^\"]*\"|\S+)")


def expand_mcp(plan: list[dict]) -> list[dict]:
    """The plan with a snapshot before each ref-needing step that follows a page change."""
    out, stale = [], True
    for step in plan:
        if step["op"] in NEEDS_REF and stale:
            out.append({"op": "snapshot"})
            stale = False
        out.append(step)
        stale = stale or step["op"] in CHANGES_PAGE
    return out


def snapshot_refs(text: str) -> list[tuple[str, str, str]]:
    """(role, name, attrs) of every line of an aria snapshot; attrs holds `[ref=eN]`, `[checked]`..."""
    return [(m.group(1), json.loads(f'"{m.group(2)}"'), m.group(3)) for m in REF_LINE.finditer(text)]


def find_ref(snapshot: str, roles: Iterable[str], name: str) -> tuple[str, str] | None:
    roles = tuple(roles)
    for role, nm, attrs in snapshot_refs(snapshot):
        ref = re.search(r"\[ref=([\w-]+)\]", attrs)
        if role in roles and nm == name and ref:
            return ref.group(1), attrs
    return None


def _roles(step: dict) -> tuple[str, ...]:
    if step["op"] == "fill":
        return FILL_ROLES
    if step["op"] == "select":
        return ("combobox", "listbox")
    return (step["role"],)


def _name(step: dict) -> str:
    return step.get("label") or step["name"]


def mcp_reply(prompt: str, plan: list[dict], final: str) -> str:
    tools = _mcp_tools(prompt)
    steps = expand_mcp(plan)
    k = prompt.count(TOOL_RESPONSE)
    if k >= len(steps):
        return final
    step = steps[k]
    if step["op"] == "goto":
        return tool_call_text({"name": tools["navigate"], "arguments": {"url": step["url"]}})
    if step["op"] == "snapshot":
        return tool_call_text({"name": tools["snapshot"], "arguments": {}})
    snap = _last_snapshot(prompt)
    hit = find_ref(snap, _roles(step), _name(step))
    if hit is None:
        return f"I could not find the {'/'.join(_roles(step))} {_name(step)!r} on the page."
    ref, attrs = hit
    what = f"{_roles(step)[0]} {_name(step)}"
    if step["op"] == "fill":
        call = {"name": tools["type"], "arguments": {"element": what, "target": ref, "text": step["value"]}}
    elif step["op"] == "select":
        call = {
            "name": tools["select_option"],
            "arguments": {"element": what, "target": ref, "values": [step["value"]]},
        }
    elif step["op"] in ("check", "uncheck") and ("[checked]" in attrs) == (step["op"] == "check"):
        call = {"name": tools["snapshot"], "arguments": {}}  # already as wanted: a harmless look instead of a toggle
    else:
        call = {"name": tools["click"], "arguments": {"element": what, "target": ref}}
    return tool_call_text(call)


def _mcp_tools(prompt: str) -> dict[str, str]:
    """The harness's names of the browser tools: {"click": "mcp__playwright__browser_click", ...}."""
    names = re.findall(r'"name":\s*"([\w.-]*browser_(?:navigate|snapshot|type|select_option|click))"', prompt)
    out = {}
    for n in names:
        out.setdefault(n.rsplit("browser_", 1)[1], n)
    for k in ("navigate", "snapshot", "type", "select_option", "click"):
        out.setdefault(k, f"browser_{k}")
    return out


def _last_snapshot(prompt: str) -> str:
    """The last tool result holding an accessibility snapshot (lines with [ref=...])."""
    parts = prompt.split(TOOL_RESPONSE)
    for part in reversed(parts[1:]):
        if "[ref=" in part:
            return part.split("</tool_response>")[0]
    return ""


# ---- browser-use ------------------------------------------------------------------------------------
def bu_elements(prompt: str) -> list[dict]:
    """browser-use's element list of the LAST browser_state: elements (index, tag, attrs, text) and text lines."""
    state = prompt[prompt.rfind("<browser_state>") :]
    items: list[dict] = []
    for raw in state.splitlines():
        m = BU_ELEMENT.search(raw)
        if m:
            attrs = {k: v.strip("'\"") for k, v in BU_ATTR.findall(m.group(3))}
            items.append({"index": int(m.group(1)), "tag": m.group(2), "attrs": attrs, "text": ""})
        elif raw.startswith("\t") and items and items[-1].get("index") is not None and not items[-1]["text"]:
            items[-1]["text"] = raw.strip()
        elif raw.strip():
            items.append({"index": None, "text": raw.strip()})
    return items


def bu_find(items: list[dict], step: dict) -> int | None:
    op, name = step["op"], _name(step)
    if op == "click":
        tag = "a" if step["role"] == "link" else "button"
        for it in items:
            if it["index"] is not None and it["tag"] == tag and name in (it["text"], it["attrs"].get("aria-label")):
                return it["index"]
        return None
    if op in ("check", "uncheck"):
        for i, it in enumerate(items):
            if it["index"] is None or it["attrs"].get("type") != step["role"]:
                continue
            nxt = items[i + 1]["text"] if i + 1 < len(items) and items[i + 1]["index"] is None else ""
            if name in (it["attrs"].get("value"), it["text"], nxt):
                return it["index"]
        return None
    tags = ("select",) if op == "select" else ("input", "textarea")
    for i, it in enumerate(items):
        if it["index"] is None and it["text"] == name:
            for nxt in items[i + 1 :]:
                if (
                    nxt["index"] is not None
                    and nxt["tag"] in tags
                    and nxt["attrs"].get("type") not in ("radio", "checkbox", "hidden", "submit")
                ):
                    return nxt["index"]
    return None


def bu_reply(prompt: str, plan: list[dict], final: str) -> str:
    m = list(BU_STEP.finditer(prompt))
    k = int(m[-1].group(1)) - 1 if m else 0
    out = {
        "thinking": "",
        "evaluation_previous_goal": "ok",
        "memory": "",
        "next_goal": "",
        "current_plan_item": 0,
        "plan_update": None,
    }
    if k >= len(plan):
        return json.dumps({**out, "action": [{"done": {"text": final, "success": True}}]})
    step = plan[k]
    out["next_goal"] = f"{step['op']} {_name(step) if step['op'] != 'goto' else step['url']}"
    if step["op"] == "goto":
        return json.dumps({**out, "action": [{"navigate": {"url": step["url"]}}]})
    idx = bu_find(bu_elements(prompt), step)
    if idx is None:
        return json.dumps({**out, "action": [{"done": {"text": f"Could not find {_name(step)!r}.", "success": False}}]})
    if step["op"] == "fill":
        action = {"input": {"index": idx, "text": step["value"]}}
    elif step["op"] == "select":
        action = {"select_dropdown": {"index": idx, "text": step["value"]}}
    else:
        action = {"click": {"index": idx}}
    return json.dumps({**out, "action": [action]})


class WebOracle:
    """The scripted policy over a set of web tasks: finds the task by its query in the prompt, then plays its
    plan (`solution/plan.json`, or `wrong_plan.json` with `wrong=True`) in the harness's dialect."""

    def __init__(self, task_dirs: Iterable[str | pathlib.Path], *, wrong: bool = False, final: str = "Done."):
        self.plans: list[tuple[str, list[dict]]] = []
        self.final = final
        for d in task_dirs:
            d = pathlib.Path(d)
            plan = d / "solution" / ("wrong_plan.json" if wrong else "plan.json")
            if not plan.is_file():
                continue
            query = json.loads((d / "data_entry.json").read_text())["user_query"]
            self.plans.append((query, json.loads(plan.read_text())))

    def plan_for(self, prompt: str) -> list[dict] | None:
        return next((plan for query, plan in self.plans if query in prompt), None)

    def reply(self, prompt: str) -> str | None:
        """The reply, or None when no known web task's query is in the prompt (another policy's turn)."""
        plan = self.plan_for(prompt)
        if plan is None:
            return None
        if "<browser_state>" in prompt:
            return bu_reply(prompt, plan, self.final)
        if "<tools>" not in prompt:  # a side call without tools (titles): any short text
            return "Web task"
        return mcp_reply(prompt, plan, self.final)


def web_script(oracle: WebOracle, decode, fallback=None):  # noqa: ANN001
    """A ReplayEngine script (a function of the GenerateRequest): the oracle's reply, else `fallback(prompt)`
    (e.g. the make_file family's oracle in a web + CLI mix), else a plain closing answer."""

    def reply(req) -> str:  # noqa: ANN001 - research.serving.api.GenerateRequest
        prompt = decode(list(req.prompt_ids))
        out = oracle.reply(prompt)
        if out is None and fallback is not None:
            out = fallback(prompt)
        return out if out is not None else "I cannot help with that."

    return reply
