"""Evaluate harnesses on tasks: pass@1, pass@k, pass^k per harness and category, plus behaviour analytics.

  python -m launch.eval --tasks=library --harness=reference --k=4 --endpoint=oracle
  python -m launch.eval --tasks=family:heldout --harness=reference,claude_code --k=4 --endpoint=jax
  python -m launch.eval --tasks=/path/to/clawgym_tasks --harness=codex --k=2 --endpoint=sglang:http://gpu:30000

--tasks: a ClawGym task dir, `library` (ours), or `family:train|heldout|all[:N]` (the make_file family).
--endpoint: where the policy runs; the shim always sits in front (every call is captured):
  oracle            scripted replay engine that solves the make_file family (pipeline check),
  replay:FILE       replay engine cycling the completions in FILE (JSON list),
  jax[:CKPT]        the embedded JAX engine: an HF checkpoint dir, else a tiny random Qwen3-MoE,
  sglang:URL        a running SGLang server (token ids in and out),
  openai:URL        any OpenAI-compatible /v1/completions server that returns token ids (vLLM-style).
Writes OUT/results.jsonl, OUT/capture.jsonl, OUT/report.{txt,json,csv,png}; a re-run resumes.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import tempfile

from absl import app, flags

from harness_env.eval import analytics, metrics, report
from harness_env.runner import Runner, RunnerConfig, plan
from harness_env.sandbox import Limits
from harness_env.tasks import LIBRARY, discover, family
from research.capture import CaptureLog, RolloutResult, read_log

_DEFAULT_TOK = str(pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "qwen3")
_TASKS = flags.DEFINE_string("tasks", "library", "task dir | library | family:SPLIT[:N]")
_HARNESS = flags.DEFINE_list("harness", ["reference"], "comma-separated harness names")
_K = flags.DEFINE_integer("k", 4, "samples per task (pass@k for every k in 1, 2, 4, ... <= this)")
_ENDPOINT = flags.DEFINE_string("endpoint", "oracle", "oracle | replay:FILE | jax[:CKPT] | sglang:URL | openai:URL")
_OUT = flags.DEFINE_string("out", "/tmp/harness_rl_eval", "output dir (resumable)")
_BACKEND = flags.DEFINE_enum("backend", "bwrap", ["bwrap", "docker", "kubernetes"], "sandbox backend")
_CONC = flags.DEFINE_integer("concurrency", 8, "rollouts in flight")
_TIMEOUT = flags.DEFINE_float("timeout_s", 300.0, "per-rollout harness timeout")
_TOKENIZER = flags.DEFINE_string("tokenizer", _DEFAULT_TOK, "policy tokenizer dir")
_THRESHOLD = flags.DEFINE_float("threshold", 1.0, "reward counted as a success")
_MEMORY = flags.DEFINE_integer("memory_mb", 2048, "sandbox memory limit")
_MAX_TURNS = flags.DEFINE_integer("max_turns", 30, "agent turns (harnesses that take a limit)")
_MAX_LEN = flags.DEFINE_integer("max_len", 4096, "--endpoint=jax: longest prompt + completion per slot")


def task_dirs(spec: str, scratch: pathlib.Path) -> list[pathlib.Path]:
    if spec == "library":
        return discover(LIBRARY)
    if spec.startswith("family:"):
        _, split, *n = spec.split(":")
        return family.generate(scratch / "family_tasks", split, int(n[0]) if n else None)
    return discover(spec)


def build_engine(endpoint: str, tok):  # noqa: ANN001
    from research.serving.replay import ReplayEngine

    kind, _, arg = endpoint.partition(":")
    if kind == "oracle":
        return ReplayEngine(lambda req: family.oracle_reply(tok.decode(req.prompt_ids)), tok)
    if kind == "replay":
        import json

        return ReplayEngine(json.loads(pathlib.Path(arg).read_text()), tok, cycle=True)
    if kind == "jax":
        return _jax_engine(tok, arg)
    if kind == "sglang":
        from research.serving.sglang_client import SGLangClient

        return SGLangClient(arg)
    if kind == "openai":
        from harness_env.eval.remote_engine import OpenAICompletionsEngine

        return OpenAICompletionsEngine(arg)
    raise app.UsageError(f"--endpoint {endpoint!r}: expected oracle | replay:FILE | jax | sglang:URL | openai:URL")


def _jax_engine(tok, checkpoint: str):  # noqa: ANN001
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
    return JaxEngine(Qwen3Runner(cfg), params, config=EngineConfig(max_len=_MAX_LEN.value))


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


def main(argv):
    del argv
    from research.models.tokenizer import load_tokenizer

    out = pathlib.Path(_OUT.value)
    tok = load_tokenizer(_TOKENIZER.value)
    cfg = RunnerConfig(out_dir=out, backend=_BACKEND.value, concurrency=_CONC.value, timeout_s=_TIMEOUT.value,
                       limits=Limits(memory_mb=_MEMORY.value), max_turns=_MAX_TURNS.value)
    tasks = task_dirs(_TASKS.value, out)
    engine = build_engine(_ENDPOINT.value, tok)
    doc = asyncio.run(evaluate(tasks=tasks, harnesses=_HARNESS.value, k=_K.value, engine=engine, tok=tok, out=out,
                               cfg=cfg, threshold=_THRESHOLD.value))
    print(doc["paths"]["txt"].read_text())
    print("report: " + " ".join(str(p) for p in doc["paths"].values()))


if __name__ == "__main__":
    app.run(main)
