"""Rollout side of the loop: engine + shim + runner in this process, one plan per training step.

Why per-step rollout ids (`s00012.task.harness.3`): the capture log, the runner's results log and the
sealed shards are all keyed by rollout / group id, and a task may be drawn again at a later step. A
step-qualified id makes every rollout unique for the whole run, so "consumed" is a plain set of ids
and a resumed run recognises exactly the rollouts it already has (the runner skips them).

The plan for step k is a pure function of (seed, k): after a crash the same command replans the same
rollouts, finds the finished ones in `results.jsonl` and only runs the missing ones.
"""

from __future__ import annotations

import dataclasses
import pathlib
import random
from collections.abc import Sequence

from harness_env.harnesses import get_harness, harness_names
from harness_env.runner import RolloutSpec, Runner, RunnerConfig
from harness_env.sandbox import Limits
from harness_env.tasks import select_tasks
from research.capture import CaptureLog, RolloutResult
from research.serving.api import Engine, GenerateRequest
from research.shim.server import ShimServer
from research.shim.session import ShimOptions


@dataclasses.dataclass(frozen=True)
class StepSpec(RolloutSpec):
    """A RolloutSpec whose ids carry the training step, a tag ("train", "eval", "demo") and the sampling
    round of the step (> 0: extra rounds of dynamic sampling)."""

    step: int = 0
    tag: str = "train"
    round: int = 0

    @property
    def _prefix(self) -> str:
        return f"{self.tag}{self.step:05d}" + (f"r{self.round}" if self.round else "")

    @property
    def group_id(self) -> str:
        return f"{self._prefix}/{self.task_dir.name}/{self.harness}"

    @property
    def rollout_id(self) -> str:
        return f"{self._prefix}.{super().rollout_id}"


def step_key(step: int) -> str:
    """The key RL step `step` seals its groups under (research/data/shards.py)."""
    return f"train{step:05d}"


def task_dirs(tasks, root: pathlib.Path, split: str) -> list[pathlib.Path]:  # noqa: ANN001
    """The task folders of `split` ("train" | "heldout") through the one task selection of harness_env
    (harness_env/tasks/select.py, also behind launch.eval). `config.tasks.source`: `make_file` (the family,
    generated under root/tasks), `web` (the web family, under root/web_tasks), `library`, `dir` (`train_dir` /
    `eval_dir` as given), or a folder of ClawGym tasks (e.g. ../shared/clawgym/train) split by a seeded hash
    (`seed`, `heldout_fraction`); `limit` > 0: a seeded sample of that many tasks per split."""
    kw = dict(seed=tasks.seed, heldout_fraction=tasks.heldout_fraction, limit=tasks.limit or None, scratch=root,
              exclude_flags=tuple(tasks.exclude_flags))
    if tasks.source == "dir":
        return select_tasks(tasks.train_dir if split == "train" else tasks.eval_dir, **kw)
    return select_tasks(tasks.source, split=split, **kw)


def harness_weights(cfg) -> list[tuple[str, float]]:  # noqa: ANN001
    """`config.rollout.harnesses` is "name:weight,name:weight" (weight defaults to 1); names must be registered."""

    out = []
    for item in str(cfg.rollout.harnesses).split(","):
        name, _, w = item.strip().partition(":")
        try:
            out.append((name, float(w) if w else 1.0))
        except ValueError:
            raise ValueError(f"config.rollout.harnesses={cfg.rollout.harnesses!r}: weight {w!r} of {name!r} is "
                             "not a number") from None
    if not out or any(w <= 0 for _, w in out):
        raise ValueError(f"config.rollout.harnesses={cfg.rollout.harnesses!r}: need name[:weight>0],...")
    unknown = [n for n, _ in out if n not in harness_names()]
    if unknown:
        raise ValueError(f"config.rollout.harnesses={cfg.rollout.harnesses!r}: unknown harness(es) {unknown}; "
                         f"known: {harness_names()}")
    return out


def plan_step(cfg, tasks: Sequence[pathlib.Path], step: int, tag: str = "train",  # noqa: ANN001
              round: int = 0) -> list[StepSpec]:
    """groups_per_step (task, harness) groups of group_size samples; harnesses drawn by weight. A pure
    function of (seed, step, round), so a resumed run replans exactly the same rollouts."""
    rng = random.Random(cfg.seed * 1_000_003 + step + 7_919 * round)
    hw = harness_weights(cfg)
    specs = []
    picked = rng.sample(list(tasks), k=min(cfg.rollout.groups_per_step, len(tasks)))
    for i, t in enumerate(picked):
        # only harnesses that can run the task (a browser agent runs web tasks only, a CLI without browser
        # tools CLI tasks only: harnesses.base.Harness.supports); all of them if none can (a harness_error)
        fit = [(n, w) for n, w in hw if _supports(n, pathlib.Path(t))] or hw
        names, weights = [n for n, _ in fit], [w for _, w in fit]
        # every harness gets a share of groups (round robin) once there are at least as many groups
        h = names[i % len(names)] if cfg.rollout.groups_per_step >= len(names) and len(set(weights)) == 1 \
            else rng.choices(names, weights)[0]
        specs += [StepSpec(pathlib.Path(t), h, k, step=step, tag=tag, round=round)
                  for k in range(cfg.rollout.group_size)]
    return specs


def _supports(harness: str, task_dir: pathlib.Path) -> bool:

    return get_harness(harness).supports((task_dir / "env" / "env.json").is_file()) is None


def groups_with_signal(results: Sequence[RolloutResult]) -> int:
    """Groups (by group id) whose finished rollouts got at least two different rewards."""
    by_group: dict[str, set] = {}
    for r in results:
        if r.status == "ok" and r.reward is not None:
            by_group.setdefault(r.group_id, set()).add(r.reward)
    return sum(len(v) > 1 for v in by_group.values())


def plan_eval(cfg, tasks: Sequence[pathlib.Path], step: int) -> list[StepSpec]:
    """`eval.samples` rollouts per held-out task and harness (one greedy one by default; sampled at
    `eval.temperature` otherwise); eval ids are tagged "eval" + the step."""
    n = cfg.eval.num_tasks
    chosen = list(tasks)[:n] if n and n > 0 else list(tasks)
    return [StepSpec(pathlib.Path(t), h, k, step=step, tag="eval") for t in chosen for h, _ in harness_weights(cfg)
            for k in range(cfg.eval.samples)]


class RolloutService:
    """Shim over an engine + a Runner writing into the run's capture log; `await run(specs)`."""

    def __init__(self, cfg, workdir: pathlib.Path, engine, tokenizer, *,
                 name: str = "rollouts", capture_path: pathlib.Path | None = None, sampling: dict | None = None,
                 backend=None, max_new_tokens: int | None = None, progress: bool | None = None):
        self.cfg, self.workdir, self.engine = cfg, workdir, engine
        harness_weights(cfg)  # unknown harness names fail here, before any sandbox starts
        self.capture_path = capture_path or workdir / "capture.jsonl"
        self.capture = CaptureLog(self.capture_path, fsync=cfg.rollout.fsync)
        sock = workdir / f"{name}.sock"
        opts = ShimOptions(enable_thinking=cfg.rollout.enable_thinking,
                           default_max_tokens=cfg.rollout.max_new_tokens,
                           sampling_override=dict(sampling if sampling is not None else self.train_sampling()),
                           vision=engine.image_processor)  # a vision-language policy sees the harness's images
        cap = max_new_tokens or cfg.rollout.max_new_tokens
        self.shim = ShimServer(CappedEngine(engine, cap), tokenizer, self.capture,
                               unix_socket=str(sock), options=opts)
        r = cfg.rollout
        self.runner_cfg = RunnerConfig(
            out_dir=workdir / name, backend=r.backend, concurrency=r.concurrency, timeout_s=r.timeout_s,
            reward_timeout_s=r.reward_timeout_s, infra_retries=r.infra_retries, max_turns=r.max_turns,
            limits=Limits(cpus=r.sandbox_cpus, memory_mb=r.sandbox_memory_mb, pids=512, wall_s=r.timeout_s + 30,
                          workspace_mb=r.workspace_mb, home_mb=r.home_mb),
            progress=r.progress if progress is None else progress, progress_label=name,
            undeclared_inputs=cfg.tasks.undeclared_inputs)
        self.runner = Runner(self.runner_cfg, self.shim, capture_log=self.capture, backend=backend)
        self._started = False

    def train_sampling(self) -> dict:
        r = self.cfg.rollout
        return {"temperature": r.temperature, "top_p": r.top_p}

    async def start(self) -> None:
        if not self._started:
            await self.shim.start()
            self._started = True

    async def run(self, specs: Sequence[StepSpec]) -> list[RolloutResult]:
        await self.start()
        return await self.runner.run(specs)

    async def close(self) -> None:
        if self._started:
            await self.shim.stop()
            self._started = False
        self.runner.close()
        self.capture.close()


class CappedEngine(Engine):
    """Caps every call's max_new_tokens (harnesses ask for 1k-32k; a CPU policy must stay short).

    Pass-through otherwise: pause/resume/update_weights reach the wrapped engine."""

    def __init__(self, inner: Engine, max_new_tokens: int):
        self.inner, self.max_new = inner, int(max_new_tokens)

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    @property
    def max_context(self) -> int:
        return self.inner.max_context

    @property
    def image_processor(self):  # noqa: ANN201
        return self.inner.image_processor

    def stream(self, req: GenerateRequest):
        sp = dataclasses.replace(req.sampling, max_new_tokens=min(req.sampling.max_new_tokens, self.max_new))
        return self.inner.stream(dataclasses.replace(req, sampling=sp))

    async def pause(self) -> None:
        await self.inner.pause()

    async def resume(self) -> None:
        await self.inner.resume()

    async def update_weights(self, params, version: int) -> None:  # noqa: ANN001
        await self.inner.update_weights(params, version)

    async def close(self) -> None:
        await self.inner.close()
