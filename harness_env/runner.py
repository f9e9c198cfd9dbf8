"""The rollout runner: tasks x harnesses x samples, each in its own sandbox, talking to the shim.

One rollout: load the task -> disk-capped workspace (task inputs, at the task's `input_mount_dir`
inside) and HOME (harness config) -> open a shim session -> the agent's sandbox -> run the harness
(per-rollout timeout, disk watch) -> close the session (its calls are in the capture log) -> stop
every agent process and close that sandbox -> grade in a SECOND, fresh sandbox that shares only the
workspace (fresh HOME and TMP, fixed environment, no shim, no harness mounts, `reward/` freshly
copied: harness_env/tasks/loader.grade) -> one RolloutResult. Nothing the agent left outside the
workspace (user site-packages, shell startup files, background processes) exists when the checker runs.

Infrastructure failures (harness install, sandbox start/exec errors) are retried; model failures never
are: a harness that ran and failed is `harness_error`, one that hung is `timeout`, one that hit a disk
cap `disk_limit`, a broken task is `task_error` (whatever is wrong with it), a broken or non-finite
checker result `reward_error` — the run always goes on. Each result is appended (fsync'd) to
`results.jsonl` and to the shared capture log the moment it is known, so a crashed run resumes where
it stopped: rollouts with a final status in results.jsonl are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import pathlib
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import urlparse

from harness_env import attribution, tamper, workspace_changes
from harness_env.desktop import rollout as desktop
from harness_env.desktop.session import DesktopError
from harness_env.harnesses.base import Harness, HarnessError, SessionContext, WebContext, get_harness
from harness_env.sandbox import disk
from harness_env.sandbox.backends import get_backend
from harness_env.sandbox.base import HOME, Backend, Limits, Mount, SandboxError, SandboxSpec
from harness_env.tasks.loader import RewardError, Task, TaskError, grade, load_task
from harness_env.web import env as webenv
from research.capture import CaptureLog, RolloutResult, read_log
from research.rl import console
from research.shim.fork import ReplayPlan
from research.shim.session import wait_through_cancel

RETRYABLE = "infra_error"  # the one status a resumed run tries again
DISK_POLL_S = 0.5


class Gateway(Protocol):
    """What the runner needs from the shim (research/shim/server.ShimServer satisfies it)."""

    unix_socket: str | None

    async def open_session(self, rollout_id: str, group_id: str, harness: str, *, meta: dict | None = None,
                           replay: ReplayPlan | None = None): ...

    async def close_session(self, session_id: str) -> list: ...

    def replay_status(self, session_id: str) -> dict | None: ...  # asked only of forked children's sessions


@dataclasses.dataclass
class RunnerConfig:
    out_dir: pathlib.Path
    backend: str = "bwrap"
    concurrency: int = 8
    timeout_s: float = 300.0
    reward_timeout_s: float = 60.0
    infra_retries: int = 2
    limits: Limits = dataclasses.field(default_factory=Limits)  # incl. the disk caps (workspace_mb, home_mb)
    model: str = "policy"
    max_turns: int = 30
    shim_port: int = 18080
    keep_workspaces: bool = False  # keep each rollout's final workspace and HOME under out_dir/rollouts/ID
    progress: bool = True  # a bar of the rollouts on a terminal (research/rl/console.py), labelled progress_label
    progress_label: str = "rollouts"
    disk_mode: str | None = None  # tmpfs | watch (None: tmpfs where this process may mount, else watch)
    undeclared_inputs: str = "destructive"  # which input changes are tampering where a task declares nothing


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    task_dir: pathlib.Path
    harness: str
    sample: int
    # a forked child (harness_env/rl/branching.py): the shim answers its first calls from its parent's records
    replay: ReplayPlan | None = dataclasses.field(default=None, compare=False, repr=False)

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


class _DiskLimit(Exception):
    """The agent hit a disk cap: status `disk_limit`."""


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
        disk.reap_orphans()  # capped mounts of orchestrators that died
        disk.release_stale(self.cfg.out_dir / "rollouts")  # ... and any left in this run's own dir
        self.results_path = self.cfg.out_dir / "results.jsonl"
        self._results = CaptureLog(self.results_path)
        self._clean: dict[str, bool | None] = {}  # task root -> its untouched workspace grades without error

    def close(self) -> None:
        self._results.close()

    async def run(self, specs: Sequence[RolloutSpec]) -> list[RolloutResult]:
        """Runs every spec not finished before; returns the results of this invocation. If anything escapes
        (it should not: every rollout failure is a status), the other rollouts are cancelled and awaited,
        so no sandbox process outlives the call."""
        done = finished_ids(self.results_path)
        todo = [s for s in specs if s.rollout_id not in done]
        for name in sorted({s.harness for s in todo}):
            get_harness(name)  # an unknown harness name is a configuration error: fail before starting
        sem = asyncio.Semaphore(self.cfg.concurrency)
        bar = _progress(len(todo), self.cfg.progress, self.cfg.progress_label)

        async def one(spec: RolloutSpec) -> RolloutResult:
            async with sem:
                res = await self.run_one(spec)
            self._results.append(res)
            if self.capture is not None:
                self.capture.append(res)
            bar.update(1)
            bar.set_postfix_str(f"{spec.rollout_id}: {res.status}", refresh=False)
            return res

        tasks = [asyncio.ensure_future(one(s)) for s in todo]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            bar.close()

    async def run_one(self, spec: RolloutSpec) -> RolloutResult:
        t0 = time.monotonic()
        base = dict(rollout_id=spec.rollout_id, group_id=spec.group_id, harness=spec.harness)
        meta: dict[str, Any] = {"task_dir": str(spec.task_dir), "sample": spec.sample, "backend": self.cfg.backend}
        try:
            task = load_task(spec.task_dir)
        except Exception as e:  # TaskError, or anything else a hostile folder provokes: the task's problem
            msg = str(e) if isinstance(e, TaskError) else f"{spec.task_dir}: {type(e).__name__}: {e}"
            meta.update(cause=attribution.TASK, cause_why="task_error")
            return RolloutResult(**base, status="task_error", message=msg, meta=meta)
        meta.update(task_id=task.task_id, category=task.category, workspace_dir=task.workspace_dir)
        harness = get_harness(spec.harness)
        last = ""
        for attempt in range(1 + self.cfg.infra_retries):
            meta["attempts"] = attempt + 1
            try:
                res = await self._attempt(spec, task, harness, meta)
            except HarnessError as e:  # the adapter itself refused (bad config, unparsable output)
                res = RolloutResult(**base, status="harness_error", message=str(e), meta=meta)
            except TaskError as e:  # e.g. its inputs do not fit the workspace cap
                res = RolloutResult(**base, status="task_error", message=str(e), meta=meta)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # _Infra, or anything unexpected: retried, never fatal for the run
                last = str(e) if isinstance(e, _Infra) else f"{type(e).__name__}: {e}"
                await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
                continue
            res.timings["total_s"] = time.monotonic() - t0
            return _finite(await self._attribute(res, task))
        msg = f"after {self.cfg.infra_retries + 1} attempts: {last}"
        return _finite(await self._attribute(RolloutResult(**base, status="infra_error", message=msg, meta=meta,
                                                           timings={"total_s": time.monotonic() - t0}), task))

    async def _attribute(self, res: RolloutResult, task: Task) -> RolloutResult:
        """Sets `meta["cause"]` / `meta["cause_why"]` of a failed rollout (harness_env/attribution.py)."""
        if res.status == "ok":
            return res
        faults_of = getattr(self.gateway, "session_faults", None)
        faults = [f for sid in res.session_ids for f in (faults_of(sid) if faults_of else [])]
        clean = await self.grades_clean(task) if res.status == "reward_error" else None
        cause, why = attribution.cause_of(res.status, ran="exit_code" in res.meta, calls=int(res.meta.get("calls", 0)),
                                          faults=faults, clean_grade=clean)
        res.meta.update(cause=cause, cause_why=why, **({"serving_faults": faults} if faults else {}))
        return res

    async def grades_clean(self, task: Task) -> bool | None:
        """Whether `task`'s untouched workspace (its inputs only) grades without error, in a fresh verifier sandbox;
        once per task and runner. None when that could not be checked (the verifier did not start)."""
        key = str(task.root)
        if key not in self._clean:
            self._clean[key] = await self._grade_untouched(task)
        return self._clean[key]

    async def _grade_untouched(self, task: Task) -> bool | None:
        tmp = pathlib.Path(tempfile.mkdtemp(prefix="untouched-", dir=self.cfg.out_dir))
        try:
            await asyncio.to_thread(task.populate, tmp)
            spec = RolloutSpec(task.root, "untouched", 0)
            vsbx = await self.backend.create(self.verifier_spec(spec, task, tmp))
            try:
                await grade(vsbx, task, timeout=self.cfg.reward_timeout_s, max_file_bytes=_file_cap(self.cfg.limits))
                return True
            except RewardError:
                return False
            finally:
                await vsbx.close()
        except (SandboxError, TaskError, OSError):
            return None
        finally:
            await asyncio.to_thread(shutil.rmtree, tmp, True)

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
        await asyncio.to_thread(_clear, rdir)
        lim = self.cfg.limits
        caps = [disk.DiskCap(rdir / "workspace", lim.workspace_mb, self.cfg.disk_mode),
                disk.DiskCap(rdir / "home", lim.home_mb, self.cfg.disk_mode)]
        if task.web is not None:  # the app's state and socket dir: capped too (the agent can make the app write)
            caps.append(disk.DiskCap(rdir / "webenv", int(task.web.state_mb), self.cfg.disk_mode))
        try:
            try:
                await _thread_to_the_end(_setup_caps, caps)
            except OSError as e:
                raise _Infra(f"disk caps: {e}") from e
            await asyncio.to_thread(task.populate, caps[0].path)  # TaskError: the task's inputs
            try:
                return await self._rollout(spec, task, harness, base, caps)
            except _DiskLimit as e:
                return RolloutResult(**base, status="disk_limit", message=str(e))
        finally:
            await _thread_to_the_end(_release_caps, caps, self.cfg.keep_workspaces)

    async def _rollout(self, spec: RolloutSpec, task: Task, harness: Harness, base: dict,
                       caps: list[disk.DiskCap]) -> RolloutResult:
        workspace, home = caps[0].path, caps[1].path
        timings, meta = base["timings"], base["meta"]
        web = task.web is not None
        why = harness.supports(web)
        if why is not None:
            return RolloutResult(**base, status="harness_error", message=why)
        if web and not self.backend.supports_web:
            return RolloutResult(**base, status="task_error", message=f"web tasks do not run on the "
                                 f"{self.cfg.backend} backend (bwrap or docker)")
        try:
            session = await self.gateway.open_session(spec.rollout_id, spec.group_id, harness.name,
                                                      meta={"task_id": task.task_id, "sample": spec.sample},
                                                      **({"replay": spec.replay} if spec.replay is not None else {}))
        except Exception as e:  # the shim is down: infrastructure
            raise _Infra(f"opening the rollout: {type(e).__name__}: {e}") from e
        base["session_ids"] = [session.session_id]
        path = urlparse(session.base_url).path.rstrip("/")
        ctx = SessionContext(base_url=f"http://127.0.0.1:{self.cfg.shim_port}{path}", api_key=session.api_key,
                             model=self.cfg.model, home=HOME, workspace=task.workspace_dir,
                             max_turns=self.cfg.max_turns,
                             context_window=getattr(getattr(self.gateway, "engine", None), "max_context", 32768),
                             web=_web_context(task))
        session_open, sbx, app, desk = True, None, None, None
        try:
            desk_spec = desktop.desktop_spec(task.metadata)
        except ValueError as e:
            return RolloutResult(**base, status="task_error", message=str(e))
        try:
            try:
                await harness.prepare(home, ctx)
                inv = await asyncio.to_thread(harness.invocation, home, task.user_query, ctx)
            except (HarnessError, OSError) as e:
                return RolloutResult(**base, status="harness_error", message=f"prepare: {e}")
            await asyncio.to_thread(_write_json, self._rollout_dir(spec) / "logs" / "invocation.json", inv)
            if web:
                app = await self._start_app(spec, task, caps[2].path, timings)
            t = time.monotonic()
            try:
                sbx = await self.backend.create(self._sandbox_spec(spec, task, harness, workspace, home, app))
            except SandboxError as e:
                raise _Infra(str(e)) from e
            timings["sandbox_start_s"] = time.monotonic() - t
            env = harness.env(ctx)
            if desk_spec is not None:  # the task's desktop, before the agent: its DISPLAY goes to the harness
                try:
                    desk = await desktop.start(sbx, desk_spec, timings)
                except DesktopError as e:
                    raise _Infra(f"starting the desktop: {e}") from e
                env = {**env, **desk.env()}
            t = time.monotonic()
            res = await self._watched(sbx.exec(harness.argv(task.user_query, ctx), env=env,
                                               cwd=task.workspace_dir, timeout=self.cfg.timeout_s), caps)
            timings["harness_s"] = time.monotonic() - t
            if desk is not None:  # the final screen kept, every desktop process stopped, before grading
                meta["desktop"] = await desktop.finish(desk, self._rollout_dir(spec) / "logs")
            records = await self.gateway.close_session(session.session_id)
            session_open = False
            meta.update(calls=len(records))
            replay = self._replay_report(spec, session.session_id)
            if replay is not None:
                meta["replay"] = replay
            if res is not None:
                meta.update(exit_code=res.exit_code, oom_killed=res.oom_killed)
            try:
                await sbx.export_workspace()  # kubernetes: copy it out; every backend: nothing runs after this
            except SandboxError as e:
                raise _Infra(str(e)) from e
            await sbx.close()
            extra = {}
            if app is not None:  # only now, with no agent process left, the app stops and its state is read
                await app.stop()
                extra[webenv.STATE_DIRNAME] = await asyncio.to_thread(
                    app.collect, self._rollout_dir(spec) / webenv.STATE_DIRNAME)
                meta["web"] = await asyncio.to_thread(webenv.summarize, extra[webenv.STATE_DIRNAME])
            await asyncio.to_thread(harness.save_logs, home, res, self._rollout_dir(spec) / "logs")
            if replay is not None and replay["mismatch"] is not None:  # the child never reached its parent's state
                return RolloutResult(**base, status="replay_mismatch",
                                     message=f"replay of {replay['parent']}: {replay['mismatch']['why']}")
            changes = await asyncio.to_thread(task.input_changes, workspace)
            meta["inputs_changed"] = [c["path"] for c in changes]
            meta["workspace_changes"], more = await asyncio.to_thread(
                workspace_changes.changes, task.input_dir, workspace, changes)
            if more:
                meta["workspace_changes_more"] = more
            bad = tamper.tampered(changes, task.editable_inputs, self.cfg.undeclared_inputs)
            if bad:
                meta["tampered"] = bad
            if web:
                meta.setdefault("web", {}).update(await asyncio.to_thread(_browser_summary, self._rollout_dir(spec)))
            if res is None or res.disk_exceeded or await _over(caps):
                raise _DiskLimit(await asyncio.to_thread(_disk_message, caps, res))
            return await self._judge(spec, task, harness, res, base, caps, extra)
        finally:
            if desk is not None and not desk.closed:
                with contextlib.suppress(Exception):  # the sandbox's close below ends it anyway
                    await desk.close()
            if sbx is not None:
                await sbx.close()
            if app is not None:
                await app.stop()
            if session_open:
                with contextlib.suppress(Exception):  # already closed, or the shim is gone
                    await self.gateway.close_session(session.session_id)

    def _replay_report(self, spec: RolloutSpec, session_id: str) -> dict | None:
        """A forked child's replay report from the shim (research/shim/fork.py), kept as `meta["replay"]`."""
        return None if spec.replay is None else self.gateway.replay_status(session_id)

    async def _start_app(self, spec: RolloutSpec, task: Task, host_dir: pathlib.Path, timings: dict):
        """The task's web app in its own sandbox (harness_env/web/env.py), answering before the agent starts.
        An app that exits is the task's fault (task_error); one that never answers, infrastructure (retried)."""
        t = time.monotonic()
        try:
            app = await webenv.start(self.backend, task.web, host_dir, name=f"{spec.rollout_id}-app",
                                     wall_s=self.cfg.timeout_s + self.cfg.reward_timeout_s + 120,
                                     labels={"harness-rl.rollout": spec.rollout_id})
        except webenv.WebEnvError as e:
            if "exited" in str(e):
                raise TaskError(f"{task.root}: {e}") from e
            raise _Infra(str(e)) from e
        except SandboxError as e:
            raise _Infra(f"starting the web app: {e}") from e
        timings["app_start_s"] = time.monotonic() - t
        return app

    async def _watched(self, coro, caps: list[disk.DiskCap]):
        """Awaits the harness exec, polling the disk caps; over a cap the exec is cancelled (which kills its
        process tree) and None returned. Cancelling this cancels the exec the same way."""
        task = asyncio.ensure_future(coro)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=DISK_POLL_S)
                if done:
                    return task.result()
                if await _over(caps):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    return None
        except BaseException:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise

    def _sandbox_spec(self, spec: RolloutSpec, task: Task, harness: Harness, workspace: pathlib.Path,
                      home: pathlib.Path, app=None) -> SandboxSpec:  # noqa: ANN001 - webenv.RunningEnv
        sock = self.gateway.unix_socket
        return SandboxSpec(workspace=workspace, home=home, limits=self.cfg.limits, name=spec.rollout_id,
                           mounts=[Mount(str(p), str(p)) for p in harness.mounts(web=app is not None)],
                           shim_socket=pathlib.Path(sock) if sock else None, shim_port=self.cfg.shim_port,
                           labels={"harness-rl.rollout": spec.rollout_id}, workspace_dir=task.workspace_dir,
                           app_ports={app.web.port: app.socket} if app is not None else {})

    def verifier_spec(self, spec: RolloutSpec, task: Task, workspace: pathlib.Path) -> SandboxSpec:
        """The grader's sandbox: the workspace and nothing else of the rollout (fresh HOME, no shim, no mounts)."""
        lim = dataclasses.replace(self.cfg.limits, wall_s=self.cfg.reward_timeout_s * 2 + 30)
        return SandboxSpec(workspace=workspace, home=None, limits=lim, name=f"{spec.rollout_id}-verify", shim=False,
                           labels={"harness-rl.rollout": spec.rollout_id, "harness-rl.role": "verifier"},
                           workspace_dir=task.workspace_dir)

    async def _judge(self, spec: RolloutSpec, task: Task, harness: Harness, res, base: dict,
                     caps: list[disk.DiskCap], extra: dict | None = None) -> RolloutResult:
        """The harness has exited and nothing of it runs: timeout / harness_error / reward_error / ok."""
        if res.timed_out:
            return RolloutResult(**base, status="timeout", message=f"harness ran past {self.cfg.timeout_s:.0f}s")
        try:
            outcome = harness.parse_output(res)
        except Exception as e:  # output the adapter cannot read is the harness's failure, never a retry
            raise HarnessError(f"{harness.name}: reading its output: {type(e).__name__}: {e}") from e
        base["meta"].update(num_turns=outcome.num_turns, final_message=outcome.final_message[-4000:],
                            harness_meta=outcome.meta)
        if not outcome.completed:
            return RolloutResult(**base, status="harness_error", message=outcome.error or "harness did not complete")
        t = time.monotonic()
        try:
            vsbx = await self.backend.create(self.verifier_spec(spec, task, caps[0].path))
        except SandboxError as e:
            raise _Infra(f"starting the verifier: {e}") from e
        try:
            sanitized: dict = {}
            try:
                reward, subs = await grade(vsbx, task, outcome.final_message, _transcript(task, outcome),
                                           timeout=self.cfg.reward_timeout_s, extra=extra,
                                           max_file_bytes=_file_cap(self.cfg.limits), sanitized=sanitized)
            finally:
                base["meta"]["sanitized"] = _removed(sanitized)
        except RewardError as e:
            return RolloutResult(**base, status="reward_error", message=str(e))
        except (SandboxError, OSError) as e:
            if await _over(caps):  # no room left even for reward/: the agent filled the disk
                raise _DiskLimit(await asyncio.to_thread(_disk_message, caps, None)) from e
            raise _Infra(f"grading: {e}") from e
        finally:
            await vsbx.close()
        base["timings"]["reward_s"] = time.monotonic() - t
        return RolloutResult(**base, status="ok", reward=reward, sub_scores=subs)


async def run_through_shim(root: pathlib.Path, engine, tok, specs: Sequence[RolloutSpec], cfg: RunnerConfig,  # noqa: ANN001
                           *, backend=None, shim_options=None) -> tuple[list[RolloutResult], list]:  # noqa: ANN001
    """One runner call through a real shim (its own Unix socket under `root`) into `engine`, capturing to
    root/capture.jsonl; returns (results, captured CallRecords). The path of tests, benches and the red-team
    suite: everything the RL loop's rollouts go through, with any engine (e.g. a scripted ReplayEngine)."""
    from research.capture import CallRecord, CaptureLog, read_log
    from research.shim.server import ShimServer

    root.mkdir(parents=True, exist_ok=True)
    log = CaptureLog(root / "capture.jsonl", fsync=False)
    server = ShimServer(engine, tok, log, unix_socket=str(root / "shim.sock"), options=shim_options)
    await server.start()
    runner = Runner(cfg, server, capture_log=log, backend=backend)
    try:
        results = await runner.run(list(specs))
    finally:
        runner.close()
        await server.stop()
        log.close()
    return results, [c for c in read_log(root / "capture.jsonl") if isinstance(c, CallRecord)]


async def _over(caps: list[disk.DiskCap]) -> bool:
    """Any cap exceeded? (tmpfs: one statvfs, inline; watch: a tree walk, off the event loop)"""
    for c in caps:
        if await asyncio.to_thread(c.exceeded) if c.mode == "watch" else c.exceeded():
            return True
    return False


def _disk_message(caps: list[disk.DiskCap], res) -> str:
    names = ("workspace", "HOME", "web app state")[: len(caps)]
    hit = [f"{n}: {c.describe()}" for n, c in zip(names, caps, strict=True) if c.exceeded()]
    if res is not None and res.disk_exceeded:
        hit.append(res.stderr.strip()[:300])
    return "disk cap exceeded: " + ("; ".join(hit) or "(the sandbox reported it)")


def _file_cap(limits: Limits) -> int:
    """No file of a graded workspace may be larger than its disk cap (only a sparse one can); 64 GiB uncapped."""
    return (limits.workspace_mb << 20) if limits.workspace_mb else 1 << 36


def _removed(report: dict) -> dict:
    """The sanitizer's report as kept with the result: what it removed or changed (empty lists dropped)."""
    return {k: v for k, v in report.items() if v and k in ("links", "special", "oversize", "modes", "errors",
                                                              "truncated", "first_report_lost")}


def _web_context(task: Task) -> WebContext | None:
    if task.web is None:
        return None
    from harness_env.web import browser

    return WebContext(start_url=task.web.start_url, origins=(task.web.origin,),
                      screenshots_dir=f"{HOME}/{browser.SCREENSHOTS}", steps_log=f"{HOME}/{browser.STEPS_LOG}")


def _browser_summary(rdir: pathlib.Path) -> dict:
    """Screenshots kept and browser steps logged (harness_env/web/browser.py) of a web rollout."""
    from harness_env.web import browser

    return browser.summarize_steps(rdir / "logs")


def _write_json(path: pathlib.Path, obj) -> None:  # noqa: ANN001
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1))


def _clear(rdir: pathlib.Path) -> None:
    """A rollout dir from an earlier attempt, gone (mounts first; rmtree never follows links)."""
    if rdir.exists():
        disk.release_stale(rdir)
        shutil.rmtree(rdir, ignore_errors=True)


def _setup_caps(caps: list[disk.DiskCap]) -> None:
    for c in caps:
        c.setup()


def _release_caps(caps: list[disk.DiskCap], keep: bool) -> None:
    for c in caps:
        c.release(keep)
    if not keep:
        for c in caps:
            shutil.rmtree(c.path, ignore_errors=True)


async def _thread_to_the_end(fn, *args):
    """Runs `fn` in a thread and waits for it to finish even through cancellation, then re-raises the
    cancellation. Mounting and unmounting the caps must not be abandoned half-way: a cancelled await on a
    plain to_thread leaves the thread running, so a mount could land after the release that should undo it."""
    return await wait_through_cancel(asyncio.ensure_future(asyncio.to_thread(fn, *args)))


def _finite(res: RolloutResult) -> RolloutResult:
    """No NaN/Infinity reaches results.jsonl (it would not be JSON): non-finite floats in meta/timings -> None."""
    res.meta = _finite_tree(res.meta)
    res.timings = {k: v for k, v in res.timings.items() if math.isfinite(v)}
    return res


def _finite_tree(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite_tree(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite_tree(v) for v in x]
    return x


def _transcript(task: Task, outcome) -> list[dict]:
    """The chat transcript given to chat-graded checkers: what the harness reported, else query + answer."""
    t = outcome.meta.get("transcript") if isinstance(outcome.meta, dict) else None
    if isinstance(t, list):
        return t
    return [{"role": "user", "content": task.user_query}, {"role": "assistant", "content": outcome.final_message}]


def _progress(total: int, enabled: bool, label: str):
    """A rollout bar on a terminal only: in a log file (CI, nohup) one redrawn bar per batch is noise."""
    return console.bar(label, total, enabled=enabled, unit="rollout", leave=False)
