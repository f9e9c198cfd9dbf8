"""Serve the interception shim in open mode in front of an engine, for capturing a harness run by hand.

  python -m launch.shim --engine=replay --replay_file=completions.json --capture=/tmp/capture.jsonl
  python -m launch.shim --engine=sglang --sglang_url=http://gpu-host:30000 --port=8765
  python -m launch.shim --engine=jax --checkpoint=/path/to/hf_qwen3  # the built-in JAX engine
  python -m launch.shim --endpoint=openai:http://vllm-host:8000  # any engine spec of research/serving/factory.py

Then point a harness at it: OPENAI_BASE_URL=http://127.0.0.1:PORT/v1, ANTHROPIC_BASE_URL=http://127.0.0.1:PORT.
Every call lands in --capture (one JSON line per call, fsync'd).
"""

from __future__ import annotations

import asyncio
import json
import signal

from absl import app, flags, logging

from research.capture import CaptureLog
from research.models.tokenizer import load_tokenizer
from research.serving.api import Engine
from research.serving.factory import build_engine
from research.shim.server import ShimServer
from research.shim.session import ShimOptions

_ENGINE = flags.DEFINE_enum("engine", "replay", ["replay", "jax", "sglang"], "generation backend")
_TOKENIZER = flags.DEFINE_string("tokenizer", "", "tokenizer dir or hub name; '': the packaged Qwen3 tokenizer")
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
_ENDPOINT = flags.DEFINE_string("endpoint", None, "engine spec, instead of --engine: replay[:FILE] | jax[:HF_DIR] | "
                                "sglang:URL | openai:URL")
_SAMPLING = flags.DEFINE_string("sampling", None, 'JSON forced on every call, e.g. {"temperature": 1.0, "top_p": 1.0}')


def endpoint_spec() -> str:
    """The flags as one engine spec for research/serving/factory.py (--endpoint wins over --engine)."""
    if _ENDPOINT.value:
        return _ENDPOINT.value
    arg = {"replay": _REPLAY.value, "jax": _CKPT.value, "sglang": _SGLANG.value}[_ENGINE.value]
    return f"{_ENGINE.value}:{arg}" if arg else _ENGINE.value


async def _serve(tok, engine: Engine, spec: str) -> None:  # noqa: ANN001
    capture = CaptureLog(_CAPTURE.value)
    opts = ShimOptions(enable_thinking=_THINK.value, sampling_override=json.loads(_SAMPLING.value or "{}"),
                       vision=engine.image_processor)  # a vision-language policy takes the harness's images
    server = ShimServer(engine, tok, capture, enforce_sessions=_ENFORCE.value, host=_HOST.value, port=_PORT.value,
                        unix_socket=_UNIX.value, options=opts)
    await server.start()
    logging.info("shim (%s engine) on %s%s, capture -> %s", spec, server.url,
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
    spec = endpoint_spec()
    try:
        engine = build_engine(spec, tok, max_len=_MAX_LEN.value, num_slots=_SLOTS.value, max_context=_MAX_CTX.value)
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    asyncio.run(_serve(tok, engine, spec))


if __name__ == "__main__":
    app.run(main)
