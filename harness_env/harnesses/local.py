"""Run a harness directly on the host, no sandbox: for developing adapters and capturing outputs.

Rollouts go through harness_env/runner.py and a sandbox; this exists so an adapter can be checked
against any endpoint (the mock endpoint, or the shim in open mode) in isolation, with the same
prepare/argv/env/parse_output path the runner uses. The process gets its own HOME, stdin /dev/null
and its own process group, killed as a whole on timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import signal
import time

from harness_env.harnesses.base import Harness, HarnessOutcome, SessionContext


@dataclasses.dataclass
class LocalExecResult:
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float = 0.0


async def exec_local(argv: list[str], env: dict[str, str], cwd: str, timeout_s: float) -> LocalExecResult:
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )
    bufs: dict[str, bytearray] = {"out": bytearray(), "err": bytearray()}

    async def pump(stream: asyncio.StreamReader, buf: bytearray) -> None:
        while chunk := await stream.read(65536):
            buf.extend(chunk)

    # Read into buffers (not communicate()) so a timed-out run keeps the output it produced.
    pumps = asyncio.gather(pump(proc.stdout, bufs["out"]), pump(proc.stderr, bufs["err"]), proc.wait())
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(pumps), timeout_s)
    except TimeoutError:
        timed_out = True
    finally:
        try:  # the whole group: children the harness left behind (MCP servers, shells) die with it
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await pumps
    return LocalExecResult(proc.returncode, bufs["out"].decode(errors="replace"), bufs["err"].decode(errors="replace"),
                           timed_out, time.monotonic() - t0)


async def run_local(harness: Harness, prompt: str, *, base_url: str, api_key: str, root: pathlib.Path,
                    model: str = "policy", timeout_s: float = 300.0, max_turns: int = 30,
                    extra_env: dict[str, str] | None = None) -> tuple[HarnessOutcome, LocalExecResult]:
    """Runs `harness` with HOME=root/home and cwd=root/workspace; logs go to root/logs."""
    home, workspace = root / "home", root / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    ctx = SessionContext(base_url=base_url, api_key=api_key, model=model, home=str(home),
                         workspace=str(workspace), max_turns=max_turns)
    await harness.install()
    await harness.prepare(home, ctx)
    env = {**harness.env(ctx), **(extra_env or {})}
    result = await exec_local(harness.argv(prompt, ctx), env, str(workspace), timeout_s)
    harness.save_logs(home, result, root / "logs")
    return harness.parse_output(result), result
