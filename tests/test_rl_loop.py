"""The RL loop end to end on CPU: tiny policy (real Qwen3 tokenizer), JAX engine, shim, bwrap, reference
harness. A random tiny model never solves make_file, so these runs use a test task whose checker gives
reward for an even-length final message: rewards vary within groups and GRPO has a signal."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from harness_env.harnesses.base import register
from harness_env.harnesses.reference import ReferenceHarness
from harness_env.sandbox import get_backend
from research.capture import CallRecord, RolloutResult, read_log
from research.rl.config import override

pytestmark = [pytest.mark.slow, pytest.mark.harness]
REPO = pathlib.Path(__file__).resolve().parent.parent


@register
class ReferenceB(ReferenceHarness):
    """A second registered harness for the mix-harness run (same agent, its own name and groups)."""

    name = "reference_b"


def _config(tmp_path: pathlib.Path, parity_tasks, **over):
    from configs import demo_cpu

    ok, why = get_backend("bwrap").available()
    if not ok:
        pytest.skip(why)
    cfg = demo_cpu.get_config("test")
    tasks = parity_tasks(tmp_path / "task_src")
    cfg.tasks.update(source="dir", train_dir=str(tasks), eval_dir=str(tasks))
    cfg.optim.update(warmup_steps=0, learning_rate=1e-2)
    cfg.rollout.update(temperature=1.0, max_turns=1)
    return override(cfg, over)


def _meta(workdir: pathlib.Path) -> dict:
    step_dir = max((workdir / "checkpoints").iterdir(), key=lambda d: int(d.name) if d.name.isdigit() else -1)
    return json.loads((step_dir / "meta" / "metadata").read_text())


def _records(workdir: pathlib.Path, kind: str):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == kind]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grpo_three_steps_mix_harness(tmp_path, parity_tasks):
    from harness_env.rl.loop import train

    cfg = _config(tmp_path, parity_tasks, **{"rollout.harnesses": "reference:1,reference_b:1"})
    wd = tmp_path / "run"
    summary = train(cfg, wd)
    assert summary["rl_step"] == 3 and summary["version"] == 3 and summary["optimizer_steps"] > 0
    meta = _meta(wd)
    recs = _records(wd, "train")
    assert [r["step"] for r in recs] == [1, 2, 3]
    for r in recs:  # every metric family is present, per harness too
        for key in ("rollout/all/reward", "rollout/reference/reward", "rollout/reference_b/reward",
                    "rollout/reference/pass_rate", "rollout/reference_b/pass_rate", "tree_compression",
                    "rollout/latency_s", "staleness", "stale_rollouts", "rollout/tokens_per_s", "signal_groups",
                    "groups/reference", "groups/reference_b", "pos_token_share", "neg_token_share", "response_len",
                    "skipped"):
            assert key in r, key
        # the rate is the step's own tokens over its own rollout time (not another step's, not another clock)
        assert r["rollout/generated_tokens"] > 0 and r["rollout_s"] > 0
        assert r["rollout/tokens_per_s"] == pytest.approx(r["rollout/generated_tokens"] / r["rollout_s"])
        assert r["tree_compression"] > 1.0  # the group's calls share their prompt
        if not r["skipped"]:  # a step with signal: the update and what it did to the batch
            for key in ("loss", "grad_norm", "update_norm", "clip_frac", "entropy", "mismatch_k3", "dlogp_pos",
                        "dlogp_neg", "kl_old_new", "behav_logp_maxdiff", "trained_tokens_per_s"):
                assert key in r, key
            assert r["grad_norm"] > 0 and r["behav_logp_maxdiff"] < 1e-4
            assert r["dlogp_pos"] > r["dlogp_neg"]  # the step favoured A > 0 tokens over A < 0 ones
    assert any(not r["skipped"] for r in recs)
    assert (wd / "reward_curve.png").stat().st_size > 1000
    assert list((wd / "tb").iterdir())
    ledger = [json.loads(x) for x in (wd / "ledger.jsonl").read_text().splitlines()]
    trained = [rid for e in ledger for rid in e["trained"]]
    assert len(trained) == len(set(trained)) == 12
    assert set(meta["consumed"]) == set(trained)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sft_warm_start_then_ppo(tmp_path, parity_tasks, monkeypatch):
    """SFT on demonstrations captured through the harness by the expert engine, then 3 PPO steps (value head)."""
    from harness_env.rl import experts
    from harness_env.rl.loop import train

    # an expert of the parity tasks (an even-length final answer): the RL phase's random policy then gets
    # rewards that vary, so the value head has returns to fit
    monkeypatch.setitem(experts.EXPERTS, "even_answer", lambda prompt: "done")
    cfg = _config(tmp_path, parity_tasks, algo="ppo")
    cfg.rollout.update(max_turns=2)
    cfg.checkpoint.update(keep=10)  # the test reads the checkpoint after SFT
    cfg.sft.update(steps=2, num_demos=2, groups_per_step=2, expert="even_answer")
    cfg.eval.update(sft_every=1, num_tasks=1)  # a held-out eval after SFT step 1 (not after the last one)
    cfg.train.update(steps=3)
    wd = tmp_path / "run"
    t0 = time.monotonic()
    summary = train(cfg, wd)
    wall = time.monotonic() - t0
    evals = _records(wd, "eval")
    assert [r["step"] for r in evals] == [1] and evals[0]["eval/all/count"] == 1
    assert 0 < evals[0]["eval/elapsed_min"] * 60 <= wall  # the run's work time so far: within this call's time
    assert summary == {**summary, "version": 5, "rl_step": 3, "sft_step": 2}
    # the value head starts at zero and only PPO steps train it (SFT leaves the critic untouched)
    from research.rl.trainer import Learner
    from research.train.checkpoint import Checkpointer

    learner = Learner(cfg)
    with Checkpointer(wd / "checkpoints") as ck:
        state, _, _ = ck.restore(learner.abstract, step=2)  # after SFT, before RL
        after_sft = float(np.abs(np.asarray(state.critic_params["value_w"])).max())
        state, _, _ = ck.restore(learner.abstract)
        after_ppo = float(np.abs(np.asarray(state.critic_params["value_w"])).max())
    assert after_sft == 0.0 and after_ppo > 0.0
    sft = _records(wd, "sft")
    assert [r["step"] for r in sft] == [1, 2] and all(np.isfinite(r["nll"]) for r in sft)
    assert sft[1]["nll"] < sft[0]["nll"]  # same kind of data, lr 1e-2: NLL goes down
    train_recs = _records(wd, "train")
    assert all("value_loss" in r and r["critic_grad_norm"] > 0 for r in train_recs)
    demos = [r for r in read_log(wd / "demos" / "rollouts" / "results.jsonl") if isinstance(r, RolloutResult)]
    assert len(demos) == 2 and all(r.reward == 1.0 for r in demos)  # the expert solves the task in the sandbox


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_async_never_trains_beyond_staleness_bound(tmp_path, parity_tasks):
    from harness_env.rl.loop import train

    bound = 0
    cfg = _config(tmp_path, parity_tasks, **{"rollout.mode": "async", "rollout.max_off_policy_steps": bound,
                               "rollout.lookahead": 2, "train.steps": 4})
    wd = tmp_path / "run"
    train(cfg, wd)
    version = {}
    for rec in read_log(wd / "capture.jsonl"):
        if isinstance(rec, CallRecord):
            version[rec.rollout_id] = min(version.get(rec.rollout_id, 1 << 30), rec.weight_version)
    ledger = [json.loads(x) for x in (wd / "ledger.jsonl").read_text().splitlines()]
    for e in ledger:
        trained_at = e["step"] - 1  # the ledger is written after the update
        for rid in e["trained"]:
            assert trained_at - version[rid] <= bound, (rid, version[rid], trained_at)
    recs = _records(wd, "train")
    dropped = sum(len(e["dropped"]) for e in ledger)
    assert sum(r["stale_rollouts"] for r in recs) == dropped
    assert dropped > 0, "lookahead 2 with bound 0 should have produced stale rollouts"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill9_resume_no_lost_or_duplicated_rollouts(tmp_path, parity_tasks):
    cfg_over = ["--config.train.steps=5", "--config.tasks.source=dir",
                f"--config.tasks.train_dir={parity_tasks(tmp_path / 'task_src')}",
                f"--config.tasks.eval_dir={tmp_path / 'task_src'}", "--config.rollout.max_turns=1"]
    if not get_backend("bwrap").available()[0]:
        pytest.skip("bwrap unavailable")
    wd = tmp_path / "run"
    cmd = [sys.executable, "-m", "launch.train", "--config=configs/demo_cpu.py:test", f"--workdir={wd}", *cfg_over]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("XLA_FLAGS", None)
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    ledger_path = wd / "ledger.jsonl"
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and p.poll() is None:
        if ledger_path.exists() and len(ledger_path.read_text().splitlines()) >= 2:
            break
        time.sleep(0.5)
    time.sleep(1.5)  # land somewhere inside step 3 (rollouts or training)
    assert p.poll() is None, "the run ended before it could be killed"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    killed_at = len(ledger_path.read_text().splitlines())
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    ledger = [json.loads(x) for x in ledger_path.read_text().splitlines()]
    last = {}
    for e in ledger:  # a resumed run rewrites the steps after its checkpoint: the last entry wins
        last[e["step"]] = e
    assert sorted(last) == [1, 2, 3, 4, 5]
    assert 2 <= killed_at < 5, killed_at  # killed mid-run, after the second step
    resumed = [e["step"] for e in ledger[killed_at:]]
    assert resumed and 2 <= resumed[0] <= killed_at + 1, resumed  # resumed from a checkpoint, not from scratch
    trained = [rid for s in sorted(last) for rid in last[s]["trained"] + last[s]["dropped"]]
    assert len(trained) == len(set(trained)), "a rollout was trained twice"
    assert set(_meta(wd)["consumed"]) == set(trained)
    results = [r for r in read_log(wd / "rollouts" / "results.jsonl") if isinstance(r, RolloutResult)]
    final = [r.rollout_id for r in results if r.status != "infra_error"]
    assert len(final) == len(set(final)), "a finished rollout was run again after the restart"
    assert set(final) == set(trained), "a captured rollout was lost (never trained or dropped)"
    shutil.rmtree(wd / "rollouts", ignore_errors=True)
