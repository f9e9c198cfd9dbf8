"""Every launcher imports and parses its flags (`--help`), as a fresh process the way users run it.

Launchers are thin: tests import the library functions they call, never the launchers, so absl flags
of different launchers (which may share names) never meet in one process.
"""

import fcntl
import os
import pathlib
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import tty

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


def _readme_env() -> dict:
    """The environment a newcomer runs the README in: without the suite's persistent XLA compilation cache
    (tests/conftest.py), whose loader logs two C++ ERROR lines per cached program it loads ("Target machine
    feature +prefer-no-gather is not supported": XLA's own tuning flags, not the CPU's) once other tests filled it."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_prints_one_line_per_step_and_no_library_chatter(tmp_path):
    """`launch.train` as the README runs it: progress lines with an ETA, no orbax INFO (~250 lines before)."""
    proc = subprocess.run([sys.executable, "-m", "launch.train", "--config=configs/demo_cpu.py:test",
                           f"--workdir={tmp_path / 'run'}", "--config.sft.steps=4", "--config.train.steps=2"],
                          cwd=REPO, capture_output=True, text=True, timeout=560, env=_readme_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    lines = out.splitlines()
    for phase, total in (("sft", 4), ("rl", 2)):
        steps = [x for x in lines if f"[{phase} " in x]
        assert len(steps) == total and all("s/step, ETA" in x for x in steps), steps
    assert "[rl 2/2] reward" in out and proc.stdout.splitlines()[-1].startswith("SUMMARY ")
    assert not [x for x in lines if "orbax" in x or "checkpoint_manager" in x], out[-3000:]
    assert len(lines) <= 20, out


def _on_a_terminal(argv: list[str], timeout: float) -> tuple[int, str, str]:
    """Runs argv with stderr on a pseudo-terminal (raw: no \\n -> \\r\\n rewriting; 160 columns), as from a
    user's shell; returns (exit code, stdout, every byte the terminal got, decoded)."""
    master, slave = pty.openpty()
    tty.setraw(slave)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    chunks: list[bytes] = []

    def drain():  # the terminal's buffer is small: a child writing to a full one would block
        while True:
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: every writer closed its end
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.run(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave,
                              text=True, timeout=timeout)
    finally:
        os.close(slave)
        reader.join(10)
        os.close(master)
    return proc.returncode, proc.stdout, b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_eval_prints_no_library_info_unless_verbosity_asks(tmp_path):
    """`launch.eval` holds library loggers at WARNING as train and sweep do. The probe: JAX's INFO line about a
    backend it could not start (JAX_PLATFORMS unset, as a user runs it: JAX tries them all), printed with
    --verbosity and gone without it."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}

    def stderr(*extra: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "launch.eval", "--tasks=family:heldout:1", "--harness=reference",
                               "--k=1", "--endpoint=jax", f"--out={tmp_path / str(len(extra))}", *extra], cwd=REPO,
                              capture_output=True, text=True, timeout=280, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "pass@1" in proc.stdout, proc.stdout[-2000:]
        return proc.stderr

    probe = "Unable to initialize backend"
    assert probe in stderr("--verbosity=0")
    quiet = stderr()
    assert probe not in quiet and "xla_bridge" not in quiet, quiet[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_on_a_terminal_draws_bars_for_sft_rl_and_eval(tmp_path):
    """On a terminal: a bar for the SFT steps, the RL steps and the eval rollouts, and the step lines still
    printed, each on a row of its own (the bars cleared around it), never inside a bar's row."""
    rc, out, term = _on_a_terminal([sys.executable, "-m", "launch.train", "--config=configs/demo_cpu.py:test",
                                    f"--workdir={tmp_path / 'run'}", "--config.sft.steps=2", "--config.train.steps=1",
                                    "--config.eval.at_start=True"], timeout=560)
    assert rc == 0, term[-3000:]
    assert out.splitlines()[-1].startswith("SUMMARY "), out
    for label, unit in (("sft", "step"), ("rl", "step"), ("eval", "rollout")):
        assert re.search(rf"(?:^|[\r\n]){label}: +\d+%\|.*?{unit}", term), (label, term[-3000:])
    rows = [row.split("\r")[-1] for row in term.split("\n")]  # what each terminal row shows at the end
    for line in ("[sft 1/2] nll", "[sft 2/2] nll", "[rl 1/1] reward"):
        hits = [r for r in rows if line in r]
        assert len(hits) == 1 and "%|" not in hits[0] and "s/step, ETA" in hits[0], (line, hits, term[-3000:])
