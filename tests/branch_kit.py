"""Shared by the branching tests (tests/test_branching.py, tests/test_branching_cli.py): a stateful scripted policy
and one parent rollout followed by its forked children through the real RolloutService."""

from __future__ import annotations

import asyncio
import collections

import pytest

from harness_env.harnesses.base import get_harness
from harness_env.harnesses.scripted import TOOLS_BLOCK, tool_call_text
from harness_env.rl import branching
from harness_env.rl.rollouts import RolloutService, StepSpec
from harness_env.sandbox import get_backend
from harness_env.tasks import family
from research.capture import CallRecord, RolloutResult, read_log
from research.rl.config import RunConfig


def stepwise(tok, plan: dict[int, list[str]], harness: str = "reference"):
    """A ReplayEngine script: at the step'th tool result, the plan's shell commands (in `harness`'s own tool) for
    its successive visits (a parent's, then its child's), "Done." after them. It counts the visits, so a child
    sampling at a prompt its parent saw answers differently."""
    shell = get_harness(harness).shell_call
    seen = collections.Counter()

    def reply(req):
        text = tok.decode(list(req.prompt_ids))
        if TOOLS_BLOCK not in text:  # a side call without tools (opencode's title): not a step
            return "Scripted session"
        step = text.count("<tool_response>")
        seen[step] += 1
        cmds = plan.get(step, ["Done."])
        cmd = cmds[min(seen[step], len(cmds)) - 1]
        return cmd if cmd == "Done." else tool_call_text(shell(cmd))

    return reply


def run_with_children(tmp_path, tok, engine, harness: str, *, branch="failed", timeout_s=60, **ro):
    """One parent (a make_file task) through RolloutService, then branching.run_children on it: (run, parent spec,
    children specs, results by rollout id, call records by rollout id in call order)."""
    from configs import demo_cpu

    ok, why = get_backend("bwrap").available()
    if not ok:
        pytest.skip(why)
    cfg = demo_cpu.get_config("test")
    cfg.rollout.update(harnesses=harness, concurrency=2, max_turns=8, max_new_tokens=256, timeout_s=timeout_s,
                       progress=False, branch=branch, **ro)
    run = RunConfig.of(cfg)
    parent = StepSpec(family.write_task(tmp_path / "tasks", "notes.txt", "apple"), harness, 0, step=3)
    svc = RolloutService(run, tmp_path / "wd", engine, tok)

    async def go():
        try:
            await svc.run([parent])
            return await branching.run_children(svc, run, [parent])
        finally:
            await svc.close()

    kids = asyncio.run(go())
    recs = list(read_log(svc.capture_path))
    results = {r.rollout_id: r for r in recs if isinstance(r, RolloutResult)}
    calls = collections.defaultdict(list)
    for c in recs:
        if isinstance(c, CallRecord):
            calls[c.rollout_id].append(c)
    return run, parent, kids, results, {k: sorted(v, key=lambda c: c.call_index) for k, v in calls.items()}
