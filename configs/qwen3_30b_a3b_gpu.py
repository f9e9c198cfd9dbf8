"""RL of Qwen3-30B-A3B through Claude Code + OpenClaw on one (or more) 8x H100/H200 host(s), SGLang serving.

    python -m launch.train --config=configs/qwen3_30b_a3b_gpu.py --workdir=/runs/q30b \
        --config.init_checkpoint=/models/Qwen3-30B-A3B --config.tasks.train_dir=/data/clawgym/train \
        --config.tasks.eval_dir=/data/clawgym/heldout --config.sync.sglang_url=http://127.0.0.1:30000

Mesh and sharding rules are those of configs/qwen3_30b_a3b.py:gpu (experts split 8 ways); the policy is
served by an SGLang server started next to the trainer (research/serving/sglang_client.py) and
receives new weights from disk (HF safetensors, bf16) with `weight_version` after every step. Tree
GRPO with clip-higher and TIS, async rollouts with a staleness bound of 1 version, ~the ClawGym /
OpenForgeRL settings (8 samples per task, 300 steps). Multi-host: set distributed.enabled and the
coordinator (jax.distributed.initialize); rollouts may run on Kubernetes (rollout.backend=kubernetes).
Validated by tests/test_rl_configs.py (build, eval_shape, lower the RL step on fake devices).
"""

import ml_collections

from configs import demo_cpu, qwen3_30b_a3b

TARGET = "gpu"


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    del arg
    base = qwen3_30b_a3b.get_config(TARGET)
    config = demo_cpu.get_config()  # every loop field, then real-scale values
    for key in ("model", "mesh", "optim"):
        config[key] = base[key]
    config.name = f"qwen3_30b_a3b_rl_{TARGET}"
    config.init_checkpoint = ""  # HF checkpoint dir of Qwen/Qwen3-30B-A3B (required)
    config.algo = "grpo"
    config.train.update(steps=300, batch_rows=base.train.batch_rows, row_len=base.train.row_len,
                        logprob_chunk=base.train.logprob_chunk, loss_slots=4096, num_microbatches=1)
    config.train.batch_axes = ("data", "fsdp", "expert")
    config.rl.update(estimator="grpo", clip_low=0.2, clip_high=0.28, is_correction="tis", is_cap=2.0)
    config.tasks.update(source="dir", train_dir="", eval_dir="")
    config.rollout.update(mode="async", max_off_policy_steps=1, lookahead=1, harnesses="claude_code:1,openclaw:1",
                          groups_per_step=16, group_size=8, backend="docker", concurrency=128, timeout_s=1800,
                          max_turns=50, sandbox_cpus=2.0, sandbox_memory_mb=4096, max_new_tokens=8192,
                          enable_thinking=True, temperature=1.0, progress=True)
    config.sync.update(kind="sglang", sglang_url="http://127.0.0.1:30000", export_dtype="bfloat16")
    config.sft.update(steps=0)
    config.eval.update(every=20, num_tasks=64, at_start=True, after_sft=False)
    config.checkpoint.update(every=10, keep=3)
    return config
