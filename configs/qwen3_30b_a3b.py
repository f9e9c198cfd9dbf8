"""Qwen3-30B-A3B (48 layers, 128 experts top-8, 30.5B total / 3.35B active parameters) at real scale.

The dims are written here (not read from a file) so the config is self-contained; tests cross-check
them against `../shared/qwen3/config.json` (the HF config of Qwen/Qwen3-30B-A3B).

Targets (`arg`), both validated by AOT-compiling the train steps on fake CPU devices against the
target's device memory (`config.device`; tests/test_train_aot.py; measured per-device numbers in brackets):

  gpu  one 8x H200 host (141 GB each): mesh (data=1, fsdp=1, expert=8, tensor=1). Experts (95% of the
       params) are split 8 ways by expert parallelism (16 experts per GPU, tokens exchanged inside the
       MoE block); attention/embeddings (1.54B) are replicated. Rows: 8 x 8192 tokens per step.
       [params + Adam state 57.7 GiB/GPU; + fp32 grads ~19 GiB; activations with full remat are small.]
       8x H100 (80 GB) does NOT fit this way: use two hosts with the `tpu` mesh shape (16 devices) or
       `--config.optim.mu_dtype=bfloat16`.
  tpu  TPU v5p-32 slice (16 chips, 95 GB HBM each): mesh (data=1, fsdp=2, expert=8, tensor=1); every
       matrix is also FSDP-sharded over 2, experts over expert x fsdp = 16. Rows: 16 x 8192 tokens.
       [params + Adam state 28.9 GiB/chip.]

fp32 master weights and Adam moments (12 bytes/param; 16 with fp32 grads: 488 GB for 30.5B before
activations), bf16 compute, full remat per layer, chunked fused-head log-probs. XLA's compiled
`memory_analysis()` per device (args/temps/peak + the largest arrays) is printed by (this file: the SFT
step on tree rows; the RL configs' tree-GRPO/PPO and SFT steps: configs/qwen3_30b_a3b_{gpu,tpu}.py):

  python -m launch.aot --config=configs/qwen3_30b_a3b.py:gpu --step=sft --fake_devices=8
  python -m launch.aot --config=configs/qwen3_30b_a3b_tpu.py --step=grpo,ppo,sft --kl --replay --fake_devices=16

On XLA:CPU the temps are dominated by CPU lowerings of the grouped expert matmul (ragged_dot becomes
per-expert dense [experts, assignments, D] arrays), so only the state numbers transfer to GPU/TPU.

(The RL launcher `python -m launch.train --config=configs/qwen3_30b_a3b_gpu.py` builds on this file.)
"""

import ml_collections

from research.models.config import DEFAULT_RULES
from research.train.optim import default_optim_config

# Qwen/Qwen3-30B-A3B config.json, verbatim values.
QWEN3_30B_A3B = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    num_layers=48,
    num_heads=32,
    num_kv_heads=4,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    tie_word_embeddings=False,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    norm_topk_prob=True,
    mlp_only_layers=(),
    decoder_sparse_step=1,
)

_MESHES = {
    "gpu": dict(data=1, fsdp=1, expert=8, tensor=1),
    "tpu": dict(data=1, fsdp=2, expert=8, tensor=1),
}
_ROWS = {"gpu": 8, "tpu": 16}
# The RL configs: a packed row holds a whole rollout path (an agent session up to the serving context), and the
# four real harnesses' prompts fit 16k (tests/test_harness_e2e.py). With 16k rows one 8x H200 host has no
# headroom (AOT peak 130.9 of 131.3 GiB) and a v5p-32 slice does not fit (92.7 of 88.5 GiB): the expert
# dispatch all-gathers every token of the expert group. So the RL targets are twice as large (measured, GRPO
# with KL + routing replay, 48 layers): 2 hosts x 8 H200 (fsdp=2, 92.7 GiB) and a v5p-64 slice (fsdp=4, 72.6).
CONTEXT = 16384
_RL_MESHES = {"gpu": dict(data=1, fsdp=2, expert=8, tensor=1), "tpu": dict(data=1, fsdp=4, expert=8, tensor=1)}
_RL_ROWS = {"gpu": 16, "tpu": 32}
# Per-device memory of each target (vendor figures, decimal GB): what research/train/aot.py checks a step against.
_DEVICES = {"gpu": dict(kind="H200", memory_gb=141.0), "tpu": dict(kind="TPU v5p", memory_gb=95.0)}


def get_config(arg: str = "gpu") -> ml_collections.ConfigDict:
    if arg not in _MESHES:
        raise ValueError(f"configs/qwen3_30b_a3b.py: arg {arg!r} not in {sorted(_MESHES)}")
    config = ml_collections.ConfigDict()
    config.name = f"qwen3_30b_a3b_{arg}"
    config.seed = 0
    config.model = ml_collections.ConfigDict(
        dict(
            **QWEN3_30B_A3B,
            dtype="bfloat16",
            param_dtype="float32",
            attention_impl="auto",
            moe_impl="ragged",
            expert_parallel=True,
            remat_policy="full",
            scan_layers=True,
            logical_rules=DEFAULT_RULES,
        )
    )
    config.mesh = ml_collections.ConfigDict(_MESHES[arg])
    config.device = ml_collections.ConfigDict(_DEVICES[arg])
    config.optim = default_optim_config()
    # ~ the RL settings of ClawGym / DAPO-style runs: small constant lr after a short warmup, clip 1.0.
    config.optim.update(learning_rate=1e-6, schedule="constant", warmup_steps=10, total_steps=400,
                        weight_decay=0.01, clip_norm=1.0)
    config.train = ml_collections.ConfigDict(
        dict(batch_rows=_ROWS[arg], row_len=8192, num_microbatches=1, logprob_chunk=2048, steps=400,
             batch_axes=("data", "fsdp", "expert"))
    )
    config.checkpoint = ml_collections.ConfigDict(dict(every=10, keep=3))
    return config


def rl_config(target: str, *, rollout_backend: str) -> ml_collections.ConfigDict:
    """The real-scale RL run shared by configs/qwen3_30b_a3b_{gpu,tpu}.py: every loop field of the CPU
    demo, then this file's model/mesh/optimizer for `target` and ClawGym/OpenForgeRL-like RL settings."""
    from configs import demo_cpu  # the loop's full field set; imported here to keep this file light

    base = get_config(target)
    config = demo_cpu.get_config()
    for key in ("model", "device", "optim"):
        config[key] = base[key]
    config.mesh = ml_collections.ConfigDict(_RL_MESHES[target])
    config.name = f"qwen3_30b_a3b_rl_{target}"
    config.init_checkpoint = ""  # HF checkpoint dir of Qwen/Qwen3-30B-A3B (required)
    config.algo = "grpo"
    # one row of CONTEXT tokens per device; engine.max_len = the serving context (SGLang: --context-length)
    config.train.update(steps=300, batch_rows=_RL_ROWS[target], row_len=CONTEXT,
                        logprob_chunk=base.train.logprob_chunk, loss_slots=4096, num_microbatches=1,
                        epochs=1, minibatches=1)  # one row per device: a batch is one optimizer step
    config.engine.update(max_len=CONTEXT)
    config.train.batch_axes = ("data", "fsdp", "expert")
    config.rl.update(estimator="grpo", clip_low=0.2, clip_high=0.28, is_correction="tis", is_cap=2.0,
                     kl_coef=0.0, kl_estimator="k3", ref_checkpoint="",  # ref "": the init_checkpoint params
                     filter_groups=True)
    config.tasks.update(source="dir", train_dir="", eval_dir="", validate=True)
    config.rollout.update(mode="async", max_off_policy_steps=1, lookahead=1, harnesses="claude_code:1,openclaw:1",
                          groups_per_step=16, group_size=8, backend=rollout_backend, concurrency=128,
                          timeout_s=1800, max_turns=50, sandbox_cpus=2.0, sandbox_memory_mb=4096,
                          max_new_tokens=8192, enable_thinking=True, temperature=1.0, progress=True,
                          max_extra_rounds=0)
    config.sft.update(steps=0)
    config.eval.update(every=20, sft_every=0, num_tasks=64, at_start=True, after_sft=False)
    config.checkpoint.update(every=10, keep=3)
    return config
