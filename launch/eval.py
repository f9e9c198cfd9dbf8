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
import pathlib

from absl import app, flags

from harness_env.eval.run import build_engine, evaluate, task_dirs
from harness_env.runner import RunnerConfig
from harness_env.sandbox import Limits

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


def main(argv):
    del argv
    from research.models.tokenizer import load_tokenizer

    out = pathlib.Path(_OUT.value)
    tok = load_tokenizer(_TOKENIZER.value)
    cfg = RunnerConfig(out_dir=out, backend=_BACKEND.value, concurrency=_CONC.value, timeout_s=_TIMEOUT.value,
                       limits=Limits(memory_mb=_MEMORY.value), max_turns=_MAX_TURNS.value)
    tasks = task_dirs(_TASKS.value, out)
    try:
        engine = build_engine(_ENDPOINT.value, tok, max_len=_MAX_LEN.value)
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    doc = asyncio.run(evaluate(tasks=tasks, harnesses=_HARNESS.value, k=_K.value, engine=engine, tok=tok, out=out,
                               cfg=cfg, threshold=_THRESHOLD.value))
    print(doc["paths"]["txt"].read_text())
    print("report: " + " ".join(str(p) for p in doc["paths"].values()))


if __name__ == "__main__":
    app.run(main)
