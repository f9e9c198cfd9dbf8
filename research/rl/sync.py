"""Weight sync: push the learner's params to the serving engine with a version number.

A small registry: "jax" swaps params in-process (the JAX engine drains in-flight calls first, so no
call mixes versions); "sglang" exports HF safetensors to a versioned directory and asks the server to
`/update_weights_from_disk` with that `weight_version` (the SGLang client pauses around it).
"""

from __future__ import annotations

import json
import pathlib
import shutil

import jax

from research.models import qwen3_vl
from research.models.hf_io import save_hf


async def sync_jax(engine, learner, version: int, workdir: pathlib.Path) -> None:  # noqa: ANN001
    del workdir
    await engine.update_weights(learner.params_copy(), version)


async def sync_sglang(engine, learner, version: int, workdir: pathlib.Path) -> None:  # noqa: ANN001
    root = workdir / "hf_weights"
    path = root / f"v{version:06d}"
    params, run = jax.device_get(learner.state.params), learner.run
    if run.vision is None:
        save_hf(params, learner.model_cfg, path, dtype=run.sync.export_dtype)
    else:  # a Qwen3-VL dir the server loads as its checkpoint (both towers)
        qwen3_vl.save_hf(params, learner.model_cfg, run.vision, run.image_pad_id, path, dtype=run.sync.export_dtype)
        (path / "preprocessor_config.json").write_text(json.dumps(run.processor().to_hf(), indent=1))
    await engine.pause()
    try:
        await engine.update_weights_from_disk(str(path), version)
    finally:
        await engine.resume()
    for old in sorted(root.glob("v*"))[:-2]:  # keep the two newest exports
        shutil.rmtree(old, ignore_errors=True)


SYNCS = {"jax": sync_jax, "sglang": sync_sglang}


def get_sync(name: str):
    try:
        return SYNCS[name]
    except KeyError:
        raise ValueError(f"config.sync.kind={name!r}; known: {sorted(SYNCS)}") from None
