"""Behaviour analytics from captured traces: turns, tool calls by kind, self-verification, error recovery,
tool coverage (the per-rollout behaviours OpenForgeRL relates to success).

Works on the capture log: every call's exact prompt/completion token ids, decoded with the policy's
tokenizer, i.e. exactly what the model saw and said in Qwen3's format: tool calls are
`<tool_call>{json}</tool_call>` in a completion, their results `<tool_response>...</tool_response>`
after the assistant turn in the next prompt, the offered tools a `<tools>` block in the system turn.
Tool names differ per harness (Bash / bash / shell / exec_command ...), so calls are mapped onto kinds
(shell commands by what they run) before counting. Browser tools (`*browser_click`, ...; browser-use's
JSON actions) are `browse`, page reads (`*browser_snapshot`) `inspect`. Web rollouts also carry what the
app saw and what the browser did (`meta["web"]`: harness_env/web/env.summarize, browser.summarize_steps),
aggregated by `web_aggregate`: pages visited, actions, failed actions and recovery after them.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from collections.abc import Iterable, Sequence

from research.capture import CallRecord
from research.shim.render import tool_results

SHELL_TOOLS = {"bash", "shell", "exec", "exec_command", "run_shell_command", "local_shell", "terminal", "run"}
WRITE_TOOLS = {"write_file", "write", "edit", "multiedit", "str_replace", "str_replace_editor", "apply_patch",
               "create_file", "patch", "notebookedit"}
READ_TOOLS = {"read_file", "read", "view", "glob", "grep", "ls", "list", "list_dir", "search", "find"}
FINISH_TOOLS = {"finish", "attempt_completion", "task_complete", "done"}
KINDS = ("write", "inspect", "run", "shell_other", "finish", "browse", "other")
BROWSER_READS = ("snapshot", "take_screenshot", "console_messages", "network_requests", "network_request", "tabs")

_WRITE_CMD = re.compile(r"(?<![0-9&])>(?!&)|\bsed\s+-i|\btee\b|\bmv\b|\bcp\b|\brm\b|\bmkdir\b|\btouch\b|\bchmod\b")
_RUN_CMD = re.compile(r"^\s*(python3?|pytest|node|npm|make|bash|sh|\./|go\s+(test|run)|cargo)\b")
_INSPECT_CMD = re.compile(r"^\s*(cat|head|tail|ls|grep|wc|diff|find|stat|file|less|jq|tree|cmp|md5sum|sha\w*sum)\b")
_EXIT = re.compile(r"^\s*(?:exit code|exit_code|Exit code)[:= ]+(-?\d+)", re.M)
_ERROR = re.compile(r"Traceback \(most recent call last\)|command not found|No such file or directory|"
                    r"Permission denied|\bError:|\berror:|\bFAILED\b|failed:|bad arguments|timed out")
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_TOOLS_BLOCK = re.compile(r"<tools>(.*?)</tools>", re.S)


@dataclasses.dataclass
class ToolUse:
    name: str
    kind: str
    command: str = ""
    ok: bool | None = None  # None: no result seen (e.g. the last call of the rollout)


@dataclasses.dataclass
class Behaviour:
    rollout_id: str
    harness: str
    turns: int
    tools: list[ToolUse]
    tools_available: list[str]

    @property
    def by_kind(self) -> dict[str, int]:
        c = collections.Counter(t.kind for t in self.tools)
        return {k: c.get(k, 0) for k in KINDS}

    @property
    def self_verified(self) -> bool:
        """Inspected outputs or ran code after (its first) write."""
        first = next((i for i, t in enumerate(self.tools) if t.kind == "write"), None)
        return first is not None and any(t.kind in ("inspect", "run") for t in self.tools[first + 1:])

    @property
    def had_error(self) -> bool:
        return any(t.ok is False for t in self.tools)

    @property
    def recovered(self) -> bool:
        """A failed tool call followed later by a successful call of the same tool."""
        return any(t.ok is False and any(u.name == t.name and u.ok for u in self.tools[i + 1:])
                   for i, t in enumerate(self.tools))

    @property
    def coverage(self) -> float | None:
        if not self.tools_available:
            return None
        used = {t.name for t in self.tools} & set(self.tools_available)
        return len(used) / len(self.tools_available)


def classify(name: str, args: dict) -> tuple[str, str]:
    """(kind, shell command or "")."""
    low = name.lower()
    cmd = args.get("command", args.get("cmd", "")) if isinstance(args, dict) else ""
    if isinstance(cmd, list):
        cmd = " ".join(map(str, cmd[2:] if cmd[:2] in (["bash", "-lc"], ["bash", "-c"]) else cmd))
    cmd = str(cmd)
    if low in FINISH_TOOLS:
        return "finish", ""
    if "browser_" in low:
        return ("inspect" if low.rsplit("browser_", 1)[1] in BROWSER_READS else "browse"), ""
    if low in WRITE_TOOLS:
        return "write", ""
    if low in READ_TOOLS:
        return "inspect", ""
    if low in SHELL_TOOLS or cmd:
        if _RUN_CMD.search(cmd):
            return "run", cmd
        if _WRITE_CMD.search(cmd):
            return "write", cmd
        if _INSPECT_CMD.search(cmd):
            return "inspect", cmd
        return "shell_other", cmd
    return "other", ""


def browser_use_actions(completion: str) -> list[tuple[str, dict]]:
    """browser-use answers with a JSON object whose `action` list holds {name: params}; done is a finish."""
    try:
        obj = json.loads(completion.replace("<|im_end|>", "").strip())
    except ValueError:
        return []
    acts = obj.get("action") if isinstance(obj, dict) else None
    out = []
    for a in acts if isinstance(acts, list) else []:
        if isinstance(a, dict) and len(a) == 1:
            (name, params), = a.items()
            out.append((str(name), params if isinstance(params, dict) else {}))
    return out


def tool_ok(output: str) -> bool:
    m = _EXIT.search(output)
    if m:
        return int(m.group(1)) == 0
    return not _ERROR.search(output)


def parse_tool_calls(completion: str) -> list[tuple[str, dict]]:
    out = []
    for raw in _TOOL_CALL.findall(completion):
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments")
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    args = {"raw": args}
            out.append((obj["name"], args if isinstance(args, dict) else {}))
    return out


def tool_responses(prompt: str) -> list[str]:
    """Tool results that follow the last assistant turn of a prompt (answers to that turn's calls)."""
    cut = prompt.rfind("<|im_start|>assistant\n", 0, max(0, len(prompt) - 1))
    return tool_results(prompt[cut:] if cut >= 0 else prompt)


def tools_offered(prompt: str) -> list[str]:
    names = []  # every <tools> block: the template's own prose mentions an empty "<tools></tools>" first
    for line in "\n".join(_TOOLS_BLOCK.findall(prompt)).splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        fn = obj.get("function", obj) if isinstance(obj, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


def analyze_texts(rollout_id: str, harness: str, calls: Sequence[tuple[str, str]]) -> Behaviour:
    """calls: (prompt text, completion text) per model call, in order."""
    tools: list[ToolUse] = []
    for i, (_, completion) in enumerate(calls):
        uses = [ToolUse(n, *classify(n, a)) for n, a in parse_tool_calls(completion)]
        if not uses:  # browser-use: JSON actions instead of tool calls
            uses = [ToolUse(n, "finish" if n == "done" else "browse") for n, _ in browser_use_actions(completion)]
        if i + 1 < len(calls):
            for use, out in zip(uses, tool_responses(calls[i + 1][0])):
                use.ok = tool_ok(out)
        tools += uses
    return Behaviour(rollout_id, harness, len(calls), tools, tools_offered(calls[0][0]) if calls else [])


def behaviours(records: Iterable, tokenizer) -> list[Behaviour]:
    """One Behaviour per rollout from CallRecords (others ignored); `tokenizer.decode(ids)` -> text."""
    by_rollout: dict[str, list[CallRecord]] = collections.defaultdict(list)
    for r in records:
        if isinstance(r, CallRecord):
            by_rollout[r.rollout_id].append(r)
    out = []
    for rid, recs in by_rollout.items():
        recs.sort(key=lambda r: r.call_index)
        texts = [(tokenizer.decode(r.prompt_ids), tokenizer.decode(r.completion_ids)) for r in recs]
        out.append(analyze_texts(rid, recs[0].harness, texts))
    return out


def aggregate(bs: Sequence[Behaviour]) -> dict:
    """Means over rollouts; error recovery among rollouts that had an error."""
    if not bs:
        return {"rollouts": 0}
    n = len(bs)
    errs = [b for b in bs if b.had_error]
    cov = [b.coverage for b in bs if b.coverage is not None]
    return {
        "rollouts": n,
        "turns_mean": sum(b.turns for b in bs) / n,
        "tool_calls_mean": sum(len(b.tools) for b in bs) / n,
        "tool_calls_by_kind": {k: sum(b.by_kind[k] for b in bs) for k in KINDS},
        "self_verification_rate": sum(b.self_verified for b in bs) / n,
        "error_rate": len(errs) / n,
        "error_recovery_rate": (sum(b.recovered for b in errs) / len(errs)) if errs else None,
        "tool_coverage_mean": (sum(cov) / len(cov)) if cov else None,
    }


WEB_MEANS = ("pages_visited", "page_views", "actions", "failed_actions", "browser_steps", "browser_failed_steps",
             "screenshots", "urls_visited")


def web_aggregate(results: Sequence) -> dict:
    """Means over web rollouts (RolloutResult.meta["web"]) of what the app logged and the browser did; recovery
    rates among rollouts with a failed action (the app rejected a post / a browser step errored)."""
    ws = [r.meta["web"] for r in results if isinstance(getattr(r, "meta", None), dict) and
          isinstance(r.meta.get("web"), dict)]
    if not ws:
        return {"rollouts": 0}
    out: dict = {"rollouts": len(ws)}
    for key in WEB_MEANS:
        vals = [w[key] for w in ws if isinstance(w.get(key), int | float)]
        out[f"{key}_mean"] = sum(vals) / len(vals) if vals else None
    for key, flag in (("recovered", "failed_actions"), ("browser_recovered", "browser_failed_steps")):
        had = [w for w in ws if (w.get(flag) or 0) > 0]
        out[f"{key.replace('recovered', 'recovery')}_rate"] = (sum(bool(w.get(key)) for w in had) / len(had)
                                                                  if had else None)
        out[f"{flag}_rollout_rate"] = len(had) / len(ws)
    return out
