"""Branching rollouts + per-turn credit vs trajectory-level GRPO at the same rollout budget, on the recover family
(harness_env/tasks/recover.py: on half the tasks `cat clue.txt` fails and the agent must read backup/clue.txt).

    python -m launch.bench --suite=branching --opt seeds=0,1,2 --opt workdir=/tmp/branching   # both arms, 3 seeds
    python -m launch.train --config=configs/branching.py:branching --workdir=/tmp/br_one        # one arm, one run
    python -m launch.train --config=configs/branching.py:trajectory --workdir=/tmp/tr_one

Both arms share the SFT phase (per seed, one checkpoint; harness_env/rl/branch_compare.py) on the demonstrations of
the give-up expert (`recover_giveup`: it recovers on 25% of the moved tasks, gives up with `echo none` on 75%)
captured through the reference agent (`reference_bash`), then tree GRPO with the checker's binary reward, 32
rollouts per step:
  * trajectory: 8 groups x 4 fresh rollouts, one advantage per rollout (`grpo`);
  * branching: 8 groups x 3 fresh rollouts plus at most 8 children forked by replay from the step's failed rollouts
    at the call that reads their first failed tool call (`rollout.branch=failed`, `branch_at=after_tool_error`): the
    child replays the failed `cat` from the record (no engine time) and re-samples the reaction to the error; the
    per-node estimator `tree_grpo` (research/trees/credit.py) credits each branch segment against the value of the
    state it branched from.
The model is the relay recipe's 2-layer, 32-wide Qwen3 (real tokenizer; configs/harness_matrix.py), SFT 250 steps
at lr 4e-3 with 16 merged demonstrations per step, GRPO at lr 1e-3 with a k3 KL of 0.1 to the SFT policy. Held-out:
32 tasks (16 moved) x 2 samples at T=1, every 6 RL steps.

`arg`: "ARM[,test]", ARM in trajectory | branching; "test" is a seconds-per-step run for the test suite.
"""

import ml_collections

from configs import demo_cpu

ARMS = ("trajectory", "branching")
ROLLOUTS_PER_STEP = 32
GROUPS = 8


def get_config(arg: str = "branching") -> ml_collections.ConfigDict:
    arm, _, variant = arg.partition(",")
    if arm not in ARMS:
        raise ValueError(f"configs/branching.py: arm {arm!r} not in {ARMS}")
    if variant not in ("", "test"):
        raise ValueError(f"configs/branching.py: variant {variant!r} not in '', 'test'")
    config = demo_cpu.get_config("test")  # the tiny model; every field below says what the recipe sets
    config.name = f"branching_{arm}"
    config.model.update(embedding_init_std=0.2)
    config.optim.update(learning_rate=4e-3, warmup_steps=0)
    config.rl_optim.update(learning_rate=1e-3)
    # every group trained that carries signal, no extra rounds: both arms spend exactly their rollout budget
    config.rl.update(kl_coef=0.1, filter_groups=True, estimator="grpo" if arm == "trajectory" else "tree_grpo")
    config.tasks.update(source="recover", validate=True)
    config.rollout.update(harnesses="reference_bash", groups_per_step=GROUPS, max_turns=5, temperature=1.0,
                          max_new_tokens=48, timeout_s=120, concurrency=4, max_extra_rounds=0, fsync=True)
    if arm == "trajectory":
        config.rollout.update(group_size=ROLLOUTS_PER_STEP // GROUPS)
    else:
        fresh = ROLLOUTS_PER_STEP // GROUPS - 1
        config.rollout.update(group_size=fresh, branch="failed", branch_at="after_tool_error", branch_children=1,
                              branch_max_per_step=ROLLOUTS_PER_STEP - GROUPS * fresh)
    config.engine.update(max_len=1024, prefill_chunk=256, num_slots=4)
    config.train.update(steps=24, row_len=1024, batch_rows=2, epochs=1, minibatches=1)
    config.sft.update(steps=250, groups_per_step=16, num_demos=-1, expert="recover_giveup", min_reward=0.0,
                      merge_demos=True)
    config.eval.update(every=6, sft_every=0, at_start=False, after_sft=True, num_tasks=-1, samples=2,
                       temperature=1.0)
    config.checkpoint.update(every=6, keep=2)
    config.metrics.update(tensorboard=False, plot_every=1000)
    if variant == "test":
        config.train.steps = 2
        config.sft.update(steps=2, num_demos=4, groups_per_step=4)
        config.rollout.update(groups_per_step=2)
        if arm == "branching":
            config.rollout.update(branch="all", branch_max_per_step=2)
        config.eval.update(every=2, after_sft=True, num_tasks=4, samples=1, temperature=0.0)
        config.checkpoint.update(every=1)
    return config
