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
import pathlib

import flax.serialization
import jax
from absl import app, flags, logging

from research.models import ModelConfig, init_params, tiny_dense, tiny_moe
from research.serving.jax_engine import EngineConfig, JaxEngine
from research.serving.native_server import NativeServer
from research.serving.qwen3_runner import Qwen3Runner

PRESETS = {"tiny_moe": tiny_moe, "tiny_dense": tiny_dense}

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


def model_and_params(model: str, *, vocab_size: int | None = None, seed: int = 0, dtype: str | None = None):
    """(cfg, params) for a preset (random init) or an HF directory."""
    over = {"dtype": dtype} if dtype else {}
    if model in PRESETS:
        cfg = PRESETS[model](**over, **({"vocab_size": vocab_size} if vocab_size else {}))
        return cfg, jax.jit(lambda k: init_params(cfg, k))(jax.random.PRNGKey(seed))
    from research.models.hf_io import load_hf

    cfg = ModelConfig.from_hf_config(pathlib.Path(model) / "config.json", **over)
    params, cfg = load_hf(model, cfg)
    return cfg, params


def weight_loader(cfg: ModelConfig, template):
    """model_path -> params with `template`'s structure (so the engine swaps without recompiling)."""

    def load(path: str):
        p = pathlib.Path(path)
        if p.is_dir():
            from research.models.hf_io import load_hf

            params, _ = load_hf(p, cfg)
        elif p.suffix == ".msgpack":
            params = flax.serialization.from_bytes(template, p.read_bytes())
        else:
            raise FileNotFoundError(f"{path}: expected an HF directory or a .msgpack params file")
        bad = jax.tree.map(lambda a, b: a.shape != b.shape or a.dtype != b.dtype, params, template)
        if any(jax.tree.leaves(bad)):
            raise ValueError(f"{path}: parameter shapes/dtypes differ from the served model")
        return params

    return load


def build(
    model: str = "tiny_moe",
    *,
    engine_config: EngineConfig = EngineConfig(),
    vocab_size: int | None = None,
    seed: int = 0,
    dtype: str | None = None,
    eos_token_ids: tuple[int, ...] = (),
    tokenizer: str | None = None,
) -> tuple[JaxEngine, NativeServer]:
    """The engine and its SGLang-native server (not started): `await server.start(host, port)`."""
    cfg, params = model_and_params(model, vocab_size=vocab_size, seed=seed, dtype=dtype)
    decode = None
    if tokenizer:
        from research.models.tokenizer import load_tokenizer

        tok = load_tokenizer(tokenizer)
        decode = tok.decode
        eos_token_ids = eos_token_ids or tok.stop_token_ids()
    engine = JaxEngine(Qwen3Runner(cfg), params, config=engine_config)
    server = NativeServer(
        engine, model_path=model, load_weights=weight_loader(cfg, params), decode=decode,
        eos_token_ids=tuple(eos_token_ids), routing_shape=engine.runner.routing_shape,
    )
    return engine, server


async def _serve() -> None:
    engine, server = build(
        _MODEL.value,
        engine_config=EngineConfig(num_slots=_SLOTS.value, max_len=_MAX_LEN.value, prefill_chunk=_CHUNK.value,
                                   on_update=_ON_UPDATE.value),
        vocab_size=_VOCAB.value, seed=_SEED.value, dtype=_DTYPE.value,
        eos_token_ids=tuple(int(t) for t in _EOS.value), tokenizer=_TOKENIZER.value,
    )
    url = await server.start(_HOST.value, _PORT.value)
    logging.info("serving %s at %s", _MODEL.value, url)
    if _URL_FILE.value:
        tmp = pathlib.Path(_URL_FILE.value + ".tmp")
        tmp.write_text(url)
        tmp.rename(_URL_FILE.value)  # atomic: a reader never sees a partial URL
    print(f"SERVING {url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
        await engine.close()


def main(argv):
    del argv
    asyncio.run(_serve())


if __name__ == "__main__":
    app.run(main)
