"""The browser every web harness drives: Debian's headless Chromium, and how MCP CLIs get it.

No browser can be downloaded here (Playwright's own builds come from a CDN), so every harness drives
the system Chromium by its executable path. Inside our sandboxes Chromium cannot build its own
sandbox (no setuid helper, no nested user namespaces under docker's seccomp/no-new-privileges), so it
runs with `--no-sandbox` - our sandbox is the boundary - plus the flags a small container needs
(/dev/shm is tiny: `--disable-dev-shm-usage`; no GPU; no background traffic, which would fail anyway:
the sandbox's network is loopback only).

MCP-capable CLIs (Claude Code, Codex) get the npm `@playwright/mcp` server, unmodified and pinned,
configured by a JSON file written into HOME (isolated in-memory profile, only the app's origin allowed,
snapshots as text, no images sent to the text-only policy). Between the CLI and the server sits
`mcp_recorder.py`, a transparent stdio relay that after every page-changing tool call asks the same
server for a screenshot and keeps it as `HOME/.hrl/screenshots/step_NNN.png`, with one JSON line per
browser step in `HOME/.hrl/browser_steps.jsonl` (tool, arguments, ok, page URL). The model sees exactly
what the server answered; the runner keeps screenshots and step log with the rollout's logs.
"""

from __future__ import annotations

import json
import os
import pathlib

from harness_env.harnesses.install import NpmPackage, install_dir

CHROMIUM = "/usr/lib/chromium/chromium"  # Debian's binary (/usr/bin/chromium is a shell wrapper around it)
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-breakpad",
    "--disable-crash-reporter",
    "--metrics-recording-only",
    "--password-store=basic",
)
VIEWPORT = {"width": 1280, "height": 800}
PLAYWRIGHT_MCP = NpmPackage("@playwright/mcp", "0.0.83", "node_modules/@playwright/mcp/cli.js")
NODE = "/usr/bin/node"
HRL_DIR = ".hrl"  # under HOME: screenshots, step log, MCP config and output
SCREENSHOTS = f"{HRL_DIR}/screenshots"
STEPS_LOG = f"{HRL_DIR}/browser_steps.jsonl"
HERE = pathlib.Path(__file__).resolve().parent
RECORDER = HERE / "mcp_recorder.py"
MCP_SERVER_NAME = "playwright"


def chromium_available() -> tuple[bool, str]:
    if not os.access(CHROMIUM, os.X_OK):
        return False, f"{CHROMIUM} missing (apt-get install chromium: .ci/setup.d/35-browsers.sh)"
    return True, ""


def mounts() -> list[pathlib.Path]:
    """Host paths a browser harness needs inside the sandbox (at the same path): this folder (the recorder)."""
    return [HERE]


def mcp_config(ctx) -> dict:  # noqa: ANN001 - harnesses.base.SessionContext
    """@playwright/mcp's config file (its documented `--config` format)."""
    return {
        "browser": {
            "browserName": "chromium",
            "isolated": True,
            "launchOptions": {
                "executablePath": CHROMIUM,
                "headless": True,
                "chromiumSandbox": False,
                "args": list(CHROMIUM_ARGS),
            },
            "contextOptions": {"viewport": VIEWPORT},
        },
        "network": {"allowedOrigins": list(ctx.web.origins)},
        "outputDir": f"{ctx.home}/{HRL_DIR}/mcp-output",
        "imageResponses": "omit",  # the policy reads text (accessibility snapshots); screenshots are for people
        "codegen": "none",
        "timeouts": {"action": 5000, "navigation": 30000},
    }


def write_mcp_config(host_home: pathlib.Path, ctx) -> str:  # noqa: ANN001
    """Writes the server config into HOME; returns its path inside the sandbox."""
    d = host_home / HRL_DIR
    (d / "screenshots").mkdir(parents=True, exist_ok=True)
    (d / "playwright-mcp.json").write_text(json.dumps(mcp_config(ctx), indent=1))
    return f"{ctx.home}/{HRL_DIR}/playwright-mcp.json"


def mcp_server(ctx) -> tuple[str, list[str]]:  # noqa: ANN001
    """(command, args) of the browser MCP server as the CLI starts it: the recorder relaying to @playwright/mcp."""
    server = [
        NODE,
        str(install_dir(PLAYWRIGHT_MCP) / PLAYWRIGHT_MCP.bin),
        "--config",
        f"{ctx.home}/{HRL_DIR}/playwright-mcp.json",
    ]
    return "/usr/bin/python3", [
        "-I",
        "-S",
        str(RECORDER),
        "--screenshots",
        ctx.web.screenshots_dir,
        "--steps",
        ctx.web.steps_log,
        "--outdir",
        f"{ctx.home}/{HRL_DIR}/mcp-output",
        "--",
        *server,
    ]


def summarize_steps(logs_dir: pathlib.Path) -> dict:
    """Browser steps of a rollout from its kept step log and screenshots (harness-independent analytics)."""
    steps = []
    path = logs_dir / "home" / STEPS_LOG
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                steps.append(obj)
    shots = sorted((logs_dir / "home" / SCREENSHOTS).glob("*.png")) if (logs_dir / "home").is_dir() else []
    failed = [i for i, s in enumerate(steps) if s.get("ok") is False]
    return {
        "browser_steps": len(steps),
        "browser_failed_steps": len(failed),
        "screenshots": len(shots),
        "urls_visited": len({s.get("url") for s in steps if s.get("url")}),
        "browser_recovered": (any(any(t.get("ok") for t in steps[i + 1 :]) for i in failed) if failed else None),
    }
