"""Every launcher imports and parses its flags (`--help`), as a fresh process the way users run it.

Launchers are thin: tests import the library functions they call, never the launchers, so absl flags
of different launchers (which may share names) never meet in one process.
"""

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
LAUNCHERS = sorted(p.stem for p in (REPO / "launch").glob("*.py") if p.stem != "__init__")


def test_launchers_found():
    assert {"bench", "eval", "serve", "shim", "train"} <= set(LAUNCHERS)


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_help(name):
    proc = subprocess.run([sys.executable, "-m", f"launch.{name}", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    # absl's --help prints the module docstring and its flags, then exits 1 (usage); a broken import
    # or a flag defined twice shows up as a traceback instead.
    assert "Traceback" not in out, out[-3000:]
    assert proc.returncode in (0, 1) and f"launch/{name}.py:" in out, out[-3000:]


def test_tests_do_not_import_launchers():
    offenders = [p.name for p in (REPO / "tests").glob("test_*.py")
                 if any(f"{kw} launch." in p.read_text() for kw in ("from", "import"))]
    assert not offenders, f"import the library, not the launcher: {offenders}"


def test_train_refuses_a_mesh_the_devices_cannot_hold_before_anything_starts(tmp_path):
    """Through `launch.train`: 8 devices, a mesh of data=3 x fsdp=-1 -> a RunConfigError naming config.mesh, before
    the engine, a sandbox or the workdir exist."""
    wd = tmp_path / "run"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "launch.train", "--config=configs/demo_cpu.py:test",
                           f"--workdir={wd}", "--config.mesh.data=3", "--config.mesh.fsdp=-1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0
    assert "RunConfigError" in proc.stderr and "config.mesh" in proc.stderr and "8 devices" in proc.stderr, \
        proc.stderr[-3000:]
    assert not wd.exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_prints_one_line_per_step_and_no_library_chatter(tmp_path):
    """`launch.train` as the README runs it: progress lines with an ETA, no orbax INFO (~250 lines before)."""
    proc = subprocess.run([sys.executable, "-m", "launch.train", "--config=configs/demo_cpu.py:test",
                           f"--workdir={tmp_path / 'run'}", "--config.sft.steps=4", "--config.train.steps=2"],
                          cwd=REPO, capture_output=True, text=True, timeout=560)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    lines = out.splitlines()
    for phase, total in (("sft", 4), ("rl", 2)):
        steps = [x for x in lines if f"[{phase} " in x]
        assert len(steps) == total and all("s/step, ETA" in x for x in steps), steps
    assert "[rl 2/2] reward" in out and proc.stdout.splitlines()[-1].startswith("SUMMARY ")
    assert not [x for x in lines if "orbax" in x or "checkpoint_manager" in x], out[-3000:]
    assert len(lines) <= 20, out
