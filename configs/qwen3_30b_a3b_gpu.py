"""RL of Qwen3-30B-A3B through Claude Code + OpenClaw on two 8x H200 hosts (16 GPUs), SGLang serving.

    python -m launch.train --config=configs/qwen3_30b_a3b_gpu.py --workdir=/runs/q30b \
        --config.init_checkpoint=/models/Qwen3-30B-A3B --config.tasks.train_dir=/data/clawgym/train \
        --config.tasks.eval_dir=/data/clawgym/heldout --config.sync.sglang_url=http://127.0.0.1:30000

Mesh (data=1, fsdp=2, expert=8) over 16 H200s, 16 rows of 16k tokens (one agent session per row: the serving
context; AOT: 92.7 GiB peak per GPU for tree GRPO with KL and routing replay; one 8-GPU host would have no
headroom at 16k rows, see configs/qwen3_30b_a3b.py); the policy is
served by an SGLang server started next to the trainer (research/serving/sglang_client.py) and
receives new weights from disk (HF safetensors, bf16) with `weight_version` after every step. Tree
GRPO with clip-higher and TIS, async rollouts with a staleness bound of 1 version, ~the ClawGym /
OpenForgeRL settings (8 samples per task, 300 steps). Multi-host: set distributed.enabled and the
coordinator (jax.distributed.initialize); rollouts may run on Kubernetes (rollout.backend=kubernetes).
Validated by tests/test_train_aot.py (lower + compile every step on fake devices, memory vs the target).
"""

import ml_collections

from configs import qwen3_30b_a3b


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    del arg
    config = qwen3_30b_a3b.rl_config("gpu", rollout_backend="docker")
    config.sync.update(kind="sglang", sglang_url="http://127.0.0.1:30000", export_dtype="bfloat16")
    return config
