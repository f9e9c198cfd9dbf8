"""Evaluation runs: the library half of `python -m launch.eval` (tasks, engine, rollouts, report)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import tempfile

from harness_env.eval import analytics, metrics, report
from harness_env.rl.experts import harness_of_prompt, readdress
from harness_env.runner import Runner, RunnerConfig, plan
from harness_env.tasks import select
from harness_env.tasks.select import parse_spec, select_tasks
from research.capture import CaptureLog, RolloutResult, read_log


def task_dirs(spec: str, scratch: pathlib.Path, *, split: str | None = None, limit: int | None = None,
              seed: int = 0, heldout_fraction: float = 0.1) -> list[pathlib.Path]:
    """`--tasks` (library | family:SPLIT[:N] | make_file | DIR) through the one task selection
    (harness_env/tasks/select.py); explicit split/limit override what the spec string says."""
    source, kw = parse_spec(spec)
    if split is not None:
        kw["split"] = split
    if limit is not None:
        kw["limit"] = limit
    return select_tasks(source, seed=seed, heldout_fraction=heldout_fraction, scratch=scratch, **kw)


def build_engine(endpoint: str, tok, *, max_len: int = 4096, max_context: int | None = None,  # noqa: ANN001
                 tasks: list[pathlib.Path] | None = None):
    """The engine for an endpoint spec (research/serving/factory.py), plus `oracle`: a scripted engine that
    solves the make_file, relay and recover families (through any CLI's own shell tool) and the web tasks among `tasks`
    (their solution/plan.json, through whichever browser harness runs them: harness_env/web/policy.py) - a
    pipeline check."""
    from harness_env.web.policy import WebOracle
    from research.serving.factory import build_engine as build

    web = WebOracle(tasks or [])

    def oracle(prompt: str) -> str:
        out = web.reply(prompt)
        if out is not None:
            return out
        # the shell call in the asking CLI's own tool
        return readdress(select.oracle_reply(prompt), harness_of_prompt(prompt))

    return build(endpoint, tok, max_len=max_len, max_context=max_context, scripts={"oracle": oracle})


async def evaluate(*, tasks: list[pathlib.Path], harnesses: list[str], k: int, engine, tok, out: pathlib.Path,
                   cfg: RunnerConfig, threshold: float = 1.0, close_engine: bool = False,
                   inspect_log: pathlib.Path | None = None, shim_options=None) -> dict:  # noqa: ANN001
    """Runs (or resumes) the rollouts, then writes the report; returns the report's JSON document paths.
    `close_engine`: the engine is closed before returning (a launcher's own engine: a JAX engine's serving thread
    still inside XLA when the interpreter exits aborts the process, rc 134, after the report was written).
    `inspect_log`: also export the run as an Inspect AI eval log there (harness_env/eval/inspect_log.py).
    `shim_options` (research.shim.session.ShimOptions): how the shim renders and samples (a trained policy is
    served as it was trained: its thinking switch, token cap and sampling; harness_env/eval/policies.py)."""
    from research.shim.server import ShimServer

    if inspect_log is not None:  # an optional extra: a missing inspect_ai fails here, not after the rollouts
        from harness_env.eval import inspect_log as inspect_export
    out.mkdir(parents=True, exist_ok=True)
    capture = CaptureLog(out / "capture.jsonl")
    sock = pathlib.Path(tempfile.gettempdir()) / f"hrl-shim-{os.getpid()}.sock"  # AF_UNIX paths: <108 bytes
    if shim_options is None:
        from research.shim.session import ShimOptions

        shim_options = ShimOptions(vision=engine.image_processor)
    server = ShimServer(engine, tok, capture, unix_socket=str(sock), options=shim_options)
    await server.start()
    runner = Runner(cfg, server, capture_log=capture)
    try:
        await runner.run(plan(tasks, harnesses, k))
    finally:
        runner.close()
        await server.stop()
        capture.close()
        sock.unlink(missing_ok=True)
        if close_engine:
            await engine.close()
    results = [r for r in read_log(out / "results.jsonl") if isinstance(r, RolloutResult)]
    ks = [x for x in (1, 2, 4, 8, 16, 32) if x <= k] or [1]
    rows = metrics.table(results, ks, threshold)
    bs = analytics.behaviours(read_log(out / "capture.jsonl"), tok)
    behaviour = {h: analytics.aggregate([b for b in bs if b.harness == h]) for h in sorted({b.harness for b in bs})}
    for h in sorted({r.harness for r in results}):
        web = analytics.web_aggregate([r for r in results if r.harness == h])
        if web["rollouts"]:
            behaviour.setdefault(h, {})["web"] = web
    paths = report.write_report(out, rows, ks, behaviour, {"harnesses": harnesses, "tasks": len(tasks)})
    if inspect_log is not None:  # in a thread: inspect_ai's writer runs its own event loop
        paths["inspect"] = await asyncio.to_thread(inspect_export.export, out, inspect_log, tok=tok,
                                                   threshold=threshold)
    return {"rows": rows, "behaviour": behaviour, "paths": paths}
