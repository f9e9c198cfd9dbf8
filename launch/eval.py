"""Evaluate harnesses on tasks: pass@1, pass@k, pass^k per harness and category, plus behaviour analytics.

  python -m launch.eval --tasks=library --harness=reference --k=4 --endpoint=oracle
  python -m launch.eval --tasks=family:heldout --harness=reference,claude_code --k=4 --endpoint=jax
  python -m launch.eval --tasks=/path/to/clawgym_tasks --harness=codex --k=2 --endpoint=sglang:http://gpu:30000
  python -m launch.eval --tasks=../shared/clawgym/train --limit=20 --seed=1 --harness=openclaw --endpoint=jax
  python -m launch.eval --tasks=web:heldout --harness=claude_code,codex,browser_use --k=2 --endpoint=oracle
  python -m launch.eval --tasks=DIR --harness=codex,claude_code,reference --k=1 --policies=sft=W1,codex=W2,mix=W3

--tasks: a ClawGym task dir, `library` (ours), `family:train|heldout|all[:N]` (the make_file family), or
  `web:train|heldout|all[:N]` (the web task family: a browser harness, a web app per task);
  --split keeps the seeded train/held-out part of a dir (the RL loop's split, same seed and fraction),
  --limit draws a seeded random sample of that many tasks.
--endpoint: where the policy runs; the shim always sits in front (every call is captured):
  oracle            scripted replay engine that solves the make_file family (pipeline check),
  replay:FILE       replay engine cycling the completions in FILE (JSON list),
  jax[:CKPT]        the embedded JAX engine: an HF checkpoint dir, else a tiny random Qwen3-MoE,
  sglang:URL        a running SGLang server (token ids in and out),
  openai:URL        any OpenAI-compatible /v1/completions server that returns token ids (vLLM-style).
Writes OUT/results.jsonl, OUT/capture.jsonl, OUT/report.{txt,json,csv,png}; a re-run resumes.
--inspect_log=FILE.eval (or a dir): also an Inspect AI eval log, for `inspect view` (pip install harness-rl[inspect];
  an existing OUT: python -m harness_env.eval.inspect_log --results=OUT --out=FILE.eval).
"""

from __future__ import annotations

import asyncio
import pathlib

from absl import app, flags

from harness_env.eval.run import build_engine, evaluate, task_dirs
from harness_env.harnesses.base import check_context, context_for
from harness_env.runner import RunnerConfig
from harness_env.sandbox import Limits
from research.rl.console import quiet_libraries

_TASKS = flags.DEFINE_string("tasks", "library", "task dir | library | family:SPLIT[:N] | web:SPLIT[:N]")
_SPLIT = flags.DEFINE_enum("split", None, ["all", "train", "heldout"], "part of the seeded train/held-out split")
_LIMIT = flags.DEFINE_integer("limit", None, "evaluate a seeded random sample of this many tasks")
_SEED = flags.DEFINE_integer("seed", 0, "seed of the task sample and of the train/held-out split")
_HELDOUT = flags.DEFINE_float("heldout_fraction", 0.1, "held-out share of a task dir (with --split)")
_HARNESS = flags.DEFINE_list("harness", ["reference"], "comma-separated harness names")
_K = flags.DEFINE_integer("k", 4, "samples per task (pass@k for every k in 1, 2, 4, ... <= this)")
_ENDPOINT = flags.DEFINE_string("endpoint", "oracle", "oracle | replay:FILE | jax[:CKPT] | sglang:URL | openai:URL")
_OUT = flags.DEFINE_string("out", "/tmp/harness_rl_eval", "output dir (resumable)")
_BACKEND = flags.DEFINE_enum("backend", "bwrap", ["bwrap", "docker", "kubernetes"], "sandbox backend")
_CONC = flags.DEFINE_integer("concurrency", 8, "rollouts in flight")
_TIMEOUT = flags.DEFINE_float("timeout_s", 300.0, "per-rollout harness timeout")
_TOKENIZER = flags.DEFINE_string("tokenizer", "", "policy tokenizer dir or hub id; '': the packaged Qwen3 tokenizer")
_THRESHOLD = flags.DEFINE_float("threshold", 1.0, "reward counted as a success")
_MEMORY = flags.DEFINE_integer("memory_mb", 2048, "sandbox memory limit")
_WS_MB = flags.DEFINE_integer("workspace_mb", 1024, "workspace disk cap in MiB (0: uncapped); over it: disk_limit")
_HOME_MB = flags.DEFINE_integer("home_mb", 512, "HOME disk cap in MiB (0: uncapped); over it: disk_limit")
_MAX_TURNS = flags.DEFINE_integer("max_turns", 30, "agent turns (harnesses that take a limit)")
_POLICIES = flags.DEFINE_list("policies", [], "NAME=WORKDIR,...: the transfer matrix instead of "
                               "--endpoint: each launch.train run's latest checkpoint under every --harness")
_MAX_LEN = flags.DEFINE_integer("max_len", 0, "--endpoint=jax: longest prompt + completion per slot (0: sized "
                                "to the harnesses' first requests, harnesses.base.context_for)")
_INSPECT = flags.DEFINE_string("inspect_log", None, "also write the run as an Inspect AI log: a .eval/.json file "
                               "or a dir (harness_env/eval/inspect_log.py; not with --policies)")


def main(argv):
    del argv
    quiet_libraries(verbose=flags.FLAGS["verbosity"].present > 0)  # jax, orbax etc. INFO only with --verbosity
    from research.models.tokenizer import load_tokenizer

    out = pathlib.Path(_OUT.value)
    tok = load_tokenizer(_TOKENIZER.value)
    limits = Limits(memory_mb=_MEMORY.value, workspace_mb=_WS_MB.value or None, home_mb=_HOME_MB.value or None)
    cfg = RunnerConfig(out_dir=out, backend=_BACKEND.value, concurrency=_CONC.value, timeout_s=_TIMEOUT.value,
                       limits=limits, max_turns=_MAX_TURNS.value, progress_label="eval")
    try:
        tasks = task_dirs(_TASKS.value, out, split=_SPLIT.value, limit=_LIMIT.value, seed=_SEED.value,
                          heldout_fraction=_HELDOUT.value)
    except ValueError as e:  # TaskError: unknown split, no such dir
        raise app.UsageError(str(e)) from e
    if _POLICIES.value:
        if _INSPECT.value:
            raise app.UsageError("--inspect_log exports one run: not with --policies")
        print(_matrix(tasks, tok, out, cfg))
        return
    try:
        max_len = _MAX_LEN.value or context_for(_HARNESS.value)
        check_context(_HARNESS.value, max_len)
        engine = build_engine(_ENDPOINT.value, tok, max_len=max_len, tasks=tasks)
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    doc = asyncio.run(evaluate(tasks=tasks, harnesses=_HARNESS.value, k=_K.value, engine=engine, tok=tok, out=out,
                               cfg=cfg, threshold=_THRESHOLD.value, close_engine=True,
                               inspect_log=pathlib.Path(_INSPECT.value) if _INSPECT.value else None))
    print(doc["paths"]["txt"].read_text())
    print("report: " + " ".join(str(p) for p in doc["paths"].values()))



def _matrix(tasks, tok, out: pathlib.Path, cfg: RunnerConfig) -> str:  # noqa: ANN001
    from harness_env.eval.policies import to_markdown, transfer_matrix

    policies = {}
    for item in _POLICIES.value:
        name, sep, workdir = item.partition("=")
        if not sep or not name or not pathlib.Path(workdir, "config.json").exists():
            raise app.UsageError(f"--policies item {item!r}: expected NAME=WORKDIR of a launch.train run")
        policies[name] = pathlib.Path(workdir)
    matrix = asyncio.run(transfer_matrix(policies, _HARNESS.value, tasks=tasks, k=_K.value, tok=tok, out=out,
                                         cfg=cfg))
    return to_markdown(matrix) + f"matrix: {out / 'matrix.json'} {out / 'matrix.md'}"


if __name__ == "__main__":
    app.run(main)
