"""Bench `learning` (and the library behind tests/test_rl_learning.py): does RL through our path learn?

A synthetic task with a known optimum, run through the real machinery of the loop minus the harness:
the embedded JAX engine samples `group_size` completions of each of `prompts` fixed prompts at the
sampling temperature -> CallRecords in a capture log -> a keyed seal into ArrayRecord shards -> the grain
step stream -> prefix trees -> the Learner's tree GRPO / PPO update -> in-process weight sync. Reward: the
fraction of generated tokens in a target set (`target` of `vocab` token ids), so the optimum is 1.0 and a
random policy scores ~target / vocab. The negated-reward control (reward -> -reward, i.e. every advantage
negated) must drive the same fraction DOWN: a sign error anywhere in the chain fails one of the two.

    python -m launch.bench --suite=learning

prints `grpo_reward_start`, `grpo_reward_end`, `ppo_reward_end`, `negated_reward_end`, `steps`, and
`logp_maxdiff` (max |trainer - behaviour| log-prob at the trained tokens over every run; fp32 engine and
trainer: goal <= 1e-5) — the baseline of each run is its own start, in the same run.
"""

from __future__ import annotations

import asyncio
import pathlib
import tempfile

import numpy as np


def bandit_config(algo: str = "grpo", *, lr: float = 1e-2, vocab: int = 64, temperature: float = 1.0,
                  prompts: int = 6, group_size: int = 8, seed: int = 0):
    """A tiny one-layer Qwen3 over a `vocab`-token vocabulary, fp32, one CPU device."""
    from configs import tiny
    from research.rl.config import defaults

    config = defaults()
    config.name, config.seed, config.algo = f"bandit_{algo}", seed, algo
    config.model = tiny.get_config("dense").model
    config.model.update(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=32, embedding_init_std=0.02, attention_impl="reference")
    config.mesh.update(data=1)
    config.optim.update(learning_rate=lr, schedule="constant", warmup_steps=0, weight_decay=0.0, clip_norm=1.0)
    config.critic_optim.update(learning_rate=lr, schedule="constant", clip_norm=1.0)
    config.train.update(batch_rows=2, row_len=256, loss_slots=64, logprob_chunk=64)
    config.rl.update(estimator="grpo", aggregation="token_mean", is_correction="none", gamma=1.0, lam=1.0)
    config.rollout.update(groups_per_step=prompts, group_size=group_size, temperature=temperature,
                          max_off_policy_steps=0)
    config.engine.update(num_slots=8, max_len=64, prefill_chunk=32)
    return config


def first_crossing(curve: list[float], threshold: float, *, window: int = 3, falling: bool = False) -> int | None:
    """The first step (1-based) at which the mean of the last `window` points reaches `threshold` (at or above;
    `falling=True`: at or below), None if it never does.

    Why: a learning test that checks only the first and the last point passes a run that got there by luck on
    one step, or only just in time. The step at which a running mean crossed can be held to a margin before the
    end of the budget, so a learner that became a few steps slower fails while its last point still passes."""
    if window < 1:
        raise ValueError(f"window={window} must be >= 1")
    for k in range(window, len(curve) + 1):
        mean = float(np.mean(curve[k - window:k]))
        if (mean <= threshold) if falling else (mean >= threshold):
            return k
    return None


def target_reward(ids: list[int], target: int) -> float:
    return float(np.mean([t < target for t in ids])) if ids else 0.0


async def _run(config, *, steps: int, sign: float, target: int, new_tokens: int, workdir: pathlib.Path) -> dict:
    from research.capture import CallRecord, CaptureLog, RolloutResult
    from research.data.pipeline import step_stream
    from research.data.shards import seal_log
    from research.rl import batches as B
    from research.rl.sync import get_sync
    from research.rl.trainer import Learner
    from research.serving.api import GenerateRequest, SamplingParams
    from research.serving.factory import policy_engine

    learner = Learner(config)
    run = learner.run
    engine = policy_engine(run, learner.params_copy(), weight_version=0)
    rng = np.random.default_rng(run.seed)
    prompts = [rng.integers(0, run.model.vocab_size, size=12).tolist() for _ in range(run.rollout.groups_per_step)]
    stream, log = step_stream(workdir / "shards", run.pipeline()), CaptureLog(workdir / "capture.jsonl", fsync=False)
    curve, maxdiff = [], 0.0
    try:
        for step in range(steps):
            reqs = [(p, g) for p in range(len(prompts)) for g in range(run.rollout.group_size)]
            sps = [SamplingParams(temperature=run.temperature, max_new_tokens=new_tokens, seed=step * 7919 + i)
                   for i in range(len(reqs))]
            outs = await asyncio.gather(*[engine.generate(GenerateRequest(prompts[p], sp))
                                          for (p, _), sp in zip(reqs, sps)])
            rewards = []
            for (p, g), o in zip(reqs, outs):
                rid, gid = f"s{step}.p{p}.{g}", f"s{step}/p{p}"
                log.append(CallRecord(rollout_id=rid, session_id=rid, group_id=gid, harness="bandit", call_index=0,
                                      prompt_ids=prompts[p], completion_ids=o.token_ids, logprobs=o.logprobs,
                                      weight_version=o.weight_version, finish_reason=o.finish_reason))
                rewards.append(target_reward(o.token_ids, target))
                log.append(RolloutResult(rollout_id=rid, group_id=gid, harness="bandit", status="ok",
                                         reward=sign * rewards[-1]))
            curve.append(float(np.mean(rewards)))
            seal_log(workdir / "capture.jsonl", workdir / "shards", key=f"s{step}")
            batch = B.build_batch(next(stream).items, run.batching(), current_version=step, max_off_policy=0,
                                  loss_slots_k=run.train.loss_slots)
            m = learner.train(batch) if not batch.empty else {"skipped": 1.0}
            if not m["skipped"]:  # a step ran: a renamed metric must fail here, not read as 0 (engine == trainer)
                maxdiff = max(maxdiff, m["behav_logp_maxdiff"])
            await get_sync("jax")(engine, learner, step + 1, workdir)
    finally:
        log.close()
        await engine.close()
    return {"curve": curve, "logp_maxdiff": maxdiff}


def run_bandit(algo: str = "grpo", *, steps: int = 15, sign: float = 1.0, target: int = 8, new_tokens: int = 8,
               workdir: str | pathlib.Path | None = None, **config_kw) -> dict:
    """One run; returns {"curve": mean reward per step (before that step's update), "logp_maxdiff"}."""
    workdir = pathlib.Path(workdir or tempfile.mkdtemp(prefix=f"bandit_{algo}_"))
    return asyncio.run(_run(bandit_config(algo, **config_kw), steps=steps, sign=sign, target=target,
                            new_tokens=new_tokens, workdir=workdir))


def run(steps: int = 15) -> dict:
    grpo = run_bandit("grpo", steps=steps)
    ppo = run_bandit("ppo", steps=steps)
    neg = run_bandit("grpo", steps=steps, sign=-1.0)
    return {"steps": steps, "grpo_reward_start": grpo["curve"][0], "grpo_reward_end": grpo["curve"][-1],
            "ppo_reward_start": ppo["curve"][0], "ppo_reward_end": ppo["curve"][-1],
            "negated_reward_start": neg["curve"][0], "negated_reward_end": neg["curve"][-1],
            "logp_maxdiff": max(grpo["logp_maxdiff"], ppo["logp_maxdiff"], neg["logp_maxdiff"]),
            "grpo_curve": [round(x, 3) for x in grpo["curve"]], "ppo_curve": [round(x, 3) for x in ppo["curve"]]}
