"""A minimal agent loop over OpenAI chat completions with bash/read_file/write_file/finish tools.

Standalone on purpose (stdlib only, no repo imports): the reference harness copies this file into
the sandbox HOME and runs it with the sandbox's python3, exactly like a real harness binary. It
prints one JSON event per line on stdout (`{"type": "turn", ...}` per model call and a final
`{"type": "result", ...}`) and keeps the full transcript in $HOME/.reference/transcript.jsonl.

    python3 reference_agent.py --base-url URL/v1 --api-key K --model M --max-turns 30 PROMPT
    python3 reference_agent.py ... --tools bash --system "You are a software agent." PROMPT  # a short prompt

`--tools` keeps a subset of the tools (in the given order) and `--system` replaces the system prompt:
a tiny from-scratch policy learns far faster from a ~180-token prompt than from the ~400-token default.
`--answers N --followup TEXT` makes it a multi-turn chat: after each plain answer but the N-th, the user
says TEXT and the model answers again (every call extends the previous one: one prefix-tree path).
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

SYSTEM = (
    "You are a careful software agent working in the current directory. Use the tools to inspect "
    "and change files and to run shell commands. When the task is done, call `finish` with a short "
    "summary of what you did."
)

TOOLS = [
    {"type": "function", "function": {
        "name": "bash", "description": "Run a shell command in the working directory; returns exit code and output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Write (overwrite) a text file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "finish", "description": "Declare the task done.",
        "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}}},
]

MAX_OUTPUT = 8000
RETRIES = 3


class ModelError(RuntimeError):
    pass


def chat(base_url, api_key, body, timeout):
    """One non-streaming chat completion; retries 429/5xx a few times honouring Retry-After."""
    data = json.dumps(body).encode()
    for attempt in range(RETRIES + 1):
        req = urllib.request.Request(
            base_url.rstrip("/") + "/chat/completions", data=data, method="POST",
            headers={"Content-Type": "application/json", "Authorization": "Bearer " + api_key})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            if e.code in (429, 500, 502, 503, 529) and attempt < RETRIES:
                time.sleep(min(float(e.headers.get("Retry-After") or 1.0), 5.0))
                continue
            raise ModelError(f"HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            if attempt < RETRIES:
                time.sleep(0.5 * (attempt + 1))
                continue
            raise ModelError(f"connection failed: {e}") from None
    raise ModelError("unreachable")


def clip(text):
    return text if len(text) <= MAX_OUTPUT else text[:MAX_OUTPUT] + "\n...[truncated]"


def run_tool(name, args):
    """Returns (output text, ok)."""
    try:
        if name == "bash":
            p = subprocess.run(["bash", "-c", args["command"]], capture_output=True, text=True, timeout=120,
                               stdin=subprocess.DEVNULL)
            return clip(f"exit code {p.returncode}\n{p.stdout}{p.stderr}"), p.returncode == 0
        if name == "read_file":
            with open(args["path"]) as f:
                return clip(f.read()), True
        if name == "write_file":
            d = os.path.dirname(args["path"])
            if d:
                os.makedirs(d, exist_ok=True)
            with open(args["path"], "w") as f:
                f.write(args["content"])
            return f"wrote {len(args['content'])} chars to {args['path']}", True
        return f"unknown tool {name!r}", False
    except subprocess.TimeoutExpired:
        return "command timed out after 120 s", False
    except (KeyError, TypeError) as e:
        return f"bad arguments for {name}: {e!r}", False
    except OSError as e:
        return f"{name} failed: {e}", False


def emit(event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--model", default="policy")
    ap.add_argument("--max-turns", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--tools", default=",".join(t["function"]["name"] for t in TOOLS),
                    help="comma-separated subset of: " + ", ".join(t["function"]["name"] for t in TOOLS))
    ap.add_argument("--system", default=SYSTEM, help="the system prompt")
    ap.add_argument("--answers", type=int, default=1, help="plain answers before the chat ends")
    ap.add_argument("--followup", default="Go on.", help="the user's message after each answer but the last")
    ap.add_argument("prompt")
    a = ap.parse_args(argv)
    by_name = {t["function"]["name"]: t for t in TOOLS}
    names = [n.strip() for n in a.tools.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown or not names:
        ap.error(f"--tools {a.tools!r}: unknown {unknown}; known: {sorted(by_name)}")
    tools = [by_name[n] for n in names]
    log_dir = os.path.join(os.environ.get("HOME", "."), ".reference")
    os.makedirs(log_dir, exist_ok=True)
    transcript = open(os.path.join(log_dir, "transcript.jsonl"), "a")
    messages = [{"role": "system", "content": a.system}, {"role": "user", "content": a.prompt}]
    for m in messages:
        transcript.write(json.dumps(m) + "\n")
    final, status, turns, answers = "", "max_turns", 0, 0
    try:
        while turns < a.max_turns:
            turns += 1
            resp = chat(a.base_url, a.api_key, {"model": a.model, "messages": messages, "tools": tools,
                                                "max_tokens": a.max_tokens, "temperature": a.temperature}, a.timeout)
            msg = resp["choices"][0]["message"]
            calls = msg.get("tool_calls") or []
            turn = {"role": "assistant", "content": msg.get("content") or ""}
            if calls:
                turn["tool_calls"] = calls
            messages.append(turn)
            transcript.write(json.dumps(turn) + "\n")
            emit({"type": "turn", "turn": turns, "tool_calls": [c["function"]["name"] for c in calls],
                  "content": turn["content"]})
            if not calls:  # a plain answer ends the loop, like the CLIs do (after --answers of them)
                answers += 1
                if answers < a.answers:
                    follow = {"role": "user", "content": a.followup}
                    messages.append(follow)
                    transcript.write(json.dumps(follow) + "\n")
                    continue
                final, status = turn["content"], "completed"
                break
            finished = False
            for c in calls:
                name = c["function"]["name"]
                try:
                    args = json.loads(c["function"].get("arguments") or "{}")
                except json.JSONDecodeError as e:
                    out, ok = f"arguments are not valid JSON: {e}", False
                else:
                    if name == "finish":
                        final, finished, out, ok = str(args.get("message", "")), True, "ok", True
                    else:
                        out, ok = run_tool(name, args if isinstance(args, dict) else {})
                tool_msg = {"role": "tool", "tool_call_id": c.get("id", ""), "content": out}
                messages.append(tool_msg)
                transcript.write(json.dumps({**tool_msg, "ok": ok}) + "\n")
            if finished:
                status = "completed"
                break
    except ModelError as e:
        emit({"type": "result", "status": "error", "error": str(e), "turns": turns, "final_message": final,
              "transcript": messages[1:]})
        return 2
    finally:
        transcript.close()
    # The transcript (without the system prompt) goes to chat-graded checkers.
    emit({"type": "result", "status": status, "turns": turns, "final_message": final, "transcript": messages[1:]})
    return 0 if status == "completed" else 3


if __name__ == "__main__":
    sys.exit(main())
