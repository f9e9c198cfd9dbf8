"""Bench `sandbox`: start latency (bwrap vs docker vs a bare process) and sustained concurrent rollouts.

  python -m launch.bench --suite=sandbox [--opt n_start=30 --opt levels=16,64 --opt docker_levels=16]

Start latency = `backend.create(spec)` + the first command (`true`) finished, i.e. until a harness
could be running; measured without and with the shim forwarder (which is one python3 start inside).
The peer is a bare `asyncio.create_subprocess_exec("true")` in the same run (ratio = sandbox cost).
Concurrency: at each level N, N rollouts of the reference harness on make_file tasks run at once
through the real path (runner -> bwrap -> forwarder -> shim -> oracle replay engine -> reward.sh);
a level passes when every rollout ends ok with reward 1.0 and N sandboxes were open at the same time.
`bwrap_max_concurrent` is the largest passing level; the same for docker at `docker_levels`.
"""

from __future__ import annotations

import asyncio
import pathlib
import tempfile
import time

import numpy as np

from harness_env.sandbox import Limits, SandboxSpec, get_backend


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000.0, q))


async def _bare(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        p = await asyncio.create_subprocess_exec("true")
        await p.wait()
        out.append(time.perf_counter() - t)
    return out


async def _starts(backend, n: int, root: pathlib.Path, shim_sock: pathlib.Path | None) -> list[float]:
    out = []
    for i in range(n):
        spec = SandboxSpec(workspace=root / f"ws{i}", home=root / f"home{i}", shim_socket=shim_sock, name=f"bench{i}")
        t = time.perf_counter()
        sbx = await backend.create(spec)
        res = await sbx.exec(["true"])
        out.append(time.perf_counter() - t)
        await sbx.close()
        if res.exit_code != 0:
            raise RuntimeError(f"sandbox start check failed: {res}")
    return out


class _Counting:
    """Wraps a backend to record the peak number of simultaneously open sandboxes."""

    def __init__(self, inner):
        self.inner, self.open, self.peak = inner, 0, 0

    async def create(self, spec):
        sbx = await self.inner.create(spec)
        self.open += 1
        self.peak = max(self.peak, self.open)
        close = sbx.close

        async def counted_close():
            if not sbx.closed:
                self.open -= 1
            await close()

        sbx.close = counted_close
        return sbx


async def _level(n: int, root: pathlib.Path, tok, backend_name: str, timeout_s: float) -> dict:
    from harness_env.runner import Runner, RunnerConfig, plan
    from harness_env.tasks import family
    from research.capture import CaptureLog
    from research.serving.replay import ReplayEngine
    from research.shim.server import ShimServer

    # A small replay delay keeps each rollout in flight long enough that all N overlap, as real model
    # calls would; the work per rollout (harness start, 2 calls, 2 tool runs, reward) is all real.
    engine = ReplayEngine(lambda req: family.oracle_reply(tok.decode(req.prompt_ids)), tok, chunk_size=16, delay_s=0.05)
    capture = CaptureLog(root / f"capture{n}.jsonl", fsync=False)
    server = ShimServer(engine, tok, capture, unix_socket=str(root / f"shim{n}.sock"))
    await server.start()
    counting = _Counting(get_backend(backend_name))
    cfg = RunnerConfig(out_dir=root / f"run{n}", backend=backend_name, concurrency=n, timeout_s=timeout_s,
                       infra_retries=0, limits=Limits(memory_mb=512, pids=128), progress=False)
    runner = Runner(cfg, server, capture_log=capture, backend=counting)
    tasks = family.generate(root / f"tasks{n}", "train", n=n, seed=n)
    t = time.perf_counter()
    try:
        results = await runner.run(plan(tasks, ["reference"], 1))
    finally:
        runner.close()
        await server.stop()
        capture.close()
    wall = time.perf_counter() - t
    ok = sum(r.status == "ok" and r.reward == 1.0 for r in results)
    return {"n": n, "ok": ok, "peak_open": counting.peak, "wall_s": wall, "rollouts_per_s": len(results) / wall,
            "passed": ok == n and counting.peak == n,
            "statuses": sorted({r.status + (": " + r.message[:80] if r.message else "") for r in results})[:3]}


async def _levels(out: dict, name: str, levels: list[int], root: pathlib.Path, tok, timeout_s: float) -> None:
    runs = [await _level(n, root / f"{name}{n}", tok, name, timeout_s) for n in levels]
    out[f"{name}_levels"] = runs
    passed = [r["n"] for r in runs if r["passed"]]
    out[f"{name}_max_concurrent"] = max(passed) if passed else 0
    if passed:
        out[f"{name}_rollouts_per_s"] = next(r for r in runs if r["n"] == max(passed))["rollouts_per_s"]


async def _run(n_start: int, levels: list[int], docker_levels: list[int], docker: bool, timeout_s: float) -> dict:
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="hrl-bench-") as tmp:
        root = pathlib.Path(tmp)
        sock = root / "dummy.sock"
        srv = await asyncio.start_unix_server(lambda r, w: w.close(), path=str(sock))
        bare = await _bare(n_start)
        out["bare_start_ms_p50"] = _pct(bare, 50)
        bw = get_backend("bwrap")
        b0 = await _starts(bw, n_start, root / "b0", None)
        b1 = await _starts(bw, n_start, root / "b1", sock)
        out.update(bwrap_start_ms_p50=_pct(b0, 50), bwrap_start_ms_p99=_pct(b0, 99),
                   bwrap_start_shim_ms_p50=_pct(b1, 50), bwrap_start_shim_ms_p99=_pct(b1, 99),
                   bwrap_vs_bare_ratio=_pct(b0, 50) / out["bare_start_ms_p50"])
        dk = get_backend("docker")
        ok, why = dk.available() if docker else (False, "disabled by --opt docker=false")
        if ok:
            d0 = await _starts(dk, max(5, n_start // 3), root / "d0", None)
            d1 = await _starts(dk, max(5, n_start // 3), root / "d1", sock)
            out.update(docker_start_ms_p50=_pct(d0, 50), docker_start_ms_p99=_pct(d0, 99),
                       docker_start_shim_ms_p50=_pct(d1, 50), docker_vs_bwrap_ratio=_pct(d0, 50) / _pct(b0, 50))
        else:
            out["docker_skipped"] = why
        srv.close()
        from research.models.tokenizer import load_tokenizer

        tok = load_tokenizer()  # the packaged Qwen3 tokenizer
        await _levels(out, "bwrap", levels, root, tok, timeout_s)
        if ok and docker_levels:
            await _levels(out, "docker", docker_levels, root, tok, timeout_s)
    return out


def run(n_start: int = 30, levels: str | int = "16,64", docker_levels: str | int = "16", docker: bool = True,
        timeout_s: float = 120.0) -> dict:
    parse = lambda v: [int(x) for x in str(v).split(",") if str(x).strip()]
    return asyncio.run(_run(int(n_start), parse(levels), parse(docker_levels), bool(docker), float(timeout_s)))
