"""Every launcher imports and parses its flags (`--help`), as a fresh process the way users run it.

Launchers are thin: tests import the library functions they call, never the launchers, so absl flags
of different launchers (which may share names) never meet in one process.
"""

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
