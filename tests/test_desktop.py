"""Desktop tasks: the per-task desktop in a real sandbox (screenshots, actions, teardown) and every template's
checker validated through the real apps: the scripted GUI plan scores 1.0, nothing 0.0, the plausible mistake 0.0.

The default tier validates one template per app (Mousepad, PCManFM, Galculator + Mousepad, Gnumeric) and the
session itself on bwrap; `slow` validates every template (variant 0, and a held-out variant of each), docker the
session in the docker backend. The apps come from .ci/setup.d/45-desktop.sh; without them the GUI tests skip,
saying which command is missing (a failure under HARNESS_RL_STRICT=1, where the setup script has run).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys

import pytest

from harness_env.desktop import check as check_mod
from harness_env.desktop import validate as V
from harness_env.desktop.session import App, DesktopError, DesktopSession
from harness_env.sandbox import SandboxSpec, get_backend
from harness_env.tasks import desktop_family as F

TOOLS = ("Xvfb", "xdotool", "xwd", "xprop", "openbox", "dbus-daemon", "mousepad", "pcmanfm", "galculator", "gnumeric")
MISSING = [t for t in TOOLS if shutil.which(t) is None]
needs_desktop = pytest.mark.skipif(bool(MISSING), reason=f"desktop tools not installed: {', '.join(MISSING)} "
                                                         "(run .ci/setup.d/45-desktop.sh)")
APP_NAMES = ("mousepad", "pcmanfm", "galculator", "gnumeric", "Xvfb", "openbox", "dbus-daemon")


def backend_or_skip(name: str):
    b = get_backend(name)
    ok, why = b.available()
    if not ok:
        pytest.skip(f"{name} backend unavailable: {why}")
    return b


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# --- the family, without a GUI -------------------------------------------------------------------------------
def test_family_has_templates_splits_and_deterministic_variants():
    assert len(F.TEMPLATES) >= 12
    apps = {a["name"] for t in F.TEMPLATES for a in F.variant(t, 0)["apps"]}
    assert apps == {"mousepad", "pcmanfm", "galculator", "gnumeric"}
    for t in F.TEMPLATES:
        assert F.variant(t, 3) == F.variant(t, 3)
        distinct = {json.dumps(F.variant(t, i)["checks"], sort_keys=True) for i in range(5)}
        assert len(distinct) >= 4, f"{t}: the seeded variants barely differ"
        splits = [F.split_of(t, i) for i in range(10)]
        assert splits.count("heldout") == 2 and splits.count("train") == 8, t
        v = F.variant(t, 0)
        assert v["plan"] != v["wrong"], t
    assert set(F.variants("train", 10)).isdisjoint(F.variants("heldout", 10))


def test_generate_writes_tasks_whose_inputs_alone_score_zero(tmp_path):
    dirs = F.generate(tmp_path / "tasks", split="heldout", n=len(F.TEMPLATES))
    assert {json.loads((d / "data_entry.json").read_text())["metadata"]["template"] for d in dirs} == set(F.TEMPLATES)
    for d in dirs:
        entry = json.loads((d / "data_entry.json").read_text())
        assert entry["metadata"]["split"] == "heldout" and "{workspace}" not in entry["user_query"]
        ws = tmp_path / "ws" / d.name
        shutil.copytree(d / "input_files", ws)
        assert V.grade(d, ws)[0] == 0.0, d.name  # the untouched workspace never passes


def test_checker_reads_gnumeric_xml_and_rejects_escapes(tmp_path):
    import gzip

    xml = (b'<?xml version="1.0"?><gnm:Workbook xmlns:gnm="http://www.gnumeric.org/v10.dtd"><gnm:Sheets><gnm:Sheet>'
           b'<gnm:Cells><gnm:Cell Row="0" Col="0" ValueType="40">7</gnm:Cell><gnm:Cell Row="1" Col="27">=sum(A1:A1)'
           b'</gnm:Cell></gnm:Cells></gnm:Sheet></gnm:Sheets></gnm:Workbook>')
    book = tmp_path / "b.gnumeric"
    book.write_bytes(gzip.compress(xml))
    assert check_mod.gnumeric_cells(str(book)) == {"A1": "7", "AB2": "=sum(A1:A1)"}
    assert check_mod.cell_ref(25, 0) == "Z1" and check_mod.cell_ref(26, 9) == "AA10"
    with pytest.raises(ValueError):
        check_mod.path_of("../outside")


# --- the desktop session --------------------------------------------------------------------------------------
def _host_descendants(root: int) -> dict[int, str]:
    """pid -> command name of every live descendant of `root` (bwrap's namespaces are visible from the host)."""
    parent, names = {}, {}
    for n in os.listdir("/proc"):
        if n.isdigit():
            try:
                stat = pathlib.Path(f"/proc/{n}/stat").read_text()
            except OSError:
                continue
            names[int(n)] = stat[stat.index("(") + 1:stat.rindex(")")]
            parent[int(n)] = int(stat[stat.rindex(")") + 2:].split()[1])
    out, frontier = {}, {root}
    while frontier:
        kids = {p for p, pp in parent.items() if pp in frontier and p not in out}
        out.update({p: names[p] for p in kids})
        frontier = kids
    return out


async def _session_roundtrip(backend_name: str, tmp_path: pathlib.Path) -> dict:
    backend = backend_or_skip(backend_name)
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    (ws / "n.txt").write_text("")
    sbx = await backend.create(SandboxSpec(workspace=ws, home=home, name="desk-test", shim=False))
    async with sbx:
        d = DesktopSession(sbx, [App("mousepad", ("mousepad", f"{sbx.spec.workspace_dir}/n.txt"), "Mousepad")],
                           size=(800, 600))
        await d.start()
        during = _host_descendants(os.getpid())
        before = await d.screenshot()
        await d.type_text("screen changes")
        await d.wait_window("^\\*")  # the title shows the unsaved change
        after = await d.screenshot()
        geo = await d.xdotool("search", "--onlyvisible", "--name", "Mousepad$", "getwindowgeometry", "--shell")
        pos = dict(line.split("=") for line in geo.split() if "=" in line)
        await d.click(int(pos["X"]) + 20, int(pos["Y"]) + 12)  # the menu bar's "File": its menu opens
        await asyncio.sleep(0.5)
        menu = await d.screenshot()
        await d.key("Escape")
        await d.close()
        left = await sbx.exec(["/usr/bin/python3", "-c", "import os\nfor p in os.listdir('/proc'):\n if p.isdigit():\n"
                               "  try: print(open(f'/proc/{p}/comm').read().strip())\n  except OSError: pass"])
        with pytest.raises(DesktopError):
            await d.screenshot()  # a closed session refuses actions
    return {"during": during, "after_close": _host_descendants(os.getpid()), "inside": left.stdout.split(),
            "before": before, "after": after, "menu": menu, "stats": d.stats}


@needs_desktop
def test_session_screenshots_actions_and_teardown_bwrap(tmp_path):
    r = asyncio.run(_session_roundtrip("bwrap", tmp_path))
    assert png_size(r["before"]) == (800, 600) == png_size(r["after"])
    assert r["before"] != r["after"] != r["menu"]  # typing changed the screen, and so did a click
    apps_during = {n for n in r["during"].values() if n in APP_NAMES}
    assert {"Xvfb", "openbox", "mousepad", "dbus-daemon"} <= apps_during
    gone = {pid for pid, n in r["during"].items() if n in APP_NAMES} & set(r["after_close"])
    assert not gone, f"left running after close: {[r['during'][p] for p in gone]}"
    assert not set(r["inside"]) & set(APP_NAMES)
    assert {p["name"] for p in r["stats"]} >= {"Xvfb", "mousepad"}


@needs_desktop
@pytest.mark.docker
@pytest.mark.slow
def test_session_in_docker(tmp_path):
    r = asyncio.run(_session_roundtrip("docker", tmp_path))
    assert png_size(r["before"]) == (800, 600) and r["before"] != r["after"]
    assert not set(r["inside"]) & set(APP_NAMES), r["inside"]  # docker: the container outlives the exec


def test_missing_tool_is_named(tmp_path):
    backend = backend_or_skip("bwrap")

    async def go():
        sbx = await backend.create(SandboxSpec(workspace=tmp_path / "ws", name="desk-missing", shim=False))
        async with sbx:
            with pytest.raises(DesktopError, match=r"no-such-editor.*45-desktop\.sh"):
                await DesktopSession(sbx, [App("x", ("no-such-editor",), package="no-such-editor")]).start()

    asyncio.run(go())


# --- every checker through the real apps ----------------------------------------------------------------------
FAST = ("mousepad_append_line", "pcmanfm_rename", "galculator_to_file", "gnumeric_sum")


def _validate(tmp_path, template: str, index: int, backend: str = "bwrap") -> V.Validation:
    backend_or_skip(backend)
    task = F.write_task(tmp_path, template, index)
    v = asyncio.run(V.validate(task, backend))
    print(json.dumps({"task": v.task_id, "seconds": v.seconds, "peak_kib": v.peak_kib}))
    return v


def _assert_valid(v: V.Validation) -> None:
    assert (v.solution, v.nothing, v.wrong) == (1.0, 0.0, 0.0), (v.task_id, v.message)


@needs_desktop
@pytest.mark.parametrize("template", FAST)
def test_checker_validated_one_template_per_app(tmp_path, template):
    _assert_valid(_validate(tmp_path, template, 0))


@needs_desktop
@pytest.mark.slow
@pytest.mark.parametrize("template", sorted(set(F.TEMPLATES) - set(FAST)))
def test_checker_validated_every_template(tmp_path, template):
    _assert_valid(_validate(tmp_path, template, 0))


@needs_desktop
@pytest.mark.slow
@pytest.mark.parametrize("template", sorted(F.TEMPLATES))
def test_checker_validated_on_a_heldout_variant(tmp_path, template):
    index = next(i for i in range(10) if F.split_of(template, i) == "heldout")
    _assert_valid(_validate(tmp_path, template, index))


@needs_desktop
@pytest.mark.docker
@pytest.mark.slow
def test_checker_validated_in_docker(tmp_path):
    _assert_valid(_validate(tmp_path, "pcmanfm_move", 0, backend="docker"))


def test_validate_cli_reports_json(tmp_path):
    """The CLI's one JSON line per task (here: a task dir without a desktop entry fails cleanly, not by a crash)."""
    task = F.write_task(tmp_path, "pcmanfm_delete", 0)
    entry = json.loads((task / "data_entry.json").read_text())
    entry["metadata"]["desktop"]["apps"] = [{"name": "x", "argv": ["no-such-app"], "wm_class": "X"}]
    (task / "data_entry.json").write_text(json.dumps(entry))
    backend_or_skip("bwrap")
    out = subprocess.run([sys.executable, "-m", "harness_env.desktop.validate", str(task)], capture_output=True,
                         text=True, timeout=120, cwd=pathlib.Path(__file__).resolve().parents[1])
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 1 and line["ok"] is False and "no-such-app" in line["message"]
