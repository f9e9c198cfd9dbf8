"""RL of Qwen3-30B-A3B through Claude Code + OpenClaw on a TPU v5p-32 slice, JAX engine serving.

    python -m launch.train --config=configs/qwen3_30b_a3b_tpu.py --workdir=gs://bucket/runs/q30b \
        --config.init_checkpoint=/models/Qwen3-30B-A3B --config.tasks.train_dir=/data/clawgym/train \
        --config.tasks.eval_dir=/data/clawgym/heldout --config.distributed.enabled=True

Mesh and sharding rules are those of configs/qwen3_30b_a3b.py:tpu (fsdp=2 x expert=8 over 16 chips,
one process per host: jax.distributed.initialize); the policy is served in-process by the JAX engine
(research/serving/jax_engine.py), which takes new weights in memory with a version after every step. Tree
GRPO with clip-higher and TIS, async rollouts with a staleness bound of 1 version, ~the ClawGym /
OpenForgeRL settings (8 samples per task, 300 steps). Multi-host: set distributed.enabled and the
coordinator (jax.distributed.initialize); rollouts may run on Kubernetes (rollout.backend=kubernetes).
Validated by tests/test_rl_configs.py (build, eval_shape, lower the RL step on fake devices).
"""

import ml_collections

from configs import demo_cpu, qwen3_30b_a3b

TARGET = "tpu"


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
                          groups_per_step=16, group_size=8, backend="kubernetes", concurrency=128, timeout_s=1800,
                          max_turns=50, sandbox_cpus=2.0, sandbox_memory_mb=4096, max_new_tokens=8192,
                          enable_thinking=True, temperature=1.0, progress=True)
    config.sync.update(kind="jax")
    config.engine.update(num_slots=64, max_len=65536, prefill_chunk=2048)
    config.distributed.update(enabled=True)
    config.sft.update(steps=0)
    config.eval.update(every=20, num_tasks=64, at_start=True, after_sft=False)
    config.checkpoint.update(every=10, keep=3)
    return config
