"""A per-task desktop inside a sandbox: Xvfb + a window manager + the task's apps, driven like a computer-use agent.

`DesktopSession` works through the `Sandbox` interface only (exec + copy_in), so the same code runs in the bwrap
and the docker backend. Its lifetime is one long exec of harness_env/desktop/inside.py `serve` (why: a bwrap
exec's namespaces die with it, see inside.py); every action is a short exec of xdotool against the session's
display, and a screenshot is a short exec that dumps the root window and returns PNG bytes. `close()` asks
`serve` to stop (a file in the control dir), which kills every process it started, and waits for that exec to end;
if it does not, cancelling the exec kills its process tree (the Sandbox contract).

The API is deliberately the small set a computer-use harness speaks: screenshot, click / double_click / move /
drag / scroll at pixel coordinates, type text, press key combos (xdotool key names: "ctrl+s", "Return"), plus
window helpers (wait for a window by title, the active window's title) that scripted plans use to stay in step
with the apps instead of sleeping blindly.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import pathlib
import shlex
import tempfile
import time
from collections.abc import Sequence

from harness_env.sandbox.base import ExecResult, Sandbox

INSIDE_HOST = pathlib.Path(__file__).with_name("inside.py")
CTL_IN = "/opt/hrl-desktop"  # the control dir inside the sandbox: inside.py, ready.json, stop, the bus socket
X11_DIR_IN = "/tmp/.X11-unix"  # shared by every exec of the sandbox (copied in: bwrap binds it into each exec)
PYTHON = "/usr/bin/python3"
# The commands a session needs, with the Debian package that has each (.ci/setup.d/45-desktop.sh installs them)
TOOLS = {"Xvfb": "xvfb", "xdotool": "xdotool", "xwd": "x11-apps", "xprop": "x11-utils", "dbus-daemon": "dbus",
         "python3": "python3"}
WMS = {"openbox": "openbox"}


class DesktopError(RuntimeError):
    """The desktop could not start, an action failed, or a tool is missing (the message says which)."""


@dataclasses.dataclass(frozen=True)
class App:
    """One application of a task: its argv (run in the session, DISPLAY set), the WM_CLASS of its main window
    (start-up waits until that window is visible; "" = do not wait), extra env and cwd."""

    name: str
    argv: tuple[str, ...]
    wm_class: str = ""
    package: str = ""  # the Debian package, for the missing-tool message
    env: tuple[tuple[str, str], ...] = ()
    cwd: str = ""
    timeout_s: float = 30.0

    def spec(self) -> dict:
        return {"name": self.name, "argv": list(self.argv), "wm_class": self.wm_class, "env": dict(self.env),
                "cwd": self.cwd, "timeout_s": self.timeout_s}


class DesktopSession:
    """Use as `async with DesktopSession(sandbox, apps) as d:` (or `await d.start()` / `await d.close()`)."""

    def __init__(self, sandbox: Sandbox, apps: Sequence[App] = (), *, size: tuple[int, int] = (1024, 768),
                 wm: str = "openbox", start_timeout_s: float = 60.0, lifetime_s: float = 900.0):
        self.sandbox, self.apps, self.size, self.wm = sandbox, list(apps), size, wm
        self.start_timeout_s, self.lifetime_s = start_timeout_s, lifetime_s
        self.display: int | None = None
        self.ready: dict = {}
        self._serve: asyncio.Task | None = None
        self.stats: list[dict] = []  # per process at teardown: name, rss_kib, peak_kib (inside.write_stats)
        self.closed = False

    # --- lifecycle -------------------------------------------------------------------------------------------
    async def check_tools(self) -> None:
        """Raises DesktopError naming every missing command and its package (one exec, `command -v` each)."""
        need = dict(TOOLS)
        if self.wm:
            need[self.wm] = WMS.get(self.wm, self.wm)
        for app in self.apps:
            need[app.argv[0]] = app.package or app.argv[0]
        script = "".join(f"command -v {shlex.quote(c)} >/dev/null || echo {shlex.quote(c)}\n" for c in need)
        res = await self.sandbox.exec(["/bin/sh", "-c", script], timeout=30)
        missing = [c for c in res.stdout.split() if c in need]
        if not res.ok or missing:
            pkgs = sorted({need[c] for c in missing})
            raise DesktopError(f"desktop tools missing in sandbox {self.sandbox.id}: {', '.join(missing)} "
                               f"(apt-get install {' '.join(pkgs)}; .ci/setup.d/45-desktop.sh installs them)"
                               + ("" if res.ok else f"; check failed: {res.stderr.strip()[-200:]}"))

    async def start(self) -> DesktopSession:
        await self.check_tools()
        with tempfile.TemporaryDirectory(prefix="hrl-desktop-") as tmp:
            ctl, x11 = pathlib.Path(tmp) / "ctl", pathlib.Path(tmp) / "x11"
            ctl.mkdir()
            x11.mkdir(mode=0o1777)
            (ctl / "inside.py").write_bytes(INSIDE_HOST.read_bytes())
            await self.sandbox.copy_in(ctl, CTL_IN)
            await self.sandbox.copy_in(x11, X11_DIR_IN)
        spec = {"ctl": CTL_IN, "size": f"{self.size[0]}x{self.size[1]}", "wm": self.wm,
                "apps": [a.spec() for a in self.apps]}
        self._serve = asyncio.ensure_future(self.sandbox.exec(
            [PYTHON, "-I", f"{CTL_IN}/inside.py", "serve", json.dumps(spec)], timeout=self.lifetime_s))
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self._serve.done():
                res = self._serve.result()
                raise DesktopError(f"desktop did not start (exit {res.exit_code}): {res.stderr.strip()[-600:]} "
                                   f"{await self._log_tail()}")
            got = await self.sandbox.exec(["/bin/cat", f"{CTL_IN}/ready.json"], timeout=10)
            if got.ok and got.stdout.strip():
                self.ready = json.loads(got.stdout)
                self.display = int(self.ready["display"])
                return self
            if time.monotonic() > deadline:
                tail = await self._log_tail()
                await self.close()
                raise DesktopError(f"desktop not ready within {self.start_timeout_s:.0f} s: {tail}")
            await asyncio.sleep(0.1)

    async def _log_tail(self) -> str:
        got = await self.sandbox.exec(["/bin/sh", "-c", f"tail -c 800 {CTL_IN}/session.log {CTL_IN}/error.txt"],
                                      timeout=10)
        return got.stdout.strip()

    async def close(self, timeout_s: float = 20.0) -> None:
        """Stops every process of the session and waits for the serving exec to end; idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._serve is None:
            return
        if not self._serve.done() and not self.sandbox.closed:
            with contextlib.suppress(Exception):
                await self.sandbox.exec(["/bin/sh", "-c", f": > {CTL_IN}/stop"], timeout=10)
            try:
                await asyncio.wait_for(asyncio.shield(self._serve), timeout_s)
            except TimeoutError:
                self._serve.cancel()  # the Sandbox contract: a cancelled exec kills its process tree
        with contextlib.suppress(BaseException):
            await self._serve
        if not self.sandbox.closed:
            with contextlib.suppress(Exception):
                got = await self.sandbox.exec(["/bin/cat", f"{CTL_IN}/stats.json"], timeout=10)
                self.stats = json.loads(got.stdout) if got.ok else []

    async def __aenter__(self) -> DesktopSession:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # --- low level -------------------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        if self.display is None or self.closed:
            raise DesktopError("the desktop session is not running")
        return {"DISPLAY": f":{self.display}", "DBUS_SESSION_BUS_ADDRESS": self.ready.get("bus", "")}

    async def run(self, argv: Sequence[str], timeout: float = 30.0, check: bool = True) -> ExecResult:
        """Any command against the session's display (an X client: xdotool, xprop ...)."""
        res = await self.sandbox.exec(list(argv), env=self.env(), timeout=timeout)
        if check and not res.ok:
            raise DesktopError(f"{' '.join(argv)[:200]}: exit {res.exit_code}{' (timed out)' * res.timed_out}: "
                               f"{res.stderr.strip()[-300:]}")
        return res

    async def xdotool(self, *args: str, timeout: float = 30.0) -> str:
        return (await self.run(["xdotool", *args], timeout=timeout)).stdout

    # --- what an agent sees and does ----------------------------------------------------------------------------
    async def screenshot(self) -> bytes:
        """The whole screen as PNG bytes (size: self.size)."""
        res = await self.run([PYTHON, "-I", f"{CTL_IN}/inside.py", "shot"], timeout=30)
        data = base64.b64decode(res.stdout.strip(), validate=True)
        if not data.startswith(b"\x89PNG\r\n\x1a\n"):
            raise DesktopError("screenshot: not a PNG")
        return data

    async def click(self, x: int, y: int, button: int = 1, repeat: int = 1) -> None:
        await self.xdotool("mousemove", "--sync", str(int(x)), str(int(y)), "click", "--repeat", str(repeat),
                           "--delay", "80", str(button))

    async def double_click(self, x: int, y: int) -> None:
        await self.click(x, y, repeat=2)

    async def move(self, x: int, y: int) -> None:
        await self.xdotool("mousemove", "--sync", str(int(x)), str(int(y)))

    async def drag(self, x0: int, y0: int, x1: int, y1: int) -> None:
        await self.xdotool("mousemove", "--sync", str(x0), str(y0), "mousedown", "1", "sleep", "0.1",
                           "mousemove", "--sync", str(x1), str(y1), "sleep", "0.1", "mouseup", "1")

    async def scroll(self, x: int, y: int, clicks: int) -> None:
        """Positive clicks scroll down (button 5), negative up (button 4)."""
        await self.click(x, y, button=5 if clicks > 0 else 4, repeat=abs(clicks))

    async def type_text(self, text: str, delay_ms: int = 8) -> None:
        """Types `text` into the focused window, each newline as a Return key press: xdotool's own typing of a
        newline at either end of its text was lost in Mousepad (measured), so lines and Returns go separately."""
        for i, line in enumerate(text.split("\n")):
            if i:
                await self.xdotool("key", "Return")
            if line:
                await self.xdotool("type", "--delay", str(delay_ms), "--", line,
                                   timeout=30 + len(line) * delay_ms / 1000)

    async def key(self, *combos: str, delay_ms: int = 40) -> None:
        """Presses each combo in turn ("ctrl+s", "Return", "alt+F4"), `delay_ms` apart."""
        await self.xdotool("key", "--delay", str(delay_ms), *combos, timeout=30 + len(combos) * delay_ms / 1000)

    # --- window helpers for scripted plans ----------------------------------------------------------------------
    async def windows(self, name: str) -> list[str]:
        """Ids of the visible windows whose title matches the regex `name`."""
        res = await self.run(["xdotool", "search", "--onlyvisible", "--name", name], check=False)
        return res.stdout.split()

    async def wait_window(self, name: str, timeout_s: float = 15.0, gone: bool = False) -> list[str]:
        """Waits until a visible window's title matches `name` (gone=True: until none does)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = await self.windows(name)
            if bool(found) != gone:
                return found
            if time.monotonic() > deadline:
                raise DesktopError(f"window {name!r} {'still there' if gone else 'not shown'} after {timeout_s:.0f} s; "
                                   f"active: {await self.active_title()!r}")
            await asyncio.sleep(0.1)

    async def active_title(self) -> str:
        res = await self.run(["xdotool", "getactivewindow", "getwindowname"], check=False)
        return res.stdout.strip()

    async def activate(self, name: str) -> None:
        """Raises and focuses the first visible window titled like `name`, waiting for it."""
        wid = (await self.wait_window(name))[0]
        await self.xdotool("windowactivate", "--sync", wid)

    async def wait_file(self, path: str, timeout_s: float = 10.0, gone: bool = False) -> None:
        """Waits until `path` exists inside the sandbox (gone=True: until it does not): the way a plan knows an
        app has finished writing, without a fixed sleep."""
        test = f"[ {'!' if gone else ''} -e {shlex.quote(path)} ]"
        deadline = time.monotonic() + timeout_s
        while not (await self.sandbox.exec(["/bin/sh", "-c", test], timeout=10)).ok:
            if time.monotonic() > deadline:
                raise DesktopError(f"{path} {'still exists' if gone else 'not written'} after {timeout_s:.0f} s")
            await asyncio.sleep(0.1)
