"""The in-sandbox half of a desktop session: run by the sandbox's /usr/bin/python3 (stdlib only, `-I`).

Why a long-lived process: in the bwrap backend every exec is a fresh pid and network namespace that dies with
the exec, so an X server started by one exec cannot outlive it. `serve` is therefore one exec that lasts the
whole session: it starts a private D-Bus session bus, Xvfb, the window manager and the task's applications as
its children, writes `ready.json` into the control dir, and waits for a `stop` file there. Later execs (the
actions, the screenshots) reach the X server through its socket file in /tmp/.X11-unix, a directory the host
side copies into the sandbox so that every exec binds the same one (docker shares it anyway).

Teardown must leave nothing behind, also where the exec's namespace does not die with it (docker): `serve` makes
itself a child subreaper, so every daemon an app forks off stays its descendant, and on stop it SIGTERMs, then
SIGKILLs every descendant it can find in /proc until none is left.

`shot` prints the root window as a base64 PNG: `xwd -root` dumped as XWD, converted here (zlib PNG encoder):
ExecResult carries text only, and no image library is assumed inside.
"""

import base64
import ctypes
import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib

PR_SET_CHILD_SUBREAPER = 36


def descendants(root: int) -> list[int]:
    """Every live process whose parent chain reaches `root` (read from /proc)."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    stat = fh.read()
                parent[int(name)] = int(stat[stat.rindex(b")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, frontier = [], {root}
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier and p not in out]
        out += kids
        frontier = set(kids)
    return out


def kill_all(grace_s: float = 1.5) -> None:
    """SIGTERM every descendant, wait up to grace_s for them to go, then SIGKILL until none is left."""
    me = os.getpid()
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in descendants(me):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                while os.waitpid(-1, os.WNOHANG)[0] > 0:
                    pass
            except ChildProcessError:
                pass
            if not descendants(me):
                return
            time.sleep(0.05)


def write_stats(ctl: str) -> None:
    """stats.json: each process's command name, current and peak resident memory (VmRSS, VmHWM; KiB), read
    before teardown: what the report's per-app RAM numbers come from."""
    procs = []
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/status") as fh:
                status = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue
        kib = {k: int(status.get(k, "0 kB").split()[0]) for k in ("VmRSS", "VmHWM")}
        procs.append({"pid": pid, "name": status.get("Name", "?").strip(), "rss_kib": kib["VmRSS"],
                      "peak_kib": kib["VmHWM"]})
    with open(os.path.join(ctl, "stats.json"), "w") as fh:
        json.dump(procs, fh)


def start_x(size: str, log) -> tuple[subprocess.Popen, int]:
    """Xvfb on the first free display (it picks and reports the number through -displayfd)."""
    r, w = os.pipe()
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(w), "-screen", "0", f"{size}x24", "-nolisten", "tcp",
                             "-noreset", "-dpi", "96", "+extension", "RANDR",
                             # no Composite: no depth-32 visuals, whose windows a root XGetImage (xwd) reads black
                             "-extension", "Composite"], pass_fds=(w,), stdout=log, stderr=log)
    os.close(w)
    with os.fdopen(r) as fh:
        line = fh.readline().strip()
    if not line.isdigit():
        raise RuntimeError(f"Xvfb did not report a display (exit {xvfb.poll()})")
    return xvfb, int(line)


def start_wm(wm: str, ctl: str, env: dict, log) -> subprocess.Popen:
    """The window manager, returned once it manages the screen. Openbox: its --startup command runs once it has
    finished starting; _NET_SUPPORTING_WM_CHECK alone is set earlier, and an app mapping its window in between
    sometimes stayed unmapped for good (1 in ~6 starts on a loaded machine). Other WMs: that property."""
    marker = os.path.join(ctl, "wm-ready")
    argv = [wm, "--sm-disable", "--startup", f"/usr/bin/touch {marker}"] if wm == "openbox" else [wm]
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"window manager {wm} exited ({proc.returncode})")
        if wm == "openbox":
            if os.path.exists(marker):
                return proc
        elif "window id" in subprocess.run(["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"], env=env,
                                           capture_output=True, text=True).stdout:
            return proc
        time.sleep(0.05)
    raise RuntimeError(f"window manager {wm} not ready within 20 s")


def wait_window(env: dict, wm_class: str, timeout_s: float) -> str:
    """The id of the first visible window of class `wm_class`, polled with xdotool."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["xdotool", "search", "--onlyvisible", "--class", wm_class], env=env,
                             capture_output=True, text=True)
        if out.stdout.split():
            return out.stdout.split()[0]
        time.sleep(0.1)
    hidden = subprocess.run(["xdotool", "search", "--class", wm_class], env=env, capture_output=True, text=True)
    raise RuntimeError(f"no visible window of class {wm_class!r} within {timeout_s:.0f} s "
                       f"(unmapped ones: {hidden.stdout.split()[:5]})")


def serve(ctl: str, size: str, apps: list[dict], wm: str) -> int:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGTERM, lambda *_: (kill_all(0.5), os._exit(0)))
    log = open(os.path.join(ctl, "session.log"), "ab", buffering=0)  # noqa: SIM115 - lives as long as we do
    t0 = time.monotonic()
    try:
        bus = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--nopidfile", "--print-address",
                                f"--address=unix:path={ctl}/bus"], stdout=subprocess.PIPE, stderr=log, text=True)
        address = bus.stdout.readline().strip()
        if not address:
            raise RuntimeError(f"dbus-daemon printed no address (exit {bus.poll()})")
        xvfb, display = start_x(size, log)
        env = {**os.environ, "DISPLAY": f":{display}", "DBUS_SESSION_BUS_ADDRESS": address,
               "NO_AT_BRIDGE": "1", "GTK_A11Y": "none", "GDK_BACKEND": "x11",
               "GSETTINGS_BACKEND": "memory"}  # no dconf: nothing starts its service here; settings stay in memory
        for _ in range(100):  # until a client can connect (-displayfd reports the number just before it listens)
            if subprocess.run(["xdotool", "getdisplaygeometry"], env=env, capture_output=True).returncode == 0:
                break
            time.sleep(0.05)
        timings = {"x": round(time.monotonic() - t0, 3)}
        wm_proc = None
        if wm:
            wm_proc = start_wm(wm, ctl, env, log)
            timings["wm"] = round(time.monotonic() - t0, 3)
        windows = {}
        for app in apps:
            app_env = {**env, **app.get("env", {})}
            proc = subprocess.Popen(app["argv"], env=app_env, cwd=app.get("cwd") or None, stdout=log, stderr=log)
            if app.get("wm_class"):
                try:
                    windows[app["name"]] = wait_window(env, app["wm_class"], app.get("timeout_s", 30.0))
                except RuntimeError as e:
                    state = ("exited " + str(proc.returncode)) if proc.poll() is not None else "runs"
                    wm_state = "none" if wm_proc is None else "runs" if wm_proc.poll() is None else "exited"
                    raise RuntimeError(f"{app['name']}: {e}; the app {state}, the WM {wm_state}") from None
            timings[app["name"]] = round(time.monotonic() - t0, 3)
            windows.setdefault(app["name"], "")
            windows[app["name"] + ".pid"] = proc.pid
        ready = {"display": display, "xvfb_pid": xvfb.pid, "bus": address, "windows": windows, "timings": timings}
        tmp = os.path.join(ctl, "ready.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(ready, fh)
        os.replace(tmp, os.path.join(ctl, "ready.json"))
        while not os.path.exists(os.path.join(ctl, "stop")):
            if xvfb.poll() is not None:
                raise RuntimeError(f"Xvfb exited ({xvfb.returncode})")
            time.sleep(0.05)
        return 0
    except Exception as e:  # reported to the host through the control dir and stderr
        with open(os.path.join(ctl, "error.txt"), "w") as fh:
            fh.write(f"{type(e).__name__}: {e}\n")
        print(f"desktop serve: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        write_stats(ctl)
        kill_all()


def png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG of packed rows (filter type 0 on every row)."""
    stride = width * 3
    raw = b"".join(b"\x00" + rgb[y * stride:(y + 1) * stride] for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 3)) + chunk(b"IEND", b"")


def xwd_to_png(data: bytes) -> bytes:
    """A 24-bit TrueColor XWD dump (what `xwd -root` writes for Xvfb's 24-bit screen, 24 or 32 bits per pixel)
    as PNG."""
    fields = struct.unpack(">25I", data[:100])  # the header is always written big-endian
    header_size, fmt, depth, width, height = fields[0], fields[2], fields[3], fields[4], fields[5]
    byte_order, bpp, bpl, ncolors = fields[7], fields[11], fields[12], fields[19]
    masks = fields[14:17]
    if fmt != 2 or bpp not in (24, 32) or depth != 24 or sorted(masks) != [0xFF, 0xFF00, 0xFF0000]:
        raise ValueError(f"unsupported XWD: format {fmt}, depth {depth}, {bpp} bits per pixel, masks {masks}")
    size = bpp // 8
    pixels = data[header_size + 12 * ncolors:]
    # the byte holding each channel: LSBFirst stores the pixel's low byte first, MSBFirst its high byte
    shift = {0xFF: 0, 0xFF00: 1, 0xFF0000: 2}
    offsets = [shift[m] if byte_order == 0 else size - 1 - shift[m] for m in masks]
    rows = b"".join(pixels[y * bpl:y * bpl + size * width] for y in range(height))
    if len(rows) != size * width * height:
        raise ValueError(f"truncated XWD: {len(rows)} pixel bytes for {width}x{height}")
    rgb = bytearray(3 * width * height)
    for channel, off in enumerate(offsets):
        rgb[channel::3] = rows[off::size]
    return png(width, height, bytes(rgb))


def shot() -> int:
    out = subprocess.run(["xwd", "-root", "-silent"], capture_output=True, timeout=30)
    if out.returncode != 0:
        print(out.stderr.decode(errors="replace"), file=sys.stderr)
        return out.returncode or 1
    sys.stdout.write(base64.b64encode(xwd_to_png(out.stdout)).decode())
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        spec = json.loads(argv[1])
        return serve(spec["ctl"], spec["size"], spec["apps"], spec.get("wm", "openbox"))
    if argv[:1] == ["shot"]:
        return shot()
    print("usage: inside.py serve SPEC_JSON | shot", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
