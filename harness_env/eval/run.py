"""Evaluation runs: the library half of `python -m launch.eval` (tasks, engine, rollouts, report)."""

from __future__ import annotations

import os
import pathlib
import tempfile

from harness_env.eval import analytics, metrics, report
from harness_env.runner import Runner, RunnerConfig, plan
from harness_env.tasks import LIBRARY, discover, family
from research.capture import CaptureLog, RolloutResult, read_log


def task_dirs(spec: str, scratch: pathlib.Path) -> list[pathlib.Path]:
    if spec == "library":
        return discover(LIBRARY)
    if spec.startswith("family:"):
        _, split, *n = spec.split(":")
        return family.generate(scratch / "family_tasks", split, int(n[0]) if n else None)
    return discover(spec)


def build_engine(endpoint: str, tok, *, max_len: int = 4096):  # noqa: ANN001
    from research.serving.replay import ReplayEngine

    kind, _, arg = endpoint.partition(":")
    if kind == "oracle":
        return ReplayEngine(lambda req: family.oracle_reply(tok.decode(req.prompt_ids)), tok)
    if kind == "replay":
        import json

        return ReplayEngine(json.loads(pathlib.Path(arg).read_text()), tok, cycle=True)
    if kind == "jax":
        return _jax_engine(tok, arg, max_len)
    if kind == "sglang":
        from research.serving.sglang_client import SGLangClient

        return SGLangClient(arg)
    if kind == "openai":
        from harness_env.eval.remote_engine import OpenAICompletionsEngine

        return OpenAICompletionsEngine(arg)
    raise ValueError(f"endpoint {endpoint!r}: expected oracle | replay:FILE | jax | sglang:URL | openai:URL")


def _jax_engine(tok, checkpoint: str, max_len: int):  # noqa: ANN001
    """The embedded JAX engine: an HF checkpoint dir, or (no dir) a tiny random Qwen3-MoE for plumbing runs."""
    import jax

    from research.models import init_params, tiny_moe
    from research.serving.jax_engine import EngineConfig, JaxEngine
    from research.serving.qwen3_runner import Qwen3Runner

    if checkpoint:
        from research.models.hf_io import load_hf

        params, cfg = load_hf(checkpoint)
    else:
        cfg = tiny_moe(vocab_size=tok.vocab_size)
        params = init_params(cfg, jax.random.PRNGKey(0))
    return JaxEngine(Qwen3Runner(cfg), params, config=EngineConfig(max_len=max_len))


async def evaluate(*, tasks: list[pathlib.Path], harnesses: list[str], k: int, engine, tok, out: pathlib.Path,
                   cfg: RunnerConfig, threshold: float = 1.0) -> dict:
    """Runs (or resumes) the rollouts, then writes the report; returns the report's JSON document paths."""
    from research.shim.server import ShimServer

    out.mkdir(parents=True, exist_ok=True)
    capture = CaptureLog(out / "capture.jsonl")
    sock = pathlib.Path(tempfile.gettempdir()) / f"hrl-shim-{os.getpid()}.sock"  # AF_UNIX paths: <108 bytes
    server = ShimServer(engine, tok, capture, unix_socket=str(sock))
    await server.start()
    runner = Runner(cfg, server, capture_log=capture)
    try:
        await runner.run(plan(tasks, harnesses, k))
    finally:
        runner.close()
        await server.stop()
        capture.close()
        sock.unlink(missing_ok=True)
    results = [r for r in read_log(out / "results.jsonl") if isinstance(r, RolloutResult)]
    ks = [x for x in (1, 2, 4, 8, 16, 32) if x <= k] or [1]
    rows = metrics.table(results, ks, threshold)
    bs = analytics.behaviours(read_log(out / "capture.jsonl"), tok)
    behaviour = {h: analytics.aggregate([b for b in bs if b.harness == h]) for h in sorted({b.harness for b in bs})}
    paths = report.write_report(out, rows, ks, behaviour, {"harnesses": harnesses, "tasks": len(tasks)})
    return {"rows": rows, "behaviour": behaviour, "paths": paths}
