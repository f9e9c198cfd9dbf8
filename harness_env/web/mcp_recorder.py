"""Runs INSIDE the agent's sandbox (stdlib only): a stdio MCP relay that screenshots every browser step.

    python3 -I -S mcp_recorder.py --screenshots DIR --steps FILE --outdir DIR -- node cli.js --config ...

The CLI starts this as its MCP server; it starts the real server (@playwright/mcp) as its child and
relays newline-delimited JSON-RPC both ways unchanged. When the server answers a `tools/call` of a
page-changing tool, the answer is held back while the relay sends the server one request of its own,
`browser_take_screenshot` (id "hrl-shot-N", never shown to the client); the PNG the server writes into
its output dir becomes DIR/step_NNN.png, a JSON line {step, tool, arguments, ok, url, screenshot, t}
goes to the step log, and then the held answer is passed on. So the model sees exactly the server's
answers, and people get one picture per step. Anything unexpected in the relay's own work (no PNG, a
failed screenshot) is logged in the step line and never blocks or alters the session.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

READ_ONLY = {
    "browser_snapshot",
    "browser_take_screenshot",
    "browser_console_messages",
    "browser_network_requests",
    "browser_network_request",
    "browser_close",
    "browser_tabs",
    "browser_find",
}
URL = re.compile(r"Page URL: (\S+)")


class Relay:
    def __init__(self, args, server):
        self.args, self.server = args, server
        self.lock = threading.Lock()
        self.out_lock = threading.Lock()
        self.pending = {}  # client request id -> (tool, arguments, t0)
        self.held = {}  # our screenshot id -> (client's held answer line, step record)
        self.step = 0
        self.t_start = time.monotonic()
        os.makedirs(args.screenshots, exist_ok=True)
        os.makedirs(args.outdir, exist_ok=True)

    def to_server(self, obj_or_line):
        line = obj_or_line if isinstance(obj_or_line, str) else json.dumps(obj_or_line) + "\n"
        with self.lock:
            self.server.stdin.write(line)
            self.server.stdin.flush()

    def to_client(self, line):
        with self.out_lock:
            sys.stdout.write(line)
            sys.stdout.flush()

    def client_loop(self):
        for line in sys.stdin:
            try:
                msg = json.loads(line)
            except ValueError:
                msg = None
            if isinstance(msg, dict) and msg.get("method") == "tools/call" and "id" in msg:
                p = msg.get("params") or {}
                self.pending[json.dumps(msg["id"])] = (
                    str(p.get("name", "")),
                    p.get("arguments") or {},
                    time.monotonic(),
                )
            try:
                self.to_server(line)
            except (BrokenPipeError, ValueError):
                break
        try:
            self.server.stdin.close()
        except OSError:
            pass

    def server_loop(self):
        for line in self.server.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                self.to_client(line)
                continue
            key = json.dumps(msg.get("id")) if isinstance(msg, dict) and "id" in msg else None
            if key is not None and str(msg.get("id", "")).startswith("hrl-shot-"):
                self.shot_done(key, msg)
            elif key is not None and key in self.pending and ("result" in msg or "error" in msg):
                self.call_done(key, msg, line)
            else:
                self.to_client(line)

    def call_done(self, key, msg, line):
        tool, arguments, t0 = self.pending.pop(key)
        result = msg.get("result") or {}
        text = " ".join(c.get("text", "") for c in result.get("content", []) if isinstance(c, dict))
        self.step += 1
        url = URL.search(text)
        rec = {
            "step": self.step,
            "tool": tool,
            "arguments": arguments,
            "ok": "error" not in msg and not result.get("isError"),
            "url": url.group(1) if url else None,
            "t": round(t0 - self.t_start, 3),
            "screenshot": None,
        }
        if tool.split("__")[-1] in READ_ONLY:
            self.log(rec)
            self.to_client(line)
            return
        sid = f"hrl-shot-{self.step}"
        self.held[json.dumps(sid)] = (line, rec, set(os.listdir(self.args.outdir)))
        try:
            self.to_server(
                {
                    "jsonrpc": "2.0",
                    "id": sid,
                    "method": "tools/call",
                    "params": {"name": "browser_take_screenshot", "arguments": {"type": "png"}},
                }
            )
        except (BrokenPipeError, ValueError):
            self.shot_done(json.dumps(sid), {"error": "server gone"})

    def shot_done(self, key, msg):
        line, rec, before = self.held.pop(key, (None, None, set()))
        if line is None:
            return
        new = sorted(
            (f for f in os.listdir(self.args.outdir) if f.endswith(".png") and f not in before),
            key=lambda f: os.path.getmtime(os.path.join(self.args.outdir, f)),
        )
        if new and "error" not in msg:
            name = f"step_{rec['step']:03d}.png"
            shutil.move(os.path.join(self.args.outdir, new[-1]), os.path.join(self.args.screenshots, name))
            rec["screenshot"] = name
        self.log(rec)
        self.to_client(line)

    def log(self, rec):
        args = json.dumps(rec["arguments"])
        if len(args) > 2000:
            rec["arguments"] = {"truncated": args[:2000]}
        with open(self.args.steps, "a") as fh:
            fh.write(json.dumps(rec) + "\n")


def main(argv):
    cmd = []
    if "--" in argv:
        i = argv.index("--")
        argv, cmd = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser()
    p.add_argument("--screenshots", required=True)
    p.add_argument("--steps", required=True)
    p.add_argument("--outdir", required=True)
    args = p.parse_args(argv)
    if not cmd:
        print("mcp_recorder: no server command after --", file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(args.steps) or ".", exist_ok=True)
    server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    relay = Relay(args, server)
    threading.Thread(target=relay.client_loop, daemon=True).start()
    relay.server_loop()
    return server.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
