"""The black-box RL loop: rollouts through real harnesses -> trees -> tree GRPO/PPO -> weights -> repeat.

`train(config, workdir)` is the one library function behind `python -m launch.train`. Phases:
  1. (optional) SFT warm start (harness_env/rl/sft.py);
  2. RL: per step, the rollouts of the step's plan (sync) or of the next finished rollout round (async,
     bounded staleness) -> one keyed seal -> the grain stream's next batch -> the RL update -> weights to
     the engine. With `rl.filter_groups` and `rollout.max_extra_rounds`, a step whose groups carry too
     little signal samples more groups first (DAPO dynamic sampling).
  Held-out evaluation (greedy, or `eval.samples` per task at `eval.temperature`) before training, every
  `eval.sft_every` SFT steps, after SFT and every `eval.every` RL steps.

Durability: see research/rl/run_state.py. The policy version (SFT + RL steps done) tags the engine's
generations, the checkpoint steps and the metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import pathlib
import time

import jax

from harness_env.rl import branching
from harness_env.rl import rollouts as R
from harness_env.rl.sft import sft_phase
from harness_env.sandbox import get_backend
from harness_env.tasks.validate import keep_valid
from research.capture import RolloutResult, read_log
from research.data.pipeline import step_stream
from research.data.shards import seal_log
from research.models.tokenizer import load_tokenizer
from research.rl import batches as B
from research.rl import dlogp
from research.rl.config import RunConfig
from research.rl.console import Progress, close_bars
from research.rl.metrics import MetricsWriter, plot_rewards, rollout_metrics
from research.rl.run_state import RunState
from research.rl.sync import get_sync
from research.rl.trainer import Learner
from research.serving import factory  # factory.policy_engine: the seam tests put a scripted policy in
from research.shim.images import IMAGE_PAD, ImageStore
from research.train import distributed

log = logging.getLogger(__name__)


def train(config, workdir: str | os.PathLike) -> dict:  # noqa: ANN001
    """Runs (or resumes) the configured run in `workdir`; returns the final summary dict.

    The config is validated with the real device count before anything starts (no engine, no sandbox, no
    file in `workdir`): a mesh the devices cannot hold fails here, not after the first rollouts."""
    run = RunConfig.of(config, check=False)
    if run.distributed.enabled:  # before the first JAX call: the device count is the whole job's after it

        # config, then env, then JAX's auto-detection (TPU pods, SLURM); process id 0 is an id, not "unset"
        distributed.initialize(dataclasses.asdict(run.distributed))
    run = RunConfig.of(run, num_devices=jax.device_count())
    workdir = pathlib.Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(json.dumps(run.to_dict(), indent=2, default=str))
    return asyncio.run(Loop(run, workdir).run_loop())


def results_of(path: pathlib.Path, ids: set[str]) -> list[RolloutResult]:
    if not path.exists():
        return []
    by_id = {r.rollout_id: r for r in read_log(path) if isinstance(r, RolloutResult) and r.rollout_id in ids}
    return list(by_id.values())


def step_images(run: RunConfig, tok, captures: list[pathlib.Path]) -> B.StepImages | None:  # noqa: ANN001
    """A vision policy's image source: the shim's stores beside these capture logs (research/shim/images.py: the
    bytes as each harness sent them), read by content hash; None for a text policy. The tokenizer's placeholder
    must be the one the trees are cut at."""
    if run.vision is None:
        return None
    if tok.token_to_id(IMAGE_PAD) != run.image_pad_id:
        raise ValueError(f"the tokenizer's {IMAGE_PAD} is {tok.token_to_id(IMAGE_PAD)}, the vision policy's image "
                         f"token {run.image_pad_id}: not a Qwen3(-VL) tokenizer")
    stores = [ImageStore(c.with_name(c.name + ".images")) for c in captures]

    def load(sha: str) -> bytes:
        for store in stores:
            if store.path(sha) is not None:
                return store.get(sha)
        raise KeyError(f"image {sha} is in none of {[str(s.root) for s in stores]}")

    return B.StepImages(load=load, processor=run.processor(), side=run.vision.side)


class Loop:
    def __init__(self, config, workdir: pathlib.Path):  # noqa: ANN001

        self.learner = Learner(config)
        self.run, self.workdir = self.learner.run, workdir
        self.tok = load_tokenizer(self.run.tokenizer_dir or None)
        self.pcfg, self.bcfg = self.run.pipeline(), self.run.batching()
        self.images = step_images(self.run, self.tok, [workdir / "capture.jsonl", workdir / "demos" / "capture.jsonl"])
        self.state = RunState(workdir, save_every=self.run.checkpoint.every, keep=self.run.checkpoint.keep)
        restored = self.state.restore(self.learner.abstract)
        if restored is not None:
            self.learner.restore(restored)
        self.metrics = MetricsWriter(workdir, tensorboard=self.run.metrics.tensorboard)
        self.sync = get_sync(self.run.sync.kind)
        self.stream = step_stream(workdir / "shards", self.pcfg)
        if "rl" in self.state.data_state:
            self.stream.set_state(self.state.data_state["rl"])
        self.engine = None
        self._engine_seen: dict[str, int] = {}
        self._branch_s: dict[int, float] = {}  # RL step -> seconds its forked children's round took

    # ------------------------------------------------------------------ setup
    async def _phases(self) -> None:
        if self.state.version == 0 and self.run.eval.at_start:
            await self.evaluate()
        if self.run.sft.steps > 0 and self.state.sft_step < self.run.sft.steps:
            await sft_phase(self)
        if self.run.algo != "sft":
            await (self.rl_async() if self.run.rollout.mode == "async" else self.rl_sync())
        self.state.finish(self.learner.state)

    async def _validate_tasks(self) -> None:
        """Leaves out the tasks whose untouched workspace errs or scores 1.0 (harness_env/tasks/validate.py);
        what was left out, and why, goes to workdir/task_validation.json and the log."""

        backend = get_backend(self.run.rollout.backend)
        report = {}
        for split in ("train", "eval"):
            dirs = getattr(self, f"{split}_tasks")
            kept, dropped = await keep_valid(backend, dirs, concurrency=self.run.rollout.concurrency)
            if not kept:
                raise ValueError(f"task validation left no {split} task of {len(dirs)}: "
                                 f"e.g. {list(dropped.items())[:2]}")
            setattr(self, f"{split}_tasks", kept)
            report[split] = {"tasks": len(dirs), "kept": len(kept), "dropped": dropped}
            logging.info("task validation (%s): kept %d of %d tasks", split, len(kept), len(dirs))
        (self.workdir / "task_validation.json").write_text(json.dumps(report, indent=1))

    async def run_loop(self) -> dict:

        self.engine = factory.policy_engine(self.run, self.learner.params_copy(), weight_version=self.state.version)
        self.train_rollouts = R.RolloutService(self.run, self.workdir, self.engine, self.tok)
        self.eval_rollouts = R.RolloutService(self.run, self.workdir, self.engine, self.tok, name="eval",
                                              capture_path=self.workdir / "eval_capture.jsonl",
                                              sampling={"temperature": self.run.eval.temperature},
                                              progress=True)  # an "eval" bar, on a terminal only
        self.train_tasks = R.task_dirs(self.run.tasks, self.workdir, "train")
        self.eval_tasks = R.task_dirs(self.run.tasks, self.workdir, "heldout")
        if self.run.tasks.validate:
            await self._validate_tasks()
        t0 = time.monotonic()
        try:
            await self._phases()
        finally:
            close_bars()  # a phase that ended by an error leaves its bar open
            await self.train_rollouts.close()
            await self.eval_rollouts.close()
            await self.engine.close()
            self.state.close()
            self.metrics.close()
        plot_rewards(self.workdir)
        summary = {"version": self.state.version, "rl_step": self.state.rl_step, "sft_step": self.state.sft_step,
                   "optimizer_steps": self.learner.step, "wall_s": time.monotonic() - t0,
                   "consumed": len(self.state.consumed)}
        (self.workdir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    async def push_weights(self) -> float:
        t = time.monotonic()
        await self.sync(self.engine, self.learner, self.state.version, self.workdir)
        dt = time.monotonic() - t
        self.metrics.write(self.state.version, {"sync_s": dt}, kind="sync")
        return dt

    def maybe_plot(self) -> None:
        if self.state.version % self.run.metrics.plot_every == 0:
            plot_rewards(self.workdir)

    # ------------------------------------------------------------------ eval
    async def evaluate(self) -> dict:
        specs = R.plan_eval(self.run, self.eval_tasks, self.state.version)
        t = time.monotonic()
        await self.eval_rollouts.run(specs)
        res = results_of(self.eval_rollouts.runner.results_path, {s.rollout_id for s in specs})
        m = rollout_metrics(res, prefix="eval")
        m["eval/wall_s"] = time.monotonic() - t
        m["eval/elapsed_min"] = self.state.work_s / 60  # the run's work minutes (research/rl/run_state.py)
        self.metrics.write(self.state.version, m, kind="eval")
        log.info("eval at version %d: pass rate %.3f", self.state.version, m.get("eval/all/pass_rate", 0.0))
        return m

    # ------------------------------------------------------------------ RL
    def _start_rl(self) -> None:
        """Once per run (a resume past the first RL checkpoint keeps the restored optimizer state)."""
        if not self.state.meta.get("rl_started"):
            if self.learner.start_rl():
                log.info("RL phase: fresh optimizer state (config.rl_optim, lr %s)", self.run.rl_optim.learning_rate)
            self.state.meta["rl_started"] = True
        self.learner.init_reference(self.workdir / "reference")  # KL reference: saved once, restored on resume
        self.rl_progress = Progress("rl", self.run.train.steps, done=self.state.rl_step)

    async def _rollout_step(self, k: int) -> tuple[set[str], float]:
        """The rollouts of RL step k: the plan, plus extra rounds while too few groups carry signal, then the
        forked children of some of them (`rollout.branch`: harness_env/rl/branching.py), in their groups."""
        t = time.monotonic()
        ids: set[str] = set()
        planned: list[R.StepSpec] = []
        for rnd in range(1 + (self.run.rollout.max_extra_rounds if self.run.rl.filter_groups else 0)):
            specs = R.plan_step(self.run, self.train_tasks, k, round=rnd)
            await self.train_rollouts.run(specs)
            planned += specs
            ids |= {s.rollout_id for s in specs}
            if R.groups_with_signal(results_of(self.train_rollouts.runner.results_path, ids)) >= \
                    self.run.rollout.groups_per_step:
                break
        tb = time.monotonic()
        ids |= {s.rollout_id for s in await branching.run_children(self.train_rollouts, self.run, planned)}
        self._branch_s[k] = time.monotonic() - tb
        return ids, time.monotonic() - t

    async def rl_sync(self) -> None:
        self._start_rl()
        while self.state.rl_step < self.run.train.steps:
            k = self.state.rl_step
            ids, rollout_s = await self._rollout_step(k)
            await self.train_on(k, ids, rollout_s)
            await self._maybe_eval()

    async def _maybe_eval(self) -> None:
        e, k = self.run.eval, self.state.rl_step
        if e.every > 0 and (k % e.every == 0 or k == self.run.train.steps):
            await self.evaluate()

    async def train_on(self, k: int, ids: set[str], rollout_s: float) -> None:
        """RL step k on its rollouts `ids`: seal (keyed) -> the stream's next batch -> update -> weights -> commit."""
        results = results_of(self.train_rollouts.runner.results_path, ids)
        t = time.monotonic()
        key = R.step_key(k)
        seal_log(self.train_rollouts.capture_path, self.workdir / "shards", key=key, rollout_ids=ids,
                 groups_per_shard=1 << 30)
        sealed = next(self.stream)
        if sealed.key != key:
            raise RuntimeError(f"RL step {k}: the data stream is at sealed batch {sealed.key!r}, expected {key!r} "
                               f"(shards of {self.workdir / 'shards'} out of step with the checkpoint)")
        items = [it for it in sealed.items if not (it.rollout_ids & self.state.consumed)]
        batch = B.build_batch(items, self.bcfg, current_version=self.state.version,
                              max_off_policy=self.run.rollout.max_off_policy_steps,
                              loss_slots_k=self.run.train.loss_slots, max_groups=self._max_groups(),
                              images=self.images)
        m = self._rollout_metrics(results, batch, rollout_s, tree_s=time.monotonic() - t)
        if self.run.rollout.branch:
            m["branch/rollout_s"] = self._branch_s.pop(k, 0.0)
        if not batch.empty:
            t = time.monotonic()
            m.update(await asyncio.to_thread(self.learner.train, batch))
            m["train_s"] = time.monotonic() - t
            m["trained_tokens_per_s"] = batch.tree_tokens / max(m["train_s"], 1e-9)
        self.state.meta["rl_step"] += 1
        if not batch.empty and self.learner.last_dlogp is not None:  # the viewer's token view: this update's effect
            await asyncio.to_thread(dlogp.save, dlogp.path_of(self.workdir, self.state.version), batch.trees,
                                    self.learner.last_dlogp)
        # pushed even when nothing was trained: the engine tags generations with the new version (unchanged
        # weights), so staleness keeps counting versions the learner really moved through
        m["sync_s"] = await self.push_weights()
        dropped = (batch.rollout_ids | ids) - batch.trained_ids
        self.metrics.write(self.state.version, m, kind="train")
        self.state.commit("rl", self.learner.state, trained=batch.trained_ids,
                          dropped=dropped & {r.rollout_id for r in results},
                          data_state={**self.state.data_state, "rl": self.stream.get_state()})
        self.maybe_plot()
        log.info(self.rl_progress.line(self.state.rl_step, {
            "reward": m.get("rollout/all/reward", 0.0), "pass": m.get("rollout/all/pass_rate", 0.0),
            "kl_ref": m.get("kl_ref"), "signal_groups": m.get("signal_groups")}))

    def _max_groups(self) -> int | None:
        extra = self.run.rl.filter_groups and self.run.rollout.max_extra_rounds > 0
        return self.run.rollout.groups_per_step if extra else None

    def _rollout_metrics(self, results, batch: B.StepBatch, rollout_s: float, tree_s: float) -> dict:
        # the step's sampled rollouts; forked children (a biased sample: children of chosen rollouts) apart
        m = rollout_metrics([r for r in results if not branching.is_child(r)])
        m.update(branching.branch_metrics(results))
        m.update(rollout_s=rollout_s, tree_s=tree_s, stale_groups=batch.stale_groups,
                 stale_rollouts=batch.stale_rollouts, filtered_groups=batch.filtered_groups,
                 rejected_calls=len(batch.rejections), tree_compression=batch.flat_tokens / max(batch.tree_tokens, 1),
                 tree_tokens=float(batch.tree_tokens), flat_tokens=float(batch.flat_tokens))
        # completions a forked child's shim answered from its parent's records took no engine time
        replayed = sum((r.meta["replay"] or {}).get("replayed_tokens", 0) for r in results
                       if branching.is_child(r) and r.rollout_id in batch.trained_ids)
        generated = sum(c.completion_len for t in batch.trees for c in t.calls) - replayed
        m["rollout/generated_tokens"] = float(generated)
        m["rollout/tokens_per_s"] = generated / max(rollout_s, 1e-9)  # generation throughput seen by the harnesses
        if batch.trees:
            m["staleness"] = self.state.version - batch.min_version
        m.update(self._engine_reuse())
        return m

    def _engine_reuse(self) -> dict:
        """The engine's prompt tokens since the previous train step (its evals included): requested, computed
        (prefilled) and the share it served from cached slots. Why: a real CLI's ~9k-token prompt is the same
        for every call of a group; without slot reuse the engine would prefill it once per call."""
        stats = getattr(self.engine, "stats", None)
        if not isinstance(stats, dict):  # an external server (SGLang) reports its own cache metrics
            return {}
        now = {k: int(stats.get(k, 0)) for k in ("prefill_tokens", "reused_tokens")}
        prev, self._engine_seen = self._engine_seen, now
        computed, reused = (now[k] - prev.get(k, 0) for k in ("prefill_tokens", "reused_tokens"))
        requested = computed + reused
        return {"engine/prompt_tokens": float(requested), "engine/prefill_tokens": float(computed),
                "engine/prefill_reuse": reused / requested if requested else 0.0}

    async def rl_async(self) -> None:
        """Rollout rounds run ahead of the learner (at most `lookahead` rounds); staleness is bounded per group."""
        self._start_rl()
        queue: asyncio.Queue = asyncio.Queue()
        ahead = asyncio.Event()
        start = self.state.rl_step

        async def produce():
            r = start
            while r < self.run.train.steps:
                while r - self.state.rl_step > self.run.rollout.lookahead:
                    ahead.clear()
                    await ahead.wait()
                ids, rollout_s = await self._rollout_step(r)
                await queue.put((r, ids, rollout_s))
                r += 1

        producer = asyncio.create_task(produce())
        try:
            while self.state.rl_step < self.run.train.steps:
                get = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({get, producer}, return_when=asyncio.FIRST_COMPLETED)
                if get not in done:  # the producer died: surface its error instead of waiting forever
                    get.cancel()
                    producer.result()
                    raise RuntimeError("rollout producer stopped before the last RL step")
                k, ids, rollout_s = get.result()
                await self.train_on(k, ids, rollout_s)
                ahead.set()
                await self._maybe_eval()
        finally:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
