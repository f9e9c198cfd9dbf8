"""The `Harness` base class and registry: how an agent CLI is installed, configured, run and read.

A harness adapter is pure description plus parsing; it never runs anything itself. The runner
(harness_env/runner.py) asks it for the npm packages to install, the read-only host paths to mount,
the files to write into the sandbox HOME (`prepare`), the argv/env to execute inside the sandbox,
and then hands the finished process back to `parse_output`. Keeping execution out of the adapter
is what lets the same adapter run under bwrap, docker or kubernetes, and what makes adding a
harness one small file: subclass `Harness`, decorate with `@register`.

Paths: `prepare` writes into the *host* directory that the sandbox will mount as HOME; everything
the harness sees at run time (`ctx.home`, `ctx.workspace`, `ctx.base_url`) is as seen *inside*
the sandbox.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import importlib
import json
import pathlib
import pkgutil
import shutil
from typing import Any, ClassVar, Protocol

from harness_env.harnesses.install import NpmPackage, bin_path, ensure_installed, install_dir

# Wire APIs a harness speaks (the names research/capture.CallRecord.api uses).
APIS = ("anthropic_messages", "openai_responses", "openai_chat")
# Kept with every rollout that drove a browser (harness_env/web/browser.py): one PNG per step, the step log.
WEB_LOG_GLOBS = (".hrl/screenshots/*.png", ".hrl/browser_steps.jsonl")
MAX_LOG_BYTES = 64 << 20  # a harness log file kept with its rollout; larger ones are named, not copied


class HarnessError(RuntimeError):
    """A harness cannot be configured or its output cannot be read; the message says which harness."""


@dataclasses.dataclass(frozen=True)
class WebContext:
    """A web task's browser setup, as seen inside the sandbox: where the app is, where screenshots go."""

    start_url: str  # e.g. http://127.0.0.1:8000/
    origins: tuple[str, ...]  # the app origins the browser may load
    screenshots_dir: str  # one PNG per browser step (kept with the rollout: Harness.save_logs)
    steps_log: str  # one JSON line per browser step (tool, arguments, ok, url): behaviour analytics


@dataclasses.dataclass(frozen=True)
class SessionContext:
    """Everything a harness needs to point itself at its shim session, as seen inside the sandbox.

    `base_url` is the shim session root without `/v1` (e.g. `http://127.0.0.1:8123/s/abc`):
    Anthropic clients use it as is, OpenAI-style clients append `/v1` (see `openai_base_url`).
    """

    base_url: str
    api_key: str
    model: str = "policy"
    home: str = "/home/agent"
    workspace: str = "/workspace"
    max_turns: int = 30
    context_window: int = 32768  # the policy's context (tokens): harnesses that plan compaction need it
    web: WebContext | None = None  # set on web tasks: the harness attaches its browser tools

    @property
    def openai_base_url(self) -> str:
        return self.base_url.rstrip("/") + "/v1"


class ExecResultLike(Protocol):
    exit_code: int | None
    stdout: str | bytes
    stderr: str | bytes
    timed_out: bool


@dataclasses.dataclass
class HarnessOutcome:
    """What the harness reported. `completed` means it ended its agent loop normally (not: the task
    is solved; the reward script decides that)."""

    completed: bool
    exit_code: int | None
    final_message: str = ""
    error: str = ""
    num_turns: int | None = None
    session_id: str | None = None  # the harness's own session/thread id, when it prints one
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


def as_text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data


_DECODER = json.JSONDecoder()


def json_lines(text: str) -> list[dict]:
    """Every JSON object in `text` that starts a line: JSON-lines events and pretty-printed envelopes
    alike (CLIs mix them with stray log lines, which are skipped)."""
    out, pos = [], 0
    while pos < len(text):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        start = pos + (len(text[pos:end]) - len(text[pos:end].lstrip()))
        if text.startswith("{", start):
            try:
                obj, stop = _DECODER.raw_decode(text, start)
            except json.JSONDecodeError:
                pass
            else:
                if isinstance(obj, dict):
                    out.append(obj)
                end = max(end, text.find("\n", stop) if text.find("\n", stop) >= 0 else len(text))
        pos = end + 1
    return out


def tail(text: str, n: int = 600) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


class Harness(abc.ABC):
    """One agent harness. Subclasses set the class attributes and implement `argv` and `parse_output`."""

    name: ClassVar[str]
    api: ClassVar[str]  # one of APIS
    package: ClassVar[NpmPackage | None] = None  # None: nothing to install (reference harness)
    node: ClassVar[NpmPackage | None] = None  # a Node runtime newer than the system one, if needed
    # Shell tool of this harness: lets a scripted replay engine emit "run this command" for it.
    shell_tool: ClassVar[str] = "bash"
    # Files under HOME worth keeping with the rollout (transcripts, session logs).
    log_globs: ClassVar[tuple[str, ...]] = ()
    # Browser: "none" (CLI tasks only), "mcp" (its own tools, plus a browser through @playwright/mcp on web
    # tasks: harness_env/web/browser.py), "only" (a browser agent: web tasks only).
    browser: ClassVar[str] = "none"
    extra_packages: ClassVar[tuple[NpmPackage, ...]] = ()  # installed beside `package` (the MCP browser server)
    # host paths its browser needs in the sandbox on web tasks (the MCP recorder: harness_env/web/browser.mounts()),
    # declared by the harness that picks the browser: harness_env/web/browser.py imports this package's install.py,
    # so this module cannot import it back
    browser_mounts: ClassVar[tuple[pathlib.Path, ...]] = ()
    # Tokens of the harness's first model request with the Qwen3 template (system prompt, tool schemas, the task),
    # measured on ClawGym tasks: the engine's context must hold it and the turns after it (`context_for`).
    first_request_tokens: ClassVar[int] = 1024

    def supports(self, web: bool) -> str | None:
        """None if this harness can run a (web / CLI) task, else why not (the rollout is a harness_error)."""
        if web and self.browser == "none":
            return f"{self.name} has no browser tools: it cannot run web tasks"
        if not web and self.browser == "only":
            return f"{self.name} is a browser agent: it runs web tasks only"
        return None

    # ---- installation -------------------------------------------------------------------------
    def npm_packages(self) -> list[NpmPackage]:
        return [p for p in (self.node, self.package, *self.extra_packages) if p is not None]

    def py_packages(self) -> list:
        """Pinned PyPI packages (install.PyPackage), each in its own venv (browser-use)."""
        return []

    async def install(self) -> None:
        """Idempotent: installs the pinned packages into the shared cache (fast when present)."""
        if self.package is not None:
            await ensure_installed(self.package, node=self.node)
        for pkg in self.extra_packages:
            await ensure_installed(pkg)

    def mounts(self, web: bool = False) -> list[pathlib.Path]:
        """Host paths the sandbox must bind read-only at the same path (install prefixes; on web tasks also
        the browser tooling of harness_env/web)."""
        paths = [install_dir(p) for p in (self.node, self.package) if p is not None]
        if web and self.browser != "none":
            paths += [install_dir(p) for p in self.extra_packages] + list(self.browser_mounts)
        return paths

    def executable(self) -> str:
        if self.package is None:
            raise HarnessError(f"{self.name}: no npm package")
        return str(bin_path(self.package))

    # ---- configuration and command -----------------------------------------------------------
    async def prepare(self, host_home: pathlib.Path, ctx: SessionContext) -> None:
        """Writes config files into the host dir mounted as HOME. Default: just create it."""
        host_home.mkdir(parents=True, exist_ok=True)

    def env(self, ctx: SessionContext) -> dict[str, str]:
        """Environment for the harness process: own HOME, no TTY, node on PATH, no side traffic."""
        path = ["/usr/local/bin", "/usr/bin", "/bin"]
        if self.node is not None:
            path.insert(0, str(bin_path(self.node).parent))
        if self.package is not None:
            path.insert(0, str(bin_path(self.package).parent))
        return {
            "HOME": ctx.home,
            "TERM": "dumb",
            "NO_COLOR": "1",
            "CI": "1",
            "PATH": ":".join(path),
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
        }

    @abc.abstractmethod
    def argv(self, prompt: str, ctx: SessionContext) -> list[str]:
        """The headless command line (run with cwd = ctx.workspace, stdin = /dev/null)."""

    def invocation(self, host_home: pathlib.Path, prompt: str, ctx: SessionContext) -> dict[str, Any]:
        """How this run configured the CLI, for the record (logs/invocation.json): the package it ran, its
        documented flags (argv), its environment and every config file `prepare` wrote into HOME (content up to
        64 KiB, else a sha256), the session's key redacted everywhere. Nothing else configures it: the installed
        files are the registry's (harness_env/harnesses/verify.py)."""
        def clean(text: str) -> str:
            return text.replace(ctx.api_key, "<redacted>") if ctx.api_key else text

        env = {k: "<redacted>" if any(w in k.upper() for w in ("KEY", "TOKEN", "SECRET")) else clean(v)
               for k, v in self.env(ctx).items()}
        files = {}
        for f in sorted(host_home.rglob("*")):
            if f.is_file() and not f.is_symlink():
                data = f.read_bytes()
                files[str(f.relative_to(host_home))] = clean(data.decode(errors="replace")) if len(data) <= 1 << 16 \
                    else f"<{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}>"
        return {"harness": self.name, "package": self.package.spec if self.package else None,
                "argv": [clean(a) for a in self.argv(prompt, ctx)], "env": env, "config_files": files}

    # ---- results ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def parse_output(self, result: ExecResultLike) -> HarnessOutcome:
        """Reads completion, exit status and the final message from the finished process."""

    def shell_call(self, command: str) -> dict[str, Any]:
        """The tool call (name + arguments) that makes this harness run `command` in its shell."""
        return {"name": self.shell_tool, "arguments": {"command": command}}

    def save_logs(self, host_home: pathlib.Path, result: ExecResultLike | None, dest: pathlib.Path) -> list[str]:
        """Keeps stdout/stderr and the harness's own transcript files with the rollout; returns names."""
        dest.mkdir(parents=True, exist_ok=True)
        kept = []
        if result is not None:
            for stream in ("stdout", "stderr"):
                (dest / f"{stream}.txt").write_text(as_text(getattr(result, stream, "")))
                kept.append(f"{stream}.txt")
        real_home = host_home.resolve()
        for pattern in (*self.log_globs, *WEB_LOG_GLOBS):
            for src in sorted(host_home.glob(pattern)):
                # HOME is the agent's: keep only regular files really inside it (no link to a host file,
                # no FIFO that would block the copy, no file reached through a linked directory).
                if src.is_symlink() or not src.is_file() or real_home not in src.resolve().parents:
                    continue
                if src.stat().st_size > MAX_LOG_BYTES:  # a sparse file would be written out to the host in full
                    kept.append(f"skipped (over {MAX_LOG_BYTES} bytes): {src.relative_to(host_home)}")
                    continue
                rel = src.relative_to(host_home)
                target = dest / "home" / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target, follow_symlinks=False)
                kept.append(str(pathlib.Path("home") / rel))
        return kept

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} api={self.api}>"


REGISTRY: dict[str, type[Harness]] = {}


def register(cls: type[Harness]) -> type[Harness]:
    if cls.api not in APIS:
        raise HarnessError(f"{cls.__name__}: api {cls.api!r} not in {APIS}")
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise HarnessError(f"harness name {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def context_for(harnesses: list[str], floor: int = 4096) -> int:
    """The engine context (tokens per sequence) that runs every harness of `harnesses`: the largest first request
    doubled (room for the turns after it), rounded up to a power of two, at least `floor`."""
    need = max([floor, *(2 * get_harness(h).first_request_tokens for h in harnesses)])
    return 1 << (need - 1).bit_length()


def first_call_need(harness: str) -> int:
    """Tokens a harness's first call needs: its first request and a first reply (256 tokens)."""
    return get_harness(harness).first_request_tokens + 256


def tight_context(harnesses: list[str]) -> int:
    """The smallest engine context, in whole 1k blocks, that holds every harness's first call (Codex: 10240): for
    short tasks whose whole path is the first request and a few hundred tokens. The CLIs shape their prompts by the
    window they are told, so a policy must be served with the window it was trained under."""
    need = max(first_call_need(h) for h in harnesses)
    return -(-need // 1024) * 1024


def check_context(harnesses: list[str], max_len: int) -> None:
    """ValueError naming both sizes when `max_len` cannot hold a harness's first call (`first_call_need`): a
    configuration mismatch must fail at start, not as every rollout's harness_error."""
    for h in harnesses:
        need = first_call_need(h)
        if max_len < need:
            raise ValueError(f"engine context {max_len} tokens < {need} that {h} needs (its first request is "
                             f"~{get_harness(h).first_request_tokens} tokens); {context_for([h])} would fit")


BUILTIN = ("reference", "claude_code", "codex", "opencode", "openclaw", "browser_use", "browser_use_vision")
# Modules of this package that are infrastructure, not adapters.
_NOT_ADAPTERS = {"base", "install", "local", "mock_endpoint", "scripted", "reference_agent", "verify"}


def _load_builtin() -> None:
    """Imports every adapter module of this package for its @register side effect, so adding a harness
    is one new file here. (Here, not at module top, to avoid import cycles.)"""
    for mod in pkgutil.iter_modules([str(pathlib.Path(__file__).parent)]):
        if not mod.name.startswith("_") and mod.name not in _NOT_ADAPTERS:
            importlib.import_module(f"harness_env.harnesses.{mod.name}")


def get_harness(name: str) -> Harness:
    _load_builtin()
    try:
        return REGISTRY[name]()
    except KeyError:
        raise HarnessError(f"unknown harness {name!r}; known: {sorted(REGISTRY)}") from None


def harness_names() -> list[str]:
    _load_builtin()
    return sorted(REGISTRY)

