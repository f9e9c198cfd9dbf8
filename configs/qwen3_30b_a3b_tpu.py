"""RL of Qwen3-30B-A3B through Claude Code + OpenClaw on a TPU v5p-64 slice (32 chips), JAX engine serving.

    python -m launch.train --config=configs/qwen3_30b_a3b_tpu.py --workdir=gs://bucket/runs/q30b \
        --config.init_checkpoint=/models/Qwen3-30B-A3B --config.tasks.train_dir=/data/clawgym/train \
        --config.tasks.eval_dir=/data/clawgym/heldout --config.distributed.enabled=True

Mesh fsdp=4 x expert=8 over 32 chips, 32 rows of 16k tokens (AOT: 72.6 GiB peak per chip for tree GRPO
with KL and routing replay; a v5p-32 slice does not fit 16k rows). One process per host
(jax.distributed.initialize); the policy is served in-process by the JAX engine, which takes new weights
in memory with a version after every step. Tree GRPO with clip-higher and TIS, async rollouts with a
staleness bound of 1 version, ~the ClawGym / OpenForgeRL settings (8 samples per task, 300 steps).
Rollouts may run on Kubernetes (rollout.backend=kubernetes). Validated by tests/test_train_aot.py
(lower + compile every step on fake devices, memory vs the target).
"""

import ml_collections

from configs import qwen3_30b_a3b


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    del arg
    config = qwen3_30b_a3b.rl_config("tpu", rollout_backend="kubernetes")
    config.sync.update(kind="jax")
    config.engine.update(num_slots=64, prefill_chunk=2048)  # max_len: the 32k context of rl_config
    config.distributed.update(enabled=True)
    return config
