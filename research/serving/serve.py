"""Build the JAX engine behind SGLang's native HTTP API (native_server.py): the library half of
`python -m launch.serve`.

`model` is a preset (tiny_moe, tiny_dense) or an HF Qwen3 directory (config.json + safetensors).
`/update_weights_from_disk` loads an HF directory (research.models.hf_io) or a flax msgpack file of
params with the served model's structure. The SGLang client (sglang_client.py) talks to this server
exactly as to real SGLang; CI tests it that way.
"""

from __future__ import annotations

import asyncio
import pathlib

import flax.serialization
import jax
from absl import logging

from research.models import ModelConfig, init_params, tiny_dense, tiny_moe
from research.serving.jax_engine import EngineConfig, JaxEngine
from research.serving.native_server import NativeServer
from research.serving.qwen3_runner import Qwen3Runner

PRESETS = {"tiny_moe": tiny_moe, "tiny_dense": tiny_dense}


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
        eos_token_ids = eos_token_ids or tok.stop_token_ids
    engine = JaxEngine(Qwen3Runner(cfg), params, config=engine_config)
    server = NativeServer(
        engine, model_path=model, load_weights=weight_loader(cfg, params), decode=decode,
        eos_token_ids=tuple(eos_token_ids), routing_shape=engine.runner.routing_shape,
    )
    return engine, server


async def serve(model: str, *, host: str, port: int, url_file: str | None = None, **build_kwargs) -> None:
    """Serve until cancelled; writes the base URL to `url_file` atomically once listening (for port 0)."""
    engine, server = build(model, **build_kwargs)
    url = await server.start(host, port)
    logging.info("serving %s at %s", model, url)
    if url_file:
        tmp = pathlib.Path(url_file + ".tmp")
        tmp.write_text(url)
        tmp.rename(url_file)  # atomic: a reader never sees a partial URL
    print(f"SERVING {url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
        await engine.close()
