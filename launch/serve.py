"""Serve the JAX engine behind SGLang's native HTTP API (research/serving/native_server.py).

    python -m launch.serve --model=tiny_moe --port=30000                   # random-init tiny preset
    python -m launch.serve --model=/ckpt/qwen3-hf --max_len=32768 --num_slots=16 --tokenizer=/work/shared/qwen3
    python -m launch.serve --model=tiny_moe --vocab_size=151936 --port=0 --url_file=/tmp/url   # free port

`--model` is a preset (tiny_moe, tiny_dense) or an HF Qwen3 directory (config.json + safetensors).
`/update_weights_from_disk` loads an HF directory (research.models.hf_io) or a flax msgpack file of
params with the served model's structure. The SGLang client (research/serving/sglang_client.py) talks
to this server exactly as to real SGLang; CI tests it that way.
"""

from __future__ import annotations

import asyncio

from absl import app, flags

from research.serving.jax_engine import EngineConfig
from research.serving.serve import PRESETS, serve

_MODEL = flags.DEFINE_string("model", "tiny_moe", f"preset {sorted(PRESETS)} or an HF Qwen3 directory")
_VOCAB = flags.DEFINE_integer("vocab_size", None, "presets only: override the vocabulary (151936 = Qwen3's)")
_SEED = flags.DEFINE_integer("init_seed", 0, "presets only: parameter init seed")
_DTYPE = flags.DEFINE_string("dtype", None, "compute dtype override (float32 | bfloat16)")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "bind address")
_PORT = flags.DEFINE_integer("port", 30000, "port (0 = any free port)")
_URL_FILE = flags.DEFINE_string("url_file", None, "write the base URL here once serving (for --port=0)")
_SLOTS = flags.DEFINE_integer("num_slots", 8, "concurrent sequences (KV-cache slots)")
_MAX_LEN = flags.DEFINE_integer("max_len", 4096, "context length per slot")
_CHUNK = flags.DEFINE_integer("prefill_chunk", 256, "prefill chunk length")
_ON_UPDATE = flags.DEFINE_enum("on_update", "drain", ["drain", "abort"], "in-flight requests on a weight update")
_EOS = flags.DEFINE_list("eos_token_ids", [], "ids that end generation unless ignore_eos (default: tokenizer's)")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "tokenizer dir: fills `text` fields and the default eos ids")


def main(argv):
    del argv
    engine_config = EngineConfig(num_slots=_SLOTS.value, max_len=_MAX_LEN.value, prefill_chunk=_CHUNK.value,
                                 on_update=_ON_UPDATE.value)
    asyncio.run(serve(
        _MODEL.value, host=_HOST.value, port=_PORT.value, url_file=_URL_FILE.value, engine_config=engine_config,
        vocab_size=_VOCAB.value, seed=_SEED.value, dtype=_DTYPE.value,
        eos_token_ids=tuple(int(t) for t in _EOS.value), tokenizer=_TOKENIZER.value,
    ))


if __name__ == "__main__":
    app.run(main)
