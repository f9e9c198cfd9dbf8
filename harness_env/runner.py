"""The rollout runner: tasks x harnesses x samples, each in its own sandbox, talking to the shim.

One rollout: load the task -> open a shim session -> fresh workspace (task inputs) and HOME (harness
config) -> sandbox -> run the harness (per-rollout timeout) -> close the session (its calls are in
the capture log) -> only now copy `reward/` in and grade -> one RolloutResult. Infrastructure
failures (harness install, sandbox start/exec errors) are retried; model failures never are: a
harness that ran and failed is `harness_error`, one that hung is `timeout`, a broken task is
`task_error`, a broken checker `reward_error` — the run always goes on. Each result is appended
(fsync'd) to `results.jsonl` and to the shared capture log the moment it is known, so a crashed run
resumes where it stopped: rollouts with a final status in results.jsonl are skipped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import re
import shutil
import time
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import urlparse

from harness_env.harnesses.base import Harness, HarnessError, SessionContext, get_harness
from harness_env.sandbox.base import HOME, WORKSPACE, Backend, Limits, Mount, SandboxError, SandboxSpec, get_backend
from harness_env.tasks.loader import RewardError, Task, TaskError, grade, load_task
from research.capture import CaptureLog, RolloutResult, read_log

RETRYABLE = "infra_error"  # the one status a resumed run tries again


class Gateway(Protocol):
    """What the runner needs from the shim (research/shim/server.ShimServer satisfies it)."""

    unix_socket: str | None

    async def open_session(self, rollout_id: str, group_id: str, harness: str, *, meta: dict | None = None): ...

    async def close_session(self, session_id: str) -> list: ...


@dataclasses.dataclass
class RunnerConfig:
    out_dir: pathlib.Path
    backend: str = "bwrap"
    concurrency: int = 8
    timeout_s: float = 300.0
    reward_timeout_s: float = 60.0
    infra_retries: int = 2
    limits: Limits = dataclasses.field(default_factory=Limits)
    model: str = "policy"
    max_turns: int = 30
    shim_port: int = 18080
    keep_workspaces: bool = False
    progress: bool = True


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    task_dir: pathlib.Path
    harness: str
    sample: int

    @property
    def group_id(self) -> str:
        return f"{self.task_dir.name}/{self.harness}"

    @property
    def rollout_id(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self.task_dir.name}.{self.harness}.{self.sample}")


def plan(task_dirs: Sequence[pathlib.Path], harnesses: Sequence[str], samples: int) -> list[RolloutSpec]:
    return [RolloutSpec(pathlib.Path(t), h, k) for t in task_dirs for h in harnesses for k in range(samples)]


class _Infra(Exception):
    """Retryable failure of one attempt."""


def finished_ids(results_path: pathlib.Path) -> set[str]:
    if not results_path.exists():
        return set()
    return {r.rollout_id for r in read_log(results_path) if isinstance(r, RolloutResult) and r.status != RETRYABLE}


class Runner:
    def __init__(self, config: RunnerConfig, gateway: Gateway, *, capture_log: CaptureLog | None = None,
                 backend: Backend | None = None):
        self.cfg = config
        self.gateway = gateway
        self.capture = capture_log
        self.backend = backend or get_backend(config.backend)
        self.cfg.out_dir.mkdir(parents=True, exist_ok=True)
        self.results_path = self.cfg.out_dir / "results.jsonl"
        self._results = CaptureLog(self.results_path)

    def close(self) -> None:
        self._results.close()

    async def run(self, specs: Sequence[RolloutSpec]) -> list[RolloutResult]:
        """Runs every spec not finished before; returns the results of this invocation."""
        done = finished_ids(self.results_path)
        todo = [s for s in specs if s.rollout_id not in done]
        for name in sorted({s.harness for s in todo}):
            get_harness(name)  # an unknown harness name is a configuration error: fail before starting
        sem = asyncio.Semaphore(self.cfg.concurrency)
        bar = _progress(len(todo), self.cfg.progress)

        async def one(spec: RolloutSpec) -> RolloutResult:
            async with sem:
                res = await self.run_one(spec)
            self._results.append(res)
            if self.capture is not None:
                self.capture.append(res)
            bar.update(1)
            bar.set_postfix_str(f"{spec.rollout_id}: {res.status}", refresh=False)
            return res

        try:
            return list(await asyncio.gather(*(one(s) for s in todo)))
        finally:
            bar.close()

    async def run_one(self, spec: RolloutSpec) -> RolloutResult:
        t0 = time.monotonic()
        base = dict(rollout_id=spec.rollout_id, group_id=spec.group_id, harness=spec.harness)
        meta: dict[str, Any] = {"task_dir": str(spec.task_dir), "sample": spec.sample, "backend": self.cfg.backend}
        try:
            task = load_task(spec.task_dir)
        except TaskError as e:
            return RolloutResult(**base, status="task_error", message=str(e), meta=meta)
        meta.update(task_id=task.task_id, category=task.category)
        harness = get_harness(spec.harness)
        last = ""
        for attempt in range(1 + self.cfg.infra_retries):
            meta["attempts"] = attempt + 1
            try:
                res = await self._attempt(spec, task, harness, meta)
            except HarnessError as e:  # the adapter itself refused (bad config, unparsable output)
                res = RolloutResult(**base, status="harness_error", message=str(e), meta=meta)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # _Infra, or anything unexpected: retried, never fatal for the run
                last = str(e) if isinstance(e, _Infra) else f"{type(e).__name__}: {e}"
                await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
                continue
            res.timings["total_s"] = time.monotonic() - t0
            return res
        msg = f"after {self.cfg.infra_retries + 1} attempts: {last}"
        return RolloutResult(**base, status="infra_error", message=msg, meta=meta,
                             timings={"total_s": time.monotonic() - t0})

    def _rollout_dir(self, spec: RolloutSpec) -> pathlib.Path:
        return self.cfg.out_dir / "rollouts" / spec.rollout_id

    async def _attempt(self, spec: RolloutSpec, task: Task, harness: Harness, meta: dict) -> RolloutResult:
        timings: dict[str, float] = {}
        base = dict(rollout_id=spec.rollout_id, group_id=spec.group_id, harness=spec.harness, meta=meta,
                    timings=timings)
        t = time.monotonic()
        try:
            await harness.install()
        except Exception as e:  # npm/network/disk: infrastructure
            raise _Infra(f"installing {harness.name}: {e}") from e
        timings["install_s"] = time.monotonic() - t
        rdir = self._rollout_dir(spec)
        shutil.rmtree(rdir, ignore_errors=True)
        workspace, home = rdir / "workspace", rdir / "home"
        try:
            task.populate(workspace)
            session = await self.gateway.open_session(spec.rollout_id, spec.group_id, harness.name,
                                                      meta={"task_id": task.task_id, "sample": spec.sample})
        except Exception as e:  # disk, or the shim is down: infrastructure
            raise _Infra(f"opening the rollout: {type(e).__name__}: {e}") from e
        base["session_ids"] = [session.session_id]
        path = urlparse(session.base_url).path.rstrip("/")
        ctx = SessionContext(base_url=f"http://127.0.0.1:{self.cfg.shim_port}{path}", api_key=session.api_key,
                             model=self.cfg.model, home=HOME, workspace=WORKSPACE, max_turns=self.cfg.max_turns,
                             context_window=getattr(getattr(self.gateway, "engine", None), "max_context", 32768))
        session_open = True
        sbx = None
        try:
            try:
                await harness.prepare(home, ctx)
            except (HarnessError, OSError) as e:
                return RolloutResult(**base, status="harness_error", message=f"prepare: {e}")
            t = time.monotonic()
            try:
                sbx = await self.backend.create(self._sandbox_spec(spec, harness, workspace, home))
            except SandboxError as e:
                raise _Infra(str(e)) from e
            timings["sandbox_start_s"] = time.monotonic() - t
            t = time.monotonic()
            try:
                res = await sbx.exec(harness.argv(task.user_query, ctx), env=harness.env(ctx), cwd=WORKSPACE,
                                     timeout=self.cfg.timeout_s)
            except SandboxError as e:
                raise _Infra(str(e)) from e
            timings["harness_s"] = time.monotonic() - t
            records = await self.gateway.close_session(session.session_id)
            session_open = False
            meta.update(calls=len(records), exit_code=res.exit_code, oom_killed=res.oom_killed)
            await asyncio.to_thread(harness.save_logs, home, res, rdir / "logs")
            return await self._judge(sbx, task, harness, res, base)
        finally:
            if sbx is not None:
                await sbx.close()
            if session_open:
                try:
                    await self.gateway.close_session(session.session_id)
                except Exception:  # already closed, or the shim is gone: nothing left to release
                    pass
            if not self.cfg.keep_workspaces:
                await asyncio.to_thread(shutil.rmtree, workspace, True)


    def _sandbox_spec(self, spec: RolloutSpec, harness: Harness, workspace: pathlib.Path,
                      home: pathlib.Path) -> SandboxSpec:
        sock = self.gateway.unix_socket
        return SandboxSpec(workspace=workspace, home=home, limits=self.cfg.limits, name=spec.rollout_id,
                           mounts=[Mount(str(p), str(p)) for p in harness.mounts()],
                           shim_socket=pathlib.Path(sock) if sock else None, shim_port=self.cfg.shim_port,
                           labels={"harness-rl.rollout": spec.rollout_id})

    async def _judge(self, sbx, task: Task, harness: Harness, res, base: dict) -> RolloutResult:
        """The harness has exited: timeout / harness_error / reward_error / ok (graded only now)."""
        if res.timed_out:
            return RolloutResult(**base, status="timeout", message=f"harness ran past {self.cfg.timeout_s:.0f}s")
        outcome = harness.parse_output(res)
        base["meta"].update(num_turns=outcome.num_turns, final_message=outcome.final_message[-4000:],
                            harness_meta=outcome.meta)
        if not outcome.completed:
            return RolloutResult(**base, status="harness_error", message=outcome.error or "harness did not complete")
        t = time.monotonic()
        try:
            reward, subs = await grade(sbx, task, outcome.final_message, _transcript(task, outcome),
                                       timeout=self.cfg.reward_timeout_s)
        except RewardError as e:
            return RolloutResult(**base, status="reward_error", message=str(e))
        except SandboxError as e:
            raise _Infra(f"grading: {e}") from e
        base["timings"]["reward_s"] = time.monotonic() - t
        return RolloutResult(**base, status="ok", reward=reward, sub_scores=subs)


def _transcript(task: Task, outcome) -> list[dict]:
    """The chat transcript given to chat-graded checkers: what the harness reported, else query + answer."""
    t = outcome.meta.get("transcript") if isinstance(outcome.meta, dict) else None
    if isinstance(t, list):
        return t
    return [{"role": "user", "content": task.user_query}, {"role": "assistant", "content": outcome.final_message}]


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, desc="rollouts", unit="rollout", dynamic_ncols=True)
