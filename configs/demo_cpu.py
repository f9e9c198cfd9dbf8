"""The CPU demo where RL does the work: tiny dense Qwen3 (real Qwen3 tokenizer), JAX engine, bwrap, the
reference agent (`reference_bash`: bash tool only, ~180-token prompts), the make_file family.

1. SFT on *unverified* demonstrations of an imperfect expert, captured through the harness
   (`make_file_cut`): on ~60% of the tasks it runs `echo the word WORD > NAME` (the file holds the phrase;
   the checker gives 0.3), on the rest `echo the word WORD | cut -d' ' -f3 > NAME` (right). The policy
   learns both, and its greedy answer follows the majority: held-out 0.19-0.42 after 300 SFT steps.
2. Tree GRPO with the verifier lifts it past what the demonstrations teach: 0.92 after 5 steps, 0.94 after 10.

    python -m launch.train --config=configs/demo_cpu.py --workdir=/tmp/demo
    python -m launch.train --config=configs/demo_cpu.py:control --workdir=/tmp/control   # same minutes on SFT
    python -m launch.train --config=configs/demo_cpu.py:long --workdir=/tmp/long         # 2x the RL steps
    python -m launch.plot --workdirs=/tmp/demo,/tmp/control --out=/tmp/demo_vs_control.png
    python -m launch.sweep --config=configs/demo_cpu.py --seeds=0,1,2,3,4 --workdir=/tmp/sweep  # the README table

Why 600 SFT steps (docs/experiments/2026-12-03-demo-seeds.md): the file-name copy forms late in SFT and at a
seed-dependent step (held-out names right, seed 0: 3/36, 4/36, 18/36, 34/36 at SFT 100 / 200 / 300 / 500),
and latest after the right form's `| cut`. RL started at SFT 300 from a policy whose `| cut` samples at T=1
wrote the right name 21% of the time (its `>` samples 69%): `| cut` then earned about what `>` did (0.22 vs
0.21), GRPO had no signal on the form and drifted to the majority `>` (held-out 0.25 -> 0.08). From SFT 500 of
the same seed (`| cut` right names 82%, `>` 94%) the same RL went 0.25 -> 0.94 in 5 steps.

What makes a 2-layer model trained from scratch learn to copy NAME/WORD from the prompt within minutes:
an embedding init std of 0.2 (at 0.02 Adam's common-mode drift makes the 16 words' embeddings collide and
the policy stays at the marginal, ln 16), 16 demonstrations per SFT step, and an expert whose every
demonstration copies WORD right after "the word", as the task text says it ("containing the word WORD"):
an induction-style copy, learned early. What makes GRPO lift the SFT policy instead of degrading it
(docs/experiments/2026-12-02-demo-grpo-diagnosis.md): right and wrong samples share that copy and part at
one token (" |" or " >"), so the tree's shared prefix has advantage 0 and the update falls on that token;
no step without signal; zero-variance groups filtered and re-sampled; 2 epochs x 2 minibatches per batch
so the clip acts; an RL lr of 2.5e-4 (at 5e-4 the policy reaches ~0.9 and then degrades); a KL penalty to the
policy RL started from (without it, GRPO breaks file-name copies SFT had learned: 0.89 instead of 0.94).

`arg`: "" (the demo), "control" (SFT only, continued for more than the RL phase's minutes), "long" (2x the
RL steps: the stability run), "literal" (the previous demo's expert: "the word WORD" or WORD after `echo`),
"sloppy" (that expert's mistake is a trailing period instead), "test" (seconds-long runs for the test suite).
"""

import ml_collections

from configs import tiny
from research.rl.config import defaults
from research.train.optim import default_optim_config


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    config = defaults()  # every RunConfig field (research/rl/config.py); this file states what it changes
    base = tiny.get_config("dense")
    config.name = "demo_cpu"
    config.seed = 0
    config.algo = "grpo"  # grpo | ppo | sft
    config.tokenizer_dir = ""  # "": the real Qwen3 tokenizer packaged with research/models (offline)
    config.model = base.model
    config.model.update(vocab_size=151936, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=64,  # wide heads: qk-norm caps logits at sqrt(head_dim)
                        attention_impl="reference",  # dense mask: fastest on CPU at 512-token rows
                        embedding_init_std=0.2)
    config.mesh.update(data=1)
    config.optim.update(learning_rate=4e-3, schedule="constant", warmup_steps=5, weight_decay=0.0, clip_norm=1.0)
    # RL after the SFT warm start: fresh Adam moments and a 16x lower lr (at the SFT lr, GRPO collapses the policy)
    config.rl_optim = default_optim_config()
    config.rl_optim.update(learning_rate=2.5e-4, schedule="constant", warmup_steps=0, weight_decay=0.0, clip_norm=1.0)
    config.critic_optim.update(learning_rate=1e-2, clip_norm=1.0)
    # loss_slots: LM-head slots per row, doubled until every row fits (RL rows need 128; SFT: sft.loss_slots)
    config.train.update(steps=10, batch_rows=8, row_len=512, num_microbatches=1, logprob_chunk=256, loss_slots=32,
                        epochs=2, minibatches=2, skip_empty=True, diagnostics=True)
    # kl_coef: a k3 penalty to the policy RL started from keeps what SFT learned and RL gives no signal on
    # (the name copy: without it, held-out names drift to one attractor;
    # docs/experiments/2026-12-02-demo-grpo-diagnosis.md)
    config.rl.update(estimator="grpo", aggregation="token_mean", clip_low=0.2, clip_high=0.28, kl_coef=0.1,
                     entropy_coef=0.0, is_correction="tis", is_cap=2.0, value_coef=0.5, gamma=1.0, lam=1.0,
                     filter_groups=True)
    config.tasks.update(source="make_file", seed=0, validate=True)
    config.rollout.update(
        mode="sync", max_off_policy_steps=1, lookahead=1,
        harnesses="reference_bash",  # "name:weight,..." e.g. "reference_bash:1,claude_code:1"
        groups_per_step=4, group_size=8, backend="bwrap", concurrency=4, timeout_s=120, reward_timeout_s=30,
        infra_retries=2, max_turns=3, max_extra_rounds=1, sandbox_cpus=1.0, sandbox_memory_mb=1024, progress=True,
        fsync=True, enable_thinking=False, max_new_tokens=48, temperature=1.0, top_p=1.0)
    # the serving context bounds a rollout path, which must fit one packed row (row_len)
    config.engine.update(num_slots=4, max_len=512, prefill_chunk=256)
    config.sync.update(kind="jax")
    # every demonstration is kept (min_reward 0): nobody verified them, as with real demonstrations
    config.sft.update(steps=600, groups_per_step=16, num_demos=-1, expert="make_file_cut", min_reward=0.0,
                      loss_slots=80)  # a demonstration pair's row has <= 74 loss tokens
    config.eval.update(every=5, sft_every=100, num_tasks=-1, at_start=True, after_sft=True)
    config.checkpoint.update(every=10, keep=2)
    config.metrics.update(tensorboard=True, plot_every=10)
    if arg == "control":  # the same data; the RL phase's minutes (and more) spent on 200 more SFT steps instead
        config.algo = "sft"
        config.sft.steps = 800
    elif arg == "long":
        config.train.steps = 20
    elif arg == "literal":  # the previous demo's expert: "echo the word WORD > NAME" or "echo WORD > NAME"
        config.sft.expert = "make_file_imperfect"
    elif arg == "sloppy":  # the expert's mistake is "WORD." instead of "the word WORD"
        # (docs/experiments/2026-12-02-demo-grpo-diagnosis.md)
        config.sft.expert = "make_file_sloppy"
    elif arg == "test":
        config.model.update(hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1, head_dim=16)
        config.train.update(steps=3, batch_rows=2)
        config.train.update(epochs=1, minibatches=1)
        config.rl.update(filter_groups=False, kl_coef=0.0)  # the KL path has its own loop test (test_rl_reference_kl)
        config.rollout.update(groups_per_step=2, group_size=2, max_new_tokens=16, max_turns=2, fsync=False,
                              max_extra_rounds=0)
        config.sft.update(steps=0, num_demos=4, groups_per_step=2, expert="make_file", min_reward=1.0)
        config.eval.update(every=0, sft_every=0, at_start=False, after_sft=False, num_tasks=2)
        config.checkpoint.update(every=1)
        config.metrics.update(tensorboard=True, plot_every=1)
    elif arg:
        raise ValueError(f"configs/demo_cpu.py: arg {arg!r} not in '', 'control', 'long', 'literal', 'sloppy', 'test'")
    return config
