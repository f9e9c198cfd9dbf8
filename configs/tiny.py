"""Tiny Qwen3 smoke config (MoE by default, or dense): seconds per step on CPU, same code path as 30B.

Used by the train-state tests and as the base of the CPU demo configs. `arg` picks the model:

  python -m launch.aot --config=configs/tiny.py          # tiny MoE (8 experts, top-2)
  python -m launch.aot --config=configs/tiny.py:dense    # tiny dense, tied embeddings

Every field can be overridden on the command line, e.g. `--config.model.num_layers=4`.
"""

import dataclasses

import ml_collections

from research.models.config import tiny_dense, tiny_moe
from research.train.optim import default_optim_config

_PRESETS = {"moe": tiny_moe, "dense": tiny_dense}


def get_config(arg: str = "moe") -> ml_collections.ConfigDict:
    if arg not in _PRESETS:
        raise ValueError(f"configs/tiny.py: arg {arg!r} not in {sorted(_PRESETS)}")
    config = ml_collections.ConfigDict()
    config.name = f"tiny_{arg}"
    config.seed = 0
    # All ModelConfig fields, so any of them can be overridden; fp32 compute keeps CPU tests exact.
    config.model = ml_collections.ConfigDict(dataclasses.asdict(_PRESETS[arg]()))
    # 8 fake CPU devices in tests; `-1` takes the remaining devices (1 on a plain CPU run).
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, expert=1, tensor=1))
    config.optim = default_optim_config()
    config.optim.update(learning_rate=1e-3, schedule="cosine", warmup_steps=2, total_steps=100, weight_decay=0.0)
    config.train = ml_collections.ConfigDict(
        dict(batch_rows=8, row_len=64, num_microbatches=1, logprob_chunk=128, steps=100)
    )
    config.checkpoint = ml_collections.ConfigDict(dict(every=10, keep=3))
    return config
