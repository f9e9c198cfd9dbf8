"""The black-box RL loop: rollouts through real harnesses -> trees -> tree GRPO/PPO -> weights -> repeat.

`train(config, workdir)` is the one library function behind `python -m launch.train`. Phases:
  1. (optional) SFT warm start: demonstrations captured through the harness by a scripted expert
     engine (research/rl/demos.py), `config.sft.steps` NLL steps on them;
  2. RL: per step, the rollouts of the step's plan (sync) or of the next finished rollout round
     (async, bounded staleness) -> sealed shards -> trees -> one train step -> weights to the engine.
  Held-out evaluation (greedy) before training, after SFT and every `config.eval.every` RL steps.

Durability: the capture log and the runner's results log are fsync'd per record; a checkpoint holds
the TrainState and, in `meta`, the ids of every consumed rollout and the phase. `ledger.jsonl` records
which rollouts each step trained on. After `kill -9`, the same command restores the latest checkpoint,
replans the same rollouts (the runner skips finished ones), and never trains a consumed rollout again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import random
import time

import ml_collections

from research.capture import RolloutResult, read_log
from research.rl import batches as B
from research.rl import rollouts as R
from research.rl.demos import expert_engine
from research.rl.metrics import MetricsWriter, plot_rewards, rollout_metrics
from research.rl.sync import get_sync
from research.rl.trainer import Learner, pipeline_config
from research.train.checkpoint import Checkpointer

log = logging.getLogger(__name__)


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> dict:
    """Runs (or resumes) the configured run in `workdir`; returns the final summary dict."""
    workdir = pathlib.Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    if config.get("distributed") and config.distributed.enabled:
        from research.train import distributed

        distributed.initialize(config.distributed)  # config, then env, then JAX's auto-detection (TPU pods, SLURM)
    return asyncio.run(Loop(config, workdir).run())


def _results(path: pathlib.Path, ids: set[str]) -> list[RolloutResult]:
    if not path.exists():
        return []
    by_id = {r.rollout_id: r for r in read_log(path) if isinstance(r, RolloutResult) and r.rollout_id in ids}
    return list(by_id.values())


class Loop:
    def __init__(self, config: ml_collections.ConfigDict, workdir: pathlib.Path):
        from research.models.tokenizer import load_tokenizer

        self.cfg, self.workdir = config, workdir
        self.tok = load_tokenizer(config.tokenizer_dir)
        self.learner = Learner(config)
        self.pcfg = pipeline_config(config)
        self.ckpt = Checkpointer(workdir / "checkpoints", save_every=config.checkpoint.every,
                                 keep=config.checkpoint.keep)
        self.meta: dict = {"consumed": [], "rl_step": 0, "sft_step": 0, "started_at": time.time()}
        if self.ckpt.latest_step() is not None:
            state, _, meta = self.ckpt.restore(self.learner.abstract)
            self.learner.restore(state)
            self.meta.update(meta)
            log.info("resumed at step %d (rl %d, sft %d)", self.learner.step, self.meta["rl_step"],
                     self.meta["sft_step"])
        self.consumed: set[str] = set(self.meta["consumed"])
        self.metrics = MetricsWriter(workdir, tensorboard=config.metrics.tensorboard)
        self.ledger = open(workdir / "ledger.jsonl", "a")
        self.sync = get_sync(config.sync.kind)
        self.engine = None

    # ------------------------------------------------------------------ setup
    def _make_engine(self):
        if self.cfg.sync.kind == "sglang":
            from research.serving.sglang_client import SGLangClient

            return SGLangClient(self.cfg.sync.sglang_url, weight_version=self.learner.step)
        from research.serving.jax_engine import EngineConfig, JaxEngine
        from research.serving.qwen3_runner import Qwen3Runner

        e = self.cfg.engine
        return JaxEngine(Qwen3Runner(self.learner.model_cfg), self.learner.params_copy(),
                         weight_version=self.learner.step,
                         config=EngineConfig(num_slots=e.num_slots, max_len=e.max_len, prefill_chunk=e.prefill_chunk))

    async def run(self) -> dict:
        self.engine = self._make_engine()
        self.train_rollouts = R.RolloutService(self.cfg, self.workdir, self.engine, self.tok)
        self.eval_rollouts = R.RolloutService(self.cfg, self.workdir, self.engine, self.tok, name="eval",
                                              capture_path=self.workdir / "eval_capture.jsonl",
                                              sampling={"temperature": 0.0})
        self.train_tasks = R.task_dirs(self.cfg.tasks, self.workdir, "train")
        self.eval_tasks = R.task_dirs(self.cfg.tasks, self.workdir, "heldout")
        t0 = time.monotonic()
        try:
            if self.learner.step == 0 and self.cfg.eval.at_start:
                await self.evaluate()
            if self.cfg.sft.steps > 0 and self.meta["sft_step"] < self.cfg.sft.steps:
                await self.sft_phase()
            if self.cfg.algo != "sft":
                if self.cfg.rollout.mode == "async":
                    await self.rl_async()
                else:
                    await self.rl_sync()
            if self.ckpt.latest_step() != self.learner.step:
                self.ckpt.save(self.learner.step, self.learner.state, data_state=self._data_state(),
                               meta=self._meta(), force=True)
            self.ckpt.wait()
        finally:
            await self.train_rollouts.close()
            await self.eval_rollouts.close()
            await self.engine.close()
            self.ckpt.close()
            self.metrics.close()
            self.ledger.close()
        plot_rewards(self.workdir)
        summary = {"step": self.learner.step, "rl_step": self.meta["rl_step"], "wall_s": time.monotonic() - t0,
                   "consumed": len(self.consumed)}
        (self.workdir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    # ------------------------------------------------------------------ bookkeeping
    def _meta(self) -> dict:
        return {**self.meta, "consumed": sorted(self.consumed)}

    def _data_state(self) -> dict:
        return {"rl_step": self.meta["rl_step"], "sft_step": self.meta["sft_step"],
                "shards": len(B.shard_paths(self.workdir / "shards"))}

    def _commit_step(self, phase: str, trained: set[str], dropped: set[str], metrics: dict, kind: str) -> None:
        """Ledger + metrics + checkpoint of one finished step (the consumed set moves with the state)."""
        step = self.learner.step
        self.consumed |= trained | dropped
        self.ledger.write(json.dumps({"step": step, "phase": phase, "trained": sorted(trained),
                                      "dropped": sorted(dropped)}) + "\n")
        self.ledger.flush()
        os.fsync(self.ledger.fileno())
        self.metrics.write(step, metrics, kind=kind)
        self.ckpt.save(step, self.learner.state, data_state=self._data_state(), meta=self._meta())
        if step % self.cfg.metrics.plot_every == 0:
            plot_rewards(self.workdir)

    async def _push_weights(self) -> float:
        t = time.monotonic()
        await self.sync(self.engine, self.learner, self.learner.step, self.workdir)
        return time.monotonic() - t

    # ------------------------------------------------------------------ eval
    async def evaluate(self) -> dict:
        specs = R.plan_eval(self.cfg, self.eval_tasks, self.learner.step)
        t = time.monotonic()
        await self.eval_rollouts.run(specs)
        res = _results(self.eval_rollouts.runner.results_path, {s.rollout_id for s in specs})
        m = rollout_metrics(res, prefix="eval")
        m["eval/wall_s"] = time.monotonic() - t
        m["eval/elapsed_min"] = (time.time() - self.meta["started_at"]) / 60  # since the run's first start
        self.metrics.write(self.learner.step, m, kind="eval")
        log.info("eval step %d: pass rate %.3f", self.learner.step, m.get("eval/all/pass_rate", 0.0))
        return m

    # ------------------------------------------------------------------ SFT
    async def sft_phase(self) -> None:
        groups = await self._demonstrations()
        if not groups:
            raise RuntimeError("SFT: no successful demonstrations were captured")
        s = self.cfg.sft
        while self.meta["sft_step"] < s.steps:
            k = self.meta["sft_step"]
            epoch, pos = divmod(k * s.groups_per_step, len(groups))
            order = list(range(len(groups)))
            random.Random(self.cfg.seed + epoch).shuffle(order)
            pick = [groups[order[(pos + i) % len(groups)]] for i in range(s.groups_per_step)]
            batch = B.build_batch(pick, self.pcfg, current_version=0, max_off_policy=1 << 30,
                                  loss_slots_k=self.cfg.train.loss_slots)
            t = time.monotonic()
            m = await asyncio.to_thread(self.learner.train, batch, sft=True)
            m["train_s"] = time.monotonic() - t
            m["trained_tokens_per_s"] = batch.tree_tokens / max(m["train_s"], 1e-9)
            self.meta["sft_step"] = k + 1
            self._commit_step("sft", set(), set(), m, kind="sft")
            if (k + 1) % 10 == 0 or k + 1 == s.steps:
                log.info("sft step %d/%d nll %.4f", k + 1, s.steps, m["nll"])
            every = self.cfg.eval.get("sft_every", 0)
            if every > 0 and (k + 1) % every == 0 and k + 1 < s.steps:
                self.metrics.write(self.learner.step, {"sync_s": await self._push_weights()}, kind="sync")
                await self.evaluate()
        m = {"sync_s": await self._push_weights()}
        self.metrics.write(self.learner.step, m, kind="sync")
        if self.cfg.eval.after_sft:
            await self.evaluate()

    async def _demonstrations(self) -> list:
        """Successful expert rollouts over the train tasks, captured through the harness (once per run)."""
        s = self.cfg.sft
        out_dir = self.workdir / "demos"
        tasks = self.train_tasks[: s.num_demos] if s.num_demos > 0 else self.train_tasks
        specs = [R.StepSpec(t, h, 0, step=0, tag="demo") for t in tasks for h, _ in R.harness_weights(self.cfg)]
        expert = expert_engine(s.expert, self.tok)
        svc = R.RolloutService(self.cfg, out_dir, expert, self.tok, name="rollouts", sampling={},
                               max_new_tokens=1024)  # the expert is never truncated
        try:
            await svc.run(specs)
        finally:
            await svc.close()
        B.seal(svc.capture_path, out_dir / "shards")
        groups = B.load_groups(out_dir / "shards", {sp.rollout_id for sp in specs})
        good = [g for g in groups if g.results and all(r.status == "ok" and r.reward == 1.0 for r in g.results)]
        log.info("SFT: %d/%d demonstrations succeeded", len(good), len(specs))
        return good

    # ------------------------------------------------------------------ RL (sync)
    def _start_rl(self) -> None:
        """Once per run (a resume past the first RL checkpoint keeps the restored optimizer state)."""
        if not self.meta.get("rl_started"):
            if self.learner.start_rl():
                log.info("RL phase: fresh optimizer state (config.rl_optim, lr %s)", self.cfg.rl_optim.learning_rate)
            self.meta["rl_started"] = True
        self.learner.init_reference(self.workdir / "reference")  # KL reference: saved once, restored on resume

    async def rl_sync(self) -> None:
        self._start_rl()
        while self.meta["rl_step"] < self.cfg.train.steps:
            k = self.meta["rl_step"]
            specs = R.plan_step(self.cfg, self.train_tasks, k)
            t = time.monotonic()
            await self.train_rollouts.run(specs)
            rollout_s = time.monotonic() - t
            await self._train_on({s.rollout_id for s in specs}, rollout_s)
            await self._maybe_eval()

    async def _maybe_eval(self) -> None:
        e = self.cfg.eval
        k = self.meta["rl_step"]
        if e.every > 0 and (k % e.every == 0 or k == self.cfg.train.steps):
            await self.evaluate()

    async def _train_on(self, ids: set[str], rollout_s: float) -> None:
        """One RL step on the (unconsumed) rollouts `ids`: seal, build, train, push weights, commit."""
        ids = ids - self.consumed
        results = _results(self.train_rollouts.runner.results_path, ids)
        t = time.monotonic()
        B.seal(self.train_rollouts.capture_path, self.workdir / "shards")
        groups = B.load_groups(self.workdir / "shards", ids)
        batch = B.build_batch(groups, self.pcfg, current_version=self.learner.step,
                              max_off_policy=self.cfg.rollout.max_off_policy_steps,
                              loss_slots_k=self.cfg.train.loss_slots)
        tree_s = time.monotonic() - t
        m = rollout_metrics(results)
        m.update(rollout_s=rollout_s, tree_s=tree_s, stale_groups=batch.stale_groups,
                 stale_rollouts=batch.stale_rollouts, rejected_calls=len(batch.rejections),
                 tree_compression=batch.flat_tokens / max(batch.tree_tokens, 1))
        generated = sum(len(c.completion_ids) for g in groups for c in g.calls)  # every call the policy answered
        m["rollout/generated_tokens"] = float(generated)
        m["rollout/tokens_per_s"] = generated / max(rollout_s, 1e-9)  # generation throughput seen by the harnesses
        if batch.trees:
            m["staleness"] = self.learner.step - batch.min_version
            t = time.monotonic()
            m.update(await asyncio.to_thread(self.learner.train, batch))
            m["train_s"] = time.monotonic() - t
            m["trained_tokens_per_s"] = batch.tree_tokens / max(m["train_s"], 1e-9)
            m["sync_s"] = await self._push_weights()
        for h in {r.harness for r in results}:
            hr = [r for r in results if r.harness == h]
            m[f"rollout/{h}/trained_groups"] = float(len({r.group_id for r in hr if r.rollout_id in batch.trained_ids}))
        self.meta["rl_step"] += 1
        dropped = (batch.rollout_ids | ids) - batch.trained_ids
        self._commit_step("rl", batch.trained_ids, dropped & {r.rollout_id for r in results}, m, kind="train")
        log.info("rl step %d: reward %.3f pass %.3f", self.meta["rl_step"], m.get("rollout/all/reward", 0.0),
                 m.get("rollout/all/pass_rate", 0.0))

    # ------------------------------------------------------------------ RL (async)
    async def rl_async(self) -> None:
        """Rollout rounds run ahead of the learner (at most `lookahead` rounds); staleness is bounded per group."""
        self._start_rl()
        queue: asyncio.Queue = asyncio.Queue()
        ahead = asyncio.Event()
        start = self.meta["rl_step"]

        async def produce():
            r = start
            while r < self.cfg.train.steps:
                while r - self.meta["rl_step"] > self.cfg.rollout.lookahead:
                    ahead.clear()
                    await ahead.wait()
                specs = R.plan_step(self.cfg, self.train_tasks, r)
                t = time.monotonic()
                await self.train_rollouts.run(specs)
                await queue.put(({s.rollout_id for s in specs}, time.monotonic() - t))
                r += 1

        producer = asyncio.create_task(produce())
        try:
            while self.meta["rl_step"] < self.cfg.train.steps:
                ids, rollout_s = await queue.get()
                await self._train_on(ids, rollout_s)
                ahead.set()
                await self._maybe_eval()
        finally:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
