"""Serve the interception shim in open mode in front of an engine, for capturing a harness run by hand.

  python -m launch.shim --engine=replay --replay_file=completions.json --capture=/tmp/capture.jsonl
  python -m launch.shim --engine=sglang --sglang_url=http://gpu-host:30000 --port=8765
  python -m launch.shim --engine=jax --checkpoint=/path/to/hf_qwen3  # the built-in JAX engine

Then point a harness at it: OPENAI_BASE_URL=http://127.0.0.1:PORT/v1, ANTHROPIC_BASE_URL=http://127.0.0.1:PORT.
Every call lands in --capture (one JSON line per call, fsync'd).
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import signal

from absl import app, flags, logging

from research.capture import CaptureLog
from research.models.tokenizer import load_tokenizer
from research.serving.api import Engine
from research.shim.server import ShimServer
from research.shim.session import ShimOptions

_DEFAULT_TOK = str(pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "qwen3")
_ENGINE = flags.DEFINE_enum("engine", "replay", ["replay", "jax", "sglang"], "generation backend")
_TOKENIZER = flags.DEFINE_string("tokenizer", _DEFAULT_TOK, "tokenizer dir or hub name")
_CAPTURE = flags.DEFINE_string("capture", "/tmp/harness_rl_capture.jsonl", "capture log (JSONL)")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "TCP host")
_PORT = flags.DEFINE_integer("port", 8765, "TCP port (0: any)")
_UNIX = flags.DEFINE_string("unix_socket", None, "also serve on this Unix socket")
_ENFORCE = flags.DEFINE_bool("enforce_sessions", False, "require /s/{session} URLs + keys (default: open mode)")
_THINK = flags.DEFINE_bool("enable_thinking", True, "Qwen3 thinking mode unless a request turns it off")
_REPLAY = flags.DEFINE_string("replay_file", None, "JSON list of completions (strings or id lists), cycled")
_SGLANG = flags.DEFINE_string("sglang_url", None, "base URL of a running SGLang server")
_MAX_CTX = flags.DEFINE_integer("max_context", None, "context length of the remote engine")
_CKPT = flags.DEFINE_string("checkpoint", None, "--engine=jax: HF checkpoint dir (default: tiny random MoE)")
_SLOTS = flags.DEFINE_integer("slots", 8, "--engine=jax: concurrent sequences")
_MAX_LEN = flags.DEFINE_integer("max_len", 4096, "--engine=jax: prompt + completion tokens per sequence")
_SAMPLING = flags.DEFINE_string("sampling", None, 'JSON forced on every call, e.g. {"temperature": 1.0, "top_p": 1.0}')


def _replay(tok) -> Engine:  # noqa: ANN001
    from research.serving.replay import ReplayEngine

    script = json.loads(pathlib.Path(_REPLAY.value).read_text()) if _REPLAY.value else ["(replay engine) ok"]
    if not isinstance(script, list) or not script:
        raise app.UsageError(f"--replay_file {_REPLAY.value}: expected a non-empty JSON list of completions")
    return ReplayEngine(script, tok, cycle=True)


def _sglang(tok) -> Engine:  # noqa: ANN001
    if not _SGLANG.value:
        raise app.UsageError("--engine=sglang needs --sglang_url")
    from research.serving.sglang_client import SGLangClient

    return SGLangClient(_SGLANG.value, max_context=_MAX_CTX.value)


def _jax(tok) -> Engine:  # noqa: ANN001
    """The built-in JAX engine: an HF checkpoint (--checkpoint) or a tiny random Qwen3-MoE (plumbing runs)."""
    import jax

    from research.models import init_params, tiny_moe
    from research.models.hf_io import load_hf
    from research.serving.jax_engine import EngineConfig, JaxEngine
    from research.serving.qwen3_runner import Qwen3Runner

    if _CKPT.value:
        params, cfg = load_hf(_CKPT.value)
    else:
        cfg = tiny_moe(vocab_size=tok.vocab_size)
        params = init_params(cfg, jax.random.PRNGKey(0))
    if cfg.vocab_size < tok.vocab_size:
        raise app.UsageError(f"model vocab {cfg.vocab_size} < tokenizer vocab {tok.vocab_size}")
    return JaxEngine(Qwen3Runner(cfg), params, config=EngineConfig(num_slots=_SLOTS.value, max_len=_MAX_LEN.value))


ENGINES = {"replay": _replay, "sglang": _sglang, "jax": _jax}


async def _serve(tok, engine: Engine) -> None:  # noqa: ANN001
    capture = CaptureLog(_CAPTURE.value)
    opts = ShimOptions(enable_thinking=_THINK.value, sampling_override=json.loads(_SAMPLING.value or "{}"))
    server = ShimServer(engine, tok, capture, enforce_sessions=_ENFORCE.value, host=_HOST.value, port=_PORT.value,
                        unix_socket=_UNIX.value, options=opts)
    await server.start()
    logging.info("shim (%s engine) on %s%s, capture -> %s", _ENGINE.value, server.url,
                 f" and unix:{_UNIX.value}" if _UNIX.value else "", _CAPTURE.value)
    print(f"SHIM_URL {server.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()
    await engine.close()
    capture.close()


def main(argv):
    del argv
    tok = load_tokenizer(_TOKENIZER.value)
    asyncio.run(_serve(tok, ENGINES[_ENGINE.value](tok)))


if __name__ == "__main__":
    app.run(main)
