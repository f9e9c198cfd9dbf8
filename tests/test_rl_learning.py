"""RL learns through the real path, and a sign error anywhere in it fails a test.

Bandit (research/benchmarks/learning.py): the JAX engine samples -> capture log -> keyed seal -> grain step
stream -> trees -> Learner (tree GRPO / PPO) -> in-process weight sync; reward = fraction of generated tokens
in a target set (optimum 1.0, random ~0.125). GRPO and PPO must lift it from <= 0.2 to >= 0.8 in a fixed
budget, with the 3-step running mean crossing 0.8 at least a recorded margin of steps before the budget ends
(`first_crossing`; the steps recorded when the margins were set are tests/test_learning_curve.py's curves), the
negated-reward control must drive it down in time too, and the trainer's log-probs must equal the engine's
at the trained tokens (<= 1e-5, fp32) at T = 1 and T = 0.7.

Multi-turn: the whole loop (`harness_env.rl.loop.train`) through the shim, bwrap and the reference agent in
chat mode (2 answers per rollout: every rollout is a 2-call path of the prefix tree), SFT-warm-started on
demonstrations that name one of 8 words at random, then GRPO with a checker rewarding one word.
"""

import hashlib
import json
import pathlib

import numpy as np
import pytest

from research.benchmarks.learning import first_crossing, run_bandit
from research.rl.config import RunConfig, RunConfigError

pytestmark = pytest.mark.slow


@pytest.mark.slow
def test_grpo_lifts_the_reward_and_trainer_logprobs_match_the_engine(tmp_path):
    r = run_bandit("grpo", steps=15, workdir=tmp_path)
    c = r["curve"]
    k = first_crossing(c, 0.8)  # recorded: step 10 of 15
    assert c[0] <= 0.2 and k is not None and k <= len(c) - 3 and c[-1] >= 0.8, (k, c)
    assert r["logp_maxdiff"] <= 1e-5, r["logp_maxdiff"]


@pytest.mark.slow
def test_ppo_lifts_the_reward(tmp_path):
    c = run_bandit("ppo", steps=18, workdir=tmp_path)["curve"]  # the value head learns first
    k = first_crossing(c, 0.8)  # recorded: step 16 of 18
    assert c[0] <= 0.2 and k is not None and k <= len(c) - 1 and c[-1] >= 0.8, (k, c)


@pytest.mark.slow
def test_negated_advantages_drive_the_reward_down(tmp_path):
    c = run_bandit("grpo", steps=12, sign=-1.0, workdir=tmp_path)["curve"]  # 10 steps left no slack at step 9
    k = first_crossing(c, 0.03, falling=True)  # recorded: step 9 of 12 (the 3-step mean at 0.02: step 10)
    assert c[0] >= 0.08 and k is not None and k <= len(c) - 2 and c[-1] <= 0.02, (k, c)


@pytest.mark.slow
def test_temperature_0_7_trains_at_the_sampling_temperature(tmp_path):
    r = run_bandit("grpo", steps=12, temperature=0.7, workdir=tmp_path)
    assert r["logp_maxdiff"] <= 1e-5, r["logp_maxdiff"]  # the trainer's log-probs are taken at T = 0.7 too
    c = r["curve"]
    k = first_crossing(c, 0.8)  # recorded: step 8 of 12
    assert c[0] <= 0.2 and k is not None and k <= len(c) - 2 and c[-1] >= 0.8, (k, c)


def test_configs_whose_trainer_and_sampler_cannot_agree_are_rejected():
    from research.benchmarks.learning import bandit_config

    cfg = bandit_config()
    assert RunConfig.of(cfg).objective().temperature == cfg.rollout.temperature == 1.0
    cfg.rollout.temperature = 0.7
    assert RunConfig.of(cfg).objective().temperature == 0.7
    for field, value, msg in (("top_p", 0.9, "top_p=0.9"), ("temperature", 0.0, "T > 0")):
        bad = bandit_config()
        bad.rollout[field] = value
        with pytest.raises(RunConfigError, match=msg):
            RunConfig.of(bad)
    sft = bandit_config("sft")
    sft.rollout.temperature = 0.0  # SFT never uses the behaviour distribution
    RunConfig.of(sft)


# ------------------------------------------------------------------------------ multi-turn, whole loop

WORDS = ("apple", "river", "cloud", "stone", "tiger", "piano", "lemon", "candle")
TARGET = "river"
CHECK = f"""import json, os
p = json.loads(os.environ["OPENCLAW_REWARD_PAYLOAD"])
answers = [m.get("content") or "" for m in p["transcript"] if m.get("role") == "assistant"]
print(sum(a.strip() == "{TARGET}" for a in answers) / max(len(answers), 1))
"""


SABOTAGE = "stone"  # an answer this checker crashes on: the policy's way to turn a failure into a grading error
SABOTAGE_CHECK = f"""import json, os, sys
p = json.loads(os.environ["OPENCLAW_REWARD_PAYLOAD"])
answers = [(m.get("content") or "").strip() for m in p.get("transcript") or [] if m.get("role") == "assistant"]
if "{SABOTAGE}" in answers:
    sys.exit("the checker cannot grade this answer")
print(sum(a == "{TARGET}" for a in answers) / max(len(answers), 1))
"""


def _tasks(root: pathlib.Path, n: int, check: str = CHECK) -> pathlib.Path:
    for i in range(n):
        d = root / f"word{i:02d}"
        (d / "reward").mkdir(parents=True)
        (d / "data_entry.json").write_text(json.dumps({
            "task_id": f"word{i:02d}", "user_query": f"Say one word ({i}).",
            "metadata": {"category": "chat", "chat_graded": True}}))
        (d / "reward" / "check.py").write_text(check)
        (d / "reward" / "reward.sh").write_text('#!/bin/bash\nexec python3 "$(dirname "$0")/check.py"\n')
    return root


def word_expert(prompt_text: str) -> str:
    """Names one of WORDS, picked by a hash of the prompt (so the two answers of a chat differ)."""
    return WORDS[int(hashlib.sha256(prompt_text.encode()).hexdigest(), 16) % len(WORDS)]


def _multi_turn_config(tmp_path, seed: int, check: str = CHECK, **rl):
    from configs import demo_cpu
    from harness_env.rl import experts as demos

    demos.EXPERTS["word_choice"] = word_expert
    cfg = demo_cpu.get_config("test")
    tasks = tmp_path / ("tasks" if check == CHECK else "sabotage_tasks")
    if not tasks.exists():
        _tasks(tasks, 16, check)
    cfg.seed = seed
    cfg.tasks.update(source="dir", train_dir=str(tasks), eval_dir=str(tasks))
    cfg.model.update(embedding_init_std=0.2)
    cfg.optim.update(learning_rate=4e-3, warmup_steps=0)
    cfg.rl_optim.update(learning_rate=2e-3)
    cfg.rl.update(**rl)
    cfg.sft.update(steps=60, groups_per_step=8, num_demos=-1, expert="word_choice", min_reward=0.0)
    cfg.rollout.update(harnesses="reference_dialog", groups_per_step=4, group_size=4, max_new_tokens=8,
                       max_turns=4, temperature=1.0)
    cfg.train.update(steps=20, batch_rows=4)
    cfg.checkpoint.update(every=10)
    cfg.metrics.update(tensorboard=False, plot_every=100)
    return cfg


def _train_rewards(workdir):
    from research.rl.metrics import read_metrics

    return [m for m in read_metrics(workdir) if m["kind"] == "train"]


@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.timeout(1800)
def test_multi_turn_grpo_through_the_harness_lifts_the_reward_on_two_seeds_negated_lowers_it(tmp_path):
    """Per seed: SFT once, then GRPO from that checkpoint lifts the reward; from seed 0's same SFT checkpoint,
    the negated-advantage control (estimator `negated_grpo`: every advantage's sign flipped) drives it down."""
    from harness_env.rl.sweep import run_part
    from harness_env.sandbox import get_backend

    ok, why = get_backend("bwrap").available()
    assert ok, why
    starts = []
    for seed in (0, 1):
        base = tmp_path / f"seed{seed}"
        sft_cfg = _multi_turn_config(tmp_path, seed)
        sft_cfg.algo = "sft"
        run_part(sft_cfg, base / "sft")
        run_part(_multi_turn_config(tmp_path, seed), base / "rl", source=base / "sft")
        recs = _train_rewards(base / "rl")
        rewards = [m["rollout/all/reward"] for m in recs]
        assert len(recs) == 20 and all(m["rollout/all/count"] == 16 for m in recs)
        # every rollout is a chat of two calls: the second call's prompt extends the first -> merged trees
        assert min(m["tree_compression"] for m in recs) > 1.5
        # recorded (docs/experiments/2026-12-03-demo-seeds.md, section 6): the 3-step mean first at >= 0.8 at step
        # 13 (seed 0) and 9 (seed 1) of 20; the margin asks for it 4 steps before the end (the slower seed's +3)
        k = first_crossing(rewards, 0.8)
        assert rewards[0] <= 0.2 and k is not None and k <= len(rewards) - 4, (seed, k, rewards)
        assert np.mean(rewards[-3:]) >= 0.8, (seed, rewards)
        starts.append(rewards[0])
    neg_cfg = _multi_turn_config(tmp_path, 0, estimator="negated_grpo")
    neg_cfg.train.steps = 10
    run_part(neg_cfg, tmp_path / "negated", source=tmp_path / "seed0" / "sft")
    neg = [m["rollout/all/reward"] for m in _train_rewards(tmp_path / "negated")]
    # batch rewards come in steps of 1/32, so judge the whole second half: one lucky step of 3/32 is not a rise.
    # Recorded (same note): the 3-step mean first at <= 0.06 at step 3 of 10; asked for before the judged half
    k = first_crossing(neg, 0.06, falling=True)
    assert neg[0] <= 0.2 and k is not None and k <= len(neg) - 5, (k, neg, starts)
    assert np.mean(neg[5:]) <= 0.06 and max(neg[5:]) <= 0.125, (neg, starts)


@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.timeout(1800)
def test_grpo_drives_sabotage_down_because_the_batch_scores_it(tmp_path):
    """A policy SFT-started to answer one of 8 words names the sabotage word in ~1 of 4 rollouts; the checker
    crashes on it (reward_error). Attribution puts that on the policy (the untouched workspace grades cleanly),
    so the batch trains on it with the failure reward, and GRPO drives it down while it lifts the target.
    (Dropped instead, as before attribution, a sabotaged rollout carried no negative advantage at all.)"""
    from harness_env.rl.sweep import run_part

    base = tmp_path / "run"
    sft_cfg = _multi_turn_config(tmp_path, 0)  # demonstrated on the plain checker: the 8 words alike
    sft_cfg.algo = "sft"
    run_part(sft_cfg, base / "sft")
    run_part(_multi_turn_config(tmp_path, 0, SABOTAGE_CHECK), base / "rl", source=base / "sft")
    recs = _train_rewards(base / "rl")
    sabotaged = [m.get("rollout/status/reward_error", 0.0) / m["rollout/all/count"] for m in recs]
    for m in recs:  # every sabotage is the policy's, and every one of them is in the batch (none sheltered)
        assert m.get("rollout/cause/policy", 0.0) == m.get("rollout/status/reward_error", 0.0), m
    assert np.mean(sabotaged[:3]) >= 0.1 and np.mean(sabotaged[-3:]) <= 0.03, sabotaged
    assert np.mean([m["rollout/all/reward"] for m in recs[-3:]]) >= 0.7, [m["rollout/all/reward"] for m in recs]


@pytest.mark.slow
def test_learning_bench_keys_are_exact_and_read_from_the_curves():
    """`launch.bench --suite=learning` prints these keys and no others: a renamed or dropped metric fails here
    (a reader of BENCH lines must never get a default for a key that silently stopped existing)."""
    from research.benchmarks import learning

    r = learning.run(steps=2)
    assert set(r) == {"steps", "grpo_reward_start", "grpo_reward_end", "ppo_reward_start", "ppo_reward_end",
                      "negated_reward_start", "negated_reward_end", "logp_maxdiff", "grpo_curve", "ppo_curve"}
    assert r["steps"] == 2 and len(r["grpo_curve"]) == len(r["ppo_curve"]) == 2
    assert r["grpo_reward_start"] == pytest.approx(r["grpo_curve"][0], abs=1e-3)
    assert r["grpo_reward_end"] == pytest.approx(r["grpo_curve"][-1], abs=1e-3)
    assert r["ppo_reward_end"] == pytest.approx(r["ppo_curve"][-1], abs=1e-3)
    assert 0.0 <= r["negated_reward_end"] <= 1.0 and r["logp_maxdiff"] <= 1e-5
